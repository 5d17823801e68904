//! The `export` stage: a checkpoint to a GGUF file of architecture
//! `cachefit` (`docs/CACHEFIT-FORMAT.md`): hyper-parameters as metadata,
//! the BPE vocabulary, matrices as int8 rows with one f32 scale each or,
//! in a ternary network, block matrices as TQ2_0 (or everything f32),
//! norms and conv taps f32.

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::files;
use crate::net::{self, config::pattern_string, Layout, NetConfig};
use crate::paths;
use crate::vocab::{vocab_metadata, Vocabulary};
use gguf::{GgmlType, TensorSpec, Value};
use std::path::Path;

/// How matrices are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixType {
    /// The network's own storage: `I8` rows + `F32` scales (what the
    /// runtime's int8 kernels read), and `TQ2_0` for the block matrices of
    /// a ternary network.
    Int8,
    /// The fake-quantized values as `F32` (same numbers, 4× the bytes).
    F32,
}

/// A prompt format the task passages use: the system text as a fact
/// line, then `Q:`/`A:` lines.
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}\
{% if m['role'] == 'system' %}{{ m['content'] | trim }}\n\
{% elif m['role'] == 'user' %}Q: {{ m['content'] | trim }}\n\
{% else %}A: {{ m['content'] | trim }}\n{% endif %}\
{% endfor %}{% if add_generation_prompt %}A:{% endif %}";

pub struct ExportReport {
    pub bytes: u64,
    pub params: usize,
    pub step: usize,
}

/// The `tokenizer.*` keys of a trained vocabulary, with the task
/// passages' chat template.
pub fn trained_tokenizer(vocab: &Vocabulary) -> Vec<(String, Value)> {
    let mut keys = vocab_metadata(vocab);
    keys.push((
        "tokenizer.chat_template".into(),
        Value::String(CHAT_TEMPLATE.into()),
    ));
    keys
}

/// Metadata for `net` with the vocabulary.
pub fn metadata(net: &NetConfig, vocab: &Vocabulary, name: &str) -> gguf::Metadata {
    metadata_with_tokenizer(net, &trained_tokenizer(vocab), name)
}

/// Metadata for `net` with these `tokenizer.*` keys (a trained vocabulary's,
/// or another model's imported by `bpe --from-model`).
pub fn metadata_with_tokenizer(
    net: &NetConfig,
    tokenizer: &[(String, Value)],
    name: &str,
) -> gguf::Metadata {
    let mut md = gguf::Metadata::new();
    let a = "cachefit";
    md.set("general.architecture", Value::String(a.into()));
    md.set("general.name", Value::String(name.into()));
    let u = |v: usize| Value::U32(v as u32);
    md.set(
        format!("{a}.block_pattern"),
        Value::String(pattern_string(&net.pattern)),
    );
    md.set(format!("{a}.block_count"), u(net.pattern.len()));
    md.set(format!("{a}.context_length"), u(net.context));
    md.set(format!("{a}.embedding_length"), u(net.d));
    md.set(format!("{a}.feed_forward_length"), u(net.ffn));
    md.set(format!("{a}.attention.head_count"), u(net.n_heads));
    md.set(format!("{a}.attention.head_count_kv"), u(net.n_kv_heads));
    md.set(format!("{a}.attention.key_length"), u(net.head_dim));
    md.set(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(net.eps),
    );
    md.set(format!("{a}.rope.freq_base"), Value::F32(net.rope_base));
    md.set(format!("{a}.conv.kernel_length"), u(net.conv_kernel));
    md.set(
        format!("{a}.final_logit_softcapping"),
        Value::F32(net.softcap),
    );
    md.set(format!("{a}.vocab_size"), u(net.vocab));
    if net.weights.is_ternary() {
        // llama.cpp's file type for "mostly TQ2_0", so tools name it so.
        md.set("general.file_type", Value::U32(37));
    }
    if net.token_code_bits > 0 {
        md.set(format!("{a}.token_codes.bits"), u(net.token_code_bits));
        md.set(
            format!("{a}.token_codes.seed"),
            Value::U64(net.token_code_seed),
        );
    }
    for (k, v) in tokenizer {
        md.set(k.clone(), v.clone());
    }
    md
}

/// Tokens in `tokenizer.ggml.tokens` of these keys.
fn token_count(tokenizer: &[(String, Value)]) -> Option<usize> {
    tokenizer
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map(|(_, items)| items.len())
}

/// Write `params` (already what the model computes with: fake-quantized
/// when trained with QAT; the int8 export quantizes them again, which
/// gives back the same numbers) as a GGUF file.
pub fn write_gguf(
    net: &NetConfig,
    params: &[f32],
    vocab: &Vocabulary,
    name: &str,
    ty: MatrixType,
    path: &Path,
) -> Result<u64> {
    write_gguf_with_tokenizer(net, params, &trained_tokenizer(vocab), name, ty, path)
}

/// [`write_gguf`] with the `tokenizer.*` keys given.
pub fn write_gguf_with_tokenizer(
    net: &NetConfig,
    params: &[f32],
    tokenizer: &[(String, Value)],
    name: &str,
    ty: MatrixType,
    path: &Path,
) -> Result<u64> {
    let l = Layout::new(net);
    if params.len() != l.len {
        return Err(Error::Config(format!(
            "{} parameters for a network of {}",
            params.len(),
            l.len
        )));
    }
    let tokens = token_count(tokenizer).unwrap_or(0);
    if tokens != net.vocab {
        return Err(Error::Config(format!(
            "the vocabulary has {tokens} tokens, the network {}",
            net.vocab
        )));
    }
    let mut b = gguf::Builder::new(metadata_with_tokenizer(net, tokenizer, name));
    let mut data: Vec<Vec<u8>> = Vec::new();
    let gg = |e: gguf::ErrorKind| Error::Gguf(gguf::Error::new(path, e));
    for t in &l.tensors {
        let src = &params[t.range()];
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        if !t.matrix {
            let dims = if t.rows == 1 {
                vec![t.cols as u64]
            } else {
                vec![t.cols as u64, t.rows as u64]
            };
            b.add_tensor(TensorSpec {
                name: format!("{}.weight", t.name),
                dims,
                ty: GgmlType::F32,
            })
            .map_err(gg)?;
            data.push(f32_bytes(src));
            continue;
        }
        let dims = vec![t.cols as u64, t.rows as u64];
        match ty {
            MatrixType::F32 => {
                b.add_tensor(TensorSpec {
                    name: format!("{}.weight", t.name),
                    dims,
                    ty: GgmlType::F32,
                })
                .map_err(gg)?;
                data.push(f32_bytes(src));
            }
            MatrixType::Int8 if t.ternary => {
                // `src` holds t·s per block already (fake-quantized): TQ2_0's
                // rule (d = max|x|, q = round(x/d)) gives back s and t.
                use kernels::quant::tq2_0::{quantize_row, BlockTQ2_0};
                let per_row = t.cols / net::TERNARY_BLOCK;
                let mut blocks =
                    vec![<BlockTQ2_0 as bytemuck::Zeroable>::zeroed(); t.rows * per_row];
                for (row, br) in src
                    .chunks_exact(t.cols)
                    .zip(blocks.chunks_exact_mut(per_row))
                {
                    quantize_row(row, br);
                }
                b.add_tensor(TensorSpec {
                    name: format!("{}.weight", t.name),
                    dims,
                    ty: GgmlType::TQ2_0,
                })
                .map_err(gg)?;
                data.push(bytemuck::cast_slice(&blocks).to_vec());
            }
            MatrixType::Int8 => {
                let mut q = vec![0i8; t.len()];
                let mut scales = Vec::with_capacity(t.rows);
                for (row, qr) in src.chunks_exact(t.cols).zip(q.chunks_exact_mut(t.cols)) {
                    scales.push(net::quantize_row(row, qr));
                }
                b.add_tensor(TensorSpec {
                    name: format!("{}.weight", t.name),
                    dims,
                    ty: GgmlType::I8,
                })
                .map_err(gg)?;
                data.push(q.iter().map(|&v| v as u8).collect());
                b.add_tensor(TensorSpec {
                    name: format!("{}.scale", t.name),
                    dims: vec![t.rows as u64],
                    ty: GgmlType::F32,
                })
                .map_err(gg)?;
                data.push(f32_bytes(&scales));
            }
        }
    }
    let mut bytes = Vec::new();
    let mut w = b.write_header(&mut bytes).map_err(gg)?;
    for d in &data {
        w.write_tensor(d).map_err(gg)?;
    }
    w.finish().map_err(gg)?;
    let tmp = path.with_extension("gguf.tmp");
    files::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        action: "replace",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.len() as u64)
}

/// Export the checkpoint in `dir` to `out` (default `dir/model.gguf`).
pub fn run(dir: &Path, out: Option<&Path>, ty: MatrixType, name: &str) -> Result<ExportReport> {
    let ck_path = files::stage_input(dir, paths::CHECKPOINT, "train")?;
    let ck = checkpoint::load(&ck_path)?;
    // An imported tokenizer (`bpe --from-model`) goes into the file as the
    // model it came from has it, chat template included.
    let tokenizer = match crate::import::imported_tokenizer(dir)? {
        Some(keys) => keys,
        None => trained_tokenizer(&Vocabulary::load(&files::stage_input(
            dir,
            paths::TOKENIZER_JSON,
            "bpe",
        )?)?),
    };
    let l = Layout::new(&ck.net);
    // What the model computes with: trained with QAT, the round trip is
    // the identity on its numbers; without, this is post-training
    // quantization.
    let mut params = vec![0.0f32; l.len];
    net::fake_quantize(&ck.net, &l, &ck.params, &mut params);
    let default = dir.join(paths::MODEL_GGUF);
    let path = out.unwrap_or(&default);
    let source = match ty {
        MatrixType::Int8 => &params,
        MatrixType::F32 => &ck.params,
    };
    let bytes = write_gguf_with_tokenizer(&ck.net, source, &tokenizer, name, ty, path)?;
    Ok(ExportReport {
        bytes,
        params: l.len,
        step: ck.step,
    })
}

/// Read a `cachefit` GGUF back into the trainer's flat parameters
/// (int8 matrices dequantized), with its network: the float reference
/// the runtime is compared against.
pub fn read_gguf(path: &Path) -> Result<(NetConfig, Vec<f32>)> {
    let file = gguf::GgufFile::open(path)?;
    let md = file.metadata();
    let bad = |problem: String| Error::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let gg = |e: gguf::ErrorKind| Error::Gguf(gguf::Error::new(path, e));
    if md.get_str("general.architecture").map_err(gg)? != "cachefit" {
        return Err(bad("not a cachefit model".into()));
    }
    let u = |k: &str| -> Result<usize> {
        Ok(md.get_u64(&format!("cachefit.{k}")).map_err(gg)? as usize)
    };
    let f = |k: &str| -> Result<f32> { md.get_f32(&format!("cachefit.{k}")).map_err(gg) };
    let code_bits = md
        .opt("cachefit.token_codes.bits", gguf::Metadata::get_u64)
        .map_err(gg)?
        .unwrap_or(0) as usize;
    let code_seed = md
        .opt("cachefit.token_codes.seed", gguf::Metadata::get_u64)
        .map_err(gg)?
        .unwrap_or(0);
    // Ternary when the first block's MLP is TQ2_0 (the scale block size
    // is not needed to read the values back).
    let ternary = file
        .tensor_info("blk.0.ffn_up.weight")
        .is_some_and(|t| t.ty == GgmlType::TQ2_0);
    let net = NetConfig {
        vocab: u("vocab_size")?,
        d: u("embedding_length")?,
        ffn: u("feed_forward_length")?,
        pattern: net::config::parse_pattern(md.get_str("cachefit.block_pattern").map_err(gg)?)?,
        n_heads: u("attention.head_count")?,
        n_kv_heads: u("attention.head_count_kv")?,
        head_dim: u("attention.key_length")?,
        context: u("context_length")?,
        conv_kernel: u("conv.kernel_length")?,
        softcap: f("final_logit_softcapping")?,
        eps: f("attention.layer_norm_rms_epsilon")?,
        rope_base: f("rope.freq_base")?,
        weights: if ternary {
            net::WeightFormat::Ternary {
                block: net::TERNARY_BLOCK,
            }
        } else {
            net::WeightFormat::Int8
        },
        token_code_bits: code_bits,
        token_code_seed: code_seed,
    };
    net.validate()?;
    let l = Layout::new(&net);
    let mut params = vec![0.0f32; l.len];
    let f32s = |name: &str, n: usize| -> Result<Vec<f32>> {
        let t = file
            .tensor_info(name)
            .ok_or_else(|| bad(format!("tensor {name} is missing")))?;
        if t.ty != GgmlType::F32 || t.n_elements() != n as u64 {
            return Err(bad(format!("tensor {name}: expected {n} F32 values")));
        }
        Ok(file
            .tensor_data(t)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    };
    for t in &l.tensors {
        let w = format!("{}.weight", t.name);
        let info = file
            .tensor_info(&w)
            .ok_or_else(|| bad(format!("tensor {w} is missing")))?;
        let dst = &mut params[t.range()];
        if t.matrix && info.ty == GgmlType::I8 {
            if info.n_elements() != t.len() as u64 {
                return Err(bad(format!("tensor {w}: expected {} values", t.len())));
            }
            let scales = f32s(&format!("{}.scale", t.name), t.rows)?;
            let q = file.tensor_data(info);
            for (r, (drow, qrow)) in dst
                .chunks_exact_mut(t.cols)
                .zip(q.chunks_exact(t.cols))
                .enumerate()
            {
                for (d, &qv) in drow.iter_mut().zip(qrow) {
                    *d = qv as i8 as f32 * scales[r];
                }
            }
        } else if t.matrix && info.ty == GgmlType::TQ2_0 {
            use kernels::quant::tq2_0::{dequantize_row, BlockTQ2_0};
            let blocks: &[BlockTQ2_0] = bytemuck::try_cast_slice(file.tensor_data(info))
                .map_err(|e| bad(format!("tensor {w}: TQ2_0 data: {e}")))?;
            if info.n_elements() != t.len() as u64 || blocks.len() * 256 != t.len() {
                return Err(bad(format!("tensor {w}: expected {} values", t.len())));
            }
            dequantize_row(blocks, dst);
        } else {
            dst.copy_from_slice(&f32s(&w, t.len())?);
        }
    }
    Ok((net, params))
}

//! The per-tensor plan: which type each tensor gets, and why.
//!
//! The rules are llama.cpp's (`src/llama-quant.cpp`: `tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`), so a file planned
//! here gets the same tensor types as `llama-quantize` gives it. They run in
//! three steps:
//!
//! 1. **Keep** tensors that are not quantized at all (1-D tensors, norms,
//!    routers, positional embeddings, ...): written as they are.
//! 2. **Pick** a type: the target's base type, unless a mix rule
//!    ([`mix_rule`]) gives this tensor's category more (or fewer) bits. Rules
//!    for `attn_v` and `ffn_down` depend on the layer, counted as llama.cpp
//!    counts: tensors in the order llama.cpp's loader visits them (by layer
//!    number, then name).
//! 3. **Fall back** when the row length is not a multiple of the picked
//!    type's block (K-quants need 256): Q4_K→Q5_0, Q5_K→Q5_1, Q6_K→Q8_0,
//!    Q2_K/Q3_K/TQ1_0/TQ2_0→Q4_0 (older llama.cpp sent Q2_K/Q3_K to IQ4_NL;
//!    we follow the current source), and F16 when even that does not fit.
//!    Fallbacks are counted, as `llama-quantize` reports them.
//!
//! Only the rules for targets we offer are written out; llama.cpp's IQ1-IQ3
//! and MXFP4 rules would go in the same table.

use crate::error::{Error, Result};
use crate::target::Target;
use gguf::{GgmlType, GgufFile, Metadata, TensorInfo, TensorSpec};
use std::collections::BTreeMap;
use std::fmt;

/// Options that change the plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanOptions {
    /// `llama-quantize --pure`: every quantizable tensor gets the base type
    /// (no mix rules, no output/embedding rules); fallbacks still apply.
    pub pure: bool,
}

/// llama.cpp's broad tensor categories (`tensor_get_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    /// Same tests, same order as llama.cpp (first match wins).
    pub fn of(name: &str) -> Category {
        use Category::*;
        if name == "output.weight" {
            return Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return TokenEmbd;
        }
        const BY_SUBSTRING: &[(&str, Category)] = &[
            ("attn_qkv.weight", AttnQkv),
            ("attn_kv_b.weight", AttnKvB),
            ("attn_v.weight", AttnV),
            ("attn_k.weight", AttnK),
            ("attn_q.weight", AttnQ),
            ("attn_output.weight", AttnOutput),
            ("ffn_up", FfnUp),
            ("ffn_gate", FfnGate),
            ("ffn_down", FfnDown),
        ];
        BY_SUBSTRING
            .iter()
            .find(|(s, _)| name.contains(s))
            .map_or(Other, |&(_, c)| c)
    }

    /// The attention-value-like tensors that share the `attn_v` rules and
    /// counter (`category_is_attn_v`).
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Why a tensor gets its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not quantized at all (llama.cpp's `tensor_allows_quantization` says
    /// no): written in its source type.
    Kept(&'static str),
    /// The target's base type.
    Base,
    /// A mix rule picked the type (the text says which).
    Rule(&'static str),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Kept(why) => write!(f, "kept ({why})"),
            Reason::Base => write!(f, "base type"),
            Reason::Rule(r) => write!(f, "{r}"),
        }
    }
}

/// One tensor of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    /// Index in the input's tensor table (output order is the same).
    pub index: usize,
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub category: Category,
    pub from: GgmlType,
    pub to: GgmlType,
    pub reason: Reason,
    /// The type the rules wanted when the row length forced `to` instead.
    pub fallback_from: Option<GgmlType>,
    /// Bytes in the input.
    pub in_bytes: u64,
}

impl PlannedTensor {
    /// Whether the data changes (otherwise the bytes are copied).
    pub fn converts(&self) -> bool {
        self.from != self.to
    }
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    pub fn spec(&self) -> TensorSpec {
        TensorSpec {
            name: self.name.clone(),
            dims: self.dims.clone(),
            ty: self.to,
        }
    }
    /// Bytes in the output.
    pub fn out_bytes(&self) -> u64 {
        self.spec()
            .n_bytes()
            .expect("planned types always fit the row length")
    }
}

/// The whole plan, tensors in input order.
#[derive(Clone, Debug)]
pub struct Plan {
    pub target: Target,
    pub tensors: Vec<PlannedTensor>,
    /// Tensors whose row length forced a fallback type.
    pub n_fallback: usize,
}

impl Plan {
    /// Tensors per output type.
    pub fn counts(&self) -> BTreeMap<GgmlType, usize> {
        let mut m = BTreeMap::new();
        for t in &self.tensors {
            *m.entry(t.to).or_insert(0) += 1;
        }
        m
    }
    pub fn n_elements(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements()).sum()
    }
    pub fn in_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.in_bytes).sum()
    }
    pub fn out_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.out_bytes()).sum()
    }

    /// Check the plan can run: without `allow_requantize` no already
    /// quantized tensor may be converted (llama.cpp's rule), and the kernels
    /// table must have a dequantizer for every source type and a quantizer
    /// for every target type that conversion needs.
    pub fn check(&self, allow_requantize: bool) -> Result<()> {
        let converting = || self.tensors.iter().filter(|t| t.converts());
        if !allow_requantize {
            if let Some(t) = converting().find(|t| t.from.is_quantized()) {
                return Err(Error::Requantize {
                    tensor: t.name.clone(),
                    ty: t.from,
                });
            }
        }
        let supported = || {
            kernels::traits::computable_types()
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for t in converting() {
            if kernels::traits(t.from).is_none() {
                return Err(Error::NoDequantizer {
                    tensor: t.name.clone(),
                    ty: t.from,
                    supported: supported(),
                });
            }
            if kernels::traits(t.to).is_none() {
                return Err(Error::NoQuantizer {
                    tensor: t.name.clone(),
                    ty: t.to,
                    supported: supported(),
                });
            }
        }
        Ok(())
    }
}

/// Plan `file` for `target` with llama.cpp's default rules.
pub fn plan(file: &GgufFile, target: Target) -> Result<Plan> {
    plan_with(file, target, PlanOptions::default())
}

pub fn plan_with(file: &GgufFile, target: Target, opts: PlanOptions) -> Result<Plan> {
    plan_tensors(file.metadata(), file.tensors(), target, opts)
}

/// The planner on a header (metadata + tensor table).
pub fn plan_tensors(
    meta: &Metadata,
    tensors: &[TensorInfo],
    target: Target,
    opts: PlanOptions,
) -> Result<Plan> {
    let model = ModelFacts::read(meta, tensors);
    let mut st = State {
        target,
        base: target.base_type(),
        model,
        // llama.cpp assumes tied embeddings until it sees `output.weight`.
        tied: !tensors
            .iter()
            .any(|t| Category::of(&t.name) == Category::Output),
        n_attn_v: tensors
            .iter()
            .filter(|t| Category::of(&t.name).is_attn_v())
            .count() as i64,
        i_attn_v: 0,
        i_ffn_down: 0,
    };

    // llama.cpp visits tensors sorted by layer number, then name; the layer
    // counters depend on that order.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&tensors[a], &tensors[b]);
        (layer_of(&ta.name).unwrap_or(-1), &ta.name)
            .cmp(&(layer_of(&tb.name).unwrap_or(-1), &tb.name))
    });

    let mut planned: Vec<Option<PlannedTensor>> = vec![None; tensors.len()];
    let mut n_fallback = 0;
    for i in order {
        let info = &tensors[i];
        let category = Category::of(&info.name);
        let (to, reason, fallback_from) = if let Some(why) = kept_because(info) {
            (info.ty, Reason::Kept(why), None)
        } else if !st.base.is_quantized() {
            // F32/F16/BF16 targets: no rules, no block size to fit.
            (st.base, Reason::Base, None)
        } else {
            let (wanted, reason) = if opts.pure {
                (st.base, Reason::Base)
            } else {
                st.pick(info, category)?
            };
            match fallback(wanted, info.row_len()) {
                Fit::Fits => (wanted, reason, None),
                Fit::Fallback(alt) => {
                    n_fallback += 1;
                    (alt, reason, Some(wanted))
                }
                Fit::NoFallback => {
                    return Err(Error::NoFallback {
                        tensor: info.name.clone(),
                        ty: wanted,
                        row_len: info.row_len(),
                    })
                }
            }
        };
        planned[i] = Some(PlannedTensor {
            index: i,
            name: info.name.clone(),
            dims: info.dims.clone(),
            category,
            from: info.ty,
            to,
            reason,
            fallback_from,
            in_bytes: info.n_bytes,
        });
    }
    Ok(Plan {
        target,
        tensors: planned
            .into_iter()
            .map(|t| t.expect("all planned"))
            .collect(),
        n_fallback,
    })
}

/// `blk.N.` prefix → N (the `sscanf(name, "blk.%d.")` llama.cpp uses).
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find('.')?;
    rest[..end].parse().ok()
}

/// `ggml_n_dims`: trailing dimensions of 1 do not count.
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Why llama.cpp's `tensor_allows_quantization` leaves a tensor alone, if
/// it does. (Arch-specific GLM5 names are left out: we do not run it.)
fn kept_because(t: &TensorInfo) -> Option<&'static str> {
    if n_dims(&t.dims) < 2 {
        return Some("1-D");
    }
    if !t.name.ends_with("weight") {
        return Some("not a weight");
    }
    if t.name.contains("_norm.weight") {
        return Some("norm");
    }
    const EXACT: &[(&str, &str)] = &[
        ("position_embd.weight", "positional embedding"),
        ("token_types.weight", "token-type embedding"),
    ];
    const CONTAINS: &[(&str, &str)] = &[
        ("ffn_gate_inp.weight", "expert router"),
        ("ffn_gate_tid2eid.weight", "expert routing table"),
        ("altup", "small AltUp tensor"),
        ("laurel", "small LAuReL tensor"),
        ("per_layer_model_proj", "small per-layer projection"),
        ("ssm_conv1d", "small conv1d"),
        ("shortconv.conv.weight", "small conv1d"),
        ("indexer.k_proj.weight", "small indexer projection"),
        ("indexer.q_proj.weight", "small indexer projection"),
        ("time_mix_first.weight", "small RWKV tensor"),
        ("time_mix_w0.weight", "small RWKV tensor"),
        ("time_mix_w1.weight", "small RWKV tensor"),
        ("time_mix_w2.weight", "small RWKV tensor"),
        ("time_mix_v0.weight", "small RWKV tensor"),
        ("time_mix_v1.weight", "small RWKV tensor"),
        ("time_mix_v2.weight", "small RWKV tensor"),
        ("time_mix_a0.weight", "small RWKV tensor"),
        ("time_mix_a1.weight", "small RWKV tensor"),
        ("time_mix_a2.weight", "small RWKV tensor"),
        ("time_mix_g1.weight", "small RWKV tensor"),
        ("time_mix_g2.weight", "small RWKV tensor"),
        ("time_mix_decay_w1.weight", "small RWKV tensor"),
        ("time_mix_decay_w2.weight", "small RWKV tensor"),
        ("time_mix_lerp_fused.weight", "small RWKV tensor"),
        ("attn_rel_b.weight", "relative position bias"),
        (".position_embd", "multimodal positional embedding"),
        ("sam.pos_embd", "multimodal tensor"),
        ("sam.neck.", "multimodal tensor"),
        ("sam.net_", "multimodal tensor"),
        (".rel_pos", "multimodal tensor"),
        (".patch_embd", "multimodal tensor"),
        (".patch_merger", "multimodal tensor"),
        ("a.rvq.codebook", "audio codebook"),
        ("mm.a.code_embd", "audio codebook"),
    ];
    EXACT
        .iter()
        .find(|(n, _)| t.name == *n)
        .or_else(|| CONTAINS.iter().find(|(s, _)| t.name.contains(s)))
        .map(|&(_, why)| why)
}

/// Model facts the rules look at.
#[derive(Clone, Debug, Default)]
struct ModelFacts {
    n_layer: i64,
    /// Query heads per KV head (0 if unknown).
    n_gqa: u64,
    n_expert: u64,
    falcon: bool,
    /// llama.cpp's `LLM_TYPE_70B`: an 80-layer GQA llama.
    is_70b: bool,
}

impl ModelFacts {
    fn read(meta: &Metadata, tensors: &[TensorInfo]) -> ModelFacts {
        let arch = meta
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        // Per-layer arrays (some archs) count by their first layer, as
        // `n_gqa()` does for layer 0.
        let num = |key: &str| -> Option<u64> {
            let v = meta.get(&format!("{arch}.{key}"))?;
            v.as_u64()
                .or_else(|| v.as_array().and_then(|(_, a)| a.first()?.as_u64()))
        };
        let n_layer = num("block_count").map(|n| n as i64).unwrap_or_else(|| {
            tensors
                .iter()
                .filter_map(|t| layer_of(&t.name))
                .max()
                .map_or(0, |m| m + 1)
        });
        let n_head = num("attention.head_count").unwrap_or(0);
        let n_head_kv = num("attention.head_count_kv").unwrap_or(n_head);
        ModelFacts {
            n_layer,
            n_gqa: n_head.checked_div(n_head_kv).unwrap_or(0),
            n_expert: num("expert_count").unwrap_or(0),
            falcon: arch == "falcon",
            is_70b: arch == "llama" && n_layer == 80 && n_head != n_head_kv,
        }
    }
}

/// `use_more_bits` in llama.cpp: the first and last eighth of the layers,
/// and every third layer in between.
pub fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// Running state of the planner (llama.cpp's `quantize_state_impl`).
struct State {
    target: Target,
    base: GgmlType,
    model: ModelFacts,
    tied: bool,
    n_attn_v: i64,
    i_attn_v: i64,
    i_ffn_down: i64,
}

impl State {
    /// The mix rules for one quantizable tensor; advances the counters.
    fn pick(&mut self, info: &TensorInfo, cat: Category) -> Result<(GgmlType, Reason)> {
        let here = Here {
            target: self.target,
            base: self.base,
            m: &self.model,
            row_len: info.row_len(),
            tied: self.tied,
            i_attn_v: self.i_attn_v,
            n_attn_v: self.n_attn_v,
            layer: (0, 0),
        };
        let here = match cat {
            Category::FfnDown => Here {
                layer: self.ffn_down_layer(&info.name)?,
                ..here
            },
            _ => here,
        };
        let picked = mix_rule(cat, &here);
        if cat.is_attn_v() {
            self.i_attn_v += 1;
        }
        if cat == Category::FfnDown {
            self.i_ffn_down += 1;
        }
        Ok(match picked {
            Some((ty, why)) if ty != self.base => (ty, Reason::Rule(why)),
            _ => (self.base, Reason::Base),
        })
    }

    /// `layer_info`: the running counter, except in MoE models whose expert
    /// tensors are not in layer order, where the name says.
    fn ffn_down_layer(&self, name: &str) -> Result<(i64, i64)> {
        let n = self.model.n_layer;
        if self.model.n_expert <= 1 {
            return Ok((self.i_ffn_down, n));
        }
        let bad = |problem: String| Error::Layer {
            tensor: name.to_string(),
            problem,
        };
        let i = layer_of(name)
            .ok_or_else(|| bad("cannot tell its layer (expected `blk.N.`)".into()))?;
        if i < 0 || i >= n {
            return Err(bad(format!("layer {i} outside the model's {n} layers")));
        }
        Ok((i, n))
    }
}

/// What the rules can see of the tensor being planned.
struct Here<'a> {
    target: Target,
    base: GgmlType,
    m: &'a ModelFacts,
    row_len: u64,
    tied: bool,
    i_attn_v: i64,
    n_attn_v: i64,
    /// `(i_layer, n_layer)` for `ffn_down`.
    layer: (i64, i64),
}

/// The mix table: the type a category gets under a target, or `None` for
/// the base type. Each arm is one branch of `llama_tensor_get_type_impl`;
/// arms are tried in order, as its if-chains are.
fn mix_rule(cat: Category, h: &Here) -> Option<(GgmlType, &'static str)> {
    use Category as C;
    use GgmlType as G;
    use Target as T;
    let m = h.m;
    let moe8 = m.n_expert == 8;
    let (wv, n_wv) = (h.i_attn_v, h.n_attn_v);
    let (i, n) = h.layer;

    // The output matrix, or the token embedding when it doubles as the
    // output (no `output.weight`): Q8_0 if the row does not fit the base
    // block, else Q6_K unless the target is already Q8_0.
    if cat == C::Output || (h.tied && cat == C::TokenEmbd) {
        return Some(if m.falcon {
            (G::Q8_0, "output (or tied token_embd) in falcon → Q8_0")
        } else if !h.row_len.is_multiple_of(h.base.block_size() as u64) {
            (
                G::Q8_0,
                "output (or tied token_embd) with rows that do not fit the base block → Q8_0",
            )
        } else if h.base != G::Q8_0 {
            (G::Q6_K, "output (or tied token_embd) → Q6_K")
        } else {
            (G::Q8_0, "output (or tied token_embd) stays Q8_0")
        });
    }

    let attn_v = cat.is_attn_v();
    let rule = match (cat, h.target) {
        (C::TokenEmbd, T::TQ1_0 | T::TQ2_0) => (G::Q4_K, "token_embd in ternary types → Q4_K"),

        // attn_v (and fused qkv / kv_b): then the 70B and 8-expert bumps below.
        (_, _) if attn_v && moe8 => (G::Q8_0, "attn_v in 8-expert models → Q8_0"),
        (_, T::Q2_K) if attn_v && m.n_gqa >= 4 => (G::Q4_K, "attn_v in Q2_K with GQA ≥ 4 → Q4_K"),
        (_, T::Q2_K) if attn_v => (G::Q3_K, "attn_v in Q2_K → Q3_K"),
        (_, T::Q3_K_M) if attn_v && wv < 2 => (G::Q5_K, "first 2 attn_v in Q3_K_M → Q5_K"),
        (_, T::Q3_K_M) if attn_v => (G::Q4_K, "attn_v in Q3_K_M → Q4_K"),
        (_, T::Q3_K_L) if attn_v => (G::Q5_K, "attn_v in Q3_K_L → Q5_K"),
        (_, T::IQ4_NL) if attn_v && m.n_gqa >= 4 => {
            (G::Q5_K, "attn_v in IQ4_NL with GQA ≥ 4 → Q5_K")
        }
        (_, T::Q4_K_M | T::Q5_K_M) if attn_v && use_more_bits(wv, n_wv) => {
            (G::Q6_K, "attn_v in a use_more_bits layer → Q6_K")
        }
        (_, T::Q4_K_S) if attn_v && wv < 4 => (G::Q5_K, "first 4 attn_v in Q4_K_S → Q5_K"),

        (C::AttnK, _) if moe8 => (G::Q8_0, "attn_k in 8-expert models → Q8_0"),

        (C::FfnDown, T::Q2_K) => (G::Q3_K, "ffn_down in Q2_K → Q3_K"),
        (C::FfnDown, T::Q3_K_M) if i < n / 16 => (
            G::Q5_K,
            "ffn_down in the first 1/16 of layers in Q3_K_M → Q5_K",
        ),
        (C::FfnDown, T::Q3_K_M) if !m.falcon || use_more_bits(i, n) => {
            (G::Q4_K, "ffn_down in Q3_K_M → Q4_K")
        }
        (C::FfnDown, T::Q3_K_L) if m.falcon => (G::Q4_K, "ffn_down in Q3_K_L (falcon) → Q4_K"),
        (C::FfnDown, T::Q3_K_L) => (G::Q5_K, "ffn_down in Q3_K_L → Q5_K"),
        (C::FfnDown, T::Q4_K_M) if m.falcon && i < n / 16 => (
            G::Q6_K,
            "ffn_down in the first 1/16 of layers in Q4_K_M (falcon) → Q6_K",
        ),
        (C::FfnDown, T::Q4_K_M) if m.falcon && use_more_bits(i, n) => (
            G::Q5_K,
            "ffn_down in a use_more_bits layer in Q4_K_M (falcon) → Q5_K",
        ),
        (C::FfnDown, T::Q4_K_M) if !m.falcon && use_more_bits(i, n) => {
            (G::Q6_K, "ffn_down in a use_more_bits layer → Q6_K")
        }
        (C::FfnDown, T::IQ4_NL) if i < n / 8 => (
            G::Q5_K,
            "ffn_down in the first 1/8 of layers in IQ4_NL → Q5_K",
        ),
        (C::FfnDown, T::Q5_K_M) if use_more_bits(i, n) => {
            (G::Q6_K, "ffn_down in a use_more_bits layer → Q6_K")
        }
        (C::FfnDown, T::Q4_K_S) if !m.falcon && i < n / 8 => (
            G::Q5_K,
            "ffn_down in the first 1/8 of layers in Q4_K_S → Q5_K",
        ),

        (C::AttnOutput, T::Q2_K | T::Q3_K_S | T::Q3_K_M | T::IQ4_NL | T::Q4_K_S | T::Q4_K_M)
            if moe8 && !m.falcon =>
        {
            (G::Q5_K, "attn_output in 8-expert models → Q5_K")
        }
        (C::AttnOutput, T::Q2_K) if !moe8 && !m.falcon => (G::Q3_K, "attn_output in Q2_K → Q3_K"),
        (C::AttnOutput, T::Q3_K_M) if !moe8 && !m.falcon => {
            (G::Q4_K, "attn_output in Q3_K_M → Q4_K")
        }
        (C::AttnOutput, T::Q3_K_L) if !moe8 && !m.falcon => {
            (G::Q5_K, "attn_output in Q3_K_L → Q5_K")
        }
        (C::AttnOutput, T::Q3_K_L) if m.falcon => {
            (G::Q4_K, "attn_output in Q3_K_L (falcon) → Q4_K")
        }

        _ => (h.base, ""),
    };
    // In the 70B llama eight heads share each attn_v, which is 8x smaller
    // than attn_q: more bits there cost almost nothing.
    let rule = match rule.0 {
        G::Q3_K | G::Q4_K if attn_v && m.is_70b && !moe8 => (G::Q5_K, "attn_v in 70B llama → Q5_K"),
        _ => rule,
    };
    (rule.0 != h.base).then_some(rule)
}

enum Fit {
    Fits,
    Fallback(GgmlType),
    NoFallback,
}

/// `tensor_type_fallback`: the type to use when rows of `row_len` are not a
/// whole number of `ty`'s blocks.
fn fallback(ty: GgmlType, row_len: u64) -> Fit {
    use GgmlType::*;
    let fits = |t: GgmlType| row_len.is_multiple_of(t.block_size() as u64);
    if fits(ty) {
        return Fit::Fits;
    }
    let alt = match ty {
        Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        // Already a 32-block type: nothing smaller to demote to (F16 below).
        t if t.block_size() <= 32 => t,
        _ => return Fit::NoFallback,
    };
    Fit::Fallback(if fits(alt) { alt } else { F16 })
}

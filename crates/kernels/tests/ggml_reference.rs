//! Our reference quantizers and dequantizers against ggml's own, on the
//! committed fixture `fixtures/ggml-quants.gguf` (made by
//! `scripts/llamacpp/make-quant-fixtures.sh` from llama.cpp's source):
//! quantized bytes must be identical and dequantized floats bit-identical.

use gguf::GgufFile;
use std::path::PathBuf;

fn fixture() -> GgufFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml-quants.gguf");
    GgufFile::open(&p).expect("fixture")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn quantize_and_dequantize_match_ggml_for_every_type() {
    let f = fixture();
    let (inp_info, inp) = f.tensor("input").unwrap();
    let input = f32s(inp);
    let n_per_row = inp_info.dims[0] as usize;
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for t in f.tensors().iter().filter(|t| t.name.starts_with("q.")) {
        let ty = t.ty;
        let Some(tr) = kernels::traits(ty) else {
            failures.push(format!("{ty}: no traits (type not implemented)"));
            continue;
        };
        let ggml_q = f.tensor_data(t);
        let ggml_deq = f32s(f.tensor(&format!("deq.{}", ty.name())).unwrap().1);

        let row_bytes = tr.row_bytes(n_per_row);
        let mut ours = vec![0u8; ggml_q.len()];
        for (src, dst) in input.chunks(n_per_row).zip(ours.chunks_mut(row_bytes)) {
            (tr.from_float)(src, dst);
        }
        if ours != ggml_q {
            let first = ours.iter().zip(ggml_q).position(|(a, b)| a != b).unwrap();
            let n_diff = ours.iter().zip(ggml_q).filter(|(a, b)| a != b).count();
            failures.push(format!(
                "{ty}: quantized bytes differ from ggml's ({n_diff} bytes, first at byte {first})"
            ));
        }
        let mut deq = vec![0f32; input.len()];
        (tr.to_float)(ggml_q, &mut deq);
        let n_diff = deq
            .iter()
            .zip(&ggml_deq)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if n_diff != 0 {
            failures.push(format!(
                "{ty}: dequantized floats differ from ggml's in {n_diff} elements"
            ));
        }
        checked.push(ty.name());
    }
    assert!(
        checked.len() >= 15 || !failures.is_empty(),
        "fixture has too few types: {checked:?}"
    );
    assert!(
        failures.is_empty(),
        "checked {checked:?}; failures:\n{}",
        failures.join("\n")
    );
}

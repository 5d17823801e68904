//! `cachefit quantize` as a user runs it: the real binary on the real test
//! model (SmolLM2-135M-Instruct Q4_1), into a temporary folder.

use gguf::{GgmlType, GgufFile};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn quantize(input: &Path, output: &Path, ty: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachefit"))
        .arg("quantize")
        .args(extra)
        .args([input, output])
        .arg(ty)
        .output()
        .expect("run cachefit")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn counts(f: &GgufFile) -> BTreeMap<GgmlType, usize> {
    let mut m = BTreeMap::new();
    for t in f.tensors() {
        *m.entry(t.ty).or_insert(0) += 1;
    }
    m
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn smollm2_to_q8_0() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-q8_0.gguf");
    let o = quantize(&model, &out, "q8_0", &["--allow-requantize", "-t", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("model size") && stdout.contains("quant size"),
        "{}",
        text(&o)
    );

    let input = GgufFile::open(&model).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensors().len(), input.tensors().len());
    for (a, b) in input.tensors().iter().zip(f.tensors()) {
        assert_eq!((&a.name, &a.dims), (&b.name, &b.dims));
        // Norms (1-D) stay F32; every matrix is Q8_0, including the tied
        // embedding (Q8_0 target: the output rule keeps Q8_0).
        let want = if a.dims.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::Q8_0
        };
        assert_eq!(b.ty, want, "{}", b.name);
    }
    assert_eq!(f.metadata().get_u32("general.file_type").unwrap(), 7);
    assert_eq!(
        f.metadata().get_str("tokenizer.ggml.model").unwrap(),
        input.metadata().get_str("tokenizer.ggml.model").unwrap()
    );
    assert_eq!(entries(dir.path()), ["smollm2-q8_0.gguf"]);
}

#[test]
fn smollm2_to_q4_k_m() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-q4_k_m.gguf");
    let o = quantize(
        &model,
        &out,
        "Q4_K_M",
        &["--allow-requantize", "--threads", "2"],
    );
    assert!(o.status.success(), "{}", text(&o));
    // Width 576 is not a multiple of 256: every attn_* and ffn_gate/up
    // matrix falls back (30 layers x 6), as with llama-quantize.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("180 of 272 tensor(s) required fallback quantization"),
        "{}",
        text(&o)
    );
    let f = GgufFile::open(&out).unwrap();
    use GgmlType::*;
    let want: BTreeMap<GgmlType, usize> =
        [(F32, 61), (Q5_0, 166), (Q8_0, 15), (Q4_K, 16), (Q6_K, 14)].into();
    assert_eq!(counts(&f), want);
    let ty = |n: &str| f.tensor_info(n).unwrap().ty;
    assert_eq!(ty("token_embd.weight"), Q8_0);
    assert_eq!(ty("blk.0.attn_v.weight"), Q8_0); // Q6_K wanted, fell back
    assert_eq!(ty("blk.3.attn_v.weight"), Q5_0); // Q4_K wanted, fell back
    assert_eq!(ty("blk.0.ffn_down.weight"), Q6_K); // rows of 1536 fit
    assert_eq!(ty("blk.3.ffn_down.weight"), Q4_K);
    assert_eq!(f.metadata().get_u32("general.file_type").unwrap(), 15);
    assert_eq!(
        f.metadata()
            .get_u32("general.quantization_version")
            .unwrap(),
        2
    );
}

#[test]
fn requantizing_is_refused_without_the_flag() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let o = quantize(&model, &out, "Q8_0", &[]);
    assert!(!o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("already quantized (Q4_1)") && stderr.contains("--allow-requantize"),
        "{}",
        text(&o)
    );
    assert!(
        entries(dir.path()).is_empty(),
        "left behind: {:?}",
        entries(dir.path())
    );
}

#[test]
fn bad_type_name_lists_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    // The type is checked before the input is opened.
    let o = quantize(
        &dir.path().join("in.gguf"),
        &dir.path().join("out.gguf"),
        "Q4_K_XL",
        &[],
    );
    assert!(!o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("unknown quantization type `Q4_K_XL`"),
        "{}",
        text(&o)
    );
    for name in ["Q4_K_M", "Q8_0", "Q2_K", "F16"] {
        assert!(stderr.contains(name), "{name} not listed: {}", text(&o));
    }
}

#[test]
fn output_equal_to_input_is_refused() {
    let Some(model) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let before = std::fs::metadata(&model).unwrap();
    let o = quantize(&model, &model, "Q4_1", &[]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is the input file"),
        "{}",
        text(&o)
    );
    let after = std::fs::metadata(&model).unwrap();
    assert_eq!(before.len(), after.len());
    assert_eq!(before.modified().unwrap(), after.modified().unwrap());
}

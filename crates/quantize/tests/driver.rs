//! The driver end to end on synthetic files: outputs read back with the
//! right types, shapes, metadata and values; refusals; nothing left behind
//! after errors and interrupts.

mod common;

use common::{dir_entries, f32_bytes, values, Shape, Synth};
use gguf::{GgmlType, GgufFile, Value};
use quantize::{plan, quantize_file, Error, Progress, QuantizeOptions, Target, TARGETS};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn opts(threads: usize) -> QuantizeOptions {
    QuantizeOptions {
        threads,
        ..Default::default()
    }
}

fn quiet(_: Progress<'_>) {}

/// A small random model: rows of 256 (K-quants fit) plus one tensor with
/// rows of 576 (K-quants fall back) and one with rows of 96 (only 32-block
/// types fit).
fn model() -> Synth {
    let shape = Shape {
        n_layer: 2,
        zeros: false,
        ..Shape::default()
    };
    let mut s = Synth::llama(shape);
    s.f32("blk.1.extra_576.weight", &[576, 8]);
    s.f32("blk.1.extra_96.weight", &[96, 8]);
    s
}

fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Vec<f32> {
    let tr = kernels::traits(ty).unwrap_or_else(|| panic!("no traits for {ty}"));
    let mut out = vec![0f32; n];
    (tr.to_float)(data, &mut out);
    out
}

/// Round-trip error bound, relative to the data's RMS, for values that are
/// roughly normal: about 1.2x what the reference quantizers measure here
/// (Q8_0 0.005, Q6_K 0.017, Q5_* 0.035-0.041, Q4_* 0.069-0.084, Q3_K 0.15,
/// Q2_K 0.29, TQ*_0 0.77), so a wrong block layout or scale fails.
fn rel_rmse_bound(ty: GgmlType) -> f64 {
    use GgmlType::*;
    match ty {
        F32 => 0.0,
        F16 => 0.0005,
        BF16 => 0.003,
        Q8_0 => 0.008,
        Q6_K => 0.022,
        Q5_0 | Q5_1 | Q5_K => 0.05,
        Q4_0 | Q4_1 | Q4_K | IQ4_NL => 0.095,
        Q3_K => 0.18,
        Q2_K => 0.35,
        // Ternary: most values round to zero; still far from garbage (≥ 1).
        TQ1_0 | TQ2_0 => 0.82,
        t => panic!("no bound for {t}"),
    }
}

fn rel_rmse(a: &[f32], b: &[f32]) -> f64 {
    let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let rms: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (err / rms.max(1e-30)).sqrt()
}

/// Check `out` against `input` for `target`: tensor order, shapes, types
/// (as planned), metadata, and values within the type's bound.
fn check_output(input: &GgufFile, out: &GgufFile, target: Target) {
    let p = plan(input, target).unwrap();
    assert_eq!(out.tensors().len(), input.tensors().len());
    for ((ti, to), pt) in input.tensors().iter().zip(out.tensors()).zip(&p.tensors) {
        assert_eq!(ti.name, to.name);
        assert_eq!(ti.dims, to.dims, "{}", to.name);
        assert_eq!(to.ty, pt.to, "{} in {target}", to.name);
        let n = ti.n_elements() as usize;
        let want = dequantize(ti.ty, input.tensor_data(ti), n);
        let got = dequantize(to.ty, out.tensor_data(to), n);
        let e = rel_rmse(&want, &got);
        let bound = rel_rmse_bound(to.ty);
        assert!(
            e <= bound,
            "{target}: {} as {}: relative RMSE {e:.5} > {bound}",
            to.name,
            to.ty
        );
        if !pt.converts() {
            assert_eq!(
                input.tensor_data(ti),
                out.tensor_data(to),
                "{} copied",
                to.name
            );
        }
    }
    let m = out.metadata();
    assert_eq!(m.get_u32("general.file_type").unwrap(), target.ftype());
    assert_eq!(m.get_u32("general.quantization_version").unwrap(), 2);
    // Everything else is copied.
    for (k, v) in input.metadata().entries() {
        if k != "general.file_type" {
            assert_eq!(m.get(k), Some(v), "{k}");
        }
    }
}

#[test]
fn every_target_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let input = GgufFile::open(&inp).unwrap();
    for info in TARGETS {
        let target = info.target;
        let out = dir.path().join(format!("out-{}.gguf", info.name));
        let s = quantize_file(&inp, &out, target, &opts(2), &quiet)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let o = GgufFile::open(&out).unwrap();
        check_output(&input, &o, target);
        let p = plan(&input, target).unwrap();
        assert_eq!(s.counts, p.counts(), "{target}");
        assert_eq!(s.n_fallback, p.n_fallback, "{target}");
        assert_eq!(s.out_bytes, p.out_bytes());
        assert_eq!(s.in_bytes, p.in_bytes());
        assert_eq!(s.out_file_bytes, std::fs::metadata(&out).unwrap().len());
        assert!(s.out_bpw() > 0.0 && s.in_bpw() == 32.0, "{target}");
    }
    // Only the input and the outputs: no temporary files left.
    assert_eq!(dir_entries(dir.path()).len(), 1 + TARGETS.len());
}

#[test]
fn fallbacks_are_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let out = dir.path().join("out.gguf");
    let s = quantize_file(&inp, &out, Target::Q4_K_M, &opts(2), &quiet).unwrap();
    // extra_576 (Q4_K → Q5_0) and extra_96 (Q4_K → Q5_0, 96 = 3 * 32).
    assert_eq!(s.n_fallback, 2);
    let o = GgufFile::open(&out).unwrap();
    assert_eq!(
        o.tensor_info("blk.1.extra_576.weight").unwrap().ty,
        GgmlType::Q5_0
    );
    assert_eq!(
        o.tensor_info("blk.1.extra_96.weight").unwrap().ty,
        GgmlType::Q5_0
    );
}

#[test]
fn thread_count_does_not_change_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    quantize_file(&inp, &a, Target::Q4_K_M, &opts(1), &quiet).unwrap();
    quantize_file(&inp, &b, Target::Q4_K_M, &opts(3), &quiet).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn progress_covers_every_tensor_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let seen = std::cell::RefCell::new(Vec::new());
    let cb = |p: Progress<'_>| {
        seen.borrow_mut()
            .push((p.index, p.done, p.bytes_done, p.bytes_total))
    };
    let s = quantize_file(
        &inp,
        &dir.path().join("o.gguf"),
        Target::Q8_0,
        &opts(2),
        &cb,
    )
    .unwrap();
    let seen = seen.into_inner();
    assert_eq!(seen.len(), 2 * s.n_tensors);
    assert_eq!(seen.last().unwrap().2, s.in_bytes);
    assert!(seen.iter().all(|e| e.3 == s.in_bytes));
    assert!(seen.windows(2).all(|w| w[0].2 <= w[1].2));
}

/// A file with one Q8_0 tensor (and its f32 original).
fn q8_0_model() -> (Synth, Vec<f32>) {
    let x = values(7, 256 * 4);
    let mut q = vec![0u8; GgmlType::Q8_0.row_bytes(256 * 4).unwrap() as usize];
    (kernels::traits(GgmlType::Q8_0).unwrap().from_float)(&x, &mut q);
    let mut s = Synth::new();
    s.raw("blk.0.attn_q.weight", &[256, 4], GgmlType::Q8_0, q);
    s.f32("blk.0.attn_norm.weight", &[256]);
    (s, x)
}

#[test]
fn requantizing_needs_permission() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    let (s, x) = q8_0_model();
    s.write(&inp);
    let out = dir.path().join("out.gguf");
    let e = quantize_file(&inp, &out, Target::Q4_0, &opts(2), &quiet).unwrap_err();
    assert!(
        matches!(e, Error::Requantize { ref tensor, ty: GgmlType::Q8_0 } if tensor == "blk.0.attn_q.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("--allow-requantize"), "{e}");
    assert_eq!(dir_entries(dir.path()), ["in.gguf"]);

    let o = QuantizeOptions {
        allow_requantize: true,
        ..opts(2)
    };
    quantize_file(&inp, &out, Target::Q4_0, &o, &quiet).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let (info, data) = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(info.ty, GgmlType::Q4_0);
    // Q8_0 then Q4_0: within the Q4_0 bound of the original values.
    let e = rel_rmse(&x, &dequantize(GgmlType::Q4_0, data, x.len()));
    assert!(e < rel_rmse_bound(GgmlType::Q4_0), "{e}");
}

#[test]
fn source_type_without_dequantizer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    let mut s = Synth::new();
    let ty = GgmlType::IQ2_XXS; // no kernels for it
    s.raw(
        "blk.0.ffn_up.weight",
        &[256, 2],
        ty,
        vec![0; 2 * ty.type_size()],
    );
    s.write(&inp);
    let o = QuantizeOptions {
        allow_requantize: true,
        ..opts(1)
    };
    let e = quantize_file(&inp, &dir.path().join("o.gguf"), Target::Q8_0, &o, &quiet).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::NoDequantizer { .. }), "{msg}");
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("IQ2_XXS"),
        "{msg}"
    );
    assert_eq!(dir_entries(dir.path()), ["in.gguf"]);
}

#[test]
fn never_writes_over_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let before = std::fs::read(&inp).unwrap();
    let refused = |out: &Path| {
        let e = quantize_file(&inp, out, Target::Q8_0, &opts(1), &quiet).unwrap_err();
        assert!(
            matches!(e, Error::SameFile { .. }),
            "{}: {e}",
            out.display()
        );
        assert!(e.to_string().contains("is the input file"), "{e}");
    };
    refused(&inp);
    // Same file by another spelling, a symlink, and a hard link.
    refused(&dir.path().join(".").join("in.gguf"));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&inp, dir.path().join("sym.gguf")).unwrap();
        refused(&dir.path().join("sym.gguf"));
        std::fs::hard_link(&inp, dir.path().join("hard.gguf")).unwrap();
        refused(&dir.path().join("hard.gguf"));
    }
    assert_eq!(std::fs::read(&inp).unwrap(), before);
}

#[test]
fn failure_midway_leaves_nothing_and_keeps_old_output() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    let mut s = model();
    // A NaN in a later tensor: found while converting it, after earlier
    // tensors were already written to the temporary file.
    let data = s.data_mut("blk.1.ffn_up.weight");
    data[4 * 700..4 * 701].copy_from_slice(&f32::NAN.to_le_bytes());
    s.write(&inp);
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"old").unwrap();
    let written = std::cell::Cell::new(0);
    let cb = |p: Progress<'_>| written.set(written.get() + p.done as usize);
    let e = quantize_file(&inp, &out, Target::Q8_0, &opts(2), &cb).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("row 2"),
        "{msg}"
    );
    assert!(written.get() > 5, "failed before writing anything");
    assert_eq!(dir_entries(dir.path()), ["in.gguf", "out.gguf"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
}

#[test]
fn missing_output_folder_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let out = dir.path().join("no/such/dir/out.gguf");
    let e = quantize_file(&inp, &out, Target::Q8_0, &opts(1), &quiet).unwrap_err();
    assert!(e.to_string().contains("no/such/dir"), "{e}");
    assert_eq!(dir_entries(dir.path()), ["in.gguf"]);
}

fn interrupted_at(target: Target, at_index: usize, when_done: bool) {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    model().write(&inp);
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"old").unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let o = QuantizeOptions {
        interrupt: Some(flag.clone()),
        ..opts(2)
    };
    let cb = |p: Progress<'_>| {
        if p.index == at_index && p.done == when_done {
            flag.store(true, Ordering::Relaxed);
        }
    };
    let e = quantize_file(&inp, &out, target, &o, &cb).unwrap_err();
    assert!(matches!(e, Error::Interrupted), "{e}");
    assert_eq!(dir_entries(dir.path()), ["in.gguf", "out.gguf"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
}

#[test]
fn interrupt_between_tensors_leaves_nothing() {
    // F32 → F32 copies every tensor: the check between tensors stops it.
    interrupted_at(Target::F32, 3, true);
}

#[test]
fn interrupt_inside_a_conversion_leaves_nothing() {
    // Set as blk.0.ffn_gate (index 7, 512 rows) starts: the workers see it
    // between chunks of that tensor.
    interrupted_at(Target::Q8_0, 7, false);
}

#[test]
fn kept_f16_source_tensor_is_copied_and_f16_source_converts() {
    // An F16 source is not "quantized" for llama.cpp: converting it needs no
    // --allow-requantize.
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.gguf");
    let x = values(3, 256 * 2);
    let mut h = vec![0u8; 2 * x.len()];
    (kernels::traits(GgmlType::F16).unwrap().from_float)(&x, &mut h);
    let mut s = Synth::new();
    s.raw("blk.0.attn_q.weight", &[256, 2], GgmlType::F16, h);
    s.raw(
        "blk.0.attn_norm.weight",
        &[256],
        GgmlType::F32,
        f32_bytes(&x[..256]),
    );
    s.write(&inp);
    let out = dir.path().join("o.gguf");
    quantize_file(&inp, &out, Target::Q8_0, &opts(1), &quiet).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(
        f.tensor_info("blk.0.attn_q.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    assert_eq!(f.metadata().get("general.file_type"), Some(&Value::U32(7)));
}

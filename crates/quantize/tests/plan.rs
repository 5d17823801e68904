//! The per-tensor plan against llama.cpp's rules (`src/llama-quant.cpp`),
//! on synthetic llama-like files. Each expectation cites the rule.

mod common;

use common::{Shape, Synth};
use gguf::GgmlType::{self, *};
use quantize::{plan, plan_with, Plan, PlanOptions, Reason, Target};

fn plan_of(s: &Synth, target: Target) -> Plan {
    let dir = tempfile::tempdir().unwrap();
    let f = s.open_in(dir.path(), "in.gguf");
    plan(&f, target).unwrap()
}

fn ty(p: &Plan, name: &str) -> GgmlType {
    p.tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
        .to
}

fn reason(p: &Plan, name: &str) -> Reason {
    p.tensors.iter().find(|t| t.name == name).unwrap().reason
}

fn fallback_from(p: &Plan, name: &str) -> Option<GgmlType> {
    p.tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap()
        .fallback_from
}

/// `use_more_bits(i, 8)`: i < 1 || i >= 7 || (i - 1) % 3 == 2.
const MORE_BITS_OF_8: [usize; 4] = [0, 3, 6, 7];

#[test]
fn use_more_bits_matches_llama_cpp() {
    let got: Vec<i64> = (0..8)
        .filter(|&i| quantize::plan::use_more_bits(i, 8))
        .collect();
    assert_eq!(got, [0, 3, 6, 7]);
    // 30 layers (SmolLM2): first 3, last 4, and every third in between.
    let got: Vec<i64> = (0..30)
        .filter(|&i| quantize::plan::use_more_bits(i, 30))
        .collect();
    assert_eq!(got, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
}

#[test]
fn q4_k_m_with_rows_of_256() {
    let s = Synth::llama(Shape::default());
    let p = plan_of(&s, Target::Q4_K_M);
    // output.weight: `new_type != Q8_0 → Q6_K` (row 256 fits Q4_K).
    assert_eq!(ty(&p, "output.weight"), Q6_K);
    assert!(matches!(reason(&p, "output.weight"), Reason::Rule(_)));
    // Untied token_embd: no rule for Q4_K_M, base type.
    assert_eq!(ty(&p, "token_embd.weight"), Q4_K);
    for i in 0..8 {
        let more = MORE_BITS_OF_8.contains(&i);
        // attn_v: `(Q4_K_M || Q5_K_M) && use_more_bits(i_attention_wv, n_attention_wv) → Q6_K`.
        assert_eq!(
            ty(&p, &format!("blk.{i}.attn_v.weight")),
            if more { Q6_K } else { Q4_K },
            "layer {i}"
        );
        // ffn_down: Q4_K_M (not falcon) `use_more_bits(i_layer, n_layer) → Q6_K`.
        assert_eq!(
            ty(&p, &format!("blk.{i}.ffn_down.weight")),
            if more { Q6_K } else { Q4_K },
            "layer {i}"
        );
        for t in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            let name = format!("blk.{i}.{t}.weight");
            assert_eq!(ty(&p, &name), Q4_K, "{name}");
            assert_eq!(reason(&p, &name), Reason::Base);
        }
        // tensor_allows_quantization: 1-D tensors are not quantized.
        assert_eq!(ty(&p, &format!("blk.{i}.attn_norm.weight")), F32);
        assert!(matches!(
            reason(&p, &format!("blk.{i}.ffn_norm.weight")),
            Reason::Kept(_)
        ));
    }
    assert_eq!(ty(&p, "output_norm.weight"), F32);
    assert_eq!(p.n_fallback, 0);
    // File order is kept.
    let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
    let want: Vec<&str> = s.tensors.iter().map(|(t, _)| t.name.as_str()).collect();
    assert_eq!(names, want);
}

#[test]
fn q4_k_m_with_rows_of_576_falls_back_like_llama_cpp() {
    // SmolLM2's geometry: width 576 = 2.25 * 256, 9 heads / 3 KV heads,
    // embeddings tied. (FFN 512 keeps the file small; 512 fits 256.)
    let shape = Shape {
        width: 576,
        ffn: 512,
        n_head: 9,
        n_head_kv: 3,
        tied: true,
        ..Shape::default()
    };
    let p = plan_of(&Synth::llama(shape), Target::Q4_K_M);
    // Tied token_embd takes the output rule: `nx % qk_k != 0 → Q8_0`, chosen
    // directly, so not a fallback.
    assert_eq!(ty(&p, "token_embd.weight"), Q8_0);
    assert_eq!(fallback_from(&p, "token_embd.weight"), None);
    for i in 0..8 {
        let more = MORE_BITS_OF_8.contains(&i);
        // attn_v wants Q6_K/Q4_K; rows of 576: Q6_K → Q8_0, Q4_K → Q5_0.
        let v = format!("blk.{i}.attn_v.weight");
        assert_eq!(ty(&p, &v), if more { Q8_0 } else { Q5_0 }, "{v}");
        assert_eq!(fallback_from(&p, &v), Some(if more { Q6_K } else { Q4_K }));
        // ffn_down rows are 512 long: no fallback.
        let d = format!("blk.{i}.ffn_down.weight");
        assert_eq!(ty(&p, &d), if more { Q6_K } else { Q4_K }, "{d}");
        assert_eq!(fallback_from(&p, &d), None);
        for t in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            let name = format!("blk.{i}.{t}.weight");
            assert_eq!(ty(&p, &name), Q5_0, "{name}");
            assert_eq!(fallback_from(&p, &name), Some(Q4_K));
        }
    }
    // 6 fallbacks per layer (attn_q/k/v/output, ffn_gate/up).
    assert_eq!(p.n_fallback, 6 * 8);
    let c = p.counts();
    assert_eq!(c[&Q8_0], 1 + 4);
    assert_eq!(c[&Q5_0], 5 * 8 + 4);
    assert_eq!(c[&Q6_K], 4);
    assert_eq!(c[&Q4_K], 4);
    assert_eq!(c[&F32], 2 * 8 + 1);
}

#[test]
fn layer_counters_follow_layer_numbers_not_file_order() {
    // llama.cpp visits tensors sorted by layer number (then name), so
    // `i_attention_wv` is the layer index even when the file lists layers
    // backwards; sorting names as strings would put blk.10 before blk.2.
    let shape = Shape {
        n_layer: 12,
        ..Shape::default()
    };
    let mut s = Synth::llama(shape);
    s.tensors.reverse();
    let p = plan_of(&s, Target::Q4_K_M);
    // use_more_bits(i, 12): i < 1 || i >= 10 || (i - 1) % 3 == 2.
    let more = [0, 3, 6, 9, 10, 11];
    for i in 0..12 {
        let want = if more.contains(&i) { Q6_K } else { Q4_K };
        assert_eq!(
            ty(&p, &format!("blk.{i}.attn_v.weight")),
            want,
            "attn_v {i}"
        );
        assert_eq!(
            ty(&p, &format!("blk.{i}.ffn_down.weight")),
            want,
            "ffn_down {i}"
        );
    }
}

#[test]
fn q3_k_mixes() {
    let shape = Shape {
        n_layer: 16,
        ..Shape::default()
    };
    let s = Synth::llama(shape);
    let m = plan_of(&s, Target::Q3_K_M);
    for i in 0..16 {
        // attn_v in Q3_K_M: `i_attention_wv < 2 ? Q5_K : Q4_K`.
        assert_eq!(
            ty(&m, &format!("blk.{i}.attn_v.weight")),
            if i < 2 { Q5_K } else { Q4_K }
        );
        // ffn_down in Q3_K_M: `i_layer < n_layer/16 ? Q5_K : Q4_K` (not falcon).
        assert_eq!(
            ty(&m, &format!("blk.{i}.ffn_down.weight")),
            if i < 1 { Q5_K } else { Q4_K }
        );
        // attn_output in Q3_K_M → Q4_K.
        assert_eq!(ty(&m, &format!("blk.{i}.attn_output.weight")), Q4_K);
        assert_eq!(ty(&m, &format!("blk.{i}.attn_q.weight")), Q3_K);
        assert_eq!(ty(&m, &format!("blk.{i}.ffn_up.weight")), Q3_K);
    }
    assert_eq!(ty(&m, "output.weight"), Q6_K);
    assert_eq!(ty(&m, "token_embd.weight"), Q3_K);

    let l = plan_of(&s, Target::Q3_K_L);
    for i in 0..16 {
        // Q3_K_L: attn_v, ffn_down and attn_output → Q5_K.
        for t in ["attn_v", "ffn_down", "attn_output"] {
            assert_eq!(ty(&l, &format!("blk.{i}.{t}.weight")), Q5_K, "{t} {i}");
        }
        assert_eq!(ty(&l, &format!("blk.{i}.ffn_gate.weight")), Q3_K);
    }

    let small = plan_of(&s, Target::Q3_K_S);
    // Q3_K_S has no rules of its own: Q3_K except the output (Q6_K).
    let c = small.counts();
    assert_eq!(c[&Q6_K], 1);
    assert_eq!(c[&Q3_K], 16 * 7 + 1);
}

#[test]
fn q2_k_depends_on_gqa() {
    let gqa4 = Shape {
        n_head: 4,
        n_head_kv: 1,
        ..Shape::default()
    };
    let p = plan_of(&Synth::llama(gqa4), Target::Q2_K);
    // attn_v in Q2_K: `n_gqa() >= 4 ? Q4_K : Q3_K`.
    assert_eq!(ty(&p, "blk.3.attn_v.weight"), Q4_K);
    let gqa2 = Shape::default();
    let p = plan_of(&Synth::llama(gqa2), Target::Q2_K);
    assert_eq!(ty(&p, "blk.3.attn_v.weight"), Q3_K);
    // ffn_down and attn_output in Q2_K → Q3_K; the rest Q2_K; output Q6_K.
    assert_eq!(ty(&p, "blk.3.ffn_down.weight"), Q3_K);
    assert_eq!(ty(&p, "blk.3.attn_output.weight"), Q3_K);
    assert_eq!(ty(&p, "blk.3.attn_k.weight"), Q2_K);
    assert_eq!(ty(&p, "token_embd.weight"), Q2_K);
    assert_eq!(ty(&p, "output.weight"), Q6_K);
}

#[test]
fn q4_k_s_and_q5_k_mixes() {
    let shape = Shape {
        n_layer: 16,
        ..Shape::default()
    };
    let s = Synth::llama(shape);
    let p = plan_of(&s, Target::Q4_K_S);
    for i in 0..16 {
        // attn_v in Q4_K_S: `i_attention_wv < 4 → Q5_K`.
        assert_eq!(
            ty(&p, &format!("blk.{i}.attn_v.weight")),
            if i < 4 { Q5_K } else { Q4_K }
        );
        // ffn_down in Q4_K_S: `i_layer < n_layer/8 → Q5_K`.
        assert_eq!(
            ty(&p, &format!("blk.{i}.ffn_down.weight")),
            if i < 2 { Q5_K } else { Q4_K }
        );
    }
    let m = plan_of(&s, Target::Q5_K_M);
    for i in 0..16 {
        let more = quantize::plan::use_more_bits(i, 16);
        let want = if more { Q6_K } else { Q5_K };
        assert_eq!(ty(&m, &format!("blk.{i}.attn_v.weight")), want);
        assert_eq!(ty(&m, &format!("blk.{i}.ffn_down.weight")), want);
        assert_eq!(ty(&m, &format!("blk.{i}.attn_q.weight")), Q5_K);
    }
    let k = plan_of(&s, Target::Q5_K_S);
    let c = k.counts();
    assert_eq!((c[&Q6_K], c[&Q5_K]), (1, 16 * 7 + 1));
}

#[test]
fn single_types_keep_llama_cpp_output_rules() {
    let s = Synth::llama(Shape::default());
    // Q8_0: output stays Q8_0 (`new_type != Q8_0` guard); all else Q8_0.
    let p = plan_of(&s, Target::Q8_0);
    let c = p.counts();
    assert_eq!(c[&Q8_0], 8 * 7 + 2);
    assert_eq!(c.len(), 2, "{c:?}");
    // Q4_0: output → Q6_K; other weights Q4_0.
    let p = plan_of(&s, Target::Q4_0);
    assert_eq!(ty(&p, "output.weight"), Q6_K);
    assert_eq!(ty(&p, "token_embd.weight"), Q4_0);
    assert_eq!(ty(&p, "blk.0.attn_v.weight"), Q4_0);
    // Q6_K: all Q6_K.
    assert_eq!(plan_of(&s, Target::Q6_K).counts()[&Q6_K], 8 * 7 + 2);
    // TQ1_0/TQ2_0: untied token_embd → Q4_K; output Q6_K.
    let p = plan_of(&s, Target::TQ2_0);
    assert_eq!(ty(&p, "token_embd.weight"), Q4_K);
    assert_eq!(ty(&p, "output.weight"), Q6_K);
    assert_eq!(ty(&p, "blk.0.attn_q.weight"), TQ2_0);
    // IQ4_NL: ffn_down in the first 1/8 of layers → Q5_K (no imatrix);
    // attn_v → Q5_K only with GQA ≥ 4 (here 2).
    let p = plan_of(&s, Target::IQ4_NL);
    assert_eq!(ty(&p, "blk.0.ffn_down.weight"), Q5_K);
    assert_eq!(ty(&p, "blk.1.ffn_down.weight"), IQ4_NL);
    assert_eq!(ty(&p, "blk.0.attn_v.weight"), IQ4_NL);
}

#[test]
fn tied_output_rule_can_itself_fall_back() {
    // Q4_0 on width 576: the tied embedding's output rule checks the row
    // against Q4_0's block (32, fits) and picks Q6_K, which then does not
    // fit 256 and falls back to Q8_0 -- counted, as llama.cpp counts it.
    let shape = Shape {
        width: 576,
        ffn: 512,
        n_head: 9,
        n_head_kv: 3,
        tied: true,
        n_layer: 1,
        ..Shape::default()
    };
    let p = plan_of(&Synth::llama(shape), Target::Q4_0);
    assert_eq!(ty(&p, "token_embd.weight"), Q8_0);
    assert_eq!(fallback_from(&p, "token_embd.weight"), Some(Q6_K));
    assert_eq!(p.n_fallback, 1);
}

#[test]
fn fallback_table() {
    // tensor_type_fallback, with --pure so every tensor wants the base type.
    let mut s = Synth::new();
    s.zeros = true;
    s.f32("blk.0.attn_q.weight", &[576, 4]) // 576 = 18 * 32 = 2.25 * 256
        .f32("blk.0.attn_k.weight", &[48, 4]) // 48: not a multiple of 32
        .f32("blk.0.attn_output.weight", &[512, 4]);
    let dir = tempfile::tempdir().unwrap();
    let f = s.open_in(dir.path(), "in.gguf");
    let pure = PlanOptions { pure: true };
    let cases = [
        (Target::Q2_K, Q4_0, F16),
        (Target::Q3_K_S, Q4_0, F16),
        (Target::Q4_K_S, Q5_0, F16),
        (Target::Q5_K_S, Q5_1, F16),
        (Target::Q6_K, Q8_0, F16),
        (Target::TQ1_0, Q4_0, F16),
        (Target::TQ2_0, Q4_0, F16),
        // 32-block types have nothing smaller: rows of 48 go to F16.
        (Target::Q8_0, Q8_0, F16),
        (Target::Q4_0, Q4_0, F16),
        (Target::IQ4_NL, IQ4_NL, F16),
    ];
    for (target, at_576, at_48) in cases {
        let p = plan_with(&f, target, pure).unwrap();
        let base = target.base_type();
        assert_eq!(ty(&p, "blk.0.attn_q.weight"), at_576, "{target} at 576");
        assert_eq!(ty(&p, "blk.0.attn_k.weight"), at_48, "{target} at 48");
        assert_eq!(ty(&p, "blk.0.attn_output.weight"), base, "{target} at 512");
        let n = if base.block_size() == 256 { 2 } else { 1 };
        assert_eq!(p.n_fallback, n, "{target}");
        assert_eq!(fallback_from(&p, "blk.0.attn_k.weight"), Some(base));
    }
}

#[test]
fn float_targets_have_no_rules_and_no_fallbacks() {
    let shape = Shape {
        width: 576,
        ffn: 512,
        n_head: 9,
        n_head_kv: 3,
        n_layer: 2,
        ..Shape::default()
    };
    let mut s = Synth::llama(shape);
    s.f32("blk.0.odd.weight", &[48, 3]);
    for (target, want) in [(Target::F16, F16), (Target::BF16, BF16), (Target::F32, F32)] {
        let p = plan_of(&s, target);
        assert_eq!(p.n_fallback, 0);
        for t in &p.tensors {
            if t.dims.len() == 1 {
                assert_eq!(t.to, F32, "{}", t.name);
            } else {
                assert_eq!(t.to, want, "{} in {target}", t.name);
                assert_eq!(t.reason, Reason::Base);
            }
        }
    }
}

#[test]
fn tensors_llama_cpp_never_quantizes() {
    let mut s = Synth::new();
    s.zeros = true;
    s.f32("blk.0.attn_q.weight", &[256, 4])
        .f32("blk.0.attn_norm.weight", &[256])
        .f32("blk.0.trailing_one.weight", &[256, 1]) // ggml_n_dims == 1
        .f32("blk.0.attn_q_norm.weight", &[256, 2]) // a 2-D norm
        .f32("blk.0.ffn_gate_inp.weight", &[256, 8]) // MoE router
        .f32("blk.0.attn_q.bias", &[256, 2]) // not a weight
        .f32("position_embd.weight", &[256, 16]);
    let p = plan_of(&s, Target::Q4_K_M);
    assert_eq!(ty(&p, "blk.0.attn_q.weight"), Q4_K);
    for (name, why) in [
        ("blk.0.attn_norm.weight", "1-D"),
        ("blk.0.trailing_one.weight", "1-D"),
        ("blk.0.attn_q_norm.weight", "norm"),
        ("blk.0.ffn_gate_inp.weight", "expert router"),
        ("blk.0.attn_q.bias", "not a weight"),
        ("position_embd.weight", "positional embedding"),
    ] {
        assert_eq!(ty(&p, name), F32, "{name}");
        assert_eq!(reason(&p, name), Reason::Kept(why), "{name}");
    }
}

#[test]
fn pure_skips_the_mix() {
    let p = {
        let s = Synth::llama(Shape::default());
        let dir = tempfile::tempdir().unwrap();
        let f = s.open_in(dir.path(), "in.gguf");
        plan_with(&f, Target::Q4_K_M, PlanOptions { pure: true }).unwrap()
    };
    let c = p.counts();
    assert_eq!(c[&Q4_K], 8 * 7 + 2, "{c:?}");
}

#[test]
fn eight_experts() {
    // Mixtral-style: attn_v and attn_k → Q8_0, attn_output → Q5_K (Q4_K_M),
    // ffn_down_exps layer taken from the name.
    let mut s = Synth::new();
    s.zeros = true;
    s.meta.set("llama.block_count", gguf::Value::U32(8));
    s.meta.set("llama.expert_count", gguf::Value::U32(8));
    for i in (0..8).rev() {
        s.f32(&format!("blk.{i}.attn_v.weight"), &[256, 4])
            .f32(&format!("blk.{i}.attn_k.weight"), &[256, 4])
            .f32(&format!("blk.{i}.attn_output.weight"), &[256, 4])
            .f32(&format!("blk.{i}.ffn_down_exps.weight"), &[256, 2, 8]);
    }
    let p = plan_of(&s, Target::Q4_K_M);
    for i in 0..8 {
        assert_eq!(ty(&p, &format!("blk.{i}.attn_v.weight")), Q8_0);
        assert_eq!(ty(&p, &format!("blk.{i}.attn_k.weight")), Q8_0);
        assert_eq!(ty(&p, &format!("blk.{i}.attn_output.weight")), Q5_K);
        let more = MORE_BITS_OF_8.contains(&i);
        assert_eq!(
            ty(&p, &format!("blk.{i}.ffn_down_exps.weight")),
            if more { Q6_K } else { Q4_K }
        );
    }
}

#[test]
fn already_in_target_type_is_copied() {
    // A Q8_0 source tensor planned Q8_0 is not converted (llama.cpp:
    // `quantize = cur_type != new_type`), so no requantize refusal.
    let mut s = Synth::new();
    let block = [&[0x00u8, 0x3C][..], &[1u8; 32][..]].concat(); // d = 1.0
    s.raw("blk.0.attn_q.weight", &[32, 2], Q8_0, block.repeat(2));
    let p = plan_of(&s, Target::Q8_0);
    assert!(!p.tensors[0].converts());
    p.check(false).unwrap();
    // To Q4_0 it must convert, which is requantizing.
    let p = plan_of(&s, Target::Q4_0);
    let e = p.check(false).unwrap_err().to_string();
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("Q8_0") && e.contains("--allow-requantize"),
        "{e}"
    );
}

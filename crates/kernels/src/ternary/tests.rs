use super::*;
use crate::quant::q8_k;
use crate::quant::testing::{rng, weights};
use crate::quant::tq2_0::{self, BlockTQ2_0};
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// `rows × blocks` TQ2_0 blocks of random fields 0..=2 (the quantizer's
/// range) and random positive scales.
fn random_ternary(r: &mut StdRng, rows: usize, blocks: usize) -> Vec<BlockTQ2_0> {
    (0..rows * blocks)
        .map(|_| {
            let mut b = BlockTQ2_0::zeroed();
            for q in b.qs.iter_mut() {
                *q = (0..4).fold(0u8, |q, k| q | (r.gen_range(0u8..3) << (2 * k)));
            }
            b.d = f16::from_f32(r.gen_range(0.001f32..4.0));
            b
        })
        .collect()
}

fn quantize_act(x: &[f32]) -> Vec<BlockQ8K> {
    let mut q = vec![BlockQ8K::zeroed(); x.len() / QK_K];
    q8_k::quantize_row(x, &mut q);
    q
}

/// The reference per row.
fn reference(w: &[BlockTQ2_0], blocks: usize, x: &[BlockQ8K]) -> Vec<f32> {
    w.chunks_exact(blocks)
        .map(|row| tq2_0::vec_dot_ref(row, x))
        .collect()
}

/// Every supported set × kernel × thread count gives the reference's bits.
fn check_all(w: &[BlockTQ2_0], rows: usize, cols: usize, x: &[BlockQ8K], pools: &[ThreadPool]) {
    let want = reference(w, cols / QK_K, x);
    for isa in Isa::supported() {
        let table = crate::table(isa).unwrap();
        for kernel in TernaryKernel::ALL {
            let m = TernaryMatrix::with_kernel(rows, cols, w, kernel, table).unwrap();
            assert_eq!(m.isa(), TernaryKernels::of(table).isa);
            for pool in pools {
                let mut y = vec![f32::NAN; rows];
                m.matvec(pool, x, &mut y);
                for (r, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} {} {rows}x{cols} threads={} row {r}: {a} vs reference {b}",
                        isa.name(),
                        kernel.name(),
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

#[test]
fn matches_reference_bit_for_bit_on_random_shapes() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut r = rng(24);
    for (rows, cols) in [
        (1, 256),
        (5, 256),
        (63, 512),
        (64, 256),
        (65, 768),
        (130, 256),
        (257, 768),
        (320, 256),
        (7, 5 * 256),
    ] {
        let w = random_ternary(&mut r, rows, cols / QK_K);
        let x = quantize_act(&weights(&mut r, cols));
        check_all(&w, rows, cols, &x, &pools);
    }
}

/// The largest sums the LUT's 16-bit partial sums must carry: every
/// activation -127 (the quantizer maps a constant row there) and every
/// weight +1 or -1, so a block sums to ∓32512; then mixed signs and an
/// all-zero activation.
#[test]
fn extreme_sums_are_exact() {
    let pools = [ThreadPool::new(1)];
    let (rows, cols) = (66, 512);
    for field in [0u8, 2] {
        let mut b = BlockTQ2_0::zeroed();
        b.qs = [field * 0x55; 64];
        b.d = f16::ONE;
        let w = vec![b; rows * cols / QK_K];
        let x = quantize_act(&vec![3.0; cols]);
        assert!(x.iter().all(|b| b.qs.iter().all(|&q| q == -127)));
        check_all(&w, rows, cols, &x, &pools);
        let y = reference(&w, cols / QK_K, &x);
        let per_block = (field as f32 - 1.0) * -127.0 * 256.0;
        assert_eq!(y[0], 2.0 * per_block * x[0].d);
    }
    // Alternating extremes and an all-zero activation.
    let mut r = rng(5);
    let w = random_ternary(&mut r, rows, cols / QK_K);
    let xs: Vec<f32> = (0..cols)
        .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    check_all(&w, rows, cols, &quantize_act(&xs), &pools);
    check_all(&w, rows, cols, &quantize_act(&vec![0.0; cols]), &pools);
}

#[test]
fn simd_tables_match_the_scalar_tables() {
    let mut r = rng(11);
    let mut qs = [0i8; QK_K];
    for q in qs.iter_mut() {
        *q = r.gen_range(-127..=127);
    }
    qs[0] = 127;
    qs[1] = -127;
    let mut want = [0u8; BLOCK_TABLES_BYTES];
    tables_ref(&qs, &mut want);
    // Spot-check the scalar tables themselves: pair 0, entry 4·2 + 1.
    let t = |tab: &[u8; BLOCK_TABLES_BYTES], g: usize, idx: usize| {
        i16::from_le_bytes([tab[32 * g + idx], tab[32 * g + 16 + idx]])
    };
    assert_eq!(t(&want, 0, 9), 2 * 127 - 127);
    assert_eq!(t(&want, 0, 0), 0);
    for isa in Isa::supported() {
        let k = TernaryKernels::of(crate::table(isa).unwrap());
        let mut got = [0u8; BLOCK_TABLES_BYTES];
        (k.tables)(&qs, &mut got);
        assert!(got == want, "{} tables differ", isa.name());
    }
    let mut want3 = [0u8; BLOCK_TABLES_BYTES];
    tables3_ref(&qs, &mut want3);
    // Triple 0 = (127, -127, qs[2]), entry 9·2 + 3·0 + 1; the last triple
    // reads one real activation (column 255) and two padding zeros.
    let t3 = |tab: &[u8; BLOCK_TABLES_BYTES], g: usize, idx: usize| {
        i16::from_le_bytes([tab[64 * g + 2 * idx], tab[64 * g + 2 * idx + 1]])
    };
    assert_eq!(t3(&want3, 0, 19), 2 * 127 + qs[2] as i16);
    assert_eq!(t3(&want3, 85, 26), 2 * qs[255] as i16);
    assert_eq!(t3(&want3, 86, 26), 0);
    for isa in Isa::supported() {
        let k = TernaryKernels::of(crate::table(isa).unwrap());
        let mut got = [0u8; BLOCK_TABLES_BYTES];
        (k.tables3)(&qs, &mut got);
        assert!(got == want3, "{} triple tables differ", isa.name());
    }
}

#[test]
fn known_small_product() {
    // Row 0: +1 on column 0, -1 on column 255; row 1: all zero; row 2: +1
    // everywhere. Activations 1..=127 repeating.
    let mut zero = BlockTQ2_0::zeroed();
    zero.qs = [0x55; 64];
    zero.d = f16::from_f32(0.5);
    let mut w = vec![zero; 3];
    w[0].qs[0] = 0b01_01_01_10;
    w[0].qs[63] = 0b00_01_01_01;
    w[2].qs = [0xaa; 64];
    let mut x = BlockQ8K::zeroed();
    for (j, q) in x.qs.iter_mut().enumerate() {
        *q = (j % 127) as i8 + 1;
    }
    x.d = 0.25;
    let total: i32 = x.qs.iter().map(|&q| q as i32).sum();
    let want = [
        (x.qs[0] as i32 - x.qs[255] as i32) as f32 * 0.125,
        0.0,
        total as f32 * 0.125,
    ];
    for isa in Isa::supported() {
        for kernel in TernaryKernel::ALL {
            let m =
                TernaryMatrix::with_kernel(3, 256, &w, kernel, crate::table(isa).unwrap()).unwrap();
            let mut y = [0.0f32; 3];
            m.matvec(&ThreadPool::new(1), &[x], &mut y);
            assert_eq!(y, want, "{} {}", isa.name(), kernel.name());
        }
    }
}

#[test]
fn binding_errors_name_the_problem() {
    let mut r = rng(3);
    let w = random_ternary(&mut r, 4, 2);
    let e = TernaryMatrix::new(4, 300, &w).unwrap_err();
    assert_eq!(e, TernaryError::RaggedCols { cols: 300 });
    assert!(e.to_string().contains("300 columns"), "{e}");
    let e = TernaryMatrix::new(3, 512, &w).unwrap_err();
    assert_eq!(
        e,
        TernaryError::BlockCount {
            rows: 3,
            cols: 512,
            expected: 6,
            actual: 8
        }
    );
    assert!(e.to_string().contains("expected 6"), "{e}");
    let e = TernaryMatrix::new(usize::MAX, 512, &w).unwrap_err();
    assert!(matches!(e, TernaryError::TooLarge { .. }), "{e:?}");
    // Field 3 at row 2, column 256 + 32·1 + 5 (byte 5 of block 1, bits 2..4).
    let mut bad = w.clone();
    bad[2 * 2 + 1].qs[5] |= 0b11 << 2;
    for kernel in TernaryKernel::ALL {
        let e = TernaryMatrix::with_kernel(4, 512, &bad, kernel, crate::selected()).unwrap_err();
        assert_eq!(
            e,
            TernaryError::NotTernary {
                row: 2,
                col: 256 + 37
            }
        );
        assert!(e.to_string().contains("(2, 293)"), "{e}");
    }
}

#[test]
fn empty_matrix() {
    let m = TernaryMatrix::new(0, 256, &[]).unwrap();
    let x = [BlockQ8K::zeroed()];
    let mut y: [f32; 0] = [];
    m.matvec(&ThreadPool::new(2), &x, &mut y);
    assert_eq!(m.bytes(), 0);
}

#[test]
#[should_panic(expected = "x has 1 Q8_K blocks")]
fn wrong_activation_length_panics_with_a_message() {
    let mut r = rng(1);
    let w = random_ternary(&mut r, 2, 2);
    let m = TernaryMatrix::new(2, 512, &w).unwrap();
    m.matvec(&ThreadPool::new(1), &[BlockQ8K::zeroed()], &mut [0.0; 2]);
}

#[test]
fn quantizers_match_the_reference_bit_for_bit() {
    let mut r = rng(77);
    let mut rows = crate::quant::testing::extreme_rows(3 * QK_K);
    rows.push(weights(&mut r, 5 * QK_K));
    // Ties of magnitude with opposite signs (the first one sets the sign),
    // exact halves after scaling, a lone maximum in the last lane.
    let mut tie = vec![0.5f32; QK_K];
    tie[7] = -2.0;
    tie[100] = 2.0;
    rows.push(tie.clone());
    tie[7] = 2.0;
    tie[100] = -2.0;
    rows.push(tie);
    rows.push((0..QK_K).map(|i| i as f32 - 127.0).collect());
    let mut last = vec![0.01f32; QK_K];
    last[255] = -9.0;
    rows.push(last);
    for x in rows {
        let mut want = vec![BlockQ8K::zeroed(); x.len() / QK_K];
        q8_k::quantize_row(&x, &mut want);
        for isa in Isa::supported() {
            let k = TernaryKernels::of(crate::table(isa).unwrap());
            let mut got = vec![BlockQ8K::zeroed(); x.len() / QK_K];
            quantize_activation_with(&k, &x, &mut got);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.d.to_bits(), w.d.to_bits(), "{}", isa.name());
                assert_eq!(g.qs, w.qs, "{}", isa.name());
                assert_eq!(g.bsums, w.bsums, "{}", isa.name());
            }
        }
    }
}

/// The runtime's activation pair: `hi = Q8_K(x)`, `lo = Q8_K(x − hi)`.
fn activation_pair(x: &[f32]) -> (Vec<BlockQ8K>, Vec<BlockQ8K>) {
    let hi = quantize_act(x);
    let residual: Vec<f32> = x
        .chunks_exact(QK_K)
        .zip(&hi)
        .flat_map(|(xb, hb)| xb.iter().zip(&hb.qs).map(|(&v, &q)| v - hb.d * q as f32))
        .collect();
    (hi, quantize_act(&residual))
}

/// `matvec_pair` gives the bits of `matvec(hi) + matvec(lo)` (added after
/// both products) on every set, kernel and thread count, and those equal
/// the reference's two row dots added.
#[test]
fn pair_matches_two_products_bit_for_bit() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut r = rng(42);
    for (rows, cols) in [
        (1, 256),
        (7, 512),
        (63, 768),
        (64, 256),
        (65, 256),
        (131, 3 * 256),
        (193, 5 * 256),
    ] {
        let w = random_ternary(&mut r, rows, cols / QK_K);
        let (hi, lo) = activation_pair(&weights(&mut r, cols));
        assert!(lo.iter().any(|b| b.d != 0.0), "a residual to add");
        let (ref_hi, ref_lo) = (
            reference(&w, cols / QK_K, &hi),
            reference(&w, cols / QK_K, &lo),
        );
        let want: Vec<f32> = ref_hi.iter().zip(&ref_lo).map(|(a, b)| a + b).collect();
        for isa in Isa::supported() {
            let table = crate::table(isa).unwrap();
            for kernel in TernaryKernel::ALL {
                let m = TernaryMatrix::with_kernel(rows, cols, &w, kernel, table).unwrap();
                for pool in &pools {
                    let (mut y, mut y_lo) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                    m.matvec(pool, &hi, &mut y);
                    m.matvec(pool, &lo, &mut y_lo);
                    for (a, b) in y.iter_mut().zip(&y_lo) {
                        *a += b;
                    }
                    let mut pair = vec![f32::NAN; rows];
                    m.matvec_pair(pool, &hi, &lo, &mut pair);
                    for (row, ((p, t), w)) in pair.iter().zip(&y).zip(&want).enumerate() {
                        assert_eq!(
                            (p.to_bits(), t.to_bits()),
                            (w.to_bits(), w.to_bits()),
                            "{} {} {rows}x{cols} threads={} row {row}: pair {p}, two \
                             products {t}, reference {w}",
                            isa.name(),
                            kernel.name(),
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// Extreme activations in both halves of the pair (every value ∓127)
/// against all-(+1) and all-(−1) weights: the largest integer sums.
#[test]
fn pair_extreme_sums_are_exact() {
    let (rows, cols) = (66, 512);
    let hi = quantize_act(&vec![3.0; cols]);
    let lo = quantize_act(&vec![-0.5; cols]);
    for field in [0u8, 2] {
        let mut b = BlockTQ2_0::zeroed();
        b.qs = [field * 0x55; 64];
        b.d = f16::ONE;
        let w = vec![b; rows * cols / QK_K];
        for isa in Isa::supported() {
            let m = TernaryMatrix::with_kernel(
                rows,
                cols,
                &w,
                TernaryKernel::Interleaved,
                crate::table(isa).unwrap(),
            )
            .unwrap();
            let mut pair = vec![0.0; rows];
            m.matvec_pair(&ThreadPool::new(1), &hi, &lo, &mut pair);
            let want = reference(&w, cols / QK_K, &hi)[0] + reference(&w, cols / QK_K, &lo)[0];
            assert!(
                pair.iter().all(|p| p.to_bits() == want.to_bits()),
                "{} field {field}: {pair:?} vs {want}",
                isa.name()
            );
        }
    }
}

#[test]
fn pair_of_an_empty_matrix() {
    let m = TernaryMatrix::new(0, 256, &[]).unwrap();
    let x = [BlockQ8K::zeroed()];
    m.matvec_pair(&ThreadPool::new(2), &x, &x, &mut []);
}

#[test]
#[should_panic(expected = "lo has 1 Q8_K blocks")]
fn pair_with_a_short_residual_panics_with_a_message() {
    let mut r = rng(1);
    let w = random_ternary(&mut r, 2, 2);
    let m = TernaryMatrix::new(2, 512, &w).unwrap();
    let x = [BlockQ8K::zeroed(); 2];
    m.matvec_pair(&ThreadPool::new(1), &x, &x[..1], &mut [0.0; 2]);
}

//! Every kernel set against the scalar twin, bit for bit, on the shapes
//! that break SIMD code: odd row counts, columns around every vector width
//! and the model's own (144, 396), weights at ±127 and activations at the
//! range limits.

use super::*;
use crate::isa::Isa;
use crate::quant::testing::{extreme_rows, rng, weights};
use rand::rngs::StdRng;
use rand::Rng;

/// The int8 kernels of `isa`, a set this CPU supports.
fn kernels(isa: Isa) -> Int8Kernels {
    crate::table(isa).unwrap().int8
}

const COLS: [usize; 17] = [
    1, 2, 7, 16, 31, 32, 33, 63, 64, 65, 96, 127, 144, 145, 396, 1000, 1031,
];
const ROWS: [usize; 8] = [1, 2, 3, 5, 13, 16, 17, 70];

/// Random weights in −127..=127 with the limits well represented.
fn int8_weights(r: &mut StdRng, n: usize) -> Vec<i8> {
    (0..n)
        .map(|_| match r.gen_range(0..10) {
            0 => 127,
            1 => -127,
            _ => r.gen_range(-127..=127),
        })
        .collect()
}

fn scales(r: &mut StdRng, rows: usize) -> Vec<f32> {
    (0..rows).map(|_| r.gen_range(1e-4f32..0.05)).collect()
}

#[test]
fn quantizer_known_values() {
    let x = [127.0, -63.5, 2.5, -2.5, 0.49, -0.5, 0.0, 126.5];
    for isa in Isa::supported() {
        let mut q = [0i8; 8];
        let s = (kernels(isa).quantize)(&x, &mut q);
        assert_eq!(s, 1.0, "{isa:?}");
        assert_eq!(q, [127, -64, 3, -3, 0, -1, 0, 127], "{isa:?}");
        let mut q = [5i8; 8];
        assert_eq!((kernels(isa).quantize)(&[0.0; 8], &mut q), 0.0);
        assert_eq!(q, [0; 8], "{isa:?}: all zeros");
    }
}

#[test]
fn quantizers_match_reference_bit_for_bit() {
    let mut r = rng(1);
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for n in [0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 144, 145, 396, 1000] {
        cases.push(weights(&mut r, n));
        cases.extend(extreme_rows(n));
    }
    // Values that land exactly on halves after the division.
    cases.push((0..200).map(|i| i as f32 * 0.5 - 50.0).collect());
    cases.push(vec![1e-40, -3e-40, 2e-41]); // subnormal scale
    for x in &cases {
        // The pair quantizers agree on every case too.
        let n = x.len();
        let (mut wh, mut wl, mut wr) = (vec![0i8; n], vec![0i8; n], vec![0.0f32; n]);
        let ws2 = quantize_pair_ref(x, &mut wh, &mut wl, &mut wr);
        for isa in Isa::supported() {
            let (mut h, mut l, mut r) = (vec![9i8; n], vec![9i8; n], vec![f32::NAN; n]);
            let s2 = (kernels(isa).quantize_pair)(x, &mut h, &mut l, &mut r);
            assert_eq!(
                (s2.0.to_bits(), s2.1.to_bits()),
                (ws2.0.to_bits(), ws2.1.to_bits())
            );
            assert_eq!(
                (&h, &l, bits(&r)),
                (&wh, &wl, bits(&wr)),
                "{isa:?} pair n={n}"
            );
        }
        let mut want = vec![0i8; x.len()];
        let ws = quantize_activation_ref(x, &mut want);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(ws, amax / 127.0);
        assert!(want.iter().all(|&q| q != i8::MIN));
        for (&v, &q) in x.iter().zip(&want) {
            if ws > 0.0 && ws.is_normal() {
                assert!((v - ws * q as f32).abs() <= 0.5001 * ws, "{v} -> {q}");
            }
        }
        for isa in Isa::supported() {
            let mut q = vec![9i8; x.len()];
            let s = (kernels(isa).quantize)(x, &mut q);
            assert_eq!(
                (s.to_bits(), &q),
                (ws.to_bits(), &want),
                "{isa:?} n={}",
                x.len()
            );
        }
    }
}

/// A random matrix and activation, and the expected outputs (scalar twin).
struct Case {
    rows: usize,
    cols: usize,
    w: Vec<i8>,
    s: Vec<f32>,
    x: Vec<f32>,
}

impl Case {
    fn random(rows: usize, cols: usize, seed: u64) -> Case {
        let mut r = rng(seed);
        Case {
            rows,
            cols,
            w: int8_weights(&mut r, rows * cols),
            s: scales(&mut r, rows),
            x: weights(&mut r, cols),
        }
    }
    fn matrix(&self) -> I8Matrix<'_> {
        I8Matrix::new(self.rows, self.cols, &self.w, &self.s).unwrap()
    }
}

#[test]
fn kernels_match_scalar_twin_bit_for_bit() {
    let mut xv = I8Vector::new();
    for (ci, &cols) in COLS.iter().enumerate() {
        for (ri, &rows) in ROWS.iter().enumerate() {
            let case = Case::random(rows, cols, (ci * 100 + ri) as u64);
            let m = case.matrix();
            xv.quantize_with(kernels(Isa::Scalar).quantize, &case.x);
            let mut want = vec![f32::NAN; rows];
            matvec_rows_ref(&m, &xv, 0, &mut want);
            // The scalar twin against an f64 sum of the dequantized values:
            // the integer sum is exact, so only the two products round.
            for (r, &yw) in want.iter().enumerate() {
                let exact: f64 = m
                    .row(r)
                    .iter()
                    .zip(xv.q())
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * case.s[r] as f64
                    * xv.scale() as f64;
                assert!(
                    (yw as f64 - exact).abs() <= 3e-7 * exact.abs() + 1e-30,
                    "{rows}x{cols} row {r}: {yw} vs {exact}"
                );
            }
            let (mut packed, mut rowwise) = (case.matrix(), case.matrix());
            packed.pack();
            rowwise.unpack();
            for isa in Isa::supported() {
                let kernel = kernels(isa).rows;
                for m in [&packed, &rowwise] {
                    let what = format!("{isa:?} {rows}x{cols} packed={}", m.is_packed());
                    let mut y = vec![f32::NAN; rows];
                    kernel(m, &xv, 0, &mut y);
                    assert_eq!(bits(&y), bits(&want), "{what}");
                    // Any row range (as the pool splits them) gives the same.
                    for row0 in 0..rows {
                        for end in [row0 + 1, rows] {
                            let mut part = vec![f32::NAN; end - row0];
                            kernel(m, &xv, row0, &mut part);
                            assert_eq!(
                                bits(&part),
                                bits(&want[row0..end]),
                                "{what} rows {row0}..{end}"
                            );
                        }
                    }
                }
            }
        }
    }
}

fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn extreme_sums_are_exact() {
    // Every product at its largest, up to the widest row allowed: the sums
    // (and the VNNI offset sums) must not overflow.
    for cols in [144, 1000, MAX_COLS] {
        let rows = 3;
        let mut w = vec![127i8; rows * cols];
        w[cols..2 * cols].fill(-127);
        for (i, v) in w[2 * cols..].iter_mut().enumerate() {
            *v = if i % 2 == 0 { 127 } else { -127 };
        }
        let s = vec![1.0f32; rows];
        let mut m = I8Matrix::new(rows, cols, &w, &s).unwrap();
        let mut xv = I8Vector::new();
        let n = cols as f32;
        for sign in [1.0f32, -1.0] {
            xv.quantize(&vec![127.0 * sign; cols]);
            assert_eq!(xv.scale(), 1.0);
            let big = 127.0 * 127.0 * n * sign;
            let want = [big, -big, 0.0];
            for pack in [true, false] {
                if pack {
                    m.pack()
                } else {
                    m.unpack()
                }
                for isa in Isa::supported() {
                    let mut y = [0.0f32; 3];
                    (kernels(isa).rows)(&m, &xv, 0, &mut y);
                    assert_eq!(y, want, "{isa:?} cols={cols} packed={pack}");
                }
            }
        }
    }
}

#[test]
fn zero_activation_and_zero_rows() {
    let case = Case::random(5, 145, 9);
    let mut s = case.s.clone();
    s[2] = 0.0;
    let m = I8Matrix::new(5, 145, &case.w, &s).unwrap();
    let mut xv = I8Vector::new();
    for isa in Isa::supported() {
        xv.quantize_with(kernels(isa).quantize, &[0.0; 145]);
        let mut y = [f32::NAN; 5];
        (kernels(isa).rows)(&m, &xv, 0, &mut y);
        assert_eq!(y, [0.0; 5], "{isa:?}");
        xv.quantize_with(kernels(isa).quantize, &case.x);
        (kernels(isa).rows)(&m, &xv, 0, &mut y);
        assert_eq!(y[2], 0.0, "{isa:?}: zero scale");
    }
}

#[test]
fn vector_is_reused_and_padding_reset() {
    let long = Case::random(7, 1000, 3);
    let short = Case::random(7, 144, 4);
    let mut xv = I8Vector::with_capacity(1000);
    let cap = xv.capacity();
    for isa in Isa::supported() {
        for c in [&long, &short, &long, &short] {
            xv.quantize_with(kernels(isa).quantize, &c.x);
            let m = c.matrix();
            let (mut y, mut want) = (vec![0.0; 7], vec![0.0; 7]);
            (kernels(isa).rows)(&m, &xv, 0, &mut y);
            let mut fresh = I8Vector::new();
            fresh.quantize_with(kernels(Isa::Scalar).quantize, &c.x);
            matvec_rows_ref(&m, &fresh, 0, &mut want);
            assert_eq!(bits(&y), bits(&want), "{isa:?} cols {}", c.cols);
        }
    }
    assert_eq!(xv.capacity(), cap);
}

#[test]
fn matvec_splits_rows_over_threads_identically() {
    // Large enough to be split (rows·cols ≥ PARALLEL_FROM), odd row count.
    let case = Case::random(4097, 72, 11);
    assert!(case.rows * case.cols >= PARALLEL_FROM);
    let m = case.matrix();
    let mut xv = I8Vector::new();
    xv.quantize(&case.x);
    let mut want = vec![0.0; case.rows];
    matvec_rows_ref(&m, &xv, 0, &mut want);
    for t in 1..=3 {
        let pool = ThreadPool::new(t);
        for isa in Isa::supported() {
            let mut y = vec![f32::NAN; case.rows];
            matvec_with(&pool, kernels(isa).rows, &m, &xv, &mut y);
            assert_eq!(bits(&y), bits(&want), "{isa:?} threads={t}");
        }
        let mut y = vec![f32::NAN; case.rows];
        matvec(&pool, &m, &xv, &mut y);
        assert_eq!(bits(&y), bits(&want), "selected, threads={t}");
    }
}

#[test]
fn constructor_checks() {
    let w = vec![1i8; 12];
    let s = vec![0.5f32; 3];
    assert!(I8Matrix::new(3, 4, &w, &s).is_ok());
    assert_eq!(
        I8Matrix::new(3, 4, &w[..11], &s).unwrap_err(),
        I8Error::DataLength {
            expected: 12,
            actual: 11
        }
    );
    assert_eq!(
        I8Matrix::new(3, 4, &w, &s[..2]).unwrap_err(),
        I8Error::ScaleLength { rows: 3, actual: 2 }
    );
    let mut bad = w.clone();
    bad[6] = -128;
    let e = I8Matrix::new(3, 4, &bad, &s).unwrap_err();
    assert_eq!(e, I8Error::MinusOneTwentyEight { row: 1, col: 2 });
    assert!(e.to_string().contains("-128"), "{e}");
    let mut ns = s.clone();
    ns[1] = f32::NAN;
    assert!(matches!(
        I8Matrix::new(3, 4, &w, &ns),
        Err(I8Error::BadScale { row: 1, .. })
    ));
    assert!(matches!(
        I8Matrix::new(1, MAX_COLS + 1, &[], &[]),
        Err(I8Error::TooWide { .. })
    ));
    assert!(matches!(
        I8Matrix::new(usize::MAX, 2, &[], &[]),
        Err(I8Error::TooLarge { .. })
    ));
    // Empty shapes.
    let mut m = I8Matrix::new(2, 0, &[], &s[..2]).unwrap();
    let mut xv = I8Vector::new();
    xv.quantize(&[]);
    for pack in [true, false] {
        if pack {
            m.pack()
        } else {
            m.unpack()
        }
        for isa in Isa::supported() {
            let mut y = [f32::NAN; 2];
            (kernels(isa).rows)(&m, &xv, 0, &mut y);
            assert_eq!(y, [0.0; 2]);
        }
    }
    let mut m = I8Matrix::new(3, 4, &w, &s).unwrap();
    let mut row = [0.0; 4];
    m.dequantize_row(2, &mut row);
    assert_eq!(row, [0.5; 4]);
    m.unpack();
    assert_eq!(m.bytes(), 12 + 12);
    m.pack();
    assert_eq!(m.bytes(), 64 + 12); // one block of 16 rows × 4 columns
}

#[test]
#[should_panic(expected = "columns")]
fn wrong_activation_length_panics() {
    let case = Case::random(2, 8, 1);
    let m = case.matrix();
    let mut xv = I8Vector::new();
    xv.quantize(&[1.0; 7]);
    matvec_rows_ref(&m, &xv, 0, &mut [0.0; 2]);
}

/// `k` random activations of `cols` elements, quantized.
fn activations(cols: usize, k: usize, seed: u64) -> Vec<I8Vector> {
    let mut r = rng(seed);
    (0..k)
        .map(|i| {
            let mut v = I8Vector::new();
            let x = match i % 3 {
                2 => vec![0.0; cols], // an all-zero activation among others
                _ => weights(&mut r, cols),
            };
            v.quantize_with(kernels(Isa::Scalar).quantize, &x);
            v
        })
        .collect()
}

/// `ys`, `(k, n)` row-major, as the per-activation slices a multi kernel
/// takes.
fn parts(ys: &mut [f32], n: usize) -> Vec<&mut [f32]> {
    ys.chunks_exact_mut(n.max(1)).collect()
}

#[test]
fn multi_kernels_equal_single_activation_runs_bit_for_bit() {
    for (ci, &cols) in [1, 7, 33, 64, 145, 396, 1031].iter().enumerate() {
        for (ri, &rows) in [1, 5, 16, 17, 70].iter().enumerate() {
            let case = Case::random(rows, cols, (ci * 100 + ri) as u64 + 7000);
            for k in [1, 2, 3, 4, 5, 8, 16] {
                let acts = activations(cols, k, (ci * 1000 + ri * 10 + k) as u64);
                let xs: Vec<&I8Vector> = acts.iter().collect();
                // Expected: the scalar twin per activation, (k, rows).
                let m = case.matrix();
                let mut want = vec![f32::NAN; rows * k];
                for (x, y) in xs.iter().zip(want.chunks_exact_mut(rows)) {
                    matvec_rows_ref(&m, x, 0, y);
                }
                let (mut packed, mut rowwise) = (case.matrix(), case.matrix());
                packed.pack();
                rowwise.unpack();
                for isa in Isa::supported() {
                    let kernel = kernels(isa).rows_multi;
                    for m in [&packed, &rowwise] {
                        let what = format!("{isa:?} {rows}x{cols} k={k} packed={}", m.is_packed());
                        let mut ys = vec![f32::NAN; rows * k];
                        kernel(m, &xs, 0, &mut parts(&mut ys, rows));
                        assert_eq!(bits(&ys), bits(&want), "{what}");
                        // Any row range (as the pool splits them).
                        for row0 in 1..rows {
                            for end in [row0 + 1, rows] {
                                let n = end - row0;
                                let mut ys = vec![f32::NAN; n * k];
                                kernel(m, &xs, row0, &mut parts(&mut ys, n));
                                for (a, y) in ys.chunks_exact(n).enumerate() {
                                    let w = &want[a * rows + row0..a * rows + end];
                                    assert_eq!(bits(y), bits(w), "{what} rows {row0}..{end}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matvec_multi_splits_rows_over_threads_identically() {
    let case = Case::random(4097, 72, 12);
    let m = case.matrix();
    for k in [1, 6, MAX_MULTI] {
        let acts = activations(72, k, 13);
        let xs: Vec<&I8Vector> = acts.iter().collect();
        let mut want = vec![0.0; case.rows * k];
        matvec_rows_multi_ref(&m, &xs, 0, &mut parts(&mut want, case.rows));
        for t in 1..=3 {
            let pool = ThreadPool::new(t);
            for isa in Isa::supported() {
                let mut ys = vec![f32::NAN; want.len()];
                matvec_multi_with(&pool, kernels(isa).rows_multi, &m, &xs, &mut ys);
                assert_eq!(bits(&ys), bits(&want), "{isa:?} threads={t} k={k}");
            }
            let mut ys = vec![f32::NAN; want.len()];
            matvec_multi(&pool, &m, &xs, &mut ys);
            assert_eq!(bits(&ys), bits(&want), "selected, threads={t} k={k}");
        }
    }
}

#[test]
#[should_panic(expected = "x has 71 elements")]
fn multi_with_a_wrong_activation_length_panics() {
    let case = Case::random(3, 72, 14);
    let m = case.matrix();
    let (a, b) = (activations(72, 1, 1), activations(71, 1, 2));
    let mut ys = vec![0.0; 6];
    matvec_rows_multi_ref(&m, &[&a[0], &b[0]], 0, &mut parts(&mut ys, 3));
}

#[test]
#[should_panic(expected = "at most 16")]
fn multi_with_too_many_activations_panics() {
    let case = Case::random(3, 72, 15);
    let m = case.matrix();
    let acts = activations(72, MAX_MULTI + 1, 3);
    let xs: Vec<&I8Vector> = acts.iter().collect();
    let mut ys = vec![0.0; 3 * xs.len()];
    matvec_multi(&ThreadPool::new(1), &m, &xs, &mut ys);
}

#[test]
fn regions_match_scalar_twin() {
    let mut r = rng(20);
    for lines in [1, 2, 3, 7] {
        let n = 64 * lines;
        let mut q: Vec<i8> = (0..n).map(|_| r.gen_range(-127..=127)).collect();
        q[0] = 127;
        q[n - 1] = -127;
        let (mut wu, mut wa) = (vec![0u8; n], vec![0u8; n]);
        let want = regions_ref(&q, &mut wu, &mut wa);
        assert_eq!(want, q.iter().map(|&v| v as i32).sum::<i32>());
        assert_eq!(wu[0], 255);
        assert_eq!(wa[n - 1], 127);
        for isa in Isa::supported() {
            let (mut u, mut a) = (vec![7u8; n], vec![7u8; n]);
            let sum = (kernels(isa).regions)(&q, &mut u, &mut a);
            assert_eq!((sum, &u, &a), (want, &wu, &wa), "{isa:?} {n} bytes");
        }
    }
    // All at the limits: the largest sums either way.
    for v in [127i8, -127] {
        let q = vec![v; 64 * 9];
        for isa in Isa::supported() {
            let (mut u, mut a) = (vec![0u8; q.len()], vec![0u8; q.len()]);
            let sum = (kernels(isa).regions)(&q, &mut u, &mut a);
            assert_eq!(sum, v as i32 * q.len() as i32, "{isa:?} all {v}");
        }
    }
}

#[test]
#[should_panic(expected = "a multiple of 64 wanted")]
fn regions_of_a_partial_line_panic() {
    let q = vec![0i8; 65];
    regions_ref(&q, &mut [0u8; 65], &mut [0u8; 65]);
}

#[test]
fn residuals_match_scalar_twin_bit_for_bit() {
    let mut r = rng(21);
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 33, 144, 145, 396, 1031] {
        let x = weights(&mut r, n);
        let mut q = vec![0i8; n];
        let s = quantize_activation_ref(&x, &mut q);
        let mut want = vec![0.0f32; n];
        residual_ref(&x, &q, s, &mut want);
        for (&w, &v) in want.iter().zip(&x) {
            assert!(w.abs() <= 0.5001 * s || s == 0.0, "{v}: residual {w}");
        }
        for isa in Isa::supported() {
            let mut got = vec![f32::NAN; n];
            (kernels(isa).residual)(&x, &q, s, &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa:?} n={n}");
        }
    }
}

#[test]
fn quantized_pairs_are_the_same_from_every_set() {
    let mut r = rng(22);
    for n in [1, 7, 31, 64, 65, 144, 145, 396, 1000] {
        let mut cases = vec![weights(&mut r, n), vec![0.0; n]];
        cases.extend(extreme_rows(n));
        for x in &cases {
            // The reference: the two quantizations, one after the other.
            let (mut wh, mut wl) = (vec![0i8; n], vec![0i8; n]);
            let sh = quantize_activation_ref(x, &mut wh);
            let rest: Vec<f32> = x
                .iter()
                .zip(&wh)
                .map(|(&v, &q)| v - sh * q as f32)
                .collect();
            let sl = quantize_activation_ref(&rest, &mut wl);
            for isa in Isa::supported() {
                let k = kernels(isa);
                let (mut hi, mut lo) = (I8Vector::new(), I8Vector::new());
                let mut scratch = vec![f32::NAN; n + 3];
                quantize_pair_with(&k, x, &mut hi, &mut lo, &mut scratch);
                let what = format!("{isa:?} n={n}");
                assert_eq!(
                    (hi.scale().to_bits(), hi.q()),
                    (sh.to_bits(), &wh[..]),
                    "{what}"
                );
                assert_eq!(
                    (lo.scale().to_bits(), lo.q()),
                    (sl.to_bits(), &wl[..]),
                    "{what}"
                );
                assert_eq!(lo.sum, wl.iter().map(|&v| v as i32).sum::<i32>(), "{what}");
                assert_eq!(bits(&scratch[..n]), bits(&rest), "{what}: residual");
                assert!(scratch[n..].iter().all(|v| v.is_nan()), "{what}: past n");
                // hi + lo is closer to x than hi alone, by about 2⁷.
                if sh > 0.0 && sh.is_normal() {
                    for ((&v, &a), &b) in x.iter().zip(&wh).zip(&wl) {
                        let err = (v - (sh * a as f32 + sl * b as f32)).abs();
                        assert!(err <= sh / 200.0, "{what}: {v} off by {err}");
                    }
                }
            }
        }
    }
}

/// `k` pairs of activations (hi, lo, hi, lo, …) of `cols` elements.
fn pairs_of(cols: usize, k: usize, seed: u64) -> Vec<I8Vector> {
    let mut r = rng(seed);
    let mut out = Vec::new();
    for i in 0..k {
        let x = match i % 3 {
            2 => vec![0.0; cols],
            _ => weights(&mut r, cols),
        };
        let (mut hi, mut lo) = (I8Vector::new(), I8Vector::new());
        let mut rest = vec![0.0; cols];
        quantize_pair_with(&kernels(Isa::Scalar), &x, &mut hi, &mut lo, &mut rest);
        out.extend([hi, lo]);
    }
    out
}

/// The scalar twin per activation, each pair's outputs added: `(k, rows)`.
fn pair_sums(m: &I8Matrix<'_>, xs: &[&I8Vector], row0: usize, n: usize) -> Vec<f32> {
    let mut want = Vec::new();
    for pair in xs.chunks_exact(2) {
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        matvec_rows_ref(m, pair[0], row0, &mut a);
        matvec_rows_ref(m, pair[1], row0, &mut b);
        want.extend(a.iter().zip(&b).map(|(u, v)| u + v));
    }
    want
}

#[test]
fn pairs_kernels_equal_added_single_runs_bit_for_bit() {
    for (ci, &cols) in [1, 7, 33, 64, 145, 396, 1031].iter().enumerate() {
        for (ri, &rows) in [1, 5, 16, 17, 70, 130, 257].iter().enumerate() {
            let case = Case::random(rows, cols, (ci * 100 + ri) as u64 + 9000);
            for k in [1, 2, 3, 4, 8] {
                let acts = pairs_of(cols, k, (ci * 1000 + ri * 10 + k) as u64);
                let xs: Vec<&I8Vector> = acts.iter().collect();
                let want = pair_sums(&case.matrix(), &xs, 0, rows);
                let (mut packed, mut rowwise) = (case.matrix(), case.matrix());
                packed.pack();
                rowwise.unpack();
                for isa in Isa::supported() {
                    let kernel = kernels(isa).rows_pairs;
                    for m in [&packed, &rowwise] {
                        let what = format!("{isa:?} {rows}x{cols} k={k} packed={}", m.is_packed());
                        let mut ys = vec![f32::NAN; rows * k];
                        kernel(m, &xs, 0, &mut parts(&mut ys, rows));
                        assert_eq!(bits(&ys), bits(&want), "{what}");
                        for row0 in [1, rows / 2, rows - 1] {
                            if row0 == 0 || row0 >= rows {
                                continue;
                            }
                            for end in [row0 + 1, rows] {
                                let n = end - row0;
                                let mut ys = vec![f32::NAN; n * k];
                                kernel(m, &xs, row0, &mut parts(&mut ys, n));
                                for (p, y) in ys.chunks_exact(n).enumerate() {
                                    let w = &want[p * rows + row0..p * rows + end];
                                    assert_eq!(bits(y), bits(w), "{what} rows {row0}..{end}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matvec_pairs_splits_rows_over_threads_identically() {
    let case = Case::random(4097, 144, 23);
    let m = case.matrix();
    for k in [1, 3, MAX_MULTI / 2] {
        let acts = pairs_of(144, k, 24);
        let xs: Vec<&I8Vector> = acts.iter().collect();
        let want = pair_sums(&m, &xs, 0, case.rows);
        for t in 1..=3 {
            let pool = ThreadPool::new(t);
            for isa in Isa::supported() {
                let mut ys = vec![f32::NAN; want.len()];
                matvec_pairs_with(&pool, kernels(isa).rows_pairs, &m, &xs, &mut ys);
                assert_eq!(bits(&ys), bits(&want), "{isa:?} threads={t} k={k}");
            }
            let mut ys = vec![f32::NAN; want.len()];
            matvec_pairs(&pool, &m, &xs, &mut ys);
            assert_eq!(bits(&ys), bits(&want), "selected, threads={t} k={k}");
        }
    }
}

#[test]
#[should_panic(expected = "an even number")]
fn pairs_with_half_a_pair_panic() {
    let case = Case::random(3, 72, 25);
    let acts = pairs_of(72, 2, 26);
    let xs: Vec<&I8Vector> = acts.iter().take(3).collect();
    let mut ys = vec![0.0; 3];
    matvec_pairs(&ThreadPool::new(1), &case.matrix(), &xs, &mut ys);
}

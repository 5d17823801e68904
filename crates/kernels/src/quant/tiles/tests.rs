use super::*;
use crate::isa::Isa;
use crate::quant::q8_0::quantize_row_activation;
use crate::quant::testing::{rng, weights};
use crate::traits::traits;

/// The tile kernel of `ty` in the table of `isa` (a supported set).
fn kernel(isa: Isa, ty: GgmlType) -> TileDotFn {
    crate::table(isa).unwrap().tile_dot(ty).unwrap()
}

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// A random `rows × cols` matrix of `ty` as stored.
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let tr = traits(ty).unwrap();
    let rb = tr.row_bytes(cols);
    let mut data = vec![0u8; rows * rb];
    let mut r = rng(seed);
    for row in data.chunks_exact_mut(rb) {
        (tr.from_float)(&weights(&mut r, cols), row);
    }
    data
}

fn packed(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u32> {
    let td = tile_dot(ty).unwrap();
    let tb = (td.tile_bytes)(cols);
    let mut buf = vec![0u32; tiles(rows) * tb / 4];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    bytes.fill(0xAA); // stale contents must not leak through
    (td.pack)(data, rows, cols, bytes);
    buf
}

/// `n` prepared activations, `stride` bytes apart, and the same as Q8_0
/// blocks for the reference dots.
fn activations(n: usize, cols: usize, seed: u64) -> (Vec<u32>, usize, Vec<Vec<u8>>) {
    let stride = prepared_bytes(cols).div_ceil(64) * 64;
    let mut buf = vec![0u32; n * stride / 4];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    let mut q8 = vec![];
    let mut r = rng(seed);
    for c in 0..n {
        let x = weights(&mut r, cols);
        prepare(
            &x,
            &mut bytes[c * stride..c * stride + prepared_bytes(cols)],
        );
        let mut blocks = vec![BlockQ8_0::zeroed(); cols / QK8_0];
        quantize_row_activation(&x, &mut blocks);
        q8.push(bytemuck::cast_slice(&blocks).to_vec());
    }
    (buf, stride, q8)
}

/// Shapes with partial tiles, one to many blocks and every group size.
const SHAPES: [(usize, usize, usize); 7] = [
    (1, 1, 1),
    (16, 2, 3),
    (17, 3, 8),
    (15, 5, 9),
    (40, 1, 13),
    (33, 18, 7),
    (3, 4, 2),
];

/// The scalar twin against the type's reference dot, row by row.
#[test]
fn scalar_twin_matches_the_reference_dot() {
    for ty in TYPES {
        let tr = traits(ty).unwrap();
        for (i, &(rows, nb, n)) in SHAPES.iter().enumerate() {
            let cols = nb * QK8_0;
            let data = matrix(ty, rows, cols, i as u64);
            let tiles_buf = packed(ty, &data, rows, cols);
            let tb = (tile_dot(ty).unwrap().tile_bytes)(cols);
            let (acts, stride, q8) = activations(n, cols, 50 + i as u64);
            let acts: &[u8] = bytemuck::cast_slice(&acts);
            let mut w = vec![0.0; cols];
            let mut y = vec![0.0; cols];
            for t in 0..tiles(rows) {
                let tile = &bytemuck::cast_slice(&tiles_buf)[t * tb..(t + 1) * tb];
                let mut out = vec![f32::NAN; TILE_ROWS * n];
                kernel(Isa::Scalar, ty)(tile, nb, acts, stride, n, &mut out);
                for c in 0..n {
                    for r in 0..TILE_ROWS {
                        let got = out[TILE_ROWS * c + r];
                        let row = t * TILE_ROWS + r;
                        if row >= rows {
                            assert_eq!(got, 0.0, "{ty:?} padding row {row}");
                            continue;
                        }
                        let rb = tr.row_bytes(cols);
                        let wr = &data[row * rb..(row + 1) * rb];
                        let want = (tr.vec_dot_ref)(wr, &q8[c]);
                        // Scale of the sum: Σ|w·y| over the dequantized values.
                        (tr.to_float)(wr, &mut w);
                        (traits(GgmlType::Q8_0).unwrap().to_float)(&q8[c], &mut y);
                        let mag: f32 = w.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
                        assert!(
                            (got - want).abs() <= 1e-5 * mag + 1e-6,
                            "{ty:?} rows {rows} blocks {nb} row {row} act {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Every kernel equals the scalar twin bit for bit.
#[test]
fn kernels_equal_the_scalar_twin() {
    for ty in TYPES {
        let td = tile_dot(ty).unwrap();
        for (i, &(rows, nb, n)) in SHAPES.iter().enumerate() {
            let cols = nb * QK8_0;
            let data = matrix(ty, rows, cols, 10 + i as u64);
            let tiles_buf = packed(ty, &data, rows, cols);
            let tb = (td.tile_bytes)(cols);
            let (acts, stride, _) = activations(n, cols, 70 + i as u64);
            let acts: &[u8] = bytemuck::cast_slice(&acts);
            for t in 0..tiles(rows) {
                let tile = &bytemuck::cast_slice(&tiles_buf)[t * tb..(t + 1) * tb];
                let mut want = vec![f32::NAN; TILE_ROWS * n];
                kernel(Isa::Scalar, ty)(tile, nb, acts, stride, n, &mut want);
                for isa in Isa::supported() {
                    let mut got = vec![f32::NAN; TILE_ROWS * n];
                    kernel(isa, ty)(tile, nb, acts, stride, n, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{ty:?} {isa:?} rows {rows} blocks {nb} n {n} tile {t}"
                    );
                }
            }
        }
    }
}

/// Every set's fused prepare equals the scalar twin byte for byte, on odd
/// block counts, zero blocks and large values.
#[test]
fn prepare_is_the_same_on_every_kernel_set() {
    let mut r = rng(9);
    for nb in [1, 2, 3, 5, 18, 48] {
        let cols = nb * QK8_0;
        let mut x = weights(&mut r, cols);
        x[..QK8_0.min(cols)].fill(0.0); // a zero block: d = 0, no division
        if nb > 2 {
            x[QK8_0 + 3] = 3.0e4;
            x[2 * QK8_0 + 7] = -1.0e-30;
        }
        let mut want = vec![0u32; prepared_bytes(cols) / 4];
        prepare_ref(&x, bytemuck::cast_slice_mut(&mut want));
        for isa in Isa::supported() {
            let mut got = vec![0xAAAA_AAAAu32; prepared_bytes(cols) / 4];
            (crate::table(isa).unwrap().tile_prepare)(&x, bytemuck::cast_slice_mut(&mut got));
            assert_eq!(got, want, "{isa:?} blocks {nb}");
        }
    }
}

#[test]
fn prepared_parts_match_q8_0() {
    let cols = 5 * QK8_0;
    let (acts, stride, q8) = activations(2, cols, 3);
    let acts: &[u8] = bytemuck::cast_slice(&acts);
    for (c, q) in q8.iter().enumerate() {
        let a = Prepared::new(&acts[c * stride..], 5);
        let blocks: &[BlockQ8_0] = bytemuck::cast_slice(q);
        for (b, x) in blocks.iter().enumerate() {
            assert_eq!(a.qy(b), &x.qs[..]);
            let sum: i32 = x.qs.iter().map(|&v| v as i32).sum();
            assert_eq!(a.sy(b), sum);
            assert_eq!(a.dy(b), x.d.to_f32());
            assert_eq!(a.dsy(b), x.d.to_f32() * sum as f32);
            assert_eq!(a.sy8(b), 8 * sum);
        }
    }
}

/// The kernels' unchecked loads rest on two asserts: a tile or an output
/// one byte short must panic on every kernel set, not read or write past.
#[test]
fn short_tiles_and_outputs_panic_on_every_kernel_set() {
    let (rows, cols, n) = (16, 64, 2);
    for ty in TYPES {
        let tile = packed(ty, &matrix(ty, rows, cols, 1), rows, cols);
        let tile: &[u8] = bytemuck::cast_slice(&tile);
        let (acts, stride, _) = activations(n, cols, 2);
        let acts: &[u8] = bytemuck::cast_slice(&acts);
        let nb = cols / QK8_0;
        for isa in Isa::supported() {
            let dot = kernel(isa, ty);
            let short_tile = std::panic::catch_unwind(|| {
                let mut out = vec![0.0; TILE_ROWS * n];
                dot(&tile[..tile.len() - 1], nb, acts, stride, n, &mut out);
            });
            let msg = short_tile.expect_err("a short tile must panic");
            assert_eq!(
                msg.downcast_ref::<&str>(),
                Some(&"tiles: tile too short"),
                "{ty:?} {isa:?}"
            );
            let short_out = std::panic::catch_unwind(|| {
                let mut out = vec![0.0; TILE_ROWS * n - 1];
                dot(tile, nb, acts, stride, n, &mut out);
            });
            let msg = short_out.expect_err("a short output must panic");
            assert_eq!(
                msg.downcast_ref::<&str>(),
                Some(&"tiles: output too short"),
                "{ty:?} {isa:?}"
            );
        }
    }
}

/// The largest quants against the largest activations, both signs: the
/// kernels' integer sums (i16 before each `madd` on AVX2) stay exact, so
/// every set still equals the scalar twin.
#[test]
fn largest_quants_and_activations_stay_exact() {
    let one = half::f16::ONE.to_le_bytes();
    for ty in TYPES {
        let td = tile_dot(ty).unwrap();
        let (rows, nb) = (16, 6);
        let cols = nb * QK8_0;
        // d = 1, m = 0, every fifth bit set, every quant at its maximum.
        let block: Vec<u8> = match ty {
            GgmlType::Q4_0 => [&one[..], &[0xFF; 16]].concat(),
            GgmlType::Q4_1 => [&one[..], &[0; 2], &[0xFF; 16]].concat(),
            GgmlType::Q5_0 => [&one[..], &[0xFF; 4], &[0xFF; 16]].concat(),
            GgmlType::Q5_1 => [&one[..], &[0; 2], &[0xFF; 4], &[0xFF; 16]].concat(),
            GgmlType::Q8_0 => [&one[..], &[0x7F; 32]].concat(),
            _ => unreachable!(),
        };
        assert_eq!(block.len(), traits(ty).unwrap().row_bytes(QK8_0));
        let data = block.repeat(rows * nb);
        let tiles_buf = packed(ty, &data, rows, cols);
        let tile: &[u8] = bytemuck::cast_slice(&tiles_buf);
        for sign in [1.0f32, -1.0] {
            let n = 5;
            let stride = prepared_bytes(cols).div_ceil(64) * 64;
            let mut acts = vec![0u8; n * stride];
            for c in 0..n {
                prepare(
                    &vec![sign; cols],
                    &mut acts[c * stride..][..prepared_bytes(cols)],
                );
            }
            let mut want = vec![f32::NAN; TILE_ROWS * n];
            kernel(Isa::Scalar, ty)(tile, nb, &acts, stride, n, &mut want);
            assert!(want.iter().all(|&x| x != 0.0 && x.signum() == sign));
            for isa in Isa::supported() {
                for n in [1, n] {
                    let mut got = vec![f32::NAN; TILE_ROWS * n];
                    kernel(isa, ty)(
                        &tile[..(td.tile_bytes)(cols)],
                        nb,
                        &acts,
                        stride,
                        n,
                        &mut got,
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want[..TILE_ROWS * n]),
                        "{ty:?} {isa:?} n {n}"
                    );
                }
            }
        }
    }
}

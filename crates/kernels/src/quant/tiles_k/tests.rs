use super::*;
use crate::isa::Isa;
use crate::quant::testing::{rng, weights};
use crate::quant::tiles::{tile_dot, tiles};
use crate::traits::traits;
use gguf::GgmlType;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// The tile kernel of `ty` in the table of `isa` (a supported set).
fn kernel(isa: Isa, ty: GgmlType) -> TileDotFn {
    crate::table(isa).unwrap().tile_dot(ty).unwrap()
}

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

fn packed(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let td = tile_dot(ty).unwrap();
    let mut buf = vec![0xAAu8; tiles(rows) * (td.tile_bytes)(cols)]; // stale bytes must not leak
    (td.pack)(data, rows, cols, &mut buf);
    buf
}

/// `n` prepared activations, `stride` bytes apart (4-aligned storage).
fn activations(n: usize, cols: usize, seed: u64) -> (Vec<u32>, usize) {
    let stride = prepared_bytes(cols).div_ceil(64) * 64;
    let mut buf = vec![0u32; n * stride / 4];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    let mut r = rng(seed);
    for c in 0..n {
        let x = weights(&mut r, cols);
        prepare(
            &x,
            &mut bytes[c * stride..c * stride + prepared_bytes(cols)],
        );
    }
    (buf, stride)
}

/// (rows, superblocks, activations): partial tiles, one to several
/// superblocks, every group size of both kernel sets and past them.
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (16, 2, 3),
    (17, 3, 8),
    (15, 1, 9),
    (40, 1, 5),
    (33, 4, 7),
    (3, 2, 2),
    (50, 1, 4),
];

/// The scalar twin against the exact dot of the dequantized weights with
/// the dequantized activations and against the type's row-wise dot (ggml's
/// arithmetic on the same Q8_K blocks), row by row, padding rows zero.
#[test]
fn scalar_twin_matches_the_dequantized_and_row_dots() {
    for ty in TYPES {
        let tr = traits(ty).unwrap();
        for (i, &(rows, ns, n)) in SHAPES.iter().enumerate() {
            let cols = ns * QK_K;
            let nb = cols / 32;
            let data = matrix(ty, rows, cols, i as u64);
            let tiles_buf = packed(ty, &data, rows, cols);
            let tb = (tile_dot(ty).unwrap().tile_bytes)(cols);
            let (acts, stride) = activations(n, cols, 50 + i as u64);
            let acts: &[u8] = bytemuck::cast_slice(&acts);
            let rb = tr.row_bytes(cols);
            let mut w = vec![0.0; cols];
            for t in 0..tiles(rows) {
                let tile = &tiles_buf[t * tb..(t + 1) * tb];
                let mut out = vec![f32::NAN; TILE_ROWS * n];
                kernel(Isa::Scalar, ty)(tile, nb, acts, stride, n, &mut out);
                for c in 0..n {
                    let a = activation(acts, c * stride, ns);
                    let y: Vec<f64> = (0..cols)
                        .map(|e| a[e / QK_K].qs[e % QK_K] as f64 * a[e / QK_K].d as f64)
                        .collect();
                    for r in 0..TILE_ROWS {
                        let got = out[TILE_ROWS * c + r];
                        let row = t * TILE_ROWS + r;
                        if row >= rows {
                            assert_eq!(got, 0.0, "{ty:?} padding row {row}");
                            continue;
                        }
                        let wr = &data[row * rb..(row + 1) * rb];
                        (tr.to_float)(wr, &mut w);
                        let want: f64 = w.iter().zip(&y).map(|(&a, b)| a as f64 * b).sum();
                        let mag: f64 = w.iter().zip(&y).map(|(&a, b)| (a as f64 * b).abs()).sum();
                        assert!(
                            (got as f64 - want).abs() <= 1e-5 * mag + 1e-6,
                            "{ty:?} rows {rows} superblocks {ns} row {row} act {c}: {got} vs {want}"
                        );
                        let row_dot = (tr.vec_dot_ref)(wr, bytemuck::cast_slice(a));
                        assert!(
                            ((got - row_dot) as f64).abs() <= 1e-5 * mag + 1e-6,
                            "{ty:?} row {row} act {c}: {got} vs row dot {row_dot}"
                        );
                    }
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every kernel equals the scalar twin bit for bit, and each activation's
/// row is the same bits run alone as in a batch.
#[test]
fn kernels_equal_the_scalar_twin_alone_or_batched() {
    for ty in TYPES {
        let td = tile_dot(ty).unwrap();
        for (i, &(rows, ns, n)) in SHAPES.iter().enumerate() {
            let cols = ns * QK_K;
            let nb = cols / 32;
            let data = matrix(ty, rows, cols, 10 + i as u64);
            let tiles_buf = packed(ty, &data, rows, cols);
            let tb = (td.tile_bytes)(cols);
            let (acts, stride) = activations(n, cols, 70 + i as u64);
            let acts: &[u8] = bytemuck::cast_slice(&acts);
            for t in 0..tiles(rows) {
                let tile = &tiles_buf[t * tb..(t + 1) * tb];
                let mut want = vec![f32::NAN; TILE_ROWS * n];
                kernel(Isa::Scalar, ty)(tile, nb, acts, stride, n, &mut want);
                for isa in Isa::supported() {
                    let mut got = vec![f32::NAN; TILE_ROWS * n];
                    kernel(isa, ty)(tile, nb, acts, stride, n, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{ty:?} {isa:?} rows {rows} superblocks {ns} n {n} tile {t}"
                    );
                    for c in 0..n {
                        let mut one = vec![f32::NAN; TILE_ROWS];
                        kernel(isa, ty)(tile, nb, &acts[c * stride..], stride, 1, &mut one);
                        assert_eq!(
                            bits(&one),
                            bits(&want[TILE_ROWS * c..TILE_ROWS * (c + 1)]),
                            "{ty:?} {isa:?} activation {c} alone vs in {n}"
                        );
                    }
                }
            }
        }
    }
}

/// Extreme quants: all-63 Q6_K values and all-15 Q4_K nibbles against
/// ±127 activations, where an i16 overflow in the AVX2 pairs would show.
#[test]
fn extreme_values_match_the_scalar_twin() {
    let cols = QK_K;
    let nb = cols / 32;
    let x: Vec<f32> = (0..cols)
        .map(|e| if e % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let stride = prepared_bytes(cols).div_ceil(64) * 64;
    let mut acts = vec![0u32; stride / 4];
    prepare(
        &x,
        &mut bytemuck::cast_slice_mut(&mut acts)[..prepared_bytes(cols)],
    );
    let acts: &[u8] = bytemuck::cast_slice(&acts);
    for ty in TYPES {
        let tr = traits(ty).unwrap();
        // Rows at the top of the range, a few outliers below.
        let rows = 16;
        let mut data = vec![0u8; rows * tr.row_bytes(cols)];
        for (r, row) in data.chunks_exact_mut(tr.row_bytes(cols)).enumerate() {
            let w: Vec<f32> = (0..cols)
                .map(|e| if e % 3 == 0 { -1.0 } else { 1.0 } * (1.0 + (e % (r + 2)) as f32))
                .collect();
            (tr.from_float)(&w, row);
        }
        let tile = packed(ty, &data, rows, cols);
        let mut want = vec![0.0; TILE_ROWS];
        kernel(Isa::Scalar, ty)(&tile, nb, acts, stride, 1, &mut want);
        for isa in Isa::supported() {
            let mut got = vec![0.0; TILE_ROWS];
            kernel(isa, ty)(&tile, nb, acts, stride, 1, &mut got);
            assert_eq!(bits(&got), bits(&want), "{ty:?} {isa:?}");
        }
    }
}

/// Tile bytes stay within 3 % of the stored rows (decode reads them).
#[test]
fn tiles_are_about_the_stored_size() {
    for ty in TYPES {
        let cols = 4 * QK_K;
        let stored = TILE_ROWS * traits(ty).unwrap().row_bytes(cols);
        let tiled = (tile_dot(ty).unwrap().tile_bytes)(cols);
        assert!(
            tiled >= stored && tiled * 100 <= stored * 103,
            "{ty:?}: {tiled} vs {stored}"
        );
        assert_eq!(tiled % 64, 0, "{ty:?}: superblocks are whole cache lines");
    }
}

/// The unchecked loads rest on the bounds checks: a short tile or output,
/// or blocks that are not whole superblocks, panic on every kernel set.
#[test]
fn bad_bounds_panic_on_every_kernel_set() {
    let (rows, cols, n) = (16, 2 * QK_K, 2);
    let nb = cols / 32;
    for ty in TYPES {
        let tile = packed(ty, &matrix(ty, rows, cols, 1), rows, cols);
        let (acts, stride) = activations(n, cols, 2);
        let acts: &[u8] = bytemuck::cast_slice(&acts);
        for isa in Isa::supported() {
            let dot = kernel(isa, ty);
            let cases: [(&[u8], usize, usize, &str); 3] = [
                (
                    &tile[..tile.len() - 1],
                    nb,
                    TILE_ROWS * n,
                    "tiles: tile too short",
                ),
                (&tile, nb, TILE_ROWS * n - 1, "tiles: output too short"),
                (
                    &tile,
                    nb - 1,
                    TILE_ROWS * n,
                    "tiles: 15 blocks of 32 are not whole K-quant superblocks",
                ),
            ];
            for (t, nb, len, want) in cases {
                let err = std::panic::catch_unwind(|| {
                    let mut out = vec![0.0; len];
                    dot(t, nb, acts, stride, n, &mut out);
                })
                .expect_err(want);
                let msg = err
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()));
                assert_eq!(msg.as_deref(), Some(want), "{ty:?} {isa:?}");
            }
        }
    }
}

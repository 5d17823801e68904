//! Attention's inner loops over cached positions: one query against many
//! key rows ([`dot_rows`]), and the weighted sum of many value rows
//! ([`axpy_rows`]). Each output equals what the one-row [`super::dot`] and
//! [`super::axpy`] give, bit for bit (same products, same additions in the
//! same order, no fused multiply-add), so using them changes no result.
//! What changes is the schedule: several independent dots at once (one
//! dot's eight accumulators form a chain of dependent additions that the
//! one-row loop waits on), and the running sum kept in registers across
//! rows instead of stored and reloaded per row.

#[cfg(target_arch = "x86_64")]
mod x86;

use crate::isa::PerIsa;

pub type DotRowsFn = fn(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]);
pub type AxpyRowsFn = fn(acc: &mut [f32], w: &[f32], rows: &[f32], stride: usize);

/// The two row kernels of one instruction set.
#[derive(Clone, Copy)]
pub struct RowKernels {
    /// [`dot_rows`].
    pub dot_rows: DotRowsFn,
    /// [`axpy_rows`].
    pub axpy_rows: AxpyRowsFn,
}

/// The kernels of every set: AVX2 for both x86 sets (its eight lanes are
/// the reference's eight accumulators), scalar elsewhere.
pub(crate) const ROW_KERNELS: PerIsa<RowKernels> = {
    let k = PerIsa::new(RowKernels {
        dot_rows: dot_rows_ref,
        axpy_rows: axpy_rows_ref,
    });
    #[cfg(target_arch = "x86_64")]
    let k = k.avx2(RowKernels {
        dot_rows: dot_rows_avx2,
        axpy_rows: axpy_rows_avx2,
    });
    k
};

/// Row `p` of `rows` (`len` values from `p·stride`) exists for every `p <
/// n`: what the kernels rely on.
fn check_rows(rows: &[f32], stride: usize, len: usize, n: usize, what: &str) {
    assert!(
        len <= stride || n <= 1,
        "{what}: rows of {len} overlap at stride {stride}"
    );
    if n > 0 {
        let need = (n - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(len))
            .expect("rows span overflows");
        assert!(
            rows.len() >= need,
            "{what}: {n} rows of {len} at stride {stride} need {need} values, have {}",
            rows.len()
        );
    }
}

/// `out[p] = dot(q, rows[p·stride..p·stride + q.len()])` for `p <
/// out.len()`, each bit-identical to [`super::dot`].
pub fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    check_rows(rows, stride, q.len(), out.len(), "dot_rows");
    (crate::selected().rows.dot_rows)(q, rows, stride, out)
}

/// `acc[i] += w[p]·rows[p·stride + i]` for `p = 0, 1, …, w.len() - 1` in
/// turn, bit-identical to [`super::axpy`] per row.
pub fn axpy_rows(acc: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    check_rows(rows, stride, acc.len(), w.len(), "axpy_rows");
    (crate::selected().rows.axpy_rows)(acc, w, rows, stride)
}

/// The scalar twin of [`dot_rows`].
pub fn dot_rows_ref(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    check_rows(rows, stride, q.len(), out.len(), "dot_rows");
    for (p, o) in out.iter_mut().enumerate() {
        *o = super::dot(q, &rows[p * stride..p * stride + q.len()]);
    }
}

/// The scalar twin of [`axpy_rows`].
pub fn axpy_rows_ref(acc: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    check_rows(rows, stride, acc.len(), w.len(), "axpy_rows");
    let n = acc.len();
    for (p, &wp) in w.iter().enumerate() {
        super::axpy(acc, wp, &rows[p * stride..p * stride + n]);
    }
}

#[cfg(target_arch = "x86_64")]
fn dot_rows_avx2(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    check_rows(rows, stride, q.len(), out.len(), "dot_rows");
    // SAFETY: reachable only through `PerIsa::get` for an x86 set, whose
    // caller guarantees the CPU has AVX2; `check_rows` saw every row's
    // `q.len()` values inside `rows`.
    unsafe { x86::dot_rows_avx2(q, rows, stride, out) }
}

#[cfg(target_arch = "x86_64")]
fn axpy_rows_avx2(acc: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    check_rows(rows, stride, acc.len(), w.len(), "axpy_rows");
    // SAFETY: as in `dot_rows_avx2`, for rows of `acc.len()` values.
    unsafe { x86::axpy_rows_avx2(acc, w, rows, stride) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use rand::{Rng, SeedableRng};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn kernels_equal_one_row_at_a_time_bit_for_bit() {
        let mut r = rand::rngs::StdRng::seed_from_u64(5);
        for len in [0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100] {
            for n in [0, 1, 2, 3, 4, 5, 7, 8, 9, 17] {
                for pad in [0, 1, 5] {
                    let stride = len + pad;
                    let total = if n == 0 { 0 } else { (n - 1) * stride + len };
                    let rows: Vec<f32> = (0..total + r.gen_range(0..3))
                        .map(|_| r.gen_range(-3.0f32..3.0))
                        .collect();
                    let q: Vec<f32> = (0..len).map(|_| r.gen_range(-2.0f32..2.0)).collect();
                    let w: Vec<f32> = (0..n).map(|_| r.gen_range(0.0f32..1.0)).collect();
                    let start: Vec<f32> = (0..len).map(|_| r.gen_range(-1.0f32..1.0)).collect();
                    let mut want = vec![f32::NAN; n];
                    dot_rows_ref(&q, &rows, stride, &mut want);
                    let mut want_acc = start.clone();
                    axpy_rows_ref(&mut want_acc, &w, &rows, stride);
                    for isa in Isa::supported() {
                        let what = format!("{isa:?} len={len} n={n} stride={stride}");
                        let k = crate::table(isa).unwrap().rows;
                        let mut got = vec![f32::NAN; n];
                        (k.dot_rows)(&q, &rows, stride, &mut got);
                        assert_eq!(bits(&got), bits(&want), "dot_rows {what}");
                        let mut acc = start.clone();
                        (k.axpy_rows)(&mut acc, &w, &rows, stride);
                        assert_eq!(bits(&acc), bits(&want_acc), "axpy_rows {what}");
                    }
                    // The dispatched entry points too.
                    let mut got = vec![f32::NAN; n];
                    dot_rows(&q, &rows, stride, &mut got);
                    assert_eq!(bits(&got), bits(&want));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "need 10 values, have 9")]
    fn short_rows_are_refused() {
        let mut out = [0.0; 2];
        dot_rows(&[1.0; 4], &[0.0; 9], 6, &mut out);
    }
}

//! Element-wise ops with a fast polynomial `exp`, and attention of several
//! query heads sharing one small key/value head: what a small model's
//! decode spends its time on between matvecs, where `libm`'s `expf` and
//! `tanhf` (a call per element) and 18-wide heads would cost more than the
//! matrices.
//!
//! Every op is one plain body (loops over independent lanes, reductions
//! into 16 explicit lane accumulators) compiled three times: for AVX-512,
//! for AVX2+FMA and for the baseline target, listed in [`VecKernels`] per
//! set for the kernel tables ([`crate::Kernels::vecops`]). Rust never
//! contracts `a * b + c` into an FMA, attention's products are written as
//! explicit fused multiply-adds (`mul_add`: the FMA instruction where the
//! set has it, the exactly rounded libm `fmaf` on the baseline, slow but
//! the same bits), and so are [`exp`]'s (its range reduction and
//! polynomial: a third fewer vector operations than separate multiplies
//! and adds, where softmax, SiLU and tanh spend their time), and the
//! accumulation order is written out, so **all three give bit-identical
//! results**; only their speed differs.
//!
//! Accuracy: [`exp`] is within 2 ulp of the true value on its range (Cephes'
//! `expf` polynomial); `tanh`, SiLU and softmax inherit that.

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;

use crate::isa::PerIsa;
use half::f16;

// The constants of [`exp`] (shared with the SIMD kernels, which must
// compute the same bits).
const EXP_HI: f32 = 88.3;
const EXP_LO: f32 = -87.3;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5·2²³: adding it rounds to an integer kept in the low mantissa bits.
const SHIFT: f32 = 12_582_912.0;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// Bits of [`SHIFT`]: `t.to_bits() - SHIFT_BITS` is the rounded integer.
const SHIFT_BITS: i32 = 0x4B40_0000;

/// `e^x` by range reduction to `x = n·ln2 + r`, `|r| ≤ ln2/2`, and a
/// degree-6 polynomial (Cephes `expf`), each step one fused multiply-add.
/// Inputs are clamped to `[-87.3, 88.3]`, so the result is always finite
/// and positive (at least ~1e-38); NaN gives an unspecified finite value.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = if x > EXP_HI { EXP_HI } else { x };
    let x = if x < EXP_LO { EXP_LO } else { x };
    let t = x.mul_add(LOG2E, SHIFT);
    let n = t - SHIFT;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // 2ⁿ from n's bits in `t`.
    let n_int = (t.to_bits() as i32).wrapping_sub(SHIFT_BITS);
    y * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// `x · σ(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `tanh(x)` as `(1 - e^(-2|x|)) / (1 + e^(-2|x|))` with the sign of `x`:
/// absolute error below ~1e-7.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let e = exp(-2.0 * x.abs());
    let t = (1.0 - e) / (1.0 + e);
    if x < 0.0 {
        -t
    } else {
        t
    }
}

const LANES: usize = 16;
type Lanes = [f32; LANES];

/// Sum of 16 lanes in a fixed pairwise tree (8 + 8, 4 + 4, ...): four
/// vector steps, the same order on every instruction set.
#[inline(always)]
fn tree_sum(mut v: Lanes) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            v[l] += v[l + w];
        }
    }
    v[0]
}

/// Max of 16 lanes in the same tree.
#[inline(always)]
fn tree_max(mut v: Lanes) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            v[l] = if v[l + w] > v[l] { v[l + w] } else { v[l] };
        }
    }
    v[0]
}

/// Max of `x` (−∞ when empty): lane `i % 16` per element, then the tree.
#[inline(always)]
fn max16(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] = if c[k] > acc[k] { c[k] } else { acc[k] };
        }
    }
    for (k, &v) in rest.iter().enumerate() {
        acc[k] = if v > acc[k] { v } else { acc[k] };
    }
    tree_max(acc)
}

/// Σ `x[i]`: lane `i % 16` per element, then the tree.
#[inline(always)]
fn sum16(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] += c[k];
        }
    }
    for (k, &v) in rest.iter().enumerate() {
        acc[k] += v;
    }
    tree_sum(acc)
}

/// 16 values of `row` from `p0` as f32, zeros past its end.
#[inline(always)]
fn load16<T: KvElement>(row: &[T], p0: usize) -> Lanes {
    let mut v = [0.0; LANES];
    match row.get(p0..p0 + LANES) {
        Some(c) => {
            for (o, &x) in v.iter_mut().zip(c) {
                *o = x.widen();
            }
        }
        None => {
            for (o, &x) in v.iter_mut().zip(&row[p0.min(row.len())..]) {
                *o = x.widen();
            }
        }
    }
    v
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// The element types [`attend`] reads keys and values in: f32, or f16
/// (widened exactly as it is loaded).
pub trait KvElement: Copy + sealed::Sealed {
    /// Stored as IEEE half precision.
    const HALF: bool;
    fn widen(self) -> f32;
}

impl KvElement for f32 {
    const HALF: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl KvElement for half::f16 {
    const HALF: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self.to_bits())
    }
}

/// IEEE half → single, exact, branch-free (so loops over it vectorize;
/// `half`'s conversion is a call per element without F16C at build time).
/// Equals `vcvtph2ps` for every input but signalling NaNs (not quieted).
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    // Normal: rebias the exponent (15 → 127); inf/NaN: all ones.
    let normal = f32::from_bits(sign | ((exp + 112) << 23) | (man << 13));
    let special = f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    // Zero or subnormal: man · 2⁻²⁴, exact.
    let tiny = f32::from_bits(sign | (man as f32 * 5.960_464_5e-8).to_bits());
    if exp == 0 {
        tiny
    } else if exp == 31 {
        special
    } else {
        normal
    }
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[inline(always)]
fn softcap_body(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x.iter_mut() {
        *v = cap * tanh(*v * inv);
    }
}

#[inline(always)]
fn softmax_body(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let m = max16(x);
    for v in x.iter_mut() {
        *v = exp(*v - m);
    }
    let inv = 1.0 / sum16(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Check an [`Attention`] call's shapes; returns `(n_heads, sp)`, `sp`
/// the scores row stride (`first + n_pos` rounded up to 16).
#[inline(always)]
fn check<T: KvElement>(
    a: &Attention<'_, T>,
    scores: &[f32],
    out: &[f32],
    stats: &[f32],
) -> (usize, usize) {
    let (hd, n, stride) = (a.head_dim, a.n_pos, a.stride);
    let nh = a.q.len() / hd.max(1);
    assert!(
        hd > 0 && nh > 0 && a.q.len() == nh * hd && out.len() == a.q.len(),
        "attend: q and out must be whole heads of the same size"
    );
    assert!(
        stats.len() == 2 * nh,
        "attend: stats takes a maximum and a sum per head"
    );
    assert!(
        a.first < KEY_BLOCK && n >= 1 && a.first + n <= stride,
        "attend: positions {}..{} of a stride of {stride}",
        a.first,
        a.first + n
    );
    assert!(
        a.head_pos.is_empty()
            || (a.head_pos.len() == nh && a.head_pos.iter().all(|&k| k >= 1 && k <= n)),
        "attend: head_pos takes one count per head, from 1 to n_pos"
    );
    let sp = scores_len(a.first + n);
    assert!(
        a.keys.len() >= sp * hd,
        "attend: keys shorter than the blocks of 16 positions they are read in"
    );
    assert!(
        a.values.len() >= (hd - 1) * stride + a.first + n,
        "attend: values shorter than head_dim rows of the stride"
    );
    assert!(
        scores.len() >= nh * sp,
        "attend: scores need n_heads × (first + n_pos rounded up to 16) floats"
    );
    (nh, sp)
}

/// Where head `h`'s positions end (see [`Attention::head_pos`]).
#[inline(always)]
fn head_end<T: KvElement>(a: &Attention<'_, T>, h: usize) -> usize {
    a.first + a.head_pos.get(h).copied().unwrap_or(a.n_pos)
}

/// `Σ_p w[p]·v[p]` over whole 16-lane chunks (lane `p % 16`), then the
/// tree; `v` is read as zeros before `from` and past its end.
#[inline(always)]
fn dot_padded<T: KvElement>(w: &[f32], v: &[T], from: usize) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut p0 = 0;
    while p0 < w.len() {
        let (wc, mut vc) = (load16(w, p0), load16(v, p0));
        for (l, x) in vc.iter_mut().enumerate() {
            if p0 + l < from {
                *x = 0.0;
            }
        }
        for l in 0..LANES {
            acc[l] = wc[l].mul_add(vc[l], acc[l]);
        }
        p0 += LANES;
    }
    tree_sum(acc)
}

/// Attention of several query heads over one key/value head, see
/// [`attend`]: the reference for the AVX-512 and AVX2 kernels, which must give the
/// same bits. Per head: scores over positions (summed over dimensions in
/// order, positions in the vector lanes), softmax over rows padded to 16
/// lanes (zeros outside `first..first + n_pos`), then each output
/// dimension as a dot over positions.
#[inline(always)]
fn attend_body<T: KvElement>(
    a: &Attention<'_, T>,
    scores: &mut [f32],
    out: &mut [f32],
    stats: &mut [f32],
) {
    let (nh, sp) = check(a, scores, out, stats);
    let (hd, stride) = (a.head_dim, a.stride);
    let from = a.first;
    for (h, ((s, oh), st)) in scores
        .chunks_exact_mut(sp)
        .zip(out.chunks_exact_mut(hd))
        .zip(stats.chunks_exact_mut(2))
        .take(nh)
        .enumerate()
    {
        let end = head_end(a, h);
        s.fill(0.0);
        // Block b holds positions 16b.. as (head_dim, 16).
        for (b, (sb, kb)) in s
            .chunks_exact_mut(KEY_BLOCK)
            .zip(a.keys.chunks_exact(KEY_BLOCK * hd))
            .enumerate()
        {
            let lanes = from.saturating_sub(b * KEY_BLOCK)
                ..end.saturating_sub(b * KEY_BLOCK).min(KEY_BLOCK);
            for i in 0..hd {
                let qs = a.q[h * hd + i] * a.scale;
                let k = &kb[i * KEY_BLOCK..][..KEY_BLOCK];
                for l in lanes.clone() {
                    sb[l] = qs.mul_add(k[l].widen(), sb[l]);
                }
            }
        }
        if a.softcap > 0.0 {
            softcap_body(&mut s[from..end], a.softcap);
        }
        s[..from].fill(f32::NEG_INFINITY);
        s[end..].fill(f32::NEG_INFINITY);
        let m = max16(s);
        for v in s.iter_mut() {
            *v = exp(*v - m);
        }
        s[..from].fill(0.0);
        s[end..].fill(0.0);
        let sum = sum16(s);
        st.copy_from_slice(&[m, sum]);
        let inv = 1.0 / sum;
        for v in s.iter_mut() {
            *v *= inv;
        }
        for (i, o) in oh.iter_mut().enumerate() {
            *o = dot_padded(s, &a.values[i * stride..i * stride + end], from);
        }
    }
}

/// The geometry of one call of the x86 attention kernels: `sp` floats per
/// row of scores, `chunks` of 16 positions, the lanes of the first and last
/// chunk that are attended to (`first..` and `..first + n_pos`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Shape {
    hd: usize,
    stride: usize,
    sp: usize,
    chunks: usize,
    first: u16,
    last: u16,
}

#[cfg(target_arch = "x86_64")]
impl Shape {
    /// The attended lanes of chunk `c`.
    #[inline(always)]
    fn mask(&self, c: usize) -> u16 {
        let m = if c == 0 { self.first } else { !0 };
        if c + 1 == self.chunks {
            m & self.last
        } else {
            m
        }
    }

    /// The lanes of the chunk holding position `end - 1` below `end`.
    fn last_lanes(end: usize) -> u16 {
        if end.is_multiple_of(16) {
            !0
        } else {
            (1u16 << (end % 16)) - 1
        }
    }
}

/// Positions per block of keys ([`Attention::keys`]).
pub const KEY_BLOCK: usize = 16;

/// Where dimension `i` of position `p` is in keys stored in blocks of
/// [`KEY_BLOCK`] positions, `(blocks, head_dim, 16)`.
#[inline(always)]
pub fn key_index(head_dim: usize, p: usize, i: usize) -> usize {
    (p / KEY_BLOCK) * KEY_BLOCK * head_dim + i * KEY_BLOCK + p % KEY_BLOCK
}

/// Several query heads attending over the same key/value head (multi-query
/// attention, or one group of grouped-query attention). Keys are stored in
/// blocks of 16 positions, so the score pass reads one sequential stream
/// (a block is `head_dim` rows of 16 lanes); values are stored transposed,
/// row `i` holding dimension `i` of every position, so the value pass
/// reads a few long rows. Each step works on 16 positions at once whatever
/// the head size. Keys and values are f32 or f16 ([`KvElement`]).
pub struct Attention<'a, T: KvElement = f32> {
    /// `(n_heads, head_dim)` queries.
    pub q: &'a [f32],
    pub head_dim: usize,
    /// `(blocks, head_dim, 16)` keys: dimension `i` of position `p` at
    /// [`key_index`]`(head_dim, p, i)`; blocks are read whole.
    pub keys: &'a [T],
    /// `(head_dim, stride)` values: dimension `i` of position `p` at
    /// `i·stride + p`.
    pub values: &'a [T],
    pub stride: usize,
    /// Positions `first..first + n_pos` are attended to; `first < 16`
    /// (a sliding window starts inside the first block), `first + n_pos ≤
    /// stride`.
    pub first: usize,
    pub n_pos: usize,
    /// Per head, how many of those positions it attends to (a prefix, at
    /// least one): several consecutive tokens' heads in one call, each
    /// causal, sharing every key and value load. Empty: all `n_pos`. A
    /// head gives the same bits either way.
    pub head_pos: &'a [usize],
    /// Multiplies the scores (`1/√head_dim`).
    pub scale: f32,
    /// `cap · tanh(s / cap)` of the scaled scores before the softmax
    /// (Gemma 2), 0 for none.
    pub softcap: f32,
}

/// An attention kernel: `(call, scores, out, stats)`, see [`attend`].
pub type AttendFn<T> = fn(&Attention<'_, T>, &mut [f32], &mut [f32], &mut [f32]);

/// The ops of one instruction set (the free functions below run the
/// selected set's).
#[derive(Clone, Copy)]
pub struct VecKernels {
    /// [`swiglu`].
    pub swiglu: fn(&mut [f32], &[f32]),
    /// [`softcap`].
    pub softcap: fn(&mut [f32], f32),
    /// [`softmax`].
    pub softmax: fn(&mut [f32]),
    /// [`attend`].
    pub attend: AttendFn<f32>,
    /// [`attend_f16`].
    pub attend_f16: AttendFn<f16>,
}

const SCALAR: VecKernels = VecKernels {
    swiglu: swiglu_body,
    softcap: softcap_body,
    softmax: softmax_body,
    attend: attend_body,
    attend_f16: attend_body,
};

/// The bodies compiled for one x86 feature set, with safe wrappers.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_table {
    ($modname:ident, $features:literal, $attend:path) => {
        mod $modname {
            use super::*;

            #[target_feature(enable = $features)]
            fn swiglu(g: &mut [f32], u: &[f32]) {
                swiglu_body(g, u)
            }
            #[target_feature(enable = $features)]
            fn softcap(x: &mut [f32], cap: f32) {
                softcap_body(x, cap)
            }
            #[target_feature(enable = $features)]
            fn softmax(x: &mut [f32]) {
                softmax_body(x)
            }
            #[target_feature(enable = $features)]
            fn attend(a: &Attention<'_>, s: &mut [f32], o: &mut [f32], st: &mut [f32]) {
                $attend(a, s, o, st)
            }
            #[target_feature(enable = $features)]
            fn attend_f16(a: &Attention<'_, f16>, s: &mut [f32], o: &mut [f32], st: &mut [f32]) {
                $attend(a, s, o, st)
            }

            // The SAFETY of every call below: this table is reachable
            // only through `PerIsa::get` for the set these features make
            // up, whose caller guarantees the CPU has them; the bodies are
            // safe code otherwise.
            pub(super) const TABLE: VecKernels = VecKernels {
                // SAFETY: see above.
                swiglu: |g, u| unsafe { swiglu(g, u) },
                // SAFETY: see above.
                softcap: |x, c| unsafe { softcap(x, c) },
                // SAFETY: see above.
                softmax: |x| unsafe { softmax(x) },
                // SAFETY: see above.
                attend: |a, s, o, st| unsafe { attend(a, s, o, st) },
                // SAFETY: see above.
                attend_f16: |a, s, o, st| unsafe { attend_f16(a, s, o, st) },
            };
        }
    };
}

#[cfg(target_arch = "x86_64")]
x86_table!(avx2, "avx2,fma,f16c", x86_avx2::attend_avx2);
#[cfg(target_arch = "x86_64")]
x86_table!(
    avx512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma",
    x86::attend_avx512
);

/// The ops of every set.
pub(crate) const KERNELS: PerIsa<VecKernels> = {
    let k = PerIsa::new(SCALAR);
    #[cfg(target_arch = "x86_64")]
    let k = k.avx2(avx2::TABLE).avx512(avx512::TABLE);
    k
};

fn selected() -> &'static VecKernels {
    &crate::selected().vecops
}

/// `gate[i] = silu(gate[i]) · up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    (selected().swiglu)(gate, up)
}

/// `x[i] = cap · tanh(x[i] / cap)` (a logit soft cap; `cap > 0`).
pub fn softcap(x: &mut [f32], cap: f32) {
    (selected().softcap)(x, cap)
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    (selected().softmax)(x)
}

/// `out[h] = softmax(scale · q[h]·K) · V` for every query head `h` of
/// `a.q`; `scores` is a work area of at least `n_heads ×` [`scores_len`]
/// floats, `out` is `(n_heads, head_dim)`, `stats` gets each head's
/// softmax maximum and sum of exponentials, `(n_heads, 2)` (what combining
/// this result with another range of positions' needs).
///
/// Panics if the shapes disagree.
pub fn attend(a: &Attention<'_>, scores: &mut [f32], out: &mut [f32], stats: &mut [f32]) {
    (selected().attend)(a, scores, out, stats)
}

/// Floats of [`attend`]'s work area per query head for `n_pos` positions
/// (`first + n_pos` of an [`Attention`]).
pub fn scores_len(n_pos: usize) -> usize {
    n_pos.next_multiple_of(LANES)
}

/// [`attend`] for keys and values stored as f16 (each widened exactly as
/// it is loaded: the result equals [`attend`] on the widened rows).
pub fn attend_f16(a: &Attention<'_, f16>, scores: &mut [f32], out: &mut [f32], stats: &mut [f32]) {
    (selected().attend_f16)(a, scores, out, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::quant::testing::{rng, weights};
    use rand::Rng;

    /// The ops of `isa`, a set this CPU supports.
    fn ops(isa: Isa) -> VecKernels {
        crate::table(isa).unwrap().vecops
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn f16_widening_is_exact() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (got, want) = (f16_to_f32(bits), h.to_f32());
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let err = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(err);
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite());
        for x in [-3.0f32, -0.5, 0.0, 0.25, 2.0, 9.0, 40.0] {
            let t = (x as f64).tanh();
            assert!((tanh(x) as f64 - t).abs() < 2e-7, "tanh({x})");
            assert!((tanh(-x) as f64 + t).abs() < 2e-7, "tanh(-{x})");
            let s = x as f64 / (1.0 + (-x as f64).exp());
            assert!(
                (silu(x) as f64 - s).abs() < 1e-6 * (1.0 + s.abs()),
                "silu({x})"
            );
        }
    }

    #[test]
    fn ops_match_f64_and_agree_across_isas() {
        for n in [1, 2, 15, 16, 17, 33, 144, 396, 1001] {
            let mut r = rng(n as u64);
            let g: Vec<f32> = weights(&mut r, n).iter().map(|v| v * 4.0).collect();
            let u = weights(&mut r, n);
            let mut want_sw = g.clone();
            (ops(Isa::Scalar).swiglu)(&mut want_sw, &u);
            let mut want_cap: Vec<f32> = g.iter().map(|v| v * 20.0).collect();
            let cap_in = want_cap.clone();
            (ops(Isa::Scalar).softcap)(&mut want_cap, 30.0);
            let mut want_sm = g.clone();
            (ops(Isa::Scalar).softmax)(&mut want_sm);
            let z: f64 = g.iter().map(|&v| (v as f64).exp()).sum();
            for i in 0..n {
                let (x, y) = (g[i] as f64, u[i] as f64);
                let sw = x / (1.0 + (-x).exp()) * y;
                assert!((want_sw[i] as f64 - sw).abs() <= 1e-6 * (1.0 + sw.abs()));
                let c = 30.0 * (cap_in[i] as f64 / 30.0).tanh();
                assert!(
                    (want_cap[i] as f64 - c).abs() <= 1e-5,
                    "{} vs {c}",
                    want_cap[i]
                );
                let sm = x.exp() / z;
                assert!((want_sm[i] as f64 - sm).abs() <= 1e-6 * sm + 1e-9);
            }
            for isa in Isa::supported() {
                let mut sw = g.clone();
                (ops(isa).swiglu)(&mut sw, &u);
                assert_eq!(bits(&sw), bits(&want_sw), "{isa:?} swiglu n={n}");
                let mut c = cap_in.clone();
                (ops(isa).softcap)(&mut c, 30.0);
                assert_eq!(bits(&c), bits(&want_cap), "{isa:?} softcap n={n}");
                let mut sm = g.clone();
                (ops(isa).softmax)(&mut sm);
                assert_eq!(bits(&sm), bits(&want_sm), "{isa:?} softmax n={n}");
            }
        }
    }

    /// Keys `(hd, stride)` by columns, in the blocks of 16 positions
    /// [`Attention::keys`] reads (zeros past `stride`).
    fn blocked<T: Copy + Default>(cols: &[T], hd: usize, stride: usize) -> Vec<T> {
        let mut out = vec![T::default(); stride.next_multiple_of(KEY_BLOCK) * hd];
        for i in 0..hd {
            for p in 0..stride {
                out[key_index(hd, p, i)] = cols[i * stride + p];
            }
        }
        out
    }

    /// `softmax(scale · q·K) · V` in f64 over positions `first..first + n`
    /// of column-stored keys and values, the scores soft-capped when
    /// `cap > 0`; and per head the maximum score and the sum of
    /// exponentials.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        hd: usize,
        keys: &[f32],
        values: &[f32],
        stride: usize,
        positions: std::ops::Range<usize>,
        scale: f64,
        cap: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut out, mut stats) = (vec![], vec![]);
        for qh in q.chunks_exact(hd) {
            let s: Vec<f64> = positions
                .clone()
                .map(|p| {
                    let d = (0..hd)
                        .map(|i| qh[i] as f64 * keys[i * stride + p] as f64)
                        .sum::<f64>()
                        * scale;
                    if cap > 0.0 {
                        cap * (d / cap).tanh()
                    } else {
                        d
                    }
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            stats.extend([m, z]);
            for i in 0..hd {
                let o: f64 = positions
                    .clone()
                    .zip(&e)
                    .map(|(p, e)| e * values[i * stride + p] as f64)
                    .sum();
                out.push(o / z);
            }
        }
        (out, stats)
    }

    /// Attention against a plain f64 computation, and identical across
    /// kernel sets, for head sizes and position counts around the lanes,
    /// from the start of the rows or from inside the first block (a
    /// sliding window).
    #[test]
    fn attention_matches_reference() {
        for (hd, nh, first, n_pos, stride) in [
            (18, 8, 0, 1, 1),
            (18, 8, 0, 17, 40),
            (18, 8, 5, 17, 40),
            (6, 4, 0, 33, 33),
            (6, 4, 15, 18, 33),
            (18, 8, 0, 1000, 1024),
            (18, 8, 9, 1000, 1024),
            (1, 1, 0, 5, 5),
            (1, 1, 3, 1, 5),
            // Every head-block size (8, 4, 3, 2, 1 for scores; 4, 3, 2, 1
            // for values), chunk counts that leave single chunks after the
            // blocks of 2, 4 or 8, and dimensions that end a value block
            // early.
            (64, 3, 0, 1025, 1088),
            (64, 3, 7, 1025, 1088),
            (64, 9, 0, 70, 80),
            (7, 5, 0, 49, 50),
            (13, 7, 0, 130, 131),
            (13, 7, 1, 130, 131),
            (5, 6, 0, 65, 70),
            (3, 12, 0, 100, 100),
            (20, 1, 0, 129, 130),
            (20, 1, 14, 116, 130),
            (9, 2, 0, 16, 16),
            (9, 2, 4, 12, 16),
            (11, 15, 0, 200, 203),
            (11, 15, 2, 200, 203),
        ] {
            let mut r = rng((hd * 1000 + n_pos + first) as u64);
            let q = weights(&mut r, nh * hd);
            let keys: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let values: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let kb = blocked(&keys, hd, stride);
            let a = Attention {
                q: &q,
                head_dim: hd,
                keys: &kb,
                values: &values,
                stride,
                first,
                n_pos,
                head_pos: &[],
                scale: 1.0 / (hd as f32).sqrt(),
                softcap: 0.0,
            };
            let mut scores = vec![f32::NAN; nh * scores_len(first + n_pos)];
            let mut want = vec![f32::NAN; nh * hd];
            let (mut want_st, mut st) = (vec![f32::NAN; 2 * nh], vec![f32::NAN; 2 * nh]);
            (ops(Isa::Scalar).attend)(&a, &mut scores, &mut want, &mut want_st);
            let scale = 1.0 / (hd as f64).sqrt();
            let (f64_out, f64_st) = reference(
                &q,
                hd,
                &keys,
                &values,
                stride,
                first..first + n_pos,
                scale,
                0.0,
            );
            for (k, (&got, &o)) in want_st.iter().zip(&f64_st).enumerate() {
                assert!(
                    (got as f64 - o).abs() < 1e-5 * o.abs().max(1.0),
                    "hd {hd} first {first} n {n_pos} stat {k}: {got} vs {o}"
                );
            }
            for (k, (&got, &o)) in want.iter().zip(&f64_out).enumerate() {
                assert!(
                    (got as f64 - o).abs() < 2e-5,
                    "hd {hd} first {first} n {n_pos} head {} dim {}: {got} vs {o}",
                    k / hd,
                    k % hd
                );
            }
            for isa in Isa::supported() {
                let mut out = vec![f32::NAN; nh * hd];
                (ops(isa).attend)(&a, &mut scores, &mut out, &mut st);
                assert_eq!(
                    bits(&out),
                    bits(&want),
                    "{isa:?} hd {hd} first {first} n {n_pos}"
                );
                assert_eq!(bits(&st), bits(&want_st), "{isa:?} stats");
            }
            let mut out = vec![f32::NAN; nh * hd];
            attend(&a, &mut scores, &mut out, &mut st);
            assert_eq!(bits(&out), bits(&want));
            assert_eq!(bits(&st), bits(&want_st));

            // f16 keys and values: the same bits as f32 rows holding the
            // widened values.
            let (k16, v16): (Vec<f16>, Vec<f16>) = (
                kb.iter().map(|&x| f16::from_f32(x)).collect(),
                values.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            let (kw, vw): (Vec<f32>, Vec<f32>) = (
                k16.iter().map(|x| x.to_f32()).collect(),
                v16.iter().map(|x| x.to_f32()).collect(),
            );
            let wide = Attention {
                keys: &kw,
                values: &vw,
                ..a
            };
            let mut want16 = vec![f32::NAN; nh * hd];
            (ops(Isa::Scalar).attend)(&wide, &mut scores, &mut want16, &mut st);
            let half_a = Attention {
                q: &q,
                head_dim: hd,
                keys: &k16,
                values: &v16,
                stride,
                first,
                n_pos,
                head_pos: &[],
                scale: a.scale,
                softcap: 0.0,
            };
            for isa in Isa::supported() {
                let mut out = vec![f32::NAN; nh * hd];
                (ops(isa).attend_f16)(&half_a, &mut scores, &mut out, &mut st);
                assert_eq!(
                    bits(&out),
                    bits(&want16),
                    "{isa:?} f16 hd {hd} first {first} n {n_pos}"
                );
            }
        }
    }

    /// Positions outside `first..first + n_pos` are not read: NaN there
    /// changes nothing.
    #[test]
    fn attention_reads_only_its_positions() {
        let (hd, nh, first, n_pos, stride) = (8, 3, 5, 20, 40);
        let mut r = rng(11);
        let q = weights(&mut r, nh * hd);
        let keys: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
        let values: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
        let poison = |x: &[f32]| -> Vec<f32> {
            let mut y = x.to_vec();
            for i in 0..hd {
                for p in (0..first).chain(first + n_pos..stride) {
                    y[i * stride + p] = f32::NAN;
                }
            }
            y
        };
        for isa in Isa::supported() {
            let mut outs = vec![];
            for (k, v) in [
                (keys.clone(), values.clone()),
                (poison(&keys), poison(&values)),
            ] {
                let kb = blocked(&k, hd, stride);
                let a = Attention {
                    q: &q,
                    head_dim: hd,
                    keys: &kb,
                    values: &v,
                    stride,
                    first,
                    n_pos,
                    head_pos: &[],
                    scale: 0.3,
                    softcap: 0.0,
                };
                let mut scores = vec![f32::NAN; nh * scores_len(first + n_pos)];
                let mut out = vec![f32::NAN; nh * hd];
                let mut st = vec![f32::NAN; 2 * nh];
                (ops(isa).attend)(&a, &mut scores, &mut out, &mut st);
                outs.push((bits(&out), bits(&st)));
            }
            assert_eq!(outs[0], outs[1], "{isa:?}");
        }
    }

    /// Several tokens' heads in one call, each over its own prefix of the
    /// positions (`head_pos`): every head gets the bits of a call of its
    /// own over just its positions, on every set, f32 and f16, with and
    /// without a soft cap, a window starting inside a block, and scores
    /// work areas holding NaN.
    #[test]
    fn heads_over_their_own_prefixes_match_separate_calls() {
        let mut r = rng(17);
        for (hd, first, n_pos, counts) in [
            (
                8usize,
                0usize,
                37usize,
                vec![30usize, 37, 1, 16, 17, 33, 36, 2, 37],
            ),
            (18, 5, 20, vec![20, 11, 3, 19]),
            (64, 0, 64, vec![49, 50, 51, 52, 61, 62, 63, 64, 64, 1, 2, 3]),
        ] {
            let nh = counts.len();
            let stride = (first + n_pos + 9).next_multiple_of(KEY_BLOCK);
            let q = weights(&mut r, nh * hd);
            let keys: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let values: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let kb = blocked(&keys, hd, stride);
            let k16: Vec<f16> = kb.iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            for cap in [0.0, 7.5] {
                for isa in Isa::supported() {
                    let k = ops(isa);
                    let mut scores = vec![f32::NAN; nh * scores_len(first + n_pos)];
                    let (mut out, mut st) = (vec![f32::NAN; nh * hd], vec![f32::NAN; 2 * nh]);
                    let (mut out16, mut st16) = (out.clone(), st.clone());
                    let a = Attention {
                        q: &q,
                        head_dim: hd,
                        keys: &kb,
                        values: &values,
                        stride,
                        first,
                        n_pos,
                        head_pos: &counts,
                        scale: 0.4,
                        softcap: cap,
                    };
                    (k.attend)(&a, &mut scores, &mut out, &mut st);
                    let a16 = Attention {
                        keys: &k16,
                        values: &v16,
                        head_pos: &counts,
                        q: &q,
                        head_dim: hd,
                        stride,
                        first,
                        n_pos,
                        scale: 0.4,
                        softcap: cap,
                    };
                    (k.attend_f16)(&a16, &mut scores, &mut out16, &mut st16);
                    for (h, &n) in counts.iter().enumerate() {
                        let qh = &q[h * hd..(h + 1) * hd];
                        let mut s1 = vec![f32::NAN; scores_len(first + n)];
                        let (mut o1, mut t1) = (vec![f32::NAN; hd], vec![f32::NAN; 2]);
                        let one = Attention {
                            q: qh,
                            n_pos: n,
                            head_pos: &[],
                            ..a
                        };
                        (k.attend)(&one, &mut s1, &mut o1, &mut t1);
                        let what = format!("{isa:?} hd {hd} head {h} of {n} cap {cap}");
                        assert_eq!(bits(&out[h * hd..][..hd]), bits(&o1), "{what}");
                        assert_eq!(bits(&st[2 * h..][..2]), bits(&t1), "{what}");
                        let one16 = Attention {
                            q: qh,
                            n_pos: n,
                            head_pos: &[],
                            ..a16
                        };
                        (k.attend_f16)(&one16, &mut s1, &mut o1, &mut t1);
                        assert_eq!(bits(&out16[h * hd..][..hd]), bits(&o1), "f16 {what}");
                        assert_eq!(bits(&st16[2 * h..][..2]), bits(&t1), "f16 {what}");
                    }
                }
            }
        }
    }

    /// Gemma 2's soft cap on the scores: the scalar body against an f64
    /// reference, every set bit-equal to it, for odd sizes and tails.
    #[test]
    fn attend_softcap_matches_reference_and_sets_agree() {
        for (hd, nh, first, n_pos, stride) in [
            (16, 3, 0, 37, 40),
            (16, 3, 6, 31, 40),
            (64, 8, 0, 129, 130),
            (5, 1, 0, 3, 3),
        ] {
            let mut r = rng((hd * 7 + n_pos) as u64);
            let q: Vec<f32> = weights(&mut r, nh * hd).iter().map(|v| v * 8.0).collect();
            let keys: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let values: Vec<f32> = (0..hd * stride).map(|_| r.gen_range(-2.0..2.0)).collect();
            let kb = blocked(&keys, hd, stride);
            let cap = 5.0f32;
            let a = Attention {
                q: &q,
                head_dim: hd,
                keys: &kb,
                values: &values,
                stride,
                first,
                n_pos,
                head_pos: &[],
                scale: 0.5,
                softcap: cap,
            };
            let mut scores = vec![f32::NAN; nh * scores_len(first + n_pos)];
            let mut want = vec![f32::NAN; nh * hd];
            let (mut want_st, mut st) = (vec![f32::NAN; 2 * nh], vec![f32::NAN; 2 * nh]);
            (ops(Isa::Scalar).attend)(&a, &mut scores, &mut want, &mut want_st);
            let positions = first..first + n_pos;
            let (f64_out, f64_st) =
                reference(&q, hd, &keys, &values, stride, positions, 0.5, cap as f64);
            for (k, (&got, &o)) in want_st.iter().zip(&f64_st).enumerate() {
                assert!(
                    (got as f64 - o).abs() < 1e-4 * o.abs().max(1.0),
                    "hd {hd} n {n_pos} stat {k}: {got} vs {o}"
                );
            }
            for (k, (&got, &o)) in want.iter().zip(&f64_out).enumerate() {
                assert!(
                    (got as f64 - o).abs() < 1e-4,
                    "hd {hd} n {n_pos} head {} dim {}: {got} vs {o}",
                    k / hd,
                    k % hd
                );
            }
            for isa in Isa::supported() {
                let mut out = vec![f32::NAN; nh * hd];
                (ops(isa).attend)(&a, &mut scores, &mut out, &mut st);
                assert_eq!(bits(&out), bits(&want), "{isa:?} hd {hd} n {n_pos}");
                assert_eq!(bits(&st), bits(&want_st), "{isa:?} stats");
            }
        }
    }
}

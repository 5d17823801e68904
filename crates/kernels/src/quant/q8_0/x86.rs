//! x86-64 dots for Q8_0 · Q8_0, and the helpers every legacy type's x86
//! kernels share.
//!
//! Two integer strategies:
//! - AVX2 has only `maddubs` (u8 × i8 → saturating i16 pairs). Types whose
//!   quants are small unsigned values (Q4_x, Q5_x) feed them straight in and
//!   subtract the zero point times Σy; signed 8-bit types use the sign trick
//!   (|x| × sign(y, x)), exact while y ≠ -128 (true of quantizer output).
//! - AVX-512 VNNI `dpbusd` (u8 × i8 summed in groups of four into i32) has
//!   no i16 stage, so every type is made unsigned by an offset c and
//!   corrected with c·Σy from a second `dpbusd`: exact for all inputs.
//!
//! Each block contributes `scale · lanes` to an f32 accumulator with FMA;
//! the horizontal sum happens once at the end. AVX2 kernels take two blocks
//! per iteration into two accumulators and convert both blocks' scales with
//! one `vcvtph2ps`. The AVX-512 kernels put two
//! blocks in one 512-bit register (block 0 in the low 256 bits).

use super::BlockQ8_0;
use core::arch::x86_64::*;
use half::f16;

// --- helpers usable from both kernel sets (AVX2 features only) -----------

/// One half to f32: for once-per-call tails only (see [`f16x4`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// Four f16 values converted in one instruction, `a` in lane 0.
///
/// The scales go through one 64-bit integer on purpose: when LLVM converts
/// a single half it inserts it into whatever register is free, often the
/// accumulator, and the false dependency serialises the whole loop. With all
/// four lanes used it must build the vector from scratch (`vmovq`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16x4(a: f16, b: f16, c: f16, d: f16) -> __m128 {
    let bits = a.to_bits() as u64
        | (b.to_bits() as u64) << 16
        | (c.to_bits() as u64) << 32
        | (d.to_bits() as u64) << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
}

/// Block scales x0·y0 and x1·y1 in lanes 0 and 2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scales2(x0: f16, y0: f16, x1: f16, y1: f16) -> __m128 {
    let v = f16x4(x0, y0, x1, y1);
    _mm_mul_ps(v, _mm_movehdup_ps(v))
}

/// Lane `i` (< 4) of `v` in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn splat_lane(v: __m128, i: i32) -> __m256 {
    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_i8x32(q: &[i8; 32]) -> __m256i {
    // SAFETY: the reference covers 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_u8x16(q: &[u8; 16]) -> __m128i {
    // SAFETY: the reference covers 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(q.as_ptr().cast()) }
}

/// 16 packed bytes → 32 nibbles: low nibbles in bytes 0..16, high nibbles in
/// 16..32 (ggml's element order for 4-bit blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn nibbles_32(q: &[u8; 16]) -> __m256i {
    let b = load_u8x16(q);
    let both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits → 32 bytes, 0xFF where the bit is set (bit j → byte j).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bytes_from_bits_32(bits: u32) -> __m256i {
    // Byte j gets source byte j/8, then keeps only bit j%8 by OR-ing every
    // other bit to 1 and testing for all-ones.
    let spread = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// Bit `j` of each byte of a fifth-bit plane as that byte's fifth bit:
/// 16 or 0. The 16-bit shifts move bits across the bytes of a pair, but
/// never into bit 4 (at most 4 places left, 3 right).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fifth_bits(plane: __m256i, j: usize) -> __m256i {
    let at4 = match j {
        0 => _mm256_slli_epi16::<4>(plane),
        1 => _mm256_slli_epi16::<3>(plane),
        2 => _mm256_slli_epi16::<2>(plane),
        3 => _mm256_slli_epi16::<1>(plane),
        4 => plane,
        5 => _mm256_srli_epi16::<1>(plane),
        6 => _mm256_srli_epi16::<2>(plane),
        _ => _mm256_srli_epi16::<3>(plane),
    };
    _mm256_and_si256(at4, _mm256_set1_epi8(16))
}

/// Σ x·y over groups of four bytes → 8 i32 lanes, for unsigned x against
/// signed y as long as no pair x0·y0 + x1·y1 leaves i16 (true for x ≤ 128
/// with |y| ≤ 127, or x ≤ 127 with any y).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u8_i8(xu: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(xu, y), _mm256_set1_epi16(1))
}

/// Σ (xu - c)·y for unsigned xu ≤ 31 and zero point c ≤ 16, exact for any y:
/// both i16 pair sums stay below 2·31·128 and their difference below 2^14.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_offset_u8_i8(xu: __m256i, c: __m256i, y: __m256i) -> __m256i {
    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(xu, y), _mm256_maddubs_epi16(c, y));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Σ x·y for signed x and y → 8 i32 lanes via |x|·sign(y, x). Exact unless
/// y holds -128 where x < 0 (activations from the quantizer never do).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Σ y over groups of four bytes → 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn sum_i8(y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_set1_epi8(1), y)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_f32x8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_i32x8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

// --- AVX-512 helpers -------------------------------------------------------

/// Two 256-bit halves → one 512-bit register, `lo` in the low half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn pair_i(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Lane `i` of `v` in the low 8 lanes, lane `j` in the high 8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn splat_lanes(v: __m128, i: i32, j: i32) -> __m512 {
    let idx = _mm512_inserti64x4(_mm512_set1_epi32(i), _mm256_set1_epi32(j), 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// Scales x0·y0 in the low 8 lanes and x1·y1 in the high 8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn pair_scale(x0: f16, y0: f16, x1: f16, y1: f16) -> __m512 {
    splat_lanes(scales2(x0, y0, x1, y1), 0, 2)
}

/// The quants of two activation blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn load_q8_pair(y0: &BlockQ8_0, y1: &BlockQ8_0) -> __m512i {
    pair_i(load_i8x32(&y0.qs), load_i8x32(&y1.qs))
}

/// The nibbles of two 4-bit blocks in element order:
/// [a low, a high, b low, b high] (16 bytes each).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn nibbles_pair(a: &[u8; 16], b: &[u8; 16]) -> __m512i {
    let ab = _mm256_set_m128i(load_u8x16(b), load_u8x16(a));
    let z = pair_i(ab, _mm256_srli_epi16(ab, 4)); // [a, b, a>>4, b>>4]
    let z = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
    _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
}

/// Σ xu·y in groups of four (u8 × i8, no saturation) → 16 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dpbusd(xu: __m512i, y: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), xu, y)
}

/// Σ (xu - c)·y = Σ xu·y - Σ c·y with c the byte in every lane of `c`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dpbusd_offset(xu: __m512i, c: __m512i, y: __m512i) -> __m512i {
    _mm512_sub_epi32(dpbusd(xu, y), dpbusd(c, y))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dpbusd_256(xu: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), xu, y)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dpbusd_offset_256(xu: __m256i, c: __m256i, y: __m256i) -> __m256i {
    _mm256_sub_epi32(dpbusd_256(xu, y), dpbusd_256(c, y))
}

// --- activation quantizer ------------------------------------------------------

/// [`super::quantize_row_activation_ref`] with AVX2: the same amax, scale
/// and round-half-even, eight lanes at a time (bit-identical for finite
/// inputs).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row_activation_avx2(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * 32);
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (amax, q) = quantize_block_avx2(xb.try_into().unwrap());
        yb.d = f16::from_f32(amax / 127.0);
        // SAFETY: yb.qs is 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), pack_quants_avx2(q)) };
    }
}

/// One block of the activation quantizer: its largest magnitude and its
/// 32 quants, `round_half_even(x · 127 / amax)`, as four vectors of i32
/// (in [-127, 127]). Shared by [`quantize_row_activation_avx2`] and the
/// row tiles' fused preparation, so both give the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_block_avx2(xb: &[f32; 32]) -> (f32, [__m256i; 4]) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // No closures here: they would not inline into this function.
    // SAFETY: xb holds 32 floats; unaligned loads of 8 at 0, 8, 16, 24.
    let v = unsafe {
        let p = xb.as_ptr();
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    };
    let a = _mm256_max_ps(
        _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
        _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut q = [_mm256_setzero_si256(); 4];
    for k in 0..4 {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v[k], id),
        );
        q[k] = _mm256_cvtps_epi32(r);
    }
    (amax, q)
}

/// The 32 quants of [`quantize_block_avx2`] as bytes, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pack_quants_avx2(q: [__m256i; 4]) -> __m256i {
    // packs work within 128-bit lanes: bytes come out as dword groups
    // 0 2 4 6 1 3 5 7 of the 8 groups of 4; the permute restores order.
    let b = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

// --- Q8_0 · Q8_0 -------------------------------------------------------------

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let block = |a: &BlockQ8_0, b: &BlockQ8_0| -> __m256 {
        _mm256_cvtepi32_ps(dot_i8_i8(load_i8x32(&a.qs), load_i8x32(&b.qs)))
    };
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let s = scales2(a[0].d, b[0].d, a[1].d, b[1].d);
        acc0 = _mm256_fmadd_ps(splat_lane(s, 0), block(&a[0], &b[0]), acc0);
        acc1 = _mm256_fmadd_ps(splat_lane(s, 2), block(&a[1], &b[1]), acc1);
    }
    if let ([a], [b]) = (xr, yr) {
        let s = scales2(a.d, b.d, a.d, b.d);
        acc0 = _mm256_fmadd_ps(splat_lane(s, 0), block(a, b), acc0);
    }
    hsum_f32x8(_mm256_add_ps(acc0, acc1))
}

/// # Safety
/// The CPU must support the [`crate::Isa::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn vec_dot_avx512(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    // x + 128 is unsigned; subtract 128·Σy afterwards.
    let bias = _mm512_set1_epi8(-128);
    let mut acc = _mm512_setzero_ps();
    let (xp, yp) = (x.chunks_exact(2), y.chunks_exact(2));
    let (xr, yr) = (xp.remainder(), yp.remainder());
    for (a, b) in xp.zip(yp) {
        let xu = _mm512_xor_si512(load_q8_pair(&a[0], &a[1]), bias);
        let dot = dpbusd_offset(xu, bias, load_q8_pair(&b[0], &b[1]));
        let s = pair_scale(a[0].d, b[0].d, a[1].d, b[1].d);
        acc = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc);
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    if let ([a], [b]) = (xr, yr) {
        let bias = _mm256_set1_epi8(-128);
        let xu = _mm256_xor_si256(load_i8x32(&a.qs), bias);
        let dot = dpbusd_offset_256(xu, bias, load_i8x32(&b.qs));
        sum += hsum_i32x8(dot) as f32 * (f16_to_f32(a.d) * f16_to_f32(b.d));
    }
    sum
}

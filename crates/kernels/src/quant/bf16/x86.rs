//! AVX2 and AVX-512 BF16 dots. A bf16 is the top half of an f32, so
//! widening is a 16-bit left shift; with AVX512_BF16 `vdpbf16ps` multiplies
//! and accumulates pairs directly.

use super::bf16;
use crate::quant::f32::x86::hsum_256;
use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_avx2(x: &[bf16], y: &[bf16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    // SAFETY: callers keep `i + 8 <= n`, so the 16-byte load stays in bounds.
    let load = |p: *const bf16, i: usize| unsafe {
        let h = _mm_loadu_si128(p.add(i).cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    };
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * k;
            *a = _mm256_fmadd_ps(load(px, o), load(py, o), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(px, i), load(py, i), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_256(v) as f64;
    for j in i..n {
        sum += (x[j].to_f32() * y[j].to_f32()) as f64;
    }
    sum as f32
}

/// Widen 16 bf16 (already loaded as 16-bit lanes) to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn widen_16(h: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn dot_avx512(x: &[bf16], y: &[bf16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    // SAFETY: callers keep `i + 16 <= n`, so the 32-byte load stays in bounds.
    let load = |p: *const bf16, i: usize| unsafe { widen_16(_mm256_loadu_si256(p.add(i).cast())) };
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 16 * k;
            *a = _mm512_fmadd_ps(load(px, o), load(py, o), *a);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(load(px, i), load(py, i), acc[0]);
        i += 16;
    }
    if i < n {
        let m = ((1u32 << (n - i)) - 1) as __mmask16;
        // SAFETY: masked to the `n - i` remaining lanes; masked-off lanes are
        // not read and cannot fault.
        let (a, b) = unsafe {
            (
                widen_16(_mm256_maskz_loadu_epi16(m, px.add(i).cast())),
                widen_16(_mm256_maskz_loadu_epi16(m, py.add(i).cast())),
            )
        };
        acc[1] = _mm512_fmadd_ps(a, b, acc[1]);
    }
    let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(v)
}

/// `vdpbf16ps` dot. Unlike the widening kernels it treats bf16 subnormals
/// as zero (the instruction ignores MXCSR and flushes), which only matters
/// for values below 1.2e-38.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512_BF16.
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn dot_avx512bf16(x: &[bf16], y: &[bf16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    // SAFETY: the masked load reads only lanes set in `m`, which callers keep
    // below `n`; a 64-byte vector is a vector of 32 bf16 either way.
    let load = |p: *const bf16, i: usize, m: __mmask32| unsafe {
        std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(m, p.add(i).cast()))
    };
    let all = !0 as __mmask32;
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 64 <= n {
        acc[0] = _mm512_dpbf16_ps(acc[0], load(px, i, all), load(py, i, all));
        acc[1] = _mm512_dpbf16_ps(acc[1], load(px, i + 32, all), load(py, i + 32, all));
        i += 64;
    }
    while i + 32 <= n {
        acc[0] = _mm512_dpbf16_ps(acc[0], load(px, i, all), load(py, i, all));
        i += 32;
    }
    if i < n {
        let m = ((1u64 << (n - i)) - 1) as __mmask32;
        acc[1] = _mm512_dpbf16_ps(acc[1], load(px, i, m), load(py, i, m));
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

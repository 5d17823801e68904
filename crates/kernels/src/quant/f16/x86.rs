//! AVX2 (F16C + FMA) F16 dot and row conversions. Halves are
//! widened exactly with `vcvtph2ps`; f32 → f16 uses `vcvtps2ph` with
//! round-to-nearest-even, the same rounding as `half::f16::from_f32`.

use super::f16;
use crate::quant::f32::x86::hsum_256;
use std::arch::x86_64::*;

/// One f16 to f32 with `vcvtph2ps`: inlined, unlike `half`'s conversion,
/// which checks for F16C at run time on every call.
#[inline]
#[target_feature(enable = "f16c")]
pub(crate) fn to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_avx2(x: &[f16], y: &[f16]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_ptr());
    // SAFETY: callers keep `i + 8 <= n`, so the 16-byte load stays in bounds.
    let load =
        |p: *const f16, i: usize| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(i).cast())) };
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
        sum += (to_f32(x[j]) * to_f32(y[j])) as f64;
    }
    sum as f32
}

/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` for both slices (equal lengths asserted).
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` for both slices (equal lengths asserted).
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i).cast()));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = to_f32(src[j]);
    }
}

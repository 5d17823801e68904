//! One module per ggml type. Each defines its `#[repr(C)]` block struct (with
//! a size assertion against ggml's), `quantize_row` (ggml's reference
//! quantizer), `dequantize_row`, a scalar `vec_dot_ref` against its activation
//! type, SIMD dots where they pay, and `TRAITS` for the table in
//! [`crate::traits`](mod@crate::traits), whose dots it lists with `vec_dots!`.

/// The dots of a weight type `W` against its activation type `A`, one per
/// instruction set, as a [`crate::isa::PerIsa`] of
/// [`crate::traits::VecDotFn`]:
///
/// ```ignore
/// dots: vec_dots!(BlockQ4_0, BlockQ8_0; vec_dot_ref,
///     avx512: x86::vec_dot_avx512, avx2: x86::vec_dot_avx2, neon: neon::vec_dot),
/// ```
///
/// Each kernel is an `unsafe fn(&[W], &[A]) -> f32` over whole blocks that
/// needs nothing but its CPU features and equal block counts (every type's
/// activation blocks hold as many elements as its weight blocks). The
/// macro wraps it in a safe function on raw bytes that casts them and
/// checks the counts; the features are the table's to guarantee. `avx2`
/// and `avx512` kernels exist on x86-64 builds only, `neon` on AArch64.
macro_rules! vec_dots {
    ($w:ty, $a:ty; $reference:path $(, $isa:ident: $kernel:path)* $(,)?) => {{
        #[allow(unused_mut)]
        let mut dots = $crate::isa::PerIsa::<$crate::traits::VecDotFn>::new(|w, a| {
            $reference(bytemuck::cast_slice(w), bytemuck::cast_slice(a))
        });
        $( $crate::quant::vec_dots!(@set dots, $isa, $w, $a, $kernel); )*
        dots
    }};
    (@set $dots:ident, avx2, $w:ty, $a:ty, $kernel:path) => {
        #[cfg(target_arch = "x86_64")]
        {
            $dots = $dots.avx2($crate::quant::vec_dots!(@wrap $w, $a, $kernel));
        }
    };
    (@set $dots:ident, avx512, $w:ty, $a:ty, $kernel:path) => {
        #[cfg(target_arch = "x86_64")]
        {
            $dots = $dots.avx512($crate::quant::vec_dots!(@wrap $w, $a, $kernel));
        }
    };
    (@set $dots:ident, avx512_bf16, $w:ty, $a:ty, $kernel:path) => {
        #[cfg(target_arch = "x86_64")]
        {
            $dots = $dots.avx512_bf16($crate::quant::vec_dots!(@wrap $w, $a, $kernel));
        }
    };
    (@set $dots:ident, neon, $w:ty, $a:ty, $kernel:path) => {
        #[cfg(target_arch = "aarch64")]
        {
            $dots = $dots.neon($crate::quant::vec_dots!(@wrap $w, $a, $kernel));
        }
    };
    (@wrap $w:ty, $a:ty, $kernel:path) => {
        |w: &[u8], a: &[u8]| -> f32 {
            let (x, y): (&[$w], &[$a]) = (bytemuck::cast_slice(w), bytemuck::cast_slice(a));
            assert_eq!(x.len(), y.len(), "vec_dot: weight and activation block counts differ");
            // SAFETY: this wrapper is reachable only through
            // `PerIsa::get` for the set the kernel is written for, whose
            // caller guarantees the CPU supports it; the kernel needs
            // nothing more than equal block counts, asserted above.
            unsafe { $kernel(x, y) }
        }
    };
}
pub(crate) use vec_dots;

pub mod bf16;
pub mod f16;
pub mod f32;
pub mod iq4_nl;
pub mod k_common;
pub mod multi;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
pub mod q8_quads;
pub mod tiles;
pub mod tiles_k;
pub mod tq1_0;
pub mod tq2_0;

#[cfg(test)]
pub(crate) mod testing;

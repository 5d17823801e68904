//! The type-traits table: for each computable ggml type, its block geometry,
//! the activation type its dot product takes, and the functions that work on
//! it. Everything above the kernels (matvec, quantize tool, models) goes
//! through this table instead of matching on types itself.
//!
//! All functions work on raw little-endian block bytes as stored in GGUF, so
//! tensor views from a memory map are used in place. Rows must be a whole
//! number of blocks; slices of the wrong length are a caller bug and panic.

use crate::isa::PerIsa;
use crate::quant;
use gguf::GgmlType;

/// `dot(w, a)`: `w` holds whole blocks of the weight type, `a` the same
/// number of elements in the activation type (`vec_dot_type`).
pub type VecDotFn = fn(w: &[u8], a: &[u8]) -> f32;
/// Dequantize whole blocks into `dst` (`dst.len()` elements).
pub type ToFloatFn = fn(src: &[u8], dst: &mut [f32]);
/// Quantize `src` (a whole number of blocks) into `dst` bytes.
pub type FromFloatFn = fn(src: &[f32], dst: &mut [u8]);
/// `out[r·n + c] = dot(row r of w, activation c)` for the rows of `w`
/// (`row_bytes` each) and `n` activations prepared by [`MultiDot::prepare`],
/// the `c`-th starting at byte `c · stride` of `acts` (4-aligned).
pub type MultiDotFn =
    fn(w: &[u8], row_bytes: usize, acts: &[u8], stride: usize, n: usize, out: &mut [f32]);

/// A dot product that takes one weight row against several activations at
/// once, so the work of unpacking a weight block is shared by all of them:
/// what batched decode (several sequences, one pass over the weights) needs.
///
/// The activations come in a layout of the kernel's own, made once per
/// activation by `prepare`. Each `out[c]` is bit-identical whatever the
/// number of activations in the call (the kernels run the same operations
/// per activation), so a batch gives the same numbers as one at a time.
pub struct MultiDot {
    /// Bytes of one prepared activation of `cols` elements.
    pub prepared_bytes: fn(cols: usize) -> usize,
    /// Quantize `x` into `dst` (`prepared_bytes(x.len())` bytes, 4-aligned).
    pub prepare: FromFloatFn,
    /// The kernels, one per instruction set ([`crate::Kernels::multi_dot`]
    /// hands them out).
    pub(crate) dots: PerIsa<MultiDotFn>,
}

pub struct TypeTraits {
    pub ty: GgmlType,
    /// The type activations are quantized to before its dot product ([`crate::Kernels::vec_dot`]).
    pub vec_dot_type: GgmlType,
    /// Reference dequantizer (bit-identical to ggml's `dequantize_row_*`).
    pub to_float: ToFloatFn,
    /// Reference quantizer (ggml's `quantize_row_*_ref`).
    pub from_float: FromFloatFn,
    /// Plain scalar dot product: the reference every SIMD variant is tested
    /// against.
    pub vec_dot_ref: VecDotFn,
    /// The dots, one per instruction set (made by [`quant::vec_dots`];
    /// [`crate::Kernels::vec_dot`] hands them out).
    pub(crate) dots: PerIsa<VecDotFn>,
    /// The several-activation dot, for types that have one; products go
    /// through it instead of `vec_dot` when it is there.
    pub multi: Option<&'static MultiDot>,
}

impl TypeTraits {
    pub fn block_size(&self) -> usize {
        self.ty.block_size()
    }
    pub fn type_size(&self) -> usize {
        self.ty.type_size()
    }
    /// Bytes of a row of `n` elements (`n` a multiple of the block size).
    pub fn row_bytes(&self, n: usize) -> usize {
        debug_assert_eq!(n % self.block_size(), 0);
        n / self.block_size() * self.type_size()
    }
}

/// How activations are quantized to `ty` before a dot product: ggml-cpu's
/// run-time quantizer where it differs from the reference one (Q8_0, see
/// [`quant::q8_0::quantize_row_activation`]), else `from_float`.
pub fn activation_quantizer(ty: GgmlType) -> Option<FromFloatFn> {
    match ty {
        GgmlType::Q8_0 => Some(|src, dst| {
            quant::q8_0::quantize_row_activation(src, bytemuck::cast_slice_mut(dst))
        }),
        _ => traits(ty).map(|t| t.from_float),
    }
}

/// The traits of `ty`, or `None` if we cannot compute with it.
pub fn traits(ty: GgmlType) -> Option<&'static TypeTraits> {
    use GgmlType::*;
    Some(match ty {
        F32 => &quant::f32::TRAITS,
        F16 => &quant::f16::TRAITS,
        BF16 => &quant::bf16::TRAITS,
        Q4_0 => &quant::q4_0::TRAITS,
        Q4_1 => &quant::q4_1::TRAITS,
        Q5_0 => &quant::q5_0::TRAITS,
        Q5_1 => &quant::q5_1::TRAITS,
        IQ4_NL => &quant::iq4_nl::TRAITS,
        Q8_0 => &quant::q8_0::TRAITS,
        Q2_K => &quant::q2_k::TRAITS,
        Q3_K => &quant::q3_k::TRAITS,
        Q4_K => &quant::q4_k::TRAITS,
        Q5_K => &quant::q5_k::TRAITS,
        Q6_K => &quant::q6_k::TRAITS,
        Q8_K => &quant::q8_k::TRAITS,
        TQ1_0 => &quant::tq1_0::TRAITS,
        TQ2_0 => &quant::tq2_0::TRAITS,
        // Each type module registers itself here with one line.
        _ => return None,
    })
}

/// Every type [`traits`] knows, in ggml id order.
pub fn computable_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|t| traits(*t).is_some())
        .collect()
}

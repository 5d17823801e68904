//! One module per ggml type. Each defines its `#[repr(C)]` block struct (with
//! a size assertion against ggml's), `quantize_row` (ggml's reference
//! quantizer), `dequantize_row`, a scalar `vec_dot_ref` against its activation
//! type, SIMD dots where they pay, and `TRAITS` for the table in
//! [`crate::traits`].

pub mod f32;
pub mod q8_k;

#[cfg(test)]
pub(crate) mod testing;

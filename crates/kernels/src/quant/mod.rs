//! One module per ggml type. Each defines its `#[repr(C)]` block struct (with
//! a size assertion against ggml's), `quantize_row` (ggml's reference
//! quantizer), `dequantize_row`, a scalar `vec_dot_ref` against its activation
//! type, SIMD dots where they pay, and `TRAITS` for the table in
//! [`crate::traits`].

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
pub mod tq1_0;
pub mod tq2_0;

#[cfg(test)]
pub(crate) mod testing;

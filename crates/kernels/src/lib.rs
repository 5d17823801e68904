//! Compute kernels: block formats, quantize/dequantize, dot products and
//! matrix-vector products, with a scalar reference for everything and SIMD
//! variants picked once at start-up.
//!
//! Layout:
//! - [`isa`]: which instruction set the SIMD variants may use (detected, or
//!   forced with `CACHEFIT_KERNELS=scalar|avx2|avx512|neon`).
//! - [`quant`]: one module per ggml type: `#[repr(C)]` block struct, reference
//!   quantizer, dequantizer, reference dot against the activation type, and
//!   the SIMD dots for that type.
//! - [`traits`]: the type-traits table (block geometry, activation type and
//!   the functions above) that everything else goes through.
//!
//! Nothing here knows about models.

pub mod bandwidth;
pub mod int8;
pub mod isa;
pub mod matmul;
pub mod matvec;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod traits;
pub mod vecops;

pub use gguf::GgmlType;
pub use isa::Isa;
pub use traits::{traits, TypeTraits, VecDotFn};

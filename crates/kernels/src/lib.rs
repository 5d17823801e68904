//! Compute kernels: block formats, quantize/dequantize, dot products and
//! matrix products, with a scalar reference for everything and SIMD
//! variants chosen once.
//!
//! Layout:
//! - [`isa`]: the instruction sets (scalar, AVX2, AVX-512, NEON), which of
//!   them the CPU runs, and the soundness rule every SIMD kernel rests on.
//! - [`dispatch`]: one table of kernel function pointers per set
//!   ([`Kernels`]), built on first use for supported sets only, and the one
//!   this process uses ([`selected`], chosen by [`configure`] or detected).
//! - [`quant`]: one module per ggml type: `#[repr(C)]` block struct, reference
//!   quantizer, dequantizer, reference dot against the activation type, and
//!   the SIMD dots for that type.
//! - [`traits`](mod@traits): the type-traits table (block geometry, activation type and
//!   the functions above) that everything else goes through.
//! - [`matrix`]: a weight matrix bound for products, its kernel chosen
//!   when it is bound; [`matmul`] runs the products (decode is `n = 1`).
//! - [`int8`]: the int8 matrices of the cachefit architecture; [`vecops`]
//!   and [`ops`]: element-wise ops and attention; [`pool`]: the thread
//!   pool; [`bandwidth`]: memory bandwidth probes; [`prefetch`]: cache-line
//!   hints (decode kernels name the lines they stream next).
//!
//! Nothing here knows about models, and nothing reads the environment:
//! programs pass their choices to [`configure`].

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bandwidth;
pub mod dispatch;
pub mod int8;
pub mod isa;
pub mod matmul;
pub mod matrix;
pub mod ops;
pub mod pages;
pub mod pool;
pub mod prefetch;
pub mod quant;
pub mod ternary;
pub mod traits;
pub mod vecops;

pub use dispatch::{config, configure, selected, table, Config, ConfigError, Kernels};
pub use gguf::GgmlType;
pub use isa::Isa;
pub use traits::{traits, TypeTraits, VecDotFn};

pub mod error;
pub mod format;
pub mod kernels;
pub mod synth;

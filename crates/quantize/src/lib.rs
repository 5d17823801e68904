//! Model-file quantization: `cachefit quantize IN OUT TYPE`.
//!
//! [`target`] names what the user asks for (a llama.cpp file type such as
//! `Q8_0` or the `Q4_K_M` mix); [`plan`] decides, per tensor, the type it
//! gets and why, with llama.cpp's rules (so our files match what
//! `llama-quantize` makes); [`driver`] runs a plan: dequantize and quantize
//! through the kernels' type-traits table on several threads, stream into a
//! temporary file and rename it into place only on success.

pub mod driver;
pub mod error;
pub mod plan;
pub mod target;

pub use driver::{quantize_file, Progress, QuantizeOptions, Summary, QUANTIZATION_VERSION};
pub use error::{Error, Result};
pub use plan::{plan, plan_with, Category, Plan, PlanOptions, PlannedTensor, Reason};
pub use target::{Target, TARGETS};

//! Model-file quantization.

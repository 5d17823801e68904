//! The engine layer between the model's logits and the text a client sees.
//!
//! For now: the sampling chain ([`sample`]) that turns a logits slice into a
//! token id with llama.cpp's semantics, and the stop conditions ([`stop`])
//! that decide when a generation ends without leaking part of a stop string.
//! Sessions, slots and batching will live here too.
//!
//! A generation loop:
//!
//! ```
//! use engine::{Sampler, SamplerConfig, StopConditions};
//!
//! # let vocab = ["<eos>", "a", "b", "\n"];
//! # let forward = |step: usize| -> Vec<f32> { let mut l = vec![0.0; 4]; l[[1, 2, 3, 3, 0][step.min(4)]] = 9.0; l };
//! let mut sampler = Sampler::new(SamplerConfig { seed: Some(42), ..SamplerConfig::default() });
//! let stop = StopConditions {
//!     eog_tokens: vec![0],
//!     stop_strings: vec!["\n\n".into()],
//!     ignore_eos: false,
//! };
//! let mut matcher = stop.matcher();
//! let mut shown = String::new();
//! for step in 0..16 {
//!     let mut logits = forward(step); // (n_vocab,)
//!     stop.suppress_eog(&mut logits); // only acts with ignore_eos
//!     let token = sampler.sample(&mut logits);
//!     sampler.accept(token);
//!     if stop.stops_at(token) {
//!         break;
//!     }
//!     let piece = vocab[token as usize]; // streaming detokenizer in real code
//!     if matcher.push(piece, &mut shown) {
//!         break;
//!     }
//!     // print and flush `shown` here, then clear it
//! }
//! matcher.finish(&mut shown);
//! assert_eq!(shown, "ab");
//! ```

pub mod rng;
pub mod sample;
pub mod stop;

pub use sample::{argmax, SampleError, Sampler, SamplerConfig};
pub use stop::{StopConditions, StopMatcher};

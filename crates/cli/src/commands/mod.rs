pub mod common;
pub mod info;
pub mod inspect;
pub mod perplexity;
pub mod quantize;
pub mod run;
pub mod stream;
pub mod tokenize;

pub mod inspect;
pub mod quantize;

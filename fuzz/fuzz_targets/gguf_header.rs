//! Fuzz the GGUF header parser: any bytes must give Ok or an error, never a
//! panic, and accepted tensors must lie inside the buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = gguf::parse_header(data, gguf::Limits::default()) {
        for t in &h.tensors {
            assert!(h.data_offset + t.offset + t.n_bytes <= data.len() as u64);
        }
        let _ = h.metadata.get_str("general.architecture");
    }
});

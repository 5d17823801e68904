//! Fuzz the server's request parsing and validation: any body gives a
//! request or a 4xx error naming what is wrong, never a panic.
#![no_main]

use engine::{GenParams, SamplerConfig};
use libfuzzer_sys::fuzz_target;
use server::api::{parse_body, ChatRequest, CompletionRequest};

fuzz_target!(|data: &[u8]| {
    let obj = match parse_body(data) {
        Ok(obj) => obj,
        Err(e) => {
            assert!((400..500).contains(&e.status), "{e:?}");
            return;
        }
    };
    // The server's defaults as `serve` starts with them.
    let defaults = GenParams::new(SamplerConfig::default());
    for e in [
        ChatRequest::from_json(&obj, &defaults).err(),
        CompletionRequest::from_json(&obj, &defaults).err(),
    ]
    .into_iter()
    .flatten()
    {
        assert!((400..500).contains(&e.status), "{e:?}");
        assert!(!e.message.is_empty());
    }
});

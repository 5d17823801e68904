//! Training checkpoints: everything a run needs to continue exactly where
//! it stopped (parameters, both AdamW moments, the step), in one file.
//!
//! Layout: `CFTRAIN1`, a u64 little-endian length, that many bytes of JSON
//! (network, training settings, step, last validation loss, parameter
//! count), then parameters, first moments and second moments as `f32`
//! little-endian. Saved to a temporary file and renamed over the old one,
//! so an interrupted save never loses the previous checkpoint.

use crate::error::{Error, Result};
use crate::files;
use crate::net::NetConfig;
use serde_json::{json, Value};
use std::path::Path;

const MAGIC: &[u8; 8] = b"CFTRAIN1";

pub struct Checkpoint {
    pub net: NetConfig,
    /// The training settings it was made with (a resumed run must match).
    pub train: Value,
    /// Optimizer steps done.
    pub step: usize,
    pub last_val: f64,
    pub params: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl Checkpoint {
    pub fn new(net: NetConfig, train: Value, params: Vec<f32>) -> Checkpoint {
        let n = params.len();
        Checkpoint {
            net,
            train,
            step: 0,
            last_val: f64::NAN,
            params,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }
}

pub fn save(path: &Path, ck: &Checkpoint) -> Result<()> {
    let header = json!({
        "net": ck.net.to_json(), "train": ck.train, "step": ck.step,
        "last_val": if ck.last_val.is_finite() { json!(ck.last_val) } else { Value::Null },
        "params": ck.params.len(),
    })
    .to_string();
    let mut bytes = Vec::with_capacity(16 + header.len() + 12 * ck.params.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for arr in [&ck.params, &ck.m, &ck.v] {
        for v in arr.iter() {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let tmp = path.with_extension("tmp");
    files::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        action: "replace",
        path: path.to_path_buf(),
        source,
    })
}

pub fn load(path: &Path) -> Result<Checkpoint> {
    let bytes = files::read_bytes(path)?;
    let bad = |problem: String| Error::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(bad("not a cachefit-train checkpoint (bad magic)".into()));
    }
    let hlen = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    let header = bytes
        .get(16..16usize.saturating_add(hlen))
        .ok_or_else(|| bad("truncated header".into()))?;
    let header: Value =
        serde_json::from_slice(header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let net = NetConfig::from_json(&header["net"])?;
    let n = header["params"]
        .as_u64()
        .ok_or_else(|| bad("header has no parameter count".into()))? as usize;
    let expect = crate::net::Layout::new(&net).len;
    if n != expect {
        return Err(bad(format!("{n} parameters, but its network has {expect}")));
    }
    let body = &bytes[16 + hlen..];
    if body.len() != 12 * n {
        return Err(bad(format!(
            "{} bytes of tensors, expected {} (truncated or corrupt)",
            body.len(),
            12 * n
        )));
    }
    let read = |k: usize| -> Vec<f32> {
        body[4 * n * k..4 * n * (k + 1)]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    };
    Ok(Checkpoint {
        net,
        train: header["train"].clone(),
        step: header["step"].as_u64().unwrap_or(0) as usize,
        last_val: header["last_val"].as_f64().unwrap_or(f64::NAN),
        params: read(0),
        m: read(1),
        v: read(2),
    })
}

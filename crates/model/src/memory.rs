//! How much memory a model needs before we allocate it, against what the
//! OS says is available.

use crate::cachefit::CachefitConfig;
use crate::config::ModelConfig;
use crate::forward::StateOptions;
use crate::kv_cache::KvCache;
use crate::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Tensor bytes of the file (mapped or read).
    pub weights: u64,
    /// K and V for every layer and position.
    pub kv_cache: u64,
    /// Activations, logits and per-token buffers.
    pub scratch: u64,
}

impl MemoryEstimate {
    /// For an f16 cache of `n_ctx` positions and the default batch.
    pub fn new(cfg: &ModelConfig, weights_bytes: u64, n_ctx: usize) -> MemoryEstimate {
        MemoryEstimate::for_state(cfg, weights_bytes, &StateOptions::new(n_ctx))
    }

    /// For a [`crate::State`] made with `o` (an unusable cache type counts
    /// as f16 here; making the state reports it).
    pub fn for_state(cfg: &ModelConfig, weights_bytes: u64, o: &StateOptions) -> MemoryEstimate {
        if let Some(cf) = &cfg.cachefit {
            return Self::for_cachefit(cfg, cf, weights_bytes, o);
        }
        let (n_ctx, nb) = (o.n_ctx, o.n_batch.max(1));
        let kv = |ty| KvCache::bytes_for(ty, cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim);
        let kv_cache = kv(o.kv_type)
            .or_else(|| kv(crate::KvType::F16))
            .unwrap_or(0)
            * o.n_seq.max(1) as u64;
        let per_token = 4 * cfg.dim
            + 2 * cfg.q_dim()
            + 2 * cfg.kv_dim()
            + 2 * cfg.ffn_dim
            + crate::forward::attention_floats(cfg, n_ctx)
            + cfg.rope.n_rot;
        let logit_rows = if o.all_logits {
            nb
        } else {
            o.n_seq.clamp(1, nb)
        };
        // Plus, for a q8_0 cache, one layer's K and V widened to f32.
        let floats =
            nb * per_token + logit_rows * cfg.vocab_size + 2 * crate::forward::widened_kv(cfg, o);
        // Plus the quantized activations (at most ~1.1 bytes per input
        // float, rows rounded up to cache lines) and the transposed output.
        let widest = cfg.dim.max(cfg.ffn_dim).max(cfg.q_dim());
        let scratch = floats as u64 * 4
            + nb as u64 * (2 * widest as u64 + 64)
            + 4 * (nb * cfg.vocab_size.max(widest)) as u64;
        MemoryEstimate {
            weights: weights_bytes,
            kv_cache,
            scratch,
        }
    }

    /// A `cachefit` state: keys and values of the attention blocks (f16
    /// unless f32 is asked for), every position's input of the convolution
    /// blocks (f32), per sequence; activations, RoPE table and logits.
    fn for_cachefit(
        cfg: &ModelConfig,
        cf: &CachefitConfig,
        weights_bytes: u64,
        o: &StateOptions,
    ) -> MemoryEstimate {
        let (n_ctx, nb) = (o.n_ctx as u64, o.n_batch.max(1) as u64);
        let elem = if o.kv_type == crate::KvType::F32 {
            4
        } else {
            2
        };
        let kv_dim = cfg.kv_dim() as u64;
        let per_seq = cf.n_attn() as u64 * 2 * kv_dim * n_ctx * elem
            + cf.n_conv() as u64 * n_ctx * cfg.dim as u64 * 4;
        let wide = cfg.dim.max(cfg.ffn_dim).max(cfg.q_dim()) as u64;
        let per_token =
            3 * cfg.dim as u64 + 2 * wide + (cfg.q_dim() as u64 + 2 * kv_dim) + cfg.q_dim() as u64;
        let logit_rows = if o.all_logits {
            nb
        } else {
            (o.n_seq as u64).clamp(1, nb)
        };
        let floats = nb * per_token
            + n_ctx * (1 + 2 * kv_dim + cfg.head_dim as u64)
            + logit_rows * cfg.vocab_size as u64;
        MemoryEstimate {
            weights: weights_bytes,
            kv_cache: per_seq * o.n_seq.max(1) as u64,
            scratch: floats * 4 + 3 * wide + 64 * 3 + 4 * wide,
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.scratch
    }

    /// Error if the total exceeds `available` bytes.
    pub fn check(&self, available: u64) -> Result<(), Error> {
        if self.total() <= available {
            return Ok(());
        }
        Err(Error::OutOfMemory {
            need: human(self.total()),
            weights: human(self.weights),
            kv: human(self.kv_cache),
            scratch: human(self.scratch),
            available: human(available),
        })
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (`None` where there is no
/// such file, e.g. not Linux).
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&s)
}

fn parse_meminfo(s: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_check() {
        let s = "MemTotal:       24000000 kB\nMemAvailable:    1000 kB\n";
        assert_eq!(parse_meminfo(s), Some(1000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let e = MemoryEstimate {
            weights: 3 << 30,
            kv_cache: 1 << 30,
            scratch: 1 << 20,
        };
        assert!(e.check(5 << 30).is_ok());
        let msg = e.check(2 << 30).unwrap_err().to_string();
        assert!(
            msg.contains("4.00 GiB") && msg.contains("2.00 GiB"),
            "{msg}"
        );
    }
}

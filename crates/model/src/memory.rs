//! How much memory a model needs before we allocate it, against what the
//! OS says is available. Each architecture estimates its own state;
//! `arch/mod.rs` picks the estimate ([`MemoryEstimate::for_state`]). What
//! the weights hold resident is not the file's size but what binding made
//! of it ([`WeightsResidency`], from the binder's ledger).

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

/// Where a bound model's weights live, in bytes, as the binder left them
/// ([`crate::Model::residency`]; [`crate::Model::plan_residency`] says the
/// same without binding). Pages are counted whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightsResidency {
    /// Made at load and resident throughout: row tiles, copies of tensors
    /// the kernels could not read in place, f32 vectors.
    pub made: u64,
    /// Pages of the file map read in place every token (matrices without
    /// row tiles): resident from the first token on.
    pub in_place: u64,
    /// Pages of the file map holding embedding tables, read a row per
    /// token: resident only as rows are read, counted whole here.
    pub by_row: u64,
    /// The whole file, when it was read into memory (`--no-mmap`, a
    /// built-in model) rather than mapped: all of it stays resident.
    pub file_copy: u64,
}

impl WeightsResidency {
    /// The most the weights hold resident.
    pub fn total(&self) -> u64 {
        self.made + self.in_place + self.by_row + self.file_copy
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
        let r = WeightsResidency {
            made: 1,
            in_place: 2,
            by_row: 4,
            file_copy: 8,
        };
        assert_eq!(r.total(), 15);
    }
}

//! `cachefit stream [--size SIZE] [-t N] [--json]`: sequential read and
//! copy bandwidth of one buffer, as STREAM measures it (GB/s = 1e9 B/s,
//! best and median pass; a copy counts the bytes read plus those written).
//!
//! The probes are `kernels::bandwidth`'s, the same ones `cachefit info`
//! runs per cache level, with the same time per probe. Without `--size` the
//! buffer is `info`'s DRAM probe (STREAM's rule: at least 4× the last-level
//! cache, and at least 256 MiB), so the two DRAM figures agree. A fixed
//! 128 MiB default measured this machine's L3 (usable up to ~128 MiB), not
//! its DRAM: 42.6 GB/s against `info`'s 30.9.

use super::inspect::human_bytes;
use anyhow::{bail, Result};
use kernels::bandwidth::{measure_copy, measure_read, Bandwidth};
use kernels::pool::ThreadPool;
use serde_json::json;
use std::time::Duration;

/// How long each probe repeats passes. Shared with `info` so their
/// numbers are comparable.
pub const PROBE_TIME: Duration = Duration::from_millis(500);

#[derive(clap::Args)]
pub struct Args {
    /// Buffer size in bytes, with an optional binary suffix: K, M, G (or
    /// KiB, MiB, GiB). Default: at least 4× the last-level cache and at
    /// least 256 MiB (`cachefit info`'s DRAM probe).
    #[arg(long)]
    pub size: Option<String>,
    /// Threads (default: the physical cores this process may use, capped
    /// by its cgroup CPU quota).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Print one JSON line instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let (size, size_arg) = match &args.size {
        Some(s) => (parse_size(s)?, s.clone()),
        None => {
            let machine = machine::Machine::probe();
            let specs = super::levels::specs(&machine, model::mem_available());
            let dram = specs.last().expect("specs end with DRAM").probe_bytes;
            (dram, human_bytes(dram))
        }
    };
    // The copy holds a source and a destination buffer at once.
    let need = size.saturating_mul(2);
    if let Some(avail) = model::mem_available() {
        if need > avail {
            bail!(
                "--size {} needs {} (a source and a destination buffer for the copy), but only {} of memory is available",
                size_arg,
                human_bytes(need),
                human_bytes(avail)
            );
        }
    }
    let Ok(bytes) = usize::try_from(size) else {
        bail!(
            "--size {} does not fit in this platform's address space",
            size_arg
        );
    };
    let threads = super::common::threads(args.threads)?;
    let pool = ThreadPool::new(threads.n);
    let read = measure_read(&pool, bytes, PROBE_TIME);
    let copy = measure_copy(&pool, bytes, PROBE_TIME);

    if args.json {
        let probe = |b: &Bandwidth| json!({"best_gbps": b.best_gbps, "median_gbps": b.median_gbps, "passes": b.passes});
        let out = json!({
            "size_bytes": size,
            "threads": threads.n,
            "threads_reason": threads.reason,
            "kernels": kernels::selected().isa().name(),
            "read": probe(&read),
            "copy": probe(&copy),
        });
        outln!("{out}");
        return Ok(());
    }
    outln!(
        "buffer {} ({size} bytes), {} thread{}: {}",
        human_bytes(size),
        threads.n,
        if threads.n == 1 { "" } else { "s" },
        threads.reason
    );
    for (name, b) in [("read", read), ("copy", copy)] {
        outln!(
            "{name}: best {:.2} GB/s, median {:.2} GB/s ({} passes)",
            b.best_gbps,
            b.median_gbps,
            b.passes
        );
    }
    Ok(())
}

/// A byte count like "128M", "64KiB", "1g" or "4096" (suffixes are
/// binary: K = 1024). Zero is an error: nothing to measure.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => bail!(
            "--size {s:?} is not a size: expected a number of bytes with an optional K, M or G suffix, e.g. 128M"
        ),
    };
    let Ok(n) = digits.parse::<u64>() else {
        bail!(
            "--size {s:?} is not a size: expected a number of bytes with an optional K, M or G suffix, e.g. 128M"
        );
    };
    let Some(bytes) = n.checked_mul(1 << shift) else {
        bail!("--size {s:?} is too large");
    };
    if bytes == 0 {
        bail!("--size must be more than 0 bytes");
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M").unwrap(), 128 << 20);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 8 M ").unwrap(), 8 << 20);
        for bad in ["", "M", "abc", "12Q", "-1M", "1.5G", "0", "0K"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        let e = parse_size("99999999999999G").unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
    }
}

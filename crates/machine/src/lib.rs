//! What this machine offers the kernels: which CPU it is ([`cpu`]), how
//! big its caches are ([`caches`]), which CPUs and how much CPU time this
//! process may use ([`cores`], [`cgroup`]), and so how many threads to run
//! by default.
//!
//! Everything is read from `/proc` and `/sys` (with x86 `cpuid` where
//! those are missing) by small parsers that take the file contents as
//! text, so they are tested on captured files from other machines. A
//! missing or malformed file gives `None` or a conservative default, never
//! an error: a probe must not stop a model from running.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod caches;
pub mod cgroup;
pub mod cores;
pub mod cpu;
pub mod cpulist;

pub use caches::{parse_cache_size, Cache, CacheKind, Caches};
pub use cgroup::{cpu_quota, CpuQuota};
pub use cores::{
    allowed_cpus, default_threads, pin_current_thread, set_thread_affinity, Cores, ThreadChoice,
};
pub use cpu::CpuInfo;
pub use cpulist::{format_cpulist, parse_cpu_mask, parse_cpulist};

/// One look at the machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub cpu: CpuInfo,
    /// The caches of the first CPU this process may run on.
    pub caches: Caches,
    pub cores: Cores,
    /// [`Cores::default_threads`] of `cores`.
    pub threads: ThreadChoice,
}

impl Machine {
    pub fn probe() -> Machine {
        let cores = Cores::probe();
        let first_cpu = cores.allowed.first().copied().unwrap_or(0);
        Machine {
            cpu: CpuInfo::probe(),
            caches: Caches::probe(first_cpu),
            threads: cores.default_threads(),
            cores,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_this_machine() {
        let m = Machine::probe();
        assert!(m.threads.n >= 1);
        assert!(!m.threads.reason.is_empty());
        // Any cache we report has a size and a level that says what it is.
        for c in m.caches.levels() {
            assert!(c.size_bytes > 0 && (1..=3).contains(&c.level), "{c:?}");
        }
    }
}

//! The memory level a test's working set lives in, and that level's read
//! bandwidth with the test's thread count: the yardstick for the weight
//! bandwidth a test achieves.
//!
//! Shared by `info` and `bench`: the levels, their capacities and probe
//! sizes (half of each cache; DRAM at least 4× L3 and 256 MiB, at most half
//! the available memory), and the rule: a working set (weights + KV cache +
//! scratch) lives in the smallest level that holds it. `bench` probes each
//! level once per thread count, for `stream`'s probe time, only when a test
//! needs it.

use super::stream::PROBE_TIME;
use kernels::bandwidth::measure_read;
use kernels::pool::ThreadPool;
use machine::Machine;
use std::collections::HashMap;

/// The DRAM probe reads at least this much, so that a large L3 (or the
/// host's caches behind a VM) does not make it look fast.
const MIN_DRAM_PROBE: u64 = 256 << 20;

/// A level before probing.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// "L1", "L2", "L3", "DRAM".
    pub name: &'static str,
    /// What it holds (`None`: DRAM of unknown size).
    pub capacity: Option<u64>,
    pub probe_bytes: u64,
}

/// The levels of `machine`, smallest first, DRAM last.
pub fn specs(machine: &Machine, mem_available: Option<u64>) -> Vec<Spec> {
    let c = &machine.caches;
    let mut v: Vec<Spec> = [("L1", &c.l1d), ("L2", &c.l2), ("L3", &c.l3)]
        .into_iter()
        .filter_map(|(name, cache)| {
            cache.as_ref().map(|c| Spec {
                name,
                capacity: Some(c.size_bytes),
                probe_bytes: (c.size_bytes / 2).max(8),
            })
        })
        .collect();
    let mut dram =
        c.l3.as_ref()
            .map_or(0, |c| c.size_bytes.saturating_mul(4))
            .max(MIN_DRAM_PROBE);
    if let Some(avail) = mem_available {
        dram = dram.min(avail / 2);
    }
    v.push(Spec {
        name: "DRAM",
        capacity: mem_available,
        probe_bytes: dram.max(8),
    });
    v
}

/// The smallest level holding `working_set` bytes (DRAM when none does).
pub fn level_for(working_set: u64, specs: &[Spec]) -> &Spec {
    specs
        .iter()
        .find(|s| s.capacity.is_some_and(|c| working_set <= c))
        .unwrap_or(&specs[specs.len() - 1])
}

/// A probed level.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    pub name: &'static str,
    pub probe_bytes: u64,
    pub n_threads: usize,
    /// Best pass, GB/s (1e9 B/s).
    pub gbps: f64,
}

/// Probes made so far, by level and thread count.
pub struct Probes {
    specs: Vec<Spec>,
    done: HashMap<(&'static str, usize), Level>,
    /// In the order probed, for the report.
    order: Vec<(&'static str, usize)>,
    /// Name the levels but measure nothing (bandwidth 0).
    skip: bool,
}

impl Probes {
    pub fn new(machine: &Machine) -> Probes {
        Probes {
            specs: specs(machine, model::mem_available()),
            done: HashMap::new(),
            order: Vec::new(),
            skip: false,
        }
    }

    /// Probes that name the level a working set fits but measure nothing
    /// (bandwidth 0): no probe buffer, so the process's peak memory is the
    /// benchmark's own.
    pub fn skipped(machine: &Machine) -> Probes {
        Probes {
            skip: true,
            ..Probes::new(machine)
        }
    }

    /// The level holding `working_set`, probed with `n_threads` threads
    /// (the first time it is asked for).
    pub fn for_working_set(&mut self, working_set: u64, n_threads: usize) -> Level {
        let spec = level_for(working_set, &self.specs).clone();
        let key = (spec.name, n_threads);
        if let Some(l) = self.done.get(&key) {
            return l.clone();
        }
        if self.skip {
            return Level {
                name: spec.name,
                probe_bytes: 0,
                n_threads,
                gbps: 0.0,
            };
        }
        eprintln!(
            "cachefit bench: measuring {} read bandwidth ({} buffer, {n_threads} thread{})",
            spec.name,
            super::inspect::human_bytes(spec.probe_bytes),
            if n_threads == 1 { "" } else { "s" }
        );
        let pool = ThreadPool::new(n_threads);
        let bytes = usize::try_from(spec.probe_bytes).unwrap_or(usize::MAX);
        let level = Level {
            name: spec.name,
            probe_bytes: spec.probe_bytes,
            n_threads,
            gbps: measure_read(&pool, bytes, PROBE_TIME).best_gbps,
        };
        self.done.insert(key, level.clone());
        self.order.push(key);
        level
    }

    /// Every probe made, in order.
    pub fn probed(&self) -> impl Iterator<Item = &Level> {
        self.order.iter().map(|k| &self.done[k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine::{Cache, CacheKind, Caches};

    fn machine(l3: Option<u64>) -> Machine {
        let mut m = Machine::probe();
        let cache = |level, size_bytes| Cache {
            level,
            kind: CacheKind::Unified,
            size_bytes,
            shared_cpus: None,
        };
        m.caches = Caches {
            l1d: Some(cache(1, 32 << 10)),
            l2: Some(cache(2, 1 << 20)),
            l3: l3.map(|b| cache(3, b)),
        };
        m
    }

    #[test]
    fn smallest_level_that_holds_it() {
        let s = specs(&machine(Some(32 << 20)), Some(8 << 30));
        let names: Vec<_> = s.iter().map(|l| l.name).collect();
        assert_eq!(names, ["L1", "L2", "L3", "DRAM"]);
        assert_eq!(level_for(16 << 10, &s).name, "L1");
        assert_eq!(level_for(2 << 20, &s).name, "L3");
        assert_eq!(level_for(100 << 20, &s).name, "DRAM");
        assert_eq!(level_for(100 << 30, &s).name, "DRAM");
        assert_eq!(s[3].probe_bytes, 256 << 20);
        assert_eq!(s[2].probe_bytes, 16 << 20);
    }

    #[test]
    fn dram_probe_is_4x_l3_but_at_most_half_the_memory() {
        let s = specs(&machine(Some(128 << 20)), Some(8 << 30));
        assert_eq!(s.last().unwrap().probe_bytes, 512 << 20);
        let s = specs(&machine(Some(128 << 20)), Some(256 << 20));
        assert_eq!(s.last().unwrap().probe_bytes, 128 << 20);
        let s = specs(&machine(None), None);
        assert_eq!(s.len(), 3);
        assert_eq!(level_for(4 << 20, &s).name, "DRAM");
    }
}

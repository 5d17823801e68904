//! How many threads to run: the CPUs this process may use (its affinity
//! mask), how many physical cores those are, and the cgroup CPU quota.
//!
//! Hyper-threads of one core share its load ports and caches, so a
//! memory-bound decode gains nothing from running on both; a quota of 1.5
//! CPUs throttles a third thread instead of using it. The default thread
//! count is therefore the physical cores among the allowed CPUs, capped at
//! the quota rounded up.

use crate::cgroup::{cpu_quota, CpuQuota};
use crate::cpulist::{format_cpulist, parse_cpulist};
use std::collections::HashSet;

/// A physical core: the CPUs (hardware threads) with the same id share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoreId {
    pub package: u32,
    /// 0 where the kernel has no `die_id`.
    pub die: u32,
    pub core: u32,
}

/// A thread count and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadChoice {
    pub n: usize,
    /// e.g. "2 physical cores available (affinity 0-1, no cgroup limit)".
    pub reason: String,
}

/// The CPUs this process may run on. From `sched_getaffinity` on Linux,
/// else `Cpus_allowed_list` in `/proc/self/status`, else CPUs
/// `0..available_parallelism` as a last resort.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    if let Some(cpus) = sched_affinity() {
        return cpus;
    }
    if let Some(cpus) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_status_cpus_allowed(&s))
    {
        return cpus;
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

#[cfg(target_os = "linux")]
fn sched_affinity() -> Option<Vec<usize>> {
    // Start at 1024 CPUs (glibc's cpu_set_t) and grow while the kernel
    // says the mask is too small for its CPU count.
    let mut words = 16usize;
    loop {
        let mut mask = vec![0u64; words];
        // SAFETY: the kernel writes at most `words * 8` bytes into `mask`,
        // which is that long; pid 0 is this thread.
        let r = unsafe {
            libc::sched_getaffinity(0, words * 8, mask.as_mut_ptr().cast::<libc::cpu_set_t>())
        };
        if r == 0 {
            let cpus: Vec<usize> = (0..words * 64)
                .filter(|&i| mask[i / 64] & (1 << (i % 64)) != 0)
                .collect();
            return (!cpus.is_empty()).then_some(cpus);
        }
        let einval = std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL);
        if !einval || words >= 1 << 14 {
            return None;
        }
        words *= 2;
    }
}

/// Pin the calling thread to one CPU (`sched_setaffinity`), so a
/// benchmark's thread keeps its caches. Linux only; elsewhere an
/// `Unsupported` error.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    set_thread_affinity(&[cpu])
}

/// Let the calling thread run only on `cpus` (`sched_setaffinity`);
/// threads it starts afterwards inherit that. Linux only; elsewhere an
/// `Unsupported` error. The OS refuses a set with no CPU this process may
/// use.
pub fn set_thread_affinity(cpus: &[usize]) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let top = cpus.iter().max().copied().unwrap_or(0);
        let mut mask = vec![0u64; (top / 64 + 1).max(16)];
        for &cpu in cpus {
            mask[cpu / 64] |= 1 << (cpu % 64);
        }
        // SAFETY: the kernel reads `mask.len() * 8` bytes from `mask`, which
        // is that long; pid 0 is this thread.
        let r = unsafe {
            libc::sched_setaffinity(0, mask.len() * 8, mask.as_ptr().cast::<libc::cpu_set_t>())
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "setting CPU affinity is implemented for Linux only",
        ))
    }
}

/// `Cpus_allowed_list` from the text of `/proc/self/status`.
pub fn parse_status_cpus_allowed(status: &str) -> Option<Vec<usize>> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpulist(line).filter(|c| !c.is_empty())
}

/// A core id from the contents of a CPU's sysfs `topology/` files
/// (`physical_package_id`, `die_id` if present, `core_id`).
pub fn parse_core_id(package: &str, die: Option<&str>, core: &str) -> Option<CoreId> {
    Some(CoreId {
        package: package.trim().parse().ok()?,
        die: match die {
            Some(d) => d.trim().parse().ok()?,
            None => 0,
        },
        core: core.trim().parse().ok()?,
    })
}

/// The core id of `cpu` from sysfs; `None` if its topology is not there.
pub fn core_id(cpu: usize) -> Option<CoreId> {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
    parse_core_id(
        &read("physical_package_id")?,
        read("die_id").as_deref(),
        &read("core_id")?,
    )
}

/// How many physical cores `cpus` are on: CPUs with the same core id count
/// once. A CPU whose topology is unknown counts as a core of its own, so
/// without topology information every CPU is a core.
pub fn count_physical_cores(cpus: &[usize], core_of: impl Fn(usize) -> Option<CoreId>) -> usize {
    let mut seen = HashSet::new();
    let mut unknown = 0;
    for &cpu in cpus {
        match core_of(cpu) {
            Some(id) => {
                seen.insert(id);
            }
            None => unknown += 1,
        }
    }
    seen.len() + unknown
}

/// The physical cores among `cpus`, from sysfs topology.
pub fn physical_cores(cpus: &[usize]) -> usize {
    count_physical_cores(cpus, core_id)
}

/// The default thread count for `allowed` CPUs on `physical` cores under
/// an optional cgroup `quota` (in CPUs): the smaller of the cores and the
/// quota rounded up, and at least 1.
pub fn choose_threads(allowed: &[usize], physical: usize, quota: Option<f64>) -> ThreadChoice {
    let physical = physical.max(1);
    let cores = if physical == 1 { "core" } else { "cores" };
    let affinity = if physical == allowed.len() {
        format!("affinity {}", format_cpulist(allowed))
    } else {
        format!(
            "{} CPUs in affinity {}",
            allowed.len(),
            format_cpulist(allowed)
        )
    };
    let Some(q) = quota.filter(|q| q.is_finite() && *q > 0.0) else {
        return ThreadChoice {
            n: physical,
            reason: format!("{physical} physical {cores} available ({affinity}, no cgroup limit)"),
        };
    };
    let by_quota = (q.ceil() as usize).max(1);
    if by_quota < physical {
        ThreadChoice {
            n: by_quota,
            reason: format!(
                "cgroup quota of {q} CPUs allows {by_quota} of {physical} physical {cores} ({affinity})"
            ),
        }
    } else {
        ThreadChoice {
            n: physical,
            reason: format!(
                "{physical} physical {cores} available ({affinity}, cgroup quota {q} CPUs)"
            ),
        }
    }
}

/// What this process may run on, in one look.
#[derive(Clone, Debug, PartialEq)]
pub struct Cores {
    /// Sorted CPU numbers from the affinity mask.
    pub allowed: Vec<usize>,
    /// Physical cores among `allowed`.
    pub physical: usize,
    pub quota: Option<CpuQuota>,
}

impl Cores {
    pub fn probe() -> Cores {
        let allowed = allowed_cpus();
        Cores {
            physical: physical_cores(&allowed),
            quota: cpu_quota(),
            allowed,
        }
    }

    pub fn default_threads(&self) -> ThreadChoice {
        choose_threads(
            &self.allowed,
            self.physical,
            self.quota.as_ref().map(|q| q.cpus),
        )
    }
}

/// The thread count to use by default on this machine and why (see the
/// module docs).
pub fn default_threads() -> ThreadChoice {
    Cores::probe().default_threads()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[cfg(target_os = "linux")]
    #[test]
    fn pinning_a_thread_narrows_its_affinity() {
        let cpus = allowed_cpus();
        let target = *cpus.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(target).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![target]);
        // A CPU outside the allowed set is refused, not ignored.
        assert!(std::thread::spawn(|| pin_current_thread(100_000))
            .join()
            .unwrap()
            .is_err());
    }

    fn id(package: u32, core: u32) -> CoreId {
        CoreId {
            package,
            die: 0,
            core,
        }
    }

    #[test]
    fn status_cpus_allowed() {
        let s = "Name:\tcat\nCpus_allowed:\tff\nCpus_allowed_list:\t0-3,8\nMems_allowed:\t1\n";
        assert_eq!(parse_status_cpus_allowed(s), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_status_cpus_allowed("Name:\tcat\n"), None);
        assert_eq!(parse_status_cpus_allowed("Cpus_allowed_list:\tx\n"), None);
    }

    #[test]
    fn core_ids() {
        assert_eq!(parse_core_id("0\n", None, "3\n"), Some(id(0, 3)));
        assert_eq!(
            parse_core_id("1", Some("2"), "5"),
            Some(CoreId {
                package: 1,
                die: 2,
                core: 5
            })
        );
        assert_eq!(parse_core_id("", None, "3"), None);
        assert_eq!(parse_core_id("0", Some("x"), "3"), None);
        assert_eq!(parse_core_id("0", None, "-1"), None);
    }

    #[test]
    fn hyper_threads_count_once() {
        // 4 cores × 2 threads, Linux numbering: siblings are n and n + 4.
        let topo: HashMap<usize, CoreId> = (0..8).map(|c| (c, id(0, c as u32 % 4))).collect();
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(count_physical_cores(&all, |c| topo.get(&c).copied()), 4);
        // Only the siblings of cores 0 and 1.
        assert_eq!(
            count_physical_cores(&[0, 1, 4, 5], |c| topo.get(&c).copied()),
            2
        );
        assert_eq!(count_physical_cores(&[0, 1], |c| topo.get(&c).copied()), 2);
        // Same core number on two packages are two cores.
        assert_eq!(count_physical_cores(&[0, 1], |c| Some(id(c as u32, 0))), 2);
        // Unknown topology: every CPU is a core; no CPUs: none.
        assert_eq!(count_physical_cores(&[0, 1, 2], |_| None), 3);
        assert_eq!(count_physical_cores(&[], |_| None), 0);
    }

    #[test]
    fn threads_without_quota() {
        let t = choose_threads(&[0, 1], 2, None);
        assert_eq!(t.n, 2);
        assert_eq!(
            t.reason,
            "2 physical cores available (affinity 0-1, no cgroup limit)"
        );
        let t = choose_threads(&[0, 1, 2, 3, 4, 5, 6, 7], 4, None);
        assert_eq!(t.n, 4);
        assert!(t.reason.contains("8 CPUs in affinity 0-7"), "{}", t.reason);
        let t = choose_threads(&[3], 1, None);
        assert_eq!(t.n, 1);
        assert!(t.reason.starts_with("1 physical core "), "{}", t.reason);
    }

    #[test]
    fn a_quota_smaller_than_the_cores_caps_threads() {
        let all: Vec<usize> = (0..8).collect();
        let t = choose_threads(&all, 8, Some(1.5));
        assert_eq!(t.n, 2);
        assert_eq!(
            t.reason,
            "cgroup quota of 1.5 CPUs allows 2 of 8 physical cores (affinity 0-7)"
        );
        assert_eq!(choose_threads(&all, 8, Some(0.25)).n, 1);
        assert_eq!(choose_threads(&all, 8, Some(4.0)).n, 4);
        // A quota above the cores does not add threads.
        let t = choose_threads(&all, 4, Some(6.0));
        assert_eq!(t.n, 4);
        assert!(t.reason.contains("cgroup quota 6 CPUs"), "{}", t.reason);
        // Nonsense quotas are ignored, never zero threads.
        assert_eq!(choose_threads(&all, 8, Some(f64::NAN)).n, 8);
        assert_eq!(choose_threads(&[], 0, Some(0.0)).n, 1);
    }

    #[test]
    fn probe_is_sane() {
        let cores = Cores::probe();
        assert!(!cores.allowed.is_empty());
        assert!(cores.physical >= 1 && cores.physical <= cores.allowed.len());
        let t = default_threads();
        assert!(t.n >= 1 && t.n <= cores.allowed.len(), "{t:?}");
        assert!(core_id(usize::MAX).is_none());
    }
}

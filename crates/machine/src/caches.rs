//! Cache sizes per level, the numbers a model's working set is held
//! against: L1 data, L2 and L3, with the CPUs that share each.
//!
//! Read from sysfs (`/sys/devices/system/cpu/cpuN/cache/index*/`) for one
//! CPU this process may run on, since on hybrid or multi-socket machines
//! the caches differ between CPUs. Without sysfs, x86 `cpuid` (leaf 4, or
//! 0x8000_001D on AMD) gives sizes but not the sharing CPUs. A level that
//! neither source describes is `None`.

use crate::cpulist::parse_cpulist;
use std::path::Path;

/// What a cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    Data,
    Instruction,
    Unified,
}

/// One cache as seen from one CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
    /// 1, 2, 3.
    pub level: u8,
    pub kind: CacheKind,
    pub size_bytes: u64,
    /// The CPUs sharing this cache; `None` when the source does not say
    /// (cpuid).
    pub shared_cpus: Option<Vec<usize>>,
}

impl Cache {
    /// "L1d", "L1i", "L2", "L3".
    pub fn name(&self) -> String {
        match self.kind {
            CacheKind::Data if self.level == 1 => "L1d".to_string(),
            CacheKind::Instruction => format!("L{}i", self.level),
            _ => format!("L{}", self.level),
        }
    }
}

/// The caches data goes through, per level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caches {
    pub l1d: Option<Cache>,
    pub l2: Option<Cache>,
    pub l3: Option<Cache>,
}

impl Caches {
    /// The caches of `cpu` from sysfs, else from `cpuid` on x86.
    pub fn probe(cpu: usize) -> Caches {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache");
        let from_sysfs = Caches::from_entries(read_sysfs_caches(Path::new(&dir)));
        if from_sysfs != Caches::default() {
            return from_sysfs;
        }
        #[cfg(target_arch = "x86_64")]
        {
            Caches::from_entries(x86::cpuid_caches())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            from_sysfs
        }
    }

    /// The data-carrying cache of each level among `entries` (instruction
    /// caches are skipped; if a level lists both data and unified caches,
    /// the first wins).
    pub fn from_entries(entries: impl IntoIterator<Item = Cache>) -> Caches {
        let mut caches = Caches::default();
        for c in entries {
            if c.kind == CacheKind::Instruction {
                continue;
            }
            let slot = match c.level {
                1 => &mut caches.l1d,
                2 => &mut caches.l2,
                3 => &mut caches.l3,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(c);
            }
        }
        caches
    }

    /// The known levels, smallest first.
    pub fn levels(&self) -> impl Iterator<Item = &Cache> {
        [&self.l1d, &self.l2, &self.l3].into_iter().flatten()
    }
}

/// A cache size as sysfs writes it: `"48K"`, `"2048K"`, `"105M"`, or plain
/// bytes. Suffixes are binary (K = 1024). `None` if malformed or zero.
pub fn parse_cache_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(mult).filter(|&b| b > 0)
}

/// One sysfs `index*` directory from its `level`, `type`, `size` and
/// `shared_cpu_list` file contents. `None` if a required field is
/// malformed; a malformed CPU list only loses the sharing CPUs.
pub fn parse_cache_index(
    level: &str,
    kind: &str,
    size: &str,
    shared_cpu_list: Option<&str>,
) -> Option<Cache> {
    let level: u8 = level.trim().parse().ok()?;
    let kind = match kind.trim() {
        "Data" => CacheKind::Data,
        "Instruction" => CacheKind::Instruction,
        "Unified" => CacheKind::Unified,
        _ => return None,
    };
    Some(Cache {
        level,
        kind,
        size_bytes: parse_cache_size(size)?,
        shared_cpus: shared_cpu_list.and_then(parse_cpulist),
    })
}

/// Every cache described under a sysfs `cpuN/cache` directory, in index
/// order; empty if the directory is missing.
fn read_sysfs_caches(dir: &Path) -> Vec<Cache> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut indexed: Vec<(u32, Cache)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name();
            let i: u32 = name.to_str()?.strip_prefix("index")?.parse().ok()?;
            let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
            let cache = parse_cache_index(
                &read("level")?,
                &read("type")?,
                &read("size")?,
                read("shared_cpu_list").as_deref(),
            )?;
            Some((i, cache))
        })
        .collect();
    indexed.sort_by_key(|(i, _)| *i);
    indexed.into_iter().map(|(_, c)| c).collect()
}

/// One cache from the registers of `cpuid` leaf 4 (Intel) or 0x8000_001D
/// (AMD, same layout); `None` for the "no more caches" entry.
pub fn decode_cpuid_cache(eax: u32, ebx: u32, ecx: u32) -> Option<Cache> {
    let kind = match eax & 0x1f {
        1 => CacheKind::Data,
        2 => CacheKind::Instruction,
        3 => CacheKind::Unified,
        _ => return None,
    };
    let level = ((eax >> 5) & 0x7) as u8;
    let line = u64::from(ebx & 0xfff) + 1;
    let partitions = u64::from((ebx >> 12) & 0x3ff) + 1;
    let ways = u64::from(ebx >> 22) + 1;
    let sets = u64::from(ecx) + 1;
    Some(Cache {
        level,
        kind,
        size_bytes: ways * partitions * line * sets,
        shared_cpus: None,
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{decode_cpuid_cache, Cache};
    use crate::cpu::x86::cpuid;

    /// The caches `cpuid` describes for the CPU this runs on.
    pub(super) fn cpuid_caches() -> Vec<Cache> {
        let vendor = crate::cpu::x86::vendor().unwrap_or_default();
        let amd = vendor == "AuthenticAMD" || vendor == "HygonGenuine";
        let leaf = if amd { 0x8000_001D } else { 4 };
        let max = if amd {
            cpuid(0x8000_0000, 0).eax
        } else {
            cpuid(0, 0).eax
        };
        if max < leaf {
            return Vec::new();
        }
        // Real CPUs list under ten caches; the bound guards a broken VM.
        (0..16)
            .map_while(|sub| {
                let r = cpuid(leaf, sub);
                decode_cpuid_cache(r.eax, r.ebx, r.ecx)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes() {
        assert_eq!(parse_cache_size("48K\n"), Some(48 << 10));
        assert_eq!(parse_cache_size("2048K"), Some(2 << 20));
        assert_eq!(parse_cache_size("105M"), Some(105 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("32768"), Some(32768));
        for bad in ["", "K", "0K", "abc", "12Q", "-1K", "99999999999999999999G"] {
            assert_eq!(parse_cache_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sysfs_index_entries() {
        let c = parse_cache_index("3\n", "Unified\n", "32768K\n", Some("0-1\n")).unwrap();
        assert_eq!(c.level, 3);
        assert_eq!(c.kind, CacheKind::Unified);
        assert_eq!(c.size_bytes, 32 << 20);
        assert_eq!(c.shared_cpus, Some(vec![0, 1]));
        assert_eq!(c.name(), "L3");
        let c = parse_cache_index("1", "Data", "48K", None).unwrap();
        assert_eq!((c.name(), c.shared_cpus), ("L1d".to_string(), None));
        let c = parse_cache_index("2", "Unified", "1M", Some("garbage")).unwrap();
        assert_eq!(c.shared_cpus, None);
        assert_eq!(parse_cache_index("x", "Data", "48K", None), None);
        assert_eq!(parse_cache_index("1", "Weird", "48K", None), None);
        assert_eq!(parse_cache_index("1", "Data", "", None), None);
    }

    #[test]
    fn levels_pick_data_caches() {
        let e = |level, kind, kib: u64| Cache {
            level,
            kind,
            size_bytes: kib << 10,
            shared_cpus: None,
        };
        let caches = Caches::from_entries([
            e(1, CacheKind::Instruction, 32),
            e(1, CacheKind::Data, 48),
            e(2, CacheKind::Unified, 2048),
            e(4, CacheKind::Unified, 1 << 20),
        ]);
        assert_eq!(caches.l1d.as_ref().unwrap().size_bytes, 48 << 10);
        assert_eq!(caches.l2.as_ref().unwrap().size_bytes, 2 << 20);
        assert_eq!(caches.l3, None);
        let names: Vec<_> = caches.levels().map(Cache::name).collect();
        assert_eq!(names, ["L1d", "L2"]);
        assert_eq!(Caches::from_entries([]), Caches::default());
    }

    #[test]
    fn cpuid_leaf4_registers() {
        // An L1d of 48 KiB: 12 ways × 1 partition × 64-byte lines × 64 sets
        // (each field holds its value minus one; partitions is bits 12..22).
        let eax = 1 | (1 << 5);
        let ebx = 63 | (11 << 22);
        let c = decode_cpuid_cache(eax, ebx, 63).unwrap();
        assert_eq!(
            (c.level, c.kind, c.size_bytes),
            (1, CacheKind::Data, 48 << 10)
        );
        // An L3 of 32 MiB: 16 ways × 64 B × 32768 sets.
        let c = decode_cpuid_cache(3 | (3 << 5), 63 | (15 << 22), 32767).unwrap();
        assert_eq!((c.name(), c.size_bytes), ("L3".to_string(), 32 << 20));
        assert_eq!(decode_cpuid_cache(0, 0, 0), None);
    }

    /// Linux fills sysfs from the same cpuid leaves on x86, so where both
    /// exist they agree.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn cpuid_agrees_with_sysfs() {
        let from_cpuid = Caches::from_entries(x86::cpuid_caches());
        let from_sysfs = Caches::from_entries(read_sysfs_caches(Path::new(
            "/sys/devices/system/cpu/cpu0/cache",
        )));
        let size = |c: &Option<Cache>| c.as_ref().map(|c| c.size_bytes);
        for (a, b) in [
            (&from_cpuid.l1d, &from_sysfs.l1d),
            (&from_cpuid.l2, &from_sysfs.l2),
            (&from_cpuid.l3, &from_sysfs.l3),
        ] {
            if a.is_some() && b.is_some() {
                assert_eq!(
                    size(a),
                    size(b),
                    "cpuid {from_cpuid:?}, sysfs {from_sysfs:?}"
                );
            }
        }
    }

    #[test]
    fn missing_sysfs_is_empty() {
        assert!(read_sysfs_caches(Path::new("/nonexistent/cache")).is_empty());
        let _ = Caches::probe(0);
        let _ = Caches::probe(usize::MAX);
    }
}

//! The CPU quota of this process's cgroup: how many CPUs' worth of time
//! the container may use, however many CPUs it can see.
//!
//! cgroup v2 writes it as `cpu.max` ("max 100000" for none, "200000
//! 100000" for two CPUs); v1 as `cpu.cfs_quota_us` / `cpu.cfs_period_us`
//! (quota -1 for none). The cgroup comes from `/proc/self/cgroup` and its
//! directory from the mount in `/proc/self/mountinfo`. A parent cgroup's
//! quota limits its children too, so every level up to the mount is read
//! and the smallest quota wins.

use std::path::{Path, PathBuf};

/// A CPU-time limit in CPUs (1.5 = one and a half CPUs' worth of time per
/// period), and the file that sets it.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuQuota {
    pub cpus: f64,
    pub file: PathBuf,
}

/// The quota of the cgroup this process is in; `None` when there is none,
/// or no cgroup files to read.
pub fn cpu_quota() -> Option<CpuQuota> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts = parse_mountinfo(&mountinfo);
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let v2 = cgroup_path(&cgroup, Hierarchy::V2).and_then(|path| {
        let (root, point) = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup2")
            .map(|m| (m.root.as_str(), m.mount_point.as_str()))
            .unwrap_or(("/", "/sys/fs/cgroup"));
        let dir = cgroup_dir(root, point, &path);
        smallest_quota(&dir, Path::new(point), |d| {
            let f = d.join("cpu.max");
            Some((parse_cpu_max(&read(&f)?)?, f))
        })
    });
    let v1 = cgroup_path(&cgroup, Hierarchy::V1Cpu).and_then(|path| {
        let mount = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "cpu"));
        let (root, point) = match mount {
            Some(m) => (m.root.as_str(), m.mount_point.clone()),
            None => ("/", default_v1_mount()?),
        };
        let dir = cgroup_dir(root, &point, &path);
        smallest_quota(&dir, Path::new(&point), |d| {
            let f = d.join("cpu.cfs_quota_us");
            let period = read(&d.join("cpu.cfs_period_us"))?;
            Some((parse_cfs_quota(&read(&f)?, &period)?, f))
        })
    });
    [v2, v1]
        .into_iter()
        .flatten()
        .min_by(|a, b| a.cpus.total_cmp(&b.cpus))
}

/// Where the v1 cpu controller usually is when mountinfo does not say.
fn default_v1_mount() -> Option<String> {
    ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
        .into_iter()
        .find(|p| Path::new(p).is_dir())
        .map(str::to_string)
}

/// A cgroup v2 `cpu.max`: `Some(cpus)` for "QUOTA PERIOD", `None` for
/// "max ..." (no limit) or anything malformed.
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?;
    // The period is optional when writing; the kernel always prints it.
    let period = fields.next().unwrap_or("100000");
    if quota == "max" {
        return None;
    }
    quota_cpus(quota, period)
}

/// A cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`: `None` for a
/// quota of -1 (no limit) or anything malformed.
pub fn parse_cfs_quota(quota: &str, period: &str) -> Option<f64> {
    quota_cpus(quota.trim(), period.trim())
}

fn quota_cpus(quota: &str, period: &str) -> Option<f64> {
    let quota: i64 = quota.parse().ok()?;
    let period: i64 = period.parse().ok()?;
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// Which cgroup hierarchy a `/proc/self/cgroup` line belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy: the line "0::/path".
    V2,
    /// The v1 hierarchy with the `cpu` controller: "N:cpu,cpuacct:/path".
    V1Cpu,
}

/// The cgroup path of this process in `hierarchy`, from the text of
/// `/proc/self/cgroup`.
pub fn cgroup_path(proc_self_cgroup: &str, hierarchy: Hierarchy) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match hierarchy {
            Hierarchy::V2 => id == "0" && controllers.is_empty(),
            Hierarchy::V1Cpu => controllers.split(',').any(|c| c == "cpu"),
        };
        wanted.then(|| path.trim().to_string())
    })
}

/// A mount from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the filesystem that is mounted (a cgroup path for
    /// cgroup mounts: "/" unless a container mounts only its own cgroup).
    pub root: String,
    pub mount_point: String,
    pub fs_type: String,
    pub super_options: String,
}

/// The cgroup mounts in a `/proc/self/mountinfo` text (other mounts and
/// malformed lines are skipped).
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let f: Vec<&str> = before.split_whitespace().collect();
            let a: Vec<&str> = after.split_whitespace().collect();
            if f.len() < 5 || a.is_empty() || !a[0].starts_with("cgroup") {
                return None;
            }
            Some(Mount {
                root: unescape(f[3]),
                mount_point: unescape(f[4]),
                fs_type: a[0].to_string(),
                super_options: a.get(2).copied().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The directory of cgroup `path` under a mount of cgroup directory `root`
/// at `mount_point`. A path outside `root` (seen from inside a cgroup
/// namespace) is the mount point itself.
pub fn cgroup_dir(root: &str, mount_point: &str, path: &str) -> PathBuf {
    let root = root.trim_end_matches('/');
    let rel = match path.strip_prefix(root) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => "",
    };
    let mut dir = PathBuf::from(mount_point);
    dir.extend(rel.split('/').filter(|c| !c.is_empty() && *c != ".."));
    dir
}

/// The smallest quota `read` finds in `dir` and its parents up to and
/// including `top`.
pub fn smallest_quota(
    dir: &Path,
    top: &Path,
    read: impl Fn(&Path) -> Option<(f64, PathBuf)>,
) -> Option<CpuQuota> {
    let mut best: Option<CpuQuota> = None;
    for d in dir.ancestors() {
        if let Some((cpus, file)) = read(d) {
            if best.as_ref().is_none_or(|b| cpus < b.cpus) {
                best = Some(CpuQuota { cpus, file });
            }
        }
        if d == top || !d.starts_with(top) {
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_forms() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("max"), None);
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2.0));
        assert_eq!(parse_cpu_max("150000 100000"), Some(1.5));
        assert_eq!(parse_cpu_max("50000 100000"), Some(0.5));
        assert_eq!(parse_cpu_max("200000"), Some(2.0));
        for bad in ["", "\n", "abc 100000", "100000 0", "0 100000", "-5 100000"] {
            assert_eq!(parse_cpu_max(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cgroup_v1_quota() {
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs_quota("300000\n", "100000\n"), Some(3.0));
        assert_eq!(parse_cfs_quota("25000", "50000"), Some(0.5));
        assert_eq!(parse_cfs_quota("", "100000"), None);
        assert_eq!(parse_cfs_quota("100000", ""), None);
    }

    #[test]
    fn proc_self_cgroup_lines() {
        let v2 = "0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            cgroup_path(v2, Hierarchy::V2).as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        assert_eq!(cgroup_path(v2, Hierarchy::V1Cpu), None);
        let hybrid =
            "9:name=systemd:/\n4:memory:/x\n2:cpuacct:/a\n1:cpu,cpuacct:/docker/abc\n0::/\n";
        assert_eq!(
            cgroup_path(hybrid, Hierarchy::V1Cpu).as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(cgroup_path(hybrid, Hierarchy::V2).as_deref(), Some("/"));
        assert_eq!(cgroup_path("", Hierarchy::V2), None);
        assert_eq!(cgroup_path("garbage", Hierarchy::V1Cpu), None);
    }

    #[test]
    fn mountinfo_cgroup_mounts() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 /docker/abc /sys/fs/cgroup/unified\\040dir rw - cgroup2 cgroup2 rw
not a mount line
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, "/sys/fs/cgroup/cpu,cpuacct");
        assert_eq!(m[0].super_options, "rw,cpu,cpuacct");
        assert_eq!(m[2].fs_type, "cgroup2");
        assert_eq!(m[2].root, "/docker/abc");
        assert_eq!(m[2].mount_point, "/sys/fs/cgroup/unified dir");
        assert!(parse_mountinfo("").is_empty());
    }

    #[test]
    fn cgroup_dirs() {
        let d = |root, point, path| cgroup_dir(root, point, path);
        assert_eq!(d("/", "/sys/fs/cgroup", "/"), Path::new("/sys/fs/cgroup"));
        assert_eq!(
            d("/", "/sys/fs/cgroup", "/a/b"),
            Path::new("/sys/fs/cgroup/a/b")
        );
        assert_eq!(
            d("/docker/abc", "/sys/fs/cgroup", "/docker/abc/sub"),
            Path::new("/sys/fs/cgroup/sub")
        );
        // Inside a cgroup namespace the process sees itself at "/".
        assert_eq!(
            d("/docker/abc", "/sys/fs/cgroup", "/"),
            Path::new("/sys/fs/cgroup")
        );
        assert_eq!(
            d("/docker/abc", "/sys/fs/cgroup", "/docker/abcdef"),
            Path::new("/sys/fs/cgroup")
        );
        assert_eq!(
            d("/", "/sys/fs/cgroup", "/../../etc"),
            Path::new("/sys/fs/cgroup/etc")
        );
    }

    #[test]
    fn a_parent_quota_limits_the_child() {
        let files = [
            ("/cg/a/b", "max 100000"),
            ("/cg/a", "150000 100000"),
            ("/cg", "400000 100000"),
            ("/", "10000 100000"),
        ];
        let read = |d: &Path| {
            let (_, text) = files.iter().find(|(p, _)| Path::new(p) == d)?;
            Some((parse_cpu_max(text)?, d.join("cpu.max")))
        };
        let q = smallest_quota(Path::new("/cg/a/b"), Path::new("/cg"), read).unwrap();
        // "/" is above the mount and not read.
        assert_eq!(q.cpus, 1.5);
        assert_eq!(q.file, Path::new("/cg/a/cpu.max"));
        assert_eq!(
            smallest_quota(Path::new("/cg/a/b"), Path::new("/cg"), |_| None),
            None
        );
    }

    #[test]
    fn probe_does_not_panic() {
        let _ = cpu_quota();
    }
}

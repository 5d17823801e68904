//! Linux CPU lists ("0-3,8,10-11"), the format of `shared_cpu_list`,
//! `/sys/devices/system/cpu/online` and `Cpus_allowed_list`.

/// The CPUs in a list like `"0-3,8,10-11"`, sorted and without
/// duplicates. `None` if any part is malformed (a reversed range, a
/// non-number); an empty or all-whitespace string is the empty set.
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    // Cap a range so a corrupt file cannot make us allocate gigabytes.
    const MAX_CPU: usize = 1 << 20;
    let mut cpus = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi): (usize, usize) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let n = part.parse().ok()?;
                (n, n)
            }
        };
        if lo > hi || hi > MAX_CPU {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The CPUs set in a hexadecimal mask like llama.cpp's `--cpu-mask`
/// (`"0x5"` or `"5"`: CPUs 0 and 2; bit i of the number is CPU i, any
/// length). `None` if it is empty or not hexadecimal; a mask of zeros is
/// the empty set.
pub fn parse_cpu_mask(s: &str) -> Option<Vec<usize>> {
    // Four CPUs a digit: 2^18 CPUs at most, far beyond any machine.
    const MAX_DIGITS: usize = 1 << 16;
    let s = s.trim();
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if hex.is_empty() || hex.len() > MAX_DIGITS {
        return None;
    }
    let mut cpus = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let d = c.to_digit(16)?;
        cpus.extend((0..4).filter(|b| d >> b & 1 == 1).map(|b| 4 * i + b));
    }
    Some(cpus)
}

/// The compact list form of `cpus` (`[0, 1, 2, 3, 8]` → `"0-3,8"`); the
/// input need not be sorted. The empty set is `""`.
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        let end = sorted[i];
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_masks() {
        assert_eq!(parse_cpu_mask("0x5"), Some(vec![0, 2]));
        assert_eq!(parse_cpu_mask("F0"), Some(vec![4, 5, 6, 7]));
        assert_eq!(parse_cpu_mask("0X10000000000000001"), Some(vec![0, 64]));
        assert_eq!(parse_cpu_mask(" 0x0 "), Some(vec![]));
        assert_eq!(parse_cpu_mask("0xg"), None);
        assert_eq!(parse_cpu_mask("0x"), None);
        assert_eq!(parse_cpu_mask(""), None);
        assert_eq!(parse_cpu_mask("-1"), None);
    }

    #[test]
    fn lists_ranges_and_singles() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("3,1,1-2"), Some(vec![1, 2, 3]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist(" \n"), Some(vec![]));
    }

    #[test]
    fn malformed_lists_are_none() {
        for bad in ["a", "3-1", "0-", "-2", "1,,x", "0-99999999999", "1.5"] {
            assert_eq!(parse_cpulist(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn format_round_trips() {
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[7]), "7");
        assert_eq!(format_cpulist(&[2, 0, 1]), "0-2");
        assert_eq!(format_cpulist(&[]), "");
        for s in ["0-3,8,10-11", "0", "1,3,5", "0-63"] {
            assert_eq!(format_cpulist(&parse_cpulist(s).unwrap()), s);
        }
    }
}

//! `cachefit stream` through the real binary.

mod common;

use common::cachefit;

#[test]
fn json_reports_positive_read_and_copy_bandwidth() {
    let (ok, out, err) = cachefit(&["stream", "--size", "8M", "-t", "1", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "one JSON line: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["size_bytes"], 8u64 << 20);
    assert_eq!(v["threads"], 1);
    assert!(v["kernels"].is_string(), "{v}");
    for probe in ["read", "copy"] {
        let best = v[probe]["best_gbps"].as_f64().unwrap();
        let median = v[probe]["median_gbps"].as_f64().unwrap();
        assert!(best.is_finite() && best > 0.0, "{probe}: {v}");
        assert!(median > 0.0 && median <= best, "{probe}: {v}");
        assert!(v[probe]["passes"].as_u64().unwrap() >= 3, "{probe}: {v}");
    }
}

#[test]
fn text_names_both_probes_and_the_thread_choice() {
    let (ok, out, err) = cachefit(&["stream", "--size", "64KiB"]);
    assert!(ok, "{err}");
    assert!(out.contains("buffer 64.00 KiB (65536 bytes)"), "{out}");
    // No -t: the default comes with its reason.
    assert!(out.contains("physical core"), "{out}");
    assert!(
        out.contains("read: best") && out.contains("copy: best"),
        "{out}"
    );
}

#[test]
fn bad_sizes_and_threads_are_clear_errors() {
    for (size, want) in [
        ("0", "more than 0 bytes"),
        ("0M", "more than 0 bytes"),
        ("garbage", "is not a size"),
        ("12Q", "is not a size"),
        ("1.5G", "is not a size"),
        ("99999999999999G", "too large"),
        // Far more than any test machine has.
        ("1000000G", "of memory is available"),
    ] {
        let (ok, out, err) = cachefit(&["stream", "--size", size]);
        assert!(!ok, "--size {size} accepted: {out}");
        assert!(err.contains(want), "--size {size}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (ok, _, err) = cachefit(&["stream", "--size", "1M", "-t", "0"]);
    assert!(!ok && err.contains("-t must be at least 1"), "{err}");
}

/// Without `--size`, stream reads the buffer `info` probes DRAM with (at
/// least 4× the last-level cache and 256 MiB), so their DRAM figures are
/// comparable.
#[test]
fn default_size_is_infos_dram_probe() {
    let (ok, out, err) = cachefit(&["stream", "-t", "1", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (ok, out, err) = cachefit(&["info", "--quick", "--json", "-t", "1"]);
    assert!(ok, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let dram = info["bandwidth"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(dram["level"], "DRAM", "{info}");
    assert_eq!(v["size_bytes"], dram["buffer_bytes"], "{v} vs {dram}");
}

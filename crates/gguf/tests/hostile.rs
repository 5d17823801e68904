//! Hostile and broken files: every one is a clear error naming the problem,
//! never a panic, an abort or a huge allocation.

mod common;

use gguf::{parse_header, GgufFile, Limits};
use proptest::prelude::*;
use std::io::Write;

fn err_of(bytes: &[u8]) -> String {
    match parse_header(bytes, Limits::default()) {
        Ok(_) => panic!("accepted a broken file"),
        Err(e) => e.to_string(),
    }
}

fn open_err(bytes: &[u8]) -> String {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    match GgufFile::open(f.path()) {
        Ok(_) => panic!("accepted a broken file"),
        Err(e) => e.to_string(),
    }
}

fn header_prefix(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A file with one tensor entry built from the given fields.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header_prefix(1, 0);
    put_str(&mut b, name);
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

#[test]
fn empty_file_directory_and_non_gguf() {
    let e = open_err(b"");
    assert!(e.contains("empty"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = GgufFile::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("directory"), "{e}");
    let e = GgufFile::open(dir.path().join("nope.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("nope.gguf") && e.contains("No such file"), "{e}");
    let e = open_err(b"hello world, this is text\n");
    assert!(e.contains("not a GGUF file"), "{e}");
    let e = open_err(b"GG");
    assert!(e.contains("truncated") && e.contains("magic"), "{e}");
    let e = open_err(b"X");
    assert!(e.contains("not a GGUF file"), "{e}");
}

/// Issue 19: a FIFO as the model blocked `open` forever waiting for a
/// writer, and `/dev/zero` was read until memory ran out.
#[cfg(unix)]
#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for path in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        for mmap in [true, false] {
            let opts = gguf::OpenOptions {
                mmap,
                ..Default::default()
            };
            let e = GgufFile::open_with(path, opts).err().unwrap().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
    }
}

#[test]
fn error_names_the_file() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(b"GGUF\x01\0\0\0").unwrap();
    let e = GgufFile::open(f.path()).err().unwrap().to_string();
    assert!(e.starts_with(&f.path().display().to_string()), "{e}");
    assert!(e.contains("version 1"), "{e}");
}

#[test]
fn truncation_anywhere_is_an_error() {
    let bytes = common::sample_file();
    let h = parse_header(&bytes, Limits::default()).unwrap();
    // Every cut inside the header, and a spread of cuts inside the data up
    // to the end of the last tensor (what follows is only padding).
    let data_start = h.data_offset as usize;
    let data_end = h
        .tensors
        .iter()
        .map(|t| (h.data_offset + t.offset + t.n_bytes) as usize)
        .max()
        .unwrap();
    let cuts = (1..data_start).chain((data_start..data_end).step_by(7));
    for cut in cuts {
        let e = err_of(&bytes[..cut]);
        assert!(
            e.contains("truncated") || e.contains("runs past the end"),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn absurd_counts_do_not_allocate() {
    let e = err_of(&header_prefix(u64::MAX, 0));
    assert!(e.contains("tensor count"), "{e}");
    let e = err_of(&header_prefix(0, u64::MAX));
    assert!(e.contains("metadata count") && e.contains("limit"), "{e}");
    let e = err_of(&header_prefix(0, 1_000_000));
    assert!(
        e.contains("metadata count") && e.contains("truncated"),
        "{e}"
    );
    // A key whose string length is absurd.
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    let e = err_of(&b);
    assert!(e.contains("string length") && e.contains("limit"), "{e}");
    // An array claiming 2^40 u32 elements.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "big.array");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let e = err_of(&b);
    assert!(
        e.contains("`big.array`") && e.contains("array length"),
        "{e}"
    );
}

#[test]
fn bad_types_and_versions() {
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&99u32.to_le_bytes());
    let e = err_of(&b);
    assert!(
        e.contains("`k`") && e.contains("unknown metadata value type 99"),
        "{e}"
    );

    let mut b = header_prefix(0, 1);
    put_str(&mut b, "flag");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.push(2);
    let e = err_of(&b);
    assert!(e.contains("`flag`") && e.contains("bool"), "{e}");

    let mut b = header_prefix(0, 1);
    put_str(&mut b, "s");
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&[0xff, 0xfe]);
    let e = err_of(&b);
    assert!(e.contains("`s`") && e.contains("UTF-8"), "{e}");

    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert!(err_of(&b).contains("version 4"));

    let e = err_of(&one_tensor("w", &[32], 4, 0, 64));
    assert!(
        e.contains("`w`") && e.contains("unknown ggml type id 4"),
        "{e}"
    );
}

#[test]
fn deeply_nested_arrays_are_refused() {
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "deep");
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..64 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    let e = err_of(&b);
    assert!(e.contains("`deep`") && e.contains("nested deeper"), "{e}");
}

#[test]
fn duplicate_keys_and_tensors() {
    let mut b = header_prefix(0, 2);
    for _ in 0..2 {
        put_str(&mut b, "dup");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
    }
    assert!(err_of(&b).contains("duplicate metadata key `dup`"));

    let mut b = header_prefix(2, 0);
    for off in [0u64, 32] {
        put_str(&mut b, "t");
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + 64, 0);
    assert!(err_of(&b).contains("duplicate tensor name `t`"));
}

#[test]
fn tensor_shapes_offsets_and_alignment() {
    // Sanity: the builder helper makes a valid file.
    parse_header(&one_tensor("ok", &[32, 2], 2, 0, 36), Limits::default()).unwrap();

    let e = err_of(&one_tensor("w", &[1 << 62, 1 << 62], 0, 0, 0));
    assert!(e.contains("`w`") && e.contains("overflows"), "{e}");
    let e = err_of(&one_tensor("w", &[u64::MAX], 0, 0, 0));
    assert!(e.contains("`w`") && e.contains("overflows"), "{e}");
    // Regression (fuzzer): a zero dimension next to huge ones is an empty
    // tensor, not an overflow panic.
    let h = parse_header(
        &one_tensor("z", &[0, 1 << 40, 1 << 40], 0, 0, 0),
        Limits::default(),
    )
    .unwrap();
    assert_eq!((h.tensors[0].n_bytes, h.tensors[0].n_elements()), (0, 0));
    assert_eq!(h.tensors[0].n_rows(), u64::MAX);
    let h = parse_header(
        &one_tensor("z", &[32, 0, u64::MAX, u64::MAX], 2, 0, 0),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(h.tensors[0].n_rows(), 0);
    let e = err_of(&one_tensor("w", &[1 << 40], 0, 0, 0));
    assert!(e.contains("`w`") && e.contains("past the end"), "{e}");
    let e = err_of(&one_tensor("w", &[33], 2, 0, 64));
    assert!(
        e.contains("`w`") && e.contains("multiple of the Q4_0 block size 32"),
        "{e}"
    );
    let e = err_of(&one_tensor("w", &[4], 0, 8, 64));
    assert!(
        e.contains("`w`") && e.contains("not a multiple of the alignment 32"),
        "{e}"
    );
    let e = err_of(&one_tensor("w", &[4], 0, u64::MAX - 31, 64));
    assert!(e.contains("`w`") && e.contains("past the end"), "{e}");
    let e = err_of(&one_tensor("w", &[4], 0, 64, 64));
    assert!(e.contains("`w`") && e.contains("past the end"), "{e}");
    let e = err_of(&one_tensor("w", &[1, 1, 1, 1, 1], 0, 0, 64));
    assert!(e.contains("`w`") && e.contains("5 dimensions"), "{e}");
    let long = "n".repeat(64);
    let e = err_of(&one_tensor(&long, &[4], 0, 0, 64));
    assert!(e.contains("name is 64 bytes"), "{e}");

    let mut b = header_prefix(0, 1);
    put_str(&mut b, "general.alignment");
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&24u32.to_le_bytes());
    assert!(err_of(&b).contains("24 is not a power of two"));
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "general.alignment");
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    assert!(err_of(&b).contains("4 is not a power of two that is a multiple of 8"));
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "general.alignment");
    b.extend_from_slice(&8u32.to_le_bytes());
    put_str(&mut b, "x");
    let e = err_of(&b);
    assert!(
        e.contains("general.alignment") && e.contains("string"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random byte corruption of a valid file never panics; if the parser
    /// accepts it, every tensor view is inside the buffer.
    #[test]
    fn corrupted_bytes_never_panic(flips in proptest::collection::vec((0usize..4096, any::<u8>()), 1..8)) {
        let mut bytes = common::sample_file();
        let n = bytes.len();
        for (pos, val) in flips {
            bytes[pos % n] = val;
        }
        if let Ok(h) = parse_header(&bytes, Limits::default()) {
            for t in &h.tensors {
                prop_assert!(h.data_offset + t.offset + t.n_bytes <= n as u64);
            }
        }
    }

    #[test]
    fn random_bytes_after_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"GGUF\x03\0\0\0".to_vec();
        bytes.extend_from_slice(&tail);
        let _ = parse_header(&bytes, Limits::default());
    }
}

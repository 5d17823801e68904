//! The writer writes what the reader reads; rewriting is byte-identical.

mod common;

use gguf::{parse_header, Builder, GgufFile, Limits, OpenOptions, TensorSpec, Value};
use std::io::Write;

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut b = Builder::new(f.metadata().clone());
    for t in f.tensors() {
        b.add_tensor(TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .unwrap();
    }
    let mut w = b.write_header(Vec::new()).unwrap();
    for t in f.tensors() {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    w.finish().unwrap()
}

fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

#[test]
fn write_read_rewrite_is_byte_identical() {
    let bytes = common::sample_file();
    let tmp = write_tmp(&bytes);
    for mmap in [true, false] {
        let f = GgufFile::open_with(
            tmp.path(),
            OpenOptions {
                mmap,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.tensors().len(), 4);
        let m = f.metadata();
        assert_eq!(m.get_str("general.name").unwrap(), "tiny ✓ test");
        assert_eq!(m.get("t.i64"), Some(&Value::I64(i64::MIN)));
        assert_eq!(m.get_u64("t.u64").unwrap(), u64::MAX);
        assert_eq!(m.get_f32("t.f64").unwrap(), -2.25);
        assert_eq!(m.get_str_array("t.strings").unwrap(), ["a", ""]);
        let (_, nested) = m.get_array("t.nested").unwrap();
        assert_eq!(nested.len(), 2);
        let (info, data) = f.tensor("b.weight").unwrap();
        assert_eq!(info.dims, [5]);
        assert_eq!(data.len(), 20);
        // Tensor data is aligned within the file and the mapping.
        for t in f.tensors() {
            assert_eq!((f.data_offset() + t.offset) % 32, 0);
            assert_eq!(f.tensor_data(t).as_ptr() as usize % 8, 0);
        }
        assert_eq!(rewrite(&f), bytes, "mmap={mmap}");
    }
}

#[test]
fn from_bytes_reads_what_open_reads() {
    let bytes = common::sample_file();
    // An odd offset: the image in memory need not be aligned.
    let mut shifted = vec![0u8; 1];
    shifted.extend_from_slice(&bytes);
    let f = GgufFile::from_bytes("<built in>", &shifted[1..], Limits::default()).unwrap();
    assert_eq!(f.path().to_str(), Some("<built in>"));
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).as_ptr() as usize % 8, 0);
    }
    assert_eq!(rewrite(&f), bytes);
    let e = GgufFile::from_bytes("<built in>", &bytes[..40], Limits::default())
        .err()
        .expect("a truncated image is refused");
    assert!(e.to_string().contains("<built in>"), "{e}");
    assert!(GgufFile::from_bytes("x", &[], Limits::default()).is_err());
}

#[test]
fn custom_alignment_round_trips() {
    let bytes = common::sample_file();
    let h = parse_header(&bytes, Limits::default()).unwrap();
    let mut m = h.metadata.clone();
    m.set("general.alignment", Value::U32(64));
    let mut b = Builder::new(m);
    for t in &h.tensors {
        b.add_tensor(TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .unwrap();
    }
    let mut w = b.write_header(Vec::new()).unwrap();
    for t in &h.tensors {
        let s = (h.data_offset + t.offset) as usize;
        w.write_tensor(&bytes[s..s + t.n_bytes as usize]).unwrap();
    }
    let out = w.finish().unwrap();
    let h2 = parse_header(&out, Limits::default()).unwrap();
    assert_eq!(h2.alignment, 64);
    assert_eq!(h2.data_offset % 64, 0);
    for (a, b) in h.tensors.iter().zip(&h2.tensors) {
        assert_eq!(b.offset % 64, 0);
        let sa = (h.data_offset + a.offset) as usize;
        let sb = (h2.data_offset + b.offset) as usize;
        assert_eq!(
            bytes[sa..sa + a.n_bytes as usize],
            out[sb..sb + b.n_bytes as usize]
        );
    }
}

#[test]
fn writer_rejects_bad_input() {
    let mut b = Builder::new(Default::default());
    let e = b
        .add_tensor(TensorSpec {
            name: "x".into(),
            dims: vec![33],
            ty: gguf::GgmlType::Q4_0,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x`") && e.contains("multiple of 32"), "{e}");
    b.add_tensor(TensorSpec {
        name: "x".into(),
        dims: vec![4],
        ty: gguf::GgmlType::F32,
    })
    .unwrap();
    let mut w = b.write_header(Vec::new()).unwrap();
    let e = w.write_tensor(&[0u8; 3]).unwrap_err().to_string();
    assert!(
        e.contains("got 3 bytes") && e.contains("expected 16"),
        "{e}"
    );
    let b2 = Builder::new(Default::default());
    let mut b3 = b2.clone();
    b3.add_tensor(TensorSpec {
        name: "y".into(),
        dims: vec![1],
        ty: gguf::GgmlType::F32,
    })
    .unwrap();
    let w = b3.write_header(Vec::new()).unwrap();
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("`y`") && e.contains("no data"), "{e}");
}

#[test]
fn real_model_reads_and_rewrites_identically() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let m = f.metadata();
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(f.tensors().len(), 272);
    let (info, data) = f.tensor("token_embd.weight").unwrap();
    assert_eq!(info.dims, [576, 49152]);
    assert_eq!(data.len() as u64, info.n_bytes);
    // Our rewrite of it reads back and rewrites to the same bytes.
    let once = rewrite(&f);
    let tmp = write_tmp(&once);
    let g = GgufFile::open(tmp.path()).unwrap();
    assert_eq!(g.metadata(), f.metadata());
    for (a, b) in f.tensors().iter().zip(g.tensors()) {
        assert_eq!(a.name, b.name);
        assert_eq!(f.tensor_data(a), g.tensor_data(b));
    }
    assert_eq!(rewrite(&g), once);
}

/// Derived buffers hold what was written into them for as long as the
/// file lives; a released tensor reads back the same bytes (from the
/// file, for a map; untouched, for a copy).
#[test]
fn derived_buffers_and_released_tensors() {
    let n = 40_000usize; // 160 KB: whole pages inside the tensor
    let mut b = Builder::new(gguf::Metadata::default());
    b.add_tensor(TensorSpec {
        name: "big".into(),
        dims: vec![n as u64],
        ty: gguf::GgmlType::F32,
    })
    .unwrap();
    let data: Vec<u8> = (0..4 * n).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = b.write_header(Vec::new()).unwrap();
    w.write_tensor(&data).unwrap();
    let tmp = write_tmp(&w.finish().unwrap());
    for mmap in [true, false] {
        let f = GgufFile::open_with(
            tmp.path(),
            OpenOptions {
                mmap,
                ..Default::default()
            },
        )
        .unwrap();
        let (_, t) = f.tensor("big").unwrap();
        assert_eq!(t, &data[..]);
        f.release(t);
        f.release(&data); // not part of the map: ignored
        assert_eq!(t, &data[..], "mmap {mmap}");
        let bufs: Vec<&[u8]> = (0..20)
            .map(|k| f.keep_derived(5000 + k, |b| b.fill(k as u8)).unwrap())
            .collect();
        for (k, b) in bufs.iter().enumerate() {
            assert_eq!(b.len(), 5000 + k);
            assert!(b.iter().all(|&v| v == k as u8));
        }
        // Carved in order from one arena on a huge-page boundary, each
        // buffer on a page of its own (8 KiB: two 4 KiB pages, or one
        // larger page).
        assert_eq!(bufs[0].as_ptr() as usize % (2 << 20), 0, "mmap {mmap}");
        for w in bufs.windows(2) {
            let (a, b) = (w[0].as_ptr() as usize, w[1].as_ptr() as usize);
            assert_eq!(b - a, w[0].len().next_multiple_of(b - a), "mmap {mmap}");
            assert!(b - a >= 4096 && (b - a).is_power_of_two(), "mmap {mmap}");
        }
        // Larger than an arena: one of its own; the first arena's room is
        // still used after it.
        let big = f.keep_derived(40 << 20, |b| b[(40 << 20) - 1] = 9).unwrap();
        assert_eq!((big.len(), big[0], big[(40 << 20) - 1]), (40 << 20, 0, 9));
        let after = f.keep_derived(10, |b| b.fill(3)).unwrap();
        let last = bufs[19].as_ptr() as usize + bufs[19].len();
        assert_eq!(after, &[3; 10]);
        assert!(after.as_ptr() as usize >= last && (after.as_ptr() as usize) < last + 65536);
        for (k, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&v| v == k as u8), "mmap {mmap}");
        }
    }
}

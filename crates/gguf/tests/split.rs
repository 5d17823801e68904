//! Models split over several files (llama.cpp's gguf-split layout) open as
//! one model through their first file; files that do not fit together are
//! clear errors naming the file and the problem.

use gguf::split::{write_split, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
use gguf::{
    parse_header, Builder, GgmlType, GgufFile, Limits, Metadata, OpenOptions, TensorSpec, Value,
    ValueType,
};
use std::path::{Path, PathBuf};

/// A small llama-like model: metadata as a converter writes it (with a
/// non-default alignment, which only the first shard will carry) and two
/// blocks of weights of mixed types. Returns its path.
fn model(dir: &Path) -> PathBuf {
    let mut m = Metadata::new();
    m.set("general.architecture", Value::String("llama".into()));
    m.set("general.name", Value::String("split test".into()));
    m.set("general.alignment", Value::U32(64));
    m.set("llama.block_count", Value::U32(2));
    m.set("llama.embedding_length", Value::U32(64));
    m.set("llama.attention.head_count", Value::U32(4));
    let tokens = ["<s>", "</s>", "a", "b"].map(|t| Value::String(t.into()));
    m.set(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, tokens.to_vec()),
    );
    let mut b = Builder::new(m);
    let mut add = |name: &str, dims: &[u64], ty| {
        b.add_tensor(TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        })
        .unwrap()
    };
    add("token_embd.weight", &[64, 4], GgmlType::Q8_0);
    for l in 0..2 {
        add(&format!("blk.{l}.attn_norm.weight"), &[64], GgmlType::F32);
        add(&format!("blk.{l}.attn_q.weight"), &[64, 64], GgmlType::Q4_0);
        add(
            &format!("blk.{l}.ffn_down.weight"),
            &[256, 64],
            GgmlType::Q4_K,
        );
    }
    add("output_norm.weight", &[64], GgmlType::F32);
    let path = dir.join("model.gguf");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = b.write_header(file).unwrap();
    let mut k = 0u32;
    while let Some(spec) = w.next_spec() {
        let n = spec.n_bytes().unwrap() as usize;
        let data: Vec<u8> = (0..n)
            .map(|i| {
                k = k.wrapping_mul(1_103_515_245).wrapping_add(12345 + i as u32);
                (k >> 16) as u8
            })
            .collect();
        w.write_tensor(&data).unwrap();
    }
    w.finish().unwrap();
    path
}

/// The model and its 3 shards (3 + 3 + 2 tensors) in a new folder.
fn split_model() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let whole = model(dir.path());
    let shards = write_split(&GgufFile::open(&whole).unwrap(), &dir.path().join("m"), 3).unwrap();
    (dir, whole, shards)
}

fn without_split_keys(md: &Metadata) -> Metadata {
    let mut md = md.clone();
    for k in [SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT] {
        md.remove(k);
    }
    md
}

/// The model as one file again: metadata without the split keys, every
/// tensor in order.
fn merge(f: &GgufFile) -> Vec<u8> {
    let mut b = Builder::new(without_split_keys(f.metadata()));
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

fn open_err(path: &Path) -> String {
    match GgufFile::open(path) {
        Ok(_) => panic!("{}: opened", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrite one shard with `edit` applied to its metadata and tensors.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Metadata, &mut Vec<(TensorSpec, Vec<u8>)>)) {
    let bytes = std::fs::read(path).unwrap();
    let h = parse_header(&bytes, Limits::default()).unwrap();
    let mut md = h.metadata.clone();
    let mut tensors: Vec<_> = h
        .tensors
        .iter()
        .map(|t| {
            let start = (h.data_offset + t.offset) as usize;
            let spec = TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
            };
            (spec, bytes[start..start + t.n_bytes as usize].to_vec())
        })
        .collect();
    edit(&mut md, &mut tensors);
    let mut b = Builder::new(md);
    for (spec, _) in &tensors {
        b.add_tensor(spec.clone()).unwrap();
    }
    let mut w = b.write_header(Vec::new()).unwrap();
    for (_, data) in &tensors {
        w.write_tensor(data).unwrap();
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

#[test]
fn shards_are_written_as_gguf_split_writes_them() {
    let (dir, whole, shards) = split_model();
    let names: Vec<_> = shards
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "m-00001-of-00003.gguf",
            "m-00002-of-00003.gguf",
            "m-00003-of-00003.gguf"
        ]
    );
    let original = GgufFile::open(&whole).unwrap();
    for (i, p) in shards.iter().enumerate() {
        let h = parse_header(&std::fs::read(p).unwrap(), Limits::default()).unwrap();
        let md = &h.metadata;
        assert_eq!(md.get(SPLIT_NO), Some(&Value::U16(i as u16)));
        assert_eq!(md.get(SPLIT_COUNT), Some(&Value::U16(3)));
        assert_eq!(md.get(SPLIT_TENSORS_COUNT), Some(&Value::I32(8)));
        // Last, in the order llama-gguf-split leaves them.
        let keys: Vec<_> = md.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys[keys.len() - 3..],
            [SPLIT_NO, SPLIT_TENSORS_COUNT, SPLIT_COUNT]
        );
        if i == 0 {
            assert_eq!(&without_split_keys(md), original.metadata());
            assert_eq!(h.alignment, 64);
        } else {
            assert_eq!(md.len(), 3, "{md:?}");
            assert_eq!(h.alignment, 32);
        }
        assert_eq!(h.tensors.len(), if i == 2 { 2 } else { 3 });
    }
    // Never overwrites: the shards exist now.
    let e = write_split(&original, &dir.path().join("m"), 3)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("m-00001-of-00003.gguf") && e.contains("exists"),
        "{e}"
    );
    let e = write_split(&original, &dir.path().join("n"), 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("at least one tensor"), "{e}");
}

#[test]
fn split_model_reads_as_the_whole_file() {
    let (_dir, whole, shards) = split_model();
    let original = GgufFile::open(&whole).unwrap();
    assert!(!original.is_split());
    assert_eq!(original.shards().len(), 1);
    for mmap in [true, false] {
        let opts = OpenOptions {
            mmap,
            ..Default::default()
        };
        let f = GgufFile::open_with(&shards[0], opts).unwrap();
        assert!(f.is_split());
        assert_eq!(f.path(), shards[0]);
        let paths: Vec<_> = f.shards().iter().map(|s| s.path().to_path_buf()).collect();
        assert_eq!(paths, shards);
        let counts: Vec<_> = f.shards().iter().map(|s| s.n_tensors()).collect();
        assert_eq!(counts, [3, 3, 2]);
        let total: u64 = shards
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(f.file_len(), total);
        assert_eq!(f.alignment(), 64);

        // The first shard's metadata, split keys included.
        assert_eq!(f.metadata().get(SPLIT_COUNT), Some(&Value::U16(3)));
        assert_eq!(&without_split_keys(f.metadata()), original.metadata());

        // Every tensor, in order, with the bytes of the unsplit file.
        assert_eq!(f.tensors().len(), original.tensors().len());
        for (i, (t, o)) in f.tensors().iter().zip(original.tensors()).enumerate() {
            assert_eq!((&t.name, &t.dims, t.ty), (&o.name, &o.dims, o.ty));
            assert_eq!(t.shard, i / 3, "{}", t.name);
            assert_eq!(f.tensor_data(t), original.tensor_data(o), "{}", t.name);
            assert_eq!(f.tensor(&t.name).unwrap().1, original.tensor_data(o));
            assert_eq!(f.tensor_info(&t.name), Some(t));
            assert_eq!(f.tensor_data(t).as_ptr() as usize % 32, 0);
            // Where it sits in its own file.
            let bytes = std::fs::read(&shards[t.shard]).unwrap();
            let at = f.tensor_file_offset(t) as usize;
            assert_eq!(&bytes[at..at + t.n_bytes as usize], f.tensor_data(t));
        }
        assert_eq!(merge(&f), std::fs::read(&whole).unwrap());

        // Pages of any shard can be released and read back.
        let last = f.tensor_info("output_norm.weight").unwrap();
        let before = f.tensor_data(last).to_vec();
        for t in f.tensors() {
            f.release(f.tensor_data(t));
        }
        assert_eq!(f.tensor_data(last), before);
        let kept = f.keep_derived(16, |b| b.fill(7)).unwrap();
        assert_eq!(kept, [7; 16]);
        let e = f.tensor("nope").err().unwrap().to_string();
        assert!(
            e.contains("m-00001-of-00003.gguf") && e.contains("`nope`"),
            "{e}"
        );
    }
}

#[test]
fn single_files_open_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let whole = model(dir.path());
    let bytes = std::fs::read(&whole).unwrap();
    // Named like a shard but without split keys; with a count of 1 (one
    // shard); with the 0 `gguf-split --merge` writes.
    let named = dir.path().join("x-00001-of-00003.gguf");
    std::fs::copy(&whole, &named).unwrap();
    for count in [None, Some(1u16), Some(0)] {
        rewrite(&named, |md, _| {
            if let Some(c) = count {
                md.set(SPLIT_NO, Value::U16(0));
                md.set(SPLIT_COUNT, Value::U16(c));
            }
        });
        let f = GgufFile::open(&named).unwrap();
        assert!(!f.is_split(), "{count:?}");
        assert_eq!(f.tensors().len(), 8);
        assert!(f.tensors().iter().all(|t| t.shard == 0));
        assert_eq!(f.file_len(), std::fs::metadata(&named).unwrap().len());
    }
    let f = GgufFile::open(&whole).unwrap();
    assert_eq!(f.file_len(), bytes.len() as u64);
    assert_eq!(f.shards().len(), 1);
    assert_eq!(f.shards()[0].data_offset(), f.data_offset());
    let t = &f.tensors()[3];
    assert_eq!(f.tensor_file_offset(t), f.data_offset() + t.offset);
}

#[test]
fn a_middle_shard_names_the_first() {
    let (_dir, _, shards) = split_model();
    let e = open_err(&shards[1]);
    assert!(
        e.starts_with(&format!("{}: split model:", shards[1].display()))
            && e.contains("file 2 of 3")
            && e.contains("open the model with its first file")
            && e.contains(&shards[0].display().to_string()),
        "{e}"
    );
    // The first shard under another name.
    let renamed = shards[0].with_file_name("first.gguf");
    std::fs::rename(&shards[0], &renamed).unwrap();
    let e = open_err(&renamed);
    assert!(
        e.contains("first.gguf") && e.contains("not named PREFIX-00001-of-00003.gguf"),
        "{e}"
    );
    // An image in memory cannot reach its other shards.
    let bytes = std::fs::read(&renamed).unwrap();
    let e = GgufFile::from_bytes("<built in>", &bytes, Limits::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("<built in>: split model: this is file 1 of 3"),
        "{e}"
    );
}

#[test]
fn a_missing_shard() {
    let (_dir, _, shards) = split_model();
    std::fs::remove_file(&shards[2]).unwrap();
    let e = open_err(&shards[0]);
    assert!(
        e.starts_with(&shards[2].display().to_string())
            && e.contains("file 3 of 3 of the model")
            && e.contains("is missing"),
        "{e}"
    );
    // A folder in its place is refused as for a single file.
    std::fs::create_dir(&shards[2]).unwrap();
    let e = open_err(&shards[0]);
    assert!(
        e.contains("m-00003-of-00003.gguf") && e.contains("directory"),
        "{e}"
    );
}

#[test]
fn shards_that_do_not_belong_together() {
    type Edit = fn(&mut Metadata);
    let cases: [(&str, usize, Edit, &str); 5] = [
        (
            "count",
            1,
            |md| md.set(SPLIT_COUNT, Value::U16(4)),
            "expected file 2 of 3 (`split.no` 1, `split.count` 3)",
        ),
        (
            "no",
            2,
            |md| md.set(SPLIT_NO, Value::U16(1)),
            "but it has `split.no` 1 and `split.count` 3",
        ),
        (
            "unsplit",
            1,
            |md| {
                md.remove(SPLIT_COUNT);
            },
            "but it has no split keys",
        ),
        (
            "total",
            2,
            |md| md.set(SPLIT_TENSORS_COUNT, Value::I32(9)),
            "`split.tensors.count` is 9, but the first file",
        ),
        (
            "type",
            1,
            |md| md.set(SPLIT_NO, Value::String("1".into())),
            "`split.no`: expected integer in u16 range, found string",
        ),
    ];
    for (what, shard, edit, want) in cases {
        let (_dir, _, shards) = split_model();
        rewrite(&shards[shard], |md, _| edit(md));
        let e = open_err(&shards[0]);
        assert!(
            e.starts_with(&shards[shard].display().to_string()) && e.contains(want),
            "{what}: {e}"
        );
    }
}

#[test]
fn tensor_counts_and_names_across_shards() {
    // The first file's total disagrees with what the files hold.
    let (_dir, _, shards) = split_model();
    rewrite(&shards[0], |md, _| {
        md.set(SPLIT_TENSORS_COUNT, Value::I32(9))
    });
    for p in &shards[1..] {
        rewrite(p, |md, _| md.set(SPLIT_TENSORS_COUNT, Value::I32(9)));
    }
    let e = open_err(&shards[0]);
    assert!(
        e.starts_with(&shards[0].display().to_string())
            && e.contains("`split.tensors.count` says 9 tensors, but the 3 files hold 8"),
        "{e}"
    );

    // A shard drops a tensor: the total is short.
    let (_dir, _, shards) = split_model();
    rewrite(&shards[1], |_, t| {
        t.pop();
    });
    let e = open_err(&shards[0]);
    assert!(e.contains("says 8 tensors, but the 3 files hold 7"), "{e}");

    // The first file has no total.
    let (_dir, _, shards) = split_model();
    rewrite(&shards[0], |md, _| {
        md.remove(SPLIT_TENSORS_COUNT);
    });
    let e = open_err(&shards[0]);
    assert!(e.contains("`split.tensors.count` is missing"), "{e}");

    // A tensor in two shards.
    let (_dir, _, shards) = split_model();
    let first = GgufFile::open(&shards[0]).unwrap();
    let (info, data) = first.tensor("token_embd.weight").unwrap();
    let dup = (
        TensorSpec {
            name: info.name.clone(),
            dims: info.dims.clone(),
            ty: info.ty,
        },
        data.to_vec(),
    );
    drop(first);
    rewrite(&shards[2], |_, t| t.push(dup));
    let e = open_err(&shards[0]);
    assert!(
        e.starts_with(&shards[2].display().to_string())
            && e.contains("tensor `token_embd.weight` is also in an earlier file"),
        "{e}"
    );

    // More tensors in all than the limit allows, though each file is under.
    let (_dir, _, shards) = split_model();
    let opts = OpenOptions {
        limits: Limits {
            max_tensor_count: 5,
            ..Default::default()
        },
        ..Default::default()
    };
    let e = GgufFile::open_with(&shards[0], opts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("m-00002-of-00003.gguf")
            && e.contains(
                "tensor count of all the files of the split model: 6 exceeds the limit of 5"
            ),
        "{e}"
    );
}

#[test]
fn a_broken_shard_gets_every_single_file_check() {
    let (_dir, _, shards) = split_model();
    // Cut inside the last tensor's data.
    let bytes = std::fs::read(&shards[2]).unwrap();
    std::fs::write(&shards[2], &bytes[..bytes.len() - 40]).unwrap();
    let e = open_err(&shards[0]);
    assert!(
        e.starts_with(&shards[2].display().to_string()) && e.contains("runs past the end"),
        "{e}"
    );
    // Not a GGUF at all; empty.
    std::fs::write(&shards[1], b"not a gguf file").unwrap();
    let e = open_err(&shards[0]);
    assert!(
        e.contains("m-00002-of-00003.gguf") && e.contains("not a GGUF file"),
        "{e}"
    );
    std::fs::write(&shards[1], b"").unwrap();
    let e = open_err(&shards[0]);
    assert!(
        e.contains("m-00002-of-00003.gguf") && e.contains("empty"),
        "{e}"
    );
}

#[test]
fn a_damaged_shard_header_is_an_error_not_a_panic() {
    let (_dir, _, shards) = split_model();
    let good = std::fs::read(&shards[1]).unwrap();
    let h = parse_header(&good, Limits::default()).unwrap();
    let header_len = h.data_offset as usize;
    for i in 0..header_len {
        for (what, bytes) in [
            ("cut", good[..i].to_vec()),
            ("flip", {
                let mut b = good.clone();
                b[i] ^= 0xff;
                b
            }),
        ] {
            std::fs::write(&shards[1], &bytes).unwrap();
            // Opens (a flip in padding or in a tensor's data offset that
            // stays in bounds) or fails naming a file; never panics.
            if let Err(e) = GgufFile::open(&shards[0]) {
                let e = e.to_string();
                assert!(e.contains("-of-00003.gguf: "), "{what} at {i}: {e}");
            }
        }
    }
}

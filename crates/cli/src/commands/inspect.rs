//! `cachefit inspect FILE [--json]`: metadata, tensor table, totals by type
//! and bits per weight. A split model (the first of its files given) is
//! shown as one, with its files listed and each tensor's file named.

use anyhow::Result;
use gguf::{GgmlType, GgufFile, OpenOptions, Value};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file to inspect (for a split model, its first file).
    pub file: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print every element of long metadata arrays (default: elided).
    #[arg(long)]
    pub full: bool,
    /// Read the file into memory instead of memory-mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// Lock the file's pages in RAM (fails clearly if the OS refuses).
    #[arg(long)]
    pub mlock: bool,
}

#[derive(Default)]
struct TypeTotal {
    tensors: usize,
    elements: u64,
    bytes: u64,
}

pub fn run(args: Args) -> Result<()> {
    let opts = OpenOptions {
        mmap: !args.no_mmap,
        mlock: args.mlock,
        ..Default::default()
    };
    let f = GgufFile::open_with(&args.file, opts)?;
    let mut totals: BTreeMap<GgmlType, TypeTotal> = BTreeMap::new();
    for t in f.tensors() {
        let e = totals.entry(t.ty).or_default();
        e.tensors += 1;
        e.elements += t.n_elements();
        e.bytes += t.n_bytes;
    }
    let n_elements: u64 = totals.values().map(|t| t.elements).sum();
    let n_bytes: u64 = totals.values().map(|t| t.bytes).sum();
    let bpw = if n_elements == 0 {
        0.0
    } else {
        n_bytes as f64 * 8.0 / n_elements as f64
    };

    if args.json {
        let mut out = json!({
            "file": f.path().display().to_string(),
            "file_bytes": f.file_len(),
            "version": f.version(),
            "alignment": f.alignment(),
            "data_offset": f.data_offset(),
            "metadata": f.metadata().entries().iter().map(|(k, v)| {
                json!({"key": k, "type": v.type_description(), "value": value_json(v, args.full)})
            }).collect::<Vec<_>>(),
            "tensors": f.tensors().iter().map(|t| {
                let mut j = json!({
                    "name": t.name, "type": t.ty.name(), "shape": t.dims,
                    "bytes": t.n_bytes, "offset": f.tensor_file_offset(t),
                });
                if f.is_split() {
                    j["shard"] = json!(t.shard + 1);
                }
                j
            }).collect::<Vec<_>>(),
            "totals_by_type": totals.iter().map(|(ty, t)| json!({
                "type": ty.name(), "tensors": t.tensors, "elements": t.elements, "bytes": t.bytes,
            })).collect::<Vec<_>>(),
            "n_elements": n_elements,
            "n_bytes": n_bytes,
            "bits_per_weight": bpw,
        });
        if f.is_split() {
            // `file_bytes` is the total; `offset`s are within each
            // tensor's own file, `shard` (from 1) says which.
            out["shards"] = json!(f
                .shards()
                .iter()
                .map(|s| json!({
                    "file": s.path().display().to_string(),
                    "file_bytes": s.len(),
                    "data_offset": s.data_offset(),
                    "tensors": s.n_tensors(),
                }))
                .collect::<Vec<_>>());
        }
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    outln!(
        "{}: GGUF v{}, {} ({} bytes), {} metadata keys, {} tensors, alignment {}, data at {}",
        f.path().display(),
        f.version(),
        human_bytes(f.file_len()),
        f.file_len(),
        f.metadata().len(),
        f.tensors().len(),
        f.alignment(),
        f.data_offset()
    );
    if f.is_split() {
        outln!("split into {} files:", f.shards().len());
        for (i, s) in f.shards().iter().enumerate() {
            outln!(
                "  {}: {}, {} ({} bytes), {} tensors, data at {}",
                i + 1,
                s.path().display(),
                human_bytes(s.len()),
                s.len(),
                s.n_tensors(),
                s.data_offset()
            );
        }
    }
    outln!("\nmetadata:");
    let kw = f
        .metadata()
        .entries()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    for (k, v) in f.metadata().entries() {
        let shown = if args.full {
            format!("{v:?}")
        } else {
            v.to_string()
        };
        outln!("  {k:<kw$}  {:<16}  {shown}", v.type_description());
    }
    outln!("\ntensors:");
    let nw = f
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    // A split model's tensors also say which file (from 1) holds them.
    let file_col = |s: &str| {
        if f.is_split() {
            format!("  {s:>5}")
        } else {
            String::new()
        }
    };
    outln!(
        "  {:<nw$}  {:<7}  {:<22}  {:>12}  {:>12}{}",
        "name",
        "type",
        "shape",
        "bytes",
        "offset",
        file_col("file")
    );
    for t in f.tensors() {
        let shape = format!("{:?}", t.dims);
        outln!(
            "  {:<nw$}  {:<7}  {:<22}  {:>12}  {:>12}{}",
            t.name,
            t.ty.name(),
            shape,
            t.n_bytes,
            f.tensor_file_offset(t),
            file_col(&(t.shard + 1).to_string())
        );
    }
    outln!("\ntotals by type:");
    outln!(
        "  {:<7}  {:>7}  {:>14}  {:>12}  {:>6}",
        "type",
        "tensors",
        "elements",
        "bytes",
        "bpw"
    );
    for (ty, t) in &totals {
        outln!(
            "  {:<7}  {:>7}  {:>14}  {:>12}  {:>6.2}",
            ty.name(),
            t.tensors,
            t.elements,
            t.bytes,
            ty.bits_per_weight()
        );
    }
    outln!(
        "\ntotal: {} parameters ({:.1}M), {} of tensor data, {:.2} bits per weight",
        n_elements,
        n_elements as f64 / 1e6,
        human_bytes(n_bytes),
        bpw
    );
    Ok(())
}

fn value_json(v: &Value, full: bool) -> serde_json::Value {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(_, items) => {
            const SHOWN: usize = 16;
            if full || items.len() <= SHOWN {
                json!(items
                    .iter()
                    .map(|i| value_json(i, full))
                    .collect::<Vec<_>>())
            } else {
                json!({
                    "len": items.len(),
                    "head": items[..SHOWN].iter().map(|i| value_json(i, full)).collect::<Vec<_>>(),
                })
            }
        }
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

//! `cachefit models [--json]`: the models in the cache folder
//! (`$CACHEFIT_MODELS`, docs/MODELS.md) with their name for `-m`, quant,
//! size, architecture and whether this build can run them; and the
//! unfinished downloads a `cachefit pull` would resume.

use anyhow::Result;
use gguf::{GgmlType, GgufFile, OpenOptions};
use serde_json::json;
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct Args {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What a cached model's header says.
struct Described {
    quant: String,
    arch: String,
    /// `Ok` when this build can run it, else why not.
    runs: Result<(), String>,
}

fn describe(path: &std::path::Path) -> Described {
    let file = match GgufFile::open_with(path, OpenOptions::default()) {
        Ok(f) => f,
        Err(e) => {
            return Described {
                quant: "?".into(),
                arch: "?".into(),
                runs: Err(e.to_string()),
            }
        }
    };
    let md = file.metadata();
    let arch = md
        .get_str("general.architecture")
        .unwrap_or("?")
        .to_string();
    // Named as `cachefit bench` names it: general.file_type, else the type
    // holding most of the bytes.
    let quant = match md
        .get_u32("general.file_type")
        .ok()
        .and_then(super::bench::ftype_name)
    {
        Some(n) => n.to_string(),
        None => {
            let mut by_type: BTreeMap<GgmlType, u64> = BTreeMap::new();
            for t in file.tensors() {
                *by_type.entry(t.ty).or_default() += t.n_bytes;
            }
            by_type
                .iter()
                .max_by_key(|(_, &b)| b)
                .map_or("?".to_string(), |(ty, _)| ty.name().to_string())
        }
    };
    let runs = model::ModelConfig::from_gguf(md)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            tokenize::Vocab::from_gguf(md)
                .map(|_| ())
                .map_err(|e| format!("no usable tokenizer: {e}"))
        });
    Described { quant, arch, runs }
}

pub fn run(args: Args) -> Result<()> {
    let dir = hub::models_dir();
    let scan = hub::scan(&dir)?;
    let rows: Vec<(&hub::CachedModel, Described)> = scan
        .models
        .iter()
        .map(|m| {
            let mut d = describe(&m.path);
            if m.missing_parts > 0 {
                d.runs = Err(format!("{} split parts missing", m.missing_parts));
            }
            (m, d)
        })
        .collect();
    if args.json {
        for (m, d) in &rows {
            outln!(
                "{}",
                json!({
                    "name": m.name,
                    "repo": m.repo,
                    "path": m.path.display().to_string(),
                    "quant": d.quant,
                    "size": m.size,
                    "architecture": d.arch,
                    "runs": d.runs.is_ok(),
                    "why_not": d.runs.as_ref().err(),
                })
            );
        }
        for p in &scan.partials {
            outln!(
                "{}",
                json!({"partial": p.path.display().to_string(), "size": p.size})
            );
        }
        return Ok(());
    }
    eprintln!("models in {}", dir.display());
    if rows.is_empty() {
        eprintln!("none (download one with `cachefit pull OWNER/REPO[:QUANT]`)");
    } else {
        let w = rows
            .iter()
            .map(|(m, _)| m.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let wq = rows
            .iter()
            .map(|(_, d)| d.quant.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let wa = rows
            .iter()
            .map(|(_, d)| d.arch.len())
            .max()
            .unwrap_or(4)
            .max(4);
        outln!(
            "{:<w$}  {:<wq$}  {:>10}  {:<wa$}  runs",
            "name",
            "quant",
            "size",
            "arch"
        );
        for (m, d) in &rows {
            let runs = match &d.runs {
                Ok(()) => "yes".to_string(),
                Err(e) => format!("no: {e}"),
            };
            outln!(
                "{:<w$}  {:<wq$}  {:>10}  {:<wa$}  {runs}",
                m.name,
                d.quant,
                human(m.size),
                d.arch
            );
        }
    }
    for p in &scan.partials {
        eprintln!(
            "partial download ({}): {} — `cachefit pull` again resumes it",
            human(p.size),
            p.path.display()
        );
    }
    Ok(())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

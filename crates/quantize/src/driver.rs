//! Running a plan: read the input (memory-mapped), convert tensor by tensor,
//! stream the result into a temporary file next to the output, rename it
//! into place only when everything is written.
//!
//! A converted tensor is built in memory (its rows split into chunks of at
//! least 16K elements, as llama.cpp does, that `threads` workers take from a
//! shared iterator), then handed to the GGUF writer; tensors kept as they are
//! are written straight from the map. Between chunks the workers check the
//! interrupt flag, so Ctrl-C stops within milliseconds; every way out before
//! the rename drops the temporary file, which deletes it.

use crate::error::{Error, Result};
use crate::plan::{plan_with, Plan, PlanOptions, PlannedTensor};
use crate::target::Target;
use gguf::{Builder, GgmlType, GgufFile, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// ggml's `GGML_QNT_VERSION`, written to `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// llama.cpp's `min_chunk_size`: elements per unit of work.
const MIN_CHUNK_ELEMENTS: usize = 32 * 512;

#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Convert tensors that are already quantized (dequantize, then
    /// quantize); refused otherwise, as in `llama-quantize`.
    pub allow_requantize: bool,
    /// No mix rules: every quantizable tensor gets the base type.
    pub pure: bool,
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Set (e.g. by a Ctrl-C handler) to stop; the driver then returns
    /// [`Error::Interrupted`] and leaves nothing behind.
    pub interrupt: Option<Arc<AtomicBool>>,
}

impl Default for QuantizeOptions {
    fn default() -> QuantizeOptions {
        QuantizeOptions {
            allow_requantize: false,
            pure: false,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            interrupt: None,
        }
    }
}

/// Reported before and after each tensor.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// 0-based index of the tensor (in file order).
    pub index: usize,
    pub n_tensors: usize,
    pub tensor: &'a PlannedTensor,
    /// `false` when starting the tensor, `true` once it is written.
    pub done: bool,
    /// Input tensor bytes handled so far (including this one if `done`).
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What a finished run did.
#[derive(Clone, Debug)]
pub struct Summary {
    pub target: Target,
    pub n_tensors: usize,
    /// Output tensors per type.
    pub counts: BTreeMap<GgmlType, usize>,
    /// Tensors that needed a fallback type (row length vs block size).
    pub n_fallback: usize,
    /// Tensors whose data was converted (the rest were copied).
    pub n_converted: usize,
    pub n_elements: u64,
    /// Tensor data bytes in and out.
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Whole-file sizes.
    pub in_file_bytes: u64,
    pub out_file_bytes: u64,
    pub elapsed: Duration,
}

impl Summary {
    pub fn in_bpw(&self) -> f64 {
        bpw(self.in_bytes, self.n_elements)
    }
    pub fn out_bpw(&self) -> f64 {
        bpw(self.out_bytes, self.n_elements)
    }
}

fn bpw(bytes: u64, elements: u64) -> f64 {
    if elements == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / elements as f64
    }
}

/// Quantize `input` into `output` for `target`. `output` is replaced only
/// when everything succeeded; on error or interrupt nothing is left behind.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    target: Target,
    opts: &QuantizeOptions,
    progress: &dyn Fn(Progress<'_>),
) -> Result<Summary> {
    let start = Instant::now();
    refuse_same_file(input, output)?;
    let file = GgufFile::open(input)?;
    let plan = plan_with(&file, target, PlanOptions { pure: opts.pure })?;
    plan.check(opts.allow_requantize)?;

    let mut meta = file.metadata().clone();
    meta.set(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    meta.set("general.file_type", Value::U32(target.ftype()));
    // One output file, whatever the input was split into.
    for key in ["split.no", "split.count", "split.tensors.count"] {
        meta.remove(key);
    }
    let mut builder = Builder::new(meta);
    let write_err = |kind| Error::Write {
        path: output.to_path_buf(),
        kind,
    };
    for t in &plan.tensors {
        builder.add_tensor(t.spec()).map_err(write_err)?;
    }

    let interrupted = || {
        opts.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    };
    let tmp = temp_file_for(output)?;
    let tmp_err = |source| Error::Io {
        path: tmp.path().to_path_buf(),
        source,
    };
    let buf = BufWriter::with_capacity(1 << 20, tmp.as_file());
    let mut w = builder.write_header(buf).map_err(write_err)?;
    let bytes_total = plan.in_bytes();
    let mut bytes_done = 0;
    let n_tensors = plan.tensors.len();
    for (index, t) in plan.tensors.iter().enumerate() {
        if interrupted() {
            return Err(Error::Interrupted);
        }
        let report = |done, bytes_done| {
            progress(Progress {
                index,
                n_tensors,
                tensor: t,
                done,
                bytes_done,
                bytes_total,
            })
        };
        report(false, bytes_done);
        let src = file.tensor_data(&file.tensors()[t.index]);
        if t.converts() {
            let data = convert(t, src, opts.threads, &interrupted)?;
            w.write_tensor(data.as_slice()).map_err(write_err)?;
        } else {
            w.write_tensor(src).map_err(write_err)?;
        }
        bytes_done += t.in_bytes;
        report(true, bytes_done);
    }
    let buf = w.finish().map_err(write_err)?;
    buf.into_inner()
        .map_err(|e| tmp_err(e.into_error()))?
        .sync_all()
        .map_err(tmp_err)?;
    if interrupted() {
        return Err(Error::Interrupted);
    }
    set_output_permissions(tmp.as_file(), output).map_err(tmp_err)?;
    let out_file = tmp.persist(output).map_err(|e| Error::Io {
        path: output.to_path_buf(),
        source: e.error,
    })?;
    let out_file_bytes = out_file
        .metadata()
        .map_err(|source| Error::Io {
            path: output.to_path_buf(),
            source,
        })?
        .len();

    Ok(summarize(
        &plan,
        file.file_len(),
        out_file_bytes,
        start.elapsed(),
    ))
}

fn summarize(plan: &Plan, in_file_bytes: u64, out_file_bytes: u64, elapsed: Duration) -> Summary {
    Summary {
        target: plan.target,
        n_tensors: plan.tensors.len(),
        counts: plan.counts(),
        n_fallback: plan.n_fallback,
        n_converted: plan.tensors.iter().filter(|t| t.converts()).count(),
        n_elements: plan.n_elements(),
        in_bytes: plan.in_bytes(),
        out_bytes: plan.out_bytes(),
        in_file_bytes,
        out_file_bytes,
        elapsed,
    }
}

/// Refuse to write over the input: same path after resolving symlinks, or
/// (on Unix) another hard link to the same file.
fn refuse_same_file(input: &Path, output: &Path) -> Result<()> {
    let io = |path: &Path, source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // A missing input is reported by the open that follows.
    let Ok(cin) = fs::canonicalize(input) else {
        return Ok(());
    };
    let out_meta = fs::metadata(output).ok();
    if out_meta.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(io(
            output,
            std::io::Error::new(std::io::ErrorKind::IsADirectory, "output is a directory"),
        ));
    }
    let cout = match fs::canonicalize(output) {
        Ok(p) => p,
        Err(_) => {
            let dir = parent_dir(output);
            let name = output.file_name().unwrap_or_default();
            fs::canonicalize(&dir).map_err(|e| io(&dir, e))?.join(name)
        }
    };
    let mut same = cin == cout;
    #[cfg(unix)]
    if let (Ok(a), Some(b)) = (fs::metadata(input), out_meta) {
        use std::os::unix::fs::MetadataExt;
        same |= a.dev() == b.dev() && a.ino() == b.ino();
    }
    if same {
        return Err(Error::SameFile {
            path: output.to_path_buf(),
        });
    }
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A hidden temporary file in the output's folder (so the final rename
/// stays on one file system and is atomic), deleted when dropped.
fn temp_file_for(output: &Path) -> Result<tempfile::NamedTempFile> {
    let dir = parent_dir(output);
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "quantize".into());
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".partial")
        .tempfile_in(&dir)
        .map_err(|source| Error::Io { path: dir, source })
}

/// Temporary files are created private (0600); give the model the mode a
/// replaced file had, or the usual 0644.
fn set_output_permissions(tmp: &fs::File, output: &Path) -> std::io::Result<()> {
    let perms = match fs::metadata(output) {
        Ok(m) => m.permissions(),
        Err(_) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                fs::Permissions::from_mode(0o644)
            }
            #[cfg(not(unix))]
            return Ok(());
        }
    };
    tmp.set_permissions(perms)
}

/// Dequantize (`to_float`) and quantize (`from_float`) one tensor with
/// `threads` workers, into an 8-byte-aligned buffer (the kernels cast block
/// structs in place).
fn convert(
    t: &PlannedTensor,
    src: &[u8],
    threads: usize,
    interrupted: &(dyn Fn() -> bool + Sync),
) -> Result<AlignedBytes> {
    let from = kernels::traits(t.from).expect("checked by Plan::check");
    let to = kernels::traits(t.to).expect("checked by Plan::check");
    let n = t.row_len() as usize;
    let rows = t.n_rows() as usize;
    let src_row = from.row_bytes(n);
    let dst_row = to.row_bytes(n);
    debug_assert_eq!(src.len(), rows * src_row);
    let rows_per_chunk = MIN_CHUNK_ELEMENTS.div_ceil(n).max(1);
    let n_chunks = rows.div_ceil(rows_per_chunk);

    let mut out = AlignedBytes::zeroed(rows * dst_row);
    let chunks = Mutex::new(
        out.as_mut_slice()
            .chunks_mut(rows_per_chunk * dst_row)
            .enumerate(),
    );
    let failed = AtomicBool::new(false);
    let work = || -> Result<()> {
        let mut f32s: Vec<f32> = Vec::new();
        loop {
            if failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            if interrupted() {
                return Err(Error::Interrupted);
            }
            let Some((ci, dst)) = chunks.lock().expect("no panics while locked").next() else {
                return Ok(());
            };
            let r0 = ci * rows_per_chunk;
            let nr = dst.len() / dst_row;
            let s = &src[r0 * src_row..(r0 + nr) * src_row];
            let copy;
            let s = if (s.as_ptr() as usize).is_multiple_of(8) {
                s
            } else {
                // Files with an alignment below 8 (legal, rare): copy so the
                // block structs can be cast.
                copy = AlignedBytes::from_slice(s);
                copy.as_slice()
            };
            f32s.resize(nr * n, 0.0);
            (from.to_float)(s, &mut f32s);
            if let Some(bad) = f32s.iter().position(|v| !v.is_finite()) {
                failed.store(true, Ordering::Relaxed);
                return Err(Error::NonFinite {
                    tensor: t.name.clone(),
                    row: (r0 + bad / n) as u64,
                });
            }
            (to.from_float)(&f32s, dst);
        }
    };
    let threads = threads.clamp(1, n_chunks.max(1));
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut results = vec![work()];
        for h in helpers {
            results.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        results
    });
    for r in results {
        r?;
    }
    Ok(out)
}

/// Bytes backed by `u64`s, so the start is 8-byte aligned.
struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn zeroed(len: usize) -> AlignedBytes {
        AlignedBytes {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }
    fn from_slice(b: &[u8]) -> AlignedBytes {
        let mut a = AlignedBytes::zeroed(b.len());
        a.as_mut_slice().copy_from_slice(b);
        a
    }
    fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

//! `cachefit quantize IN OUT TYPE [--allow-requantize] [-t N]`: convert a
//! GGUF model to a tensor type or a llama.cpp mix (`Q4_K_M`, ...), with
//! llama.cpp's per-tensor rules. Thin: the plan and the conversion live in
//! the `quantize` crate; this file parses arguments, installs the Ctrl-C
//! flag, draws the progress bar and prints the summary.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use quantize::{Plan, PlannedTensor, Progress, QuantizeOptions, Summary, Target};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF model.
    pub input: PathBuf,
    /// Output GGUF file; replaced only when quantization succeeds, and never
    /// the input itself.
    pub output: PathBuf,
    /// A tensor type (Q8_0, Q4_0, Q6_K, F16, ...) or a llama.cpp mix
    /// (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q3_K_M, Q3_K_S, Q3_K_L, Q2_K),
    /// case-insensitive.
    #[arg(value_name = "TYPE")]
    pub target: String,
    /// Convert tensors that are already quantized (dequantize, then
    /// quantize); quality suffers, so it is refused without this flag.
    #[arg(long)]
    pub allow_requantize: bool,
    /// No mix: every quantizable tensor gets the type itself (row-length
    /// fallbacks still apply), like llama-quantize --pure.
    #[arg(long)]
    pub pure: bool,
    /// Worker threads [default: available parallelism].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Print the per-tensor plan and sizes, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the per-tensor plan before quantizing.
    #[arg(short, long)]
    pub verbose: bool,
}

pub fn run(args: Args) -> Result<()> {
    let target = Target::parse(&args.target)?;
    let threads = match args.threads {
        Some(n) => super::common::cap_threads("-t", n.max(1)),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };

    if args.dry_run || args.verbose {
        let file = gguf::GgufFile::open(&args.input)?;
        let plan = quantize::plan_with(&file, target, quantize::PlanOptions { pure: args.pure })
            .with_context(|| format!("planning {} as {target}", args.input.display()))?;
        print_plan(&plan);
        if args.dry_run {
            print_plan_totals(&plan);
            return Ok(());
        }
    }

    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupt.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
        // SIGTERM and SIGHUP (a service stopped, a terminal closed) end the
        // run the same way, so no `.partial` file is left behind.
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
            signal_hook::flag::register(sig, interrupt.clone())
                .context("installing the SIGTERM/SIGHUP handler")?;
        }
        // The input changing under us also stops the run cleanly.
        let flag = interrupt.clone();
        mapguard::set_fault_handler(move |_| flag.store(true, Ordering::Relaxed))
            .context("watching the input file")?;
    }
    let opts = QuantizeOptions {
        allow_requantize: args.allow_requantize,
        pure: args.pure,
        threads,
        interrupt: Some(interrupt),
    };

    // Draws only when stderr is a terminal.
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} [{elapsed_precise}<{eta}] {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let on_progress = |p: Progress<'_>| {
        if p.done {
            bar.set_position(p.bytes_done);
        } else {
            bar.set_length(p.bytes_total);
            let t = p.tensor;
            bar.set_message(format!(
                "[{}/{}] {} {} → {}",
                p.index + 1,
                p.n_tensors,
                t.name,
                t.from,
                t.to
            ));
        }
    };
    eprintln!(
        "quantizing {} → {} as {target} (ftype {}), {threads} thread{}",
        args.input.display(),
        args.output.display(),
        target.ftype(),
        if threads == 1 { "" } else { "s" }
    );
    let before = file_identity(&args.input);
    let result = quantize::quantize_file(&args.input, &args.output, target, &opts, &on_progress);
    bar.finish_and_clear();
    if let Some(fault) = mapguard::faulted() {
        // Finished just as it faulted: what it wrote read zeros.
        if result.is_ok() {
            let _ = std::fs::remove_file(&args.output);
        }
        bail!("{fault}; nothing was written");
    }
    // Tensors copied as they are go from the map straight to write(2),
    // which fails with EFAULT (not SIGBUS) on a truncated input: say why.
    if result.is_err() && file_identity(&args.input) != before {
        bail!(
            "{}: the file changed on disk while in use (it was truncated or overwritten); nothing was written",
            args.input.display()
        );
    }
    let summary = result.with_context(|| {
        format!(
            "quantizing {} to {}",
            args.input.display(),
            args.output.display()
        )
    })?;
    print_summary(&summary);
    Ok(())
}

/// Size and modification time, to tell whether a file changed.
fn file_identity(path: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

fn print_plan(plan: &Plan) {
    let n = plan.tensors.len();
    let nw = plan.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4);
    for (i, t) in plan.tensors.iter().enumerate() {
        outln!(
            "[{:>4}/{n}] {:<nw$}  {:<20}  {:>6} → {:<6}  {}",
            i + 1,
            t.name,
            format!("{:?}", t.dims),
            t.from.name(),
            t.to.name(),
            why(t)
        );
    }
}

fn why(t: &PlannedTensor) -> String {
    let mut s = t.reason.to_string();
    if let Some(wanted) = t.fallback_from {
        s += &format!(
            "; rows of {} do not fit {wanted} blocks of {}, fallback",
            t.row_len(),
            wanted.block_size()
        );
    } else if !t.converts() && !matches!(t.reason, quantize::Reason::Kept(_)) {
        s += "; already this type, copied";
    }
    s
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn bpw(bytes: u64, elements: u64) -> f64 {
    if elements == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / elements as f64
    }
}

fn type_counts(counts: &std::collections::BTreeMap<gguf::GgmlType, usize>) -> String {
    counts
        .iter()
        .map(|(ty, n)| format!("{ty}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_fallbacks(n_fallback: usize, n_tensors: usize) {
    if n_fallback > 0 {
        outln!("WARNING: {n_fallback} of {n_tensors} tensor(s) required fallback quantization");
    }
}

fn print_plan_totals(plan: &Plan) {
    let n = plan.n_elements();
    outln!(
        "model size  = {:8.2} MiB ({:.2} BPW)",
        mib(plan.in_bytes()),
        bpw(plan.in_bytes(), n)
    );
    outln!(
        "quant size  = {:8.2} MiB ({:.2} BPW)",
        mib(plan.out_bytes()),
        bpw(plan.out_bytes(), n)
    );
    outln!("tensor types: {}", type_counts(&plan.counts()));
    print_fallbacks(plan.n_fallback, plan.tensors.len());
}

fn print_summary(s: &Summary) {
    outln!(
        "model size  = {:8.2} MiB ({:.2} BPW)",
        mib(s.in_bytes),
        s.in_bpw()
    );
    outln!(
        "quant size  = {:8.2} MiB ({:.2} BPW)",
        mib(s.out_bytes),
        s.out_bpw()
    );
    outln!(
        "tensor types: {} ({} converted, {} copied)",
        type_counts(&s.counts),
        s.n_converted,
        s.n_tensors - s.n_converted
    );
    print_fallbacks(s.n_fallback, s.n_tensors);
    outln!(
        "file: {:.2} MiB → {:.2} MiB in {:.2} s",
        mib(s.in_file_bytes),
        mib(s.out_file_bytes),
        s.elapsed.as_secs_f64()
    );
}

//! How a download shows itself: a progress bar on a terminal's stderr;
//! otherwise a line at the start, every half minute and at the end, so
//! logs and CI output stay short.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

const LINE_EVERY: Duration = Duration::from_secs(30);

pub struct Reporter {
    bar: Option<ProgressBar>,
    quiet: bool,
    file: String,
    total: Option<u64>,
    last_line: Instant,
}

impl Reporter {
    /// A bar when stderr is a terminal, lines otherwise.
    pub fn stderr() -> Reporter {
        Reporter::new(std::io::stderr().is_terminal(), false)
    }

    /// Nothing shown (tests, library use).
    pub fn silent() -> Reporter {
        Reporter::new(false, true)
    }

    fn new(bar: bool, quiet: bool) -> Reporter {
        Reporter {
            bar: bar.then(ProgressBar::hidden),
            quiet,
            file: String::new(),
            total: None,
            last_line: Instant::now(),
        }
    }

    /// A message between downloads (resuming, retrying, verifying).
    pub fn note(&self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(format!("cachefit: {msg}")),
            _ => eprintln!("cachefit: {msg}"),
        }
    }

    pub(crate) fn start(&mut self, file: &str, total: Option<u64>, have: u64) {
        self.file = file.to_string();
        self.total = total;
        self.last_line = Instant::now();
        if self.quiet {
            return;
        }
        if let Some(bar) = &mut self.bar {
            let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("a valid progress template")
                .progress_chars("=> "),
            );
            b.set_message(short_name(file).to_string());
            b.set_position(have);
            *bar = b;
        } else {
            let from = if have > 0 {
                format!(" from byte {have}")
            } else {
                String::new()
            };
            eprintln!(
                "cachefit: downloading {file}{}{from}",
                self.total
                    .map(|t| format!(" ({})", human(t)))
                    .unwrap_or_default()
            );
        }
    }

    pub(crate) fn advance(&mut self, have: u64) {
        if self.quiet {
            return;
        }
        if let Some(bar) = &self.bar {
            bar.set_position(have);
        } else if self.last_line.elapsed() >= LINE_EVERY {
            self.last_line = Instant::now();
            match self.total {
                Some(t) if t > 0 => eprintln!(
                    "cachefit: {}: {} of {} ({:.0}%)",
                    self.file,
                    human(have),
                    human(t),
                    have as f64 * 100.0 / t as f64
                ),
                _ => eprintln!("cachefit: {}: {}", self.file, human(have)),
            }
        }
    }

    pub(crate) fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn short_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// Bytes for people: 1.5 GiB, 20.0 MiB, 512 B.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

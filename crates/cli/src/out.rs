//! Writing to stdout without panicking. `println!` panics when stdout is a
//! closed pipe (`cachefit inspect FILE | head -1`); [`outln!`] writes the
//! same text, and when the reader has gone it ends the process quietly with
//! status 0, as ripgrep does: the reader took what it wanted. Any other
//! write error is reported and the status is 1.

use std::io::{ErrorKind, Write};

/// Write `args` and a newline to stdout.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` that survives a closed pipe (see the module doc).
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

//! Standard output for the commands' reports. A reader that goes away
//! (`flux-lite info … | head -3`) ends the command quietly, as it ends any
//! Unix tool, instead of a panic; any other write error is one `error:`
//! line and a failing exit.

use std::io::Write;

/// Writes one line of a report.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` for reports: see [`line`].
macro_rules! say {
    () => {
        $crate::stdout::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::stdout::line(format_args!($($arg)*))
    };
}
pub(crate) use say;

//! The one line a test prints when it does not really run, or leaves part of
//! its checks out, because this machine lacks something (a precision tier, a
//! device file, an OS report): `skipped: <test>: <why>`.
//!
//! Every skip in the workspace's tests goes through [`skipped`], so a run of
//! the suite can count them (ci/test.sh does, by test name). The line goes
//! straight to the process's standard error, past the test harness's capture,
//! so it shows for a test that passes too.

use std::io::Write;

/// Prints `skipped: <test>: <why>` for the running test (the harness names
/// each test's thread after it) on one line of standard error.
pub fn skipped(why: impl std::fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("main");
    let why = why.to_string().replace(['\n', '\r'], " ");
    let line = format!("skipped: {test}: {why}\n");
    // One write, so lines of tests running side by side do not mix.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

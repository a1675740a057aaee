//! The binary as a user meets it: output on success, one `error:` line and a
//! non-zero exit on bad input.

use flux_lite_tests::only_an_error_line;
use std::path::Path;
use std::process::{Command, Output};

fn flux_lite(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flux-lite"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run flux-lite")
}

fn tiny(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models").join(name).display().to_string()
}

#[test]
fn info_summarises_a_model_folder() {
    let out = flux_lite(&["info", "--model", &tiny("tiny-a")], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("transformer: 2 double + 2 single blocks, 4 heads × 16"), "{stdout}");
    assert!(stdout.contains("prompt layers [1, 2, 3]"), "{stdout}");
    assert!(stdout.contains("distilled: true"), "{stdout}");
}

#[test]
fn info_on_a_missing_folder_is_only_an_error_line() {
    let line = only_an_error_line(&flux_lite(&["info", "--model", "/no/such/model"], &[]));
    assert!(line.contains("/no/such/model"), "{line}");
}

#[test]
fn unknown_backend_is_only_an_error_line() {
    let line = only_an_error_line(&flux_lite(&["gpu"], &[("FLUX_LITE_BACKEND", "glide")]));
    assert!(line.contains("FLUX_LITE_BACKEND") && line.contains("glide"), "{line}");
}

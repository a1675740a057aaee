//! `flux-lite selftest` on this machine's adapter: it passes, reports the
//! adapter first and each check on its own line (or as JSON), and a
//! deliberately broken kernel (`FLUX_LITE_BREAK_KERNEL=linear`, every
//! linear one term short) fails it loudly: the kernel's own check and the
//! tiny model's, with one `error:` line and a failing exit.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn selftest(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flux-lite"));
    command.arg("selftest").args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

/// Whether the matrix tier must be checked here (CI's Mesa 26 run).
fn matrix_required() -> bool {
    flux_lite_kernels::test_devices::tiers_required()
}

#[test]
fn the_selftest_passes_on_this_adapter_one_line_per_check() {
    let out = selftest(&[], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("adapter: ") && lines[1].starts_with("driver: "), "the adapter and driver come first: {stdout}");
    let checks: Vec<&&str> = lines.iter().filter(|l| l.starts_with("pass  ") || l.starts_with("FAIL  ")).collect();
    assert!(checks.iter().all(|l| l.starts_with("pass  ") && l.contains("(tolerance ")), "{stdout}");
    // DF11 (4 groups) and, on f32 at least, 3 kernels and 4 tiny-model figures.
    assert!(checks.len() >= 11, "{stdout}");
    for what in ["DF11 expansion", "f32 linear", "f32 conv2d", "f32 attention", "f32 tiny model: image"] {
        assert!(checks.iter().any(|l| l.contains(what)), "no {what} check: {stdout}");
    }
    let summary = format!("selftest: {n} of {n} checks passed", n = checks.len());
    assert_eq!(lines.last().copied(), Some(summary.as_str()), "{stdout}");
    if matrix_required() {
        assert!(lines.contains(&"tier matrix:") && checks.iter().any(|l| l.contains("matrix attention")), "{stdout}");
    }
}

#[test]
fn the_json_report_holds_every_check() {
    let out = selftest(&["--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["passed"], true);
    assert!(report["adapter"].as_str().is_some_and(|a| !a.is_empty()));
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 11);
    for c in checks {
        assert_eq!(c["passed"], true, "{c}");
        assert!(c["worst"].as_f64().unwrap() <= c["tolerance"].as_f64().unwrap(), "{c}");
    }
    assert_eq!(report["tiers"][0]["tier"], "f32");
    assert_eq!(report["tiers"][0]["offered"], true);
}

#[test]
fn a_broken_kernel_fails_the_selftest_loudly() {
    let out = selftest(&[], &[("FLUX_LITE_BREAK_KERNEL", "linear")]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}");
    assert!(!out.status.success(), "a broken linear passed: {stdout}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert!(errors.len() == 1 && errors[0].contains("checks failed"), "{stderr}");
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL  ")).collect();
    // The kernel's own check and everything the tiny model computes with it.
    assert!(failed.iter().any(|l| l.contains("f32 linear")), "{stdout}");
    assert!(failed.iter().any(|l| l.contains("f32 tiny model: prompt embedding")), "{stdout}");
    // The kernels that do not use it still pass.
    assert!(stdout.lines().any(|l| l.starts_with("pass  ") && l.contains("f32 conv2d")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("pass  ") && l.contains("DF11 expansion")), "{stdout}");
}

//! `flux-lite bench df11` runs on any machine and prints its figures beside
//! their ceilings; the GPU expansion it times is checked bit for bit.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn df11_bench_prints_host_and_gpu_figures_with_their_ceilings() {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "df11", "--elements", "100003", "--repeats", "1"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    assert!(stdout.contains("100003 bf16 weights"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("host decode, 1 thread:") && l.contains("GB/s") && l.contains("copy, 1 thread:")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("gpu decode") && l.contains("buffer copy:") && l.ends_with("bit-exact")), "{stdout}");
}

#[test]
fn df11_bench_rejects_an_empty_group() {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "df11", "--elements", "0", "--no-gpu"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "error: --elements must be at least 1");
}

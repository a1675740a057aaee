//! `flux-lite encode` against transformers' prompt embeddings, and its file
//! read back by `gen --embeddings`.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{model_dir, rel_l2, scratch_dir, Goldens};
use safetensors::SafeTensors;
use std::process::Command;

fn flux_lite(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).arg("--quiet").output().unwrap()
}

#[test]
fn encode_writes_transformers_prompt_embeddings_that_gen_accepts() {
    let g = Goldens::load("tiny-a/one-step");
    let prompt = g.case_json()["prompt"].as_str().unwrap().to_string();
    let dir = scratch_dir("cli-encode");
    let out = dir.join("embeds.safetensors");
    let model = model_dir("tiny-a");
    let run = flux_lite(&["encode", "--model", model.to_str().unwrap(), "--prompt", &prompt, "--output", out.to_str().unwrap(), "--precision", "f32"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("prompt_embeds").unwrap();
    let (want, shape) = g.f32("prompt_embeds");
    assert_eq!(t.shape(), shape.as_slice());
    let got: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (err, worst) = rel_l2(&got, &want);
    let tol = flux_lite_tests::tolerance::f32::TEXT_ENCODER;
    assert!(err <= tol, "prompt_embeds: relative L2 {err:.3e} > {tol:.0e}, worst element {worst}");

    let latents = dir.join("latents.safetensors");
    let run = flux_lite(&["gen", "--model", model.to_str().unwrap(), "--embeddings", out.to_str().unwrap(), "--seed", "42"]
        .iter()
        .chain(&["--steps", "1", "--width", "32", "--height", "32", "--output-latents", latents.to_str().unwrap(), "--precision", "f32"])
        .copied()
        .collect::<Vec<_>>());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    // Seed, size and steps are the one-step golden's: its latents follow.
    let bytes = std::fs::read(&latents).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<f32> = st.tensor("latents").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (err, worst) = rel_l2(&got, &g.f32("latents.0").0);
    eprintln!("latents from encode's embeddings: relative L2 {err:.3e}");
    // Measured 2.6e-6 (2026-11-25), as from the golden embeddings themselves.
    assert!(err <= 8e-6, "latents from encode's embeddings: relative L2 {err:.3e}, worst element {worst}");
}

#[test]
fn a_prompt_over_512_tokens_is_cut_with_a_warning() {
    let dir = scratch_dir("cli-encode-long");
    let out = dir.join("embeds.safetensors");
    let model = model_dir("tiny-a");
    let prompt = "fox ".repeat(600);
    let run = flux_lite(&["encode", "--model", model.to_str().unwrap(), "--prompt", &prompt, "--output", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let stderr = String::from_utf8_lossy(&run.stderr);
    let warning = stderr.lines().find(|l| l.starts_with("warning: ")).unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(warning.contains("dropped") && warning.contains("512"), "{warning}");
    assert!(out.exists());
}

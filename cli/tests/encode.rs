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

#[test]
fn encode_writes_the_negative_prompts_embeddings_beside_the_prompts() {
    let g = Goldens::load("tiny-b/cfg-negative");
    let c = g.case_json();
    let (prompt, negative) = (c["prompt"].as_str().unwrap(), c["negative_prompt"].as_str().unwrap());
    let dir = scratch_dir("cli-encode-negative");
    let out = dir.join("embeds.safetensors");
    let model = model_dir("tiny-b");
    let run = flux_lite(&["encode", "--model", model.to_str().unwrap(), "--prompt", prompt, "--negative-prompt", negative, "--output", out.to_str().unwrap(), "--precision", "f32"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    // The golden's embeddings come from the pipeline's own encode_prompt (generate_negative.py).
    for name in ["prompt_embeds", "negative_prompt_embeds"] {
        let got: Vec<f32> = st.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let (err, worst) = rel_l2(&got, &g.f32(name).0);
        let tol = flux_lite_tests::tolerance::f32::TEXT_ENCODER;
        assert!(err <= tol, "{name}: relative L2 {err:.3e} > {tol:.0e}, worst element {worst}");
    }
    // gen with that file guides away from its negative as diffusers does.
    let png = dir.join("out.png");
    let (seed, steps, w, h) = (c["seed"].to_string(), c["steps"].to_string(), c["width"].to_string(), c["height"].to_string());
    let args = ["gen", "--model", model.to_str().unwrap(), "--embeddings", out.to_str().unwrap(), "--seed", &seed, "--steps", &steps, "--width", &w, "--height", &h];
    let run = flux_lite(&args.iter().chain(&["--output", png.to_str().unwrap(), "--precision", "f32"]).copied().collect::<Vec<_>>());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (got, want) = (flux_lite_tests::read_png(&png), flux_lite_tests::read_png(&Goldens::dir("tiny-b/cfg-negative").join("image.png")));
    flux_lite_tests::tolerance::assert_png_close("gen --embeddings with a negative", &got.rgb, &want.rgb);
}

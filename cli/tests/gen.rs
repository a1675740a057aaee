//! `flux-lite gen --embeddings` end to end against the diffusers goldens:
//! noise from the seed, schedule, every step on the GPU, the latents file.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{model_dir, rel_l2, scratch_dir, the_error_line, Goldens};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The golden prompt embeddings as an embeddings file, in f32 or bf16.
fn embeddings_file(case: &str, dir: &Path, bf16: bool) -> PathBuf {
    let (values, shape) = Goldens::load(case).f32("prompt_embeds");
    let bytes: Vec<u8> = if bf16 {
        values.iter().flat_map(|&v| flux_lite_core::numerics::bf16::from_f32(v).to_le_bytes()).collect()
    } else {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    let view = TensorView::new(if bf16 { Dtype::BF16 } else { Dtype::F32 }, shape, &bytes).unwrap();
    let path = dir.join("embeds.safetensors");
    std::fs::write(&path, safetensors::serialize([("prompt_embeds", view)], None).unwrap()).unwrap();
    path
}

fn gen(model: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .arg("gen")
        .arg("--model")
        .arg(model_dir(model))
        .args(args)
        .args(["--quiet", "--precision", "f32"])
        .output()
        .unwrap()
}

/// Final latents from the golden f32 embeddings vs diffusers: measured
/// 8.3e-7 – 2.6e-6 relative L2 (2026-11-25).
const F32_LATENTS: f64 = 8e-6;

fn check_case(case: &str, model: &str, seed: &str, steps: usize, width: &str, height: &str, extra: &[&str]) {
    let err = final_latents_error(case, model, seed, steps, [width, height], extra, false);
    assert!(err <= F32_LATENTS, "{case}: final latents off by relative L2 {err:.3e} > {F32_LATENTS:.0e}");
}

/// Runs `gen --embeddings` with the case's golden embeddings (rounded to
/// bf16 when `bf16`) and returns the relative L2 of its final latents
/// against the case's golden latents.
fn final_latents_error(case: &str, model: &str, seed: &str, steps: usize, [width, height]: [&str; 2], extra: &[&str], bf16: bool) -> f64 {
    let dir = scratch_dir(&format!("cli-{}-{}", case.replace('/', "-"), if bf16 { "bf16" } else { "f32" }));
    let out = dir.join("latents.safetensors");
    let embeds = embeddings_file(case, &dir, bf16);
    let run = gen(
        model,
        &[
            "--embeddings",
            embeds.to_str().unwrap(),
            "--seed",
            seed,
            "--steps",
            &steps.to_string(),
            "--width",
            width,
            "--height",
            height,
            "--output-latents",
            out.to_str().unwrap(),
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect::<Vec<_>>(),
    );
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stderr).contains(&format!("seed: {seed}")));
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("latents").unwrap();
    let got: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (want, shape) = Goldens::load(case).f32(&format!("latents.{}", steps - 1));
    assert_eq!(t.shape(), shape.as_slice());
    let (err, _) = rel_l2(&got, &want);
    eprintln!("{case} (embeddings in {}): final latents relative L2 {err:.3e}", if bf16 { "bf16" } else { "f32" });
    err
}

#[test]
fn one_step_from_seed_42() {
    check_case("tiny-a/one-step", "tiny-a", "42", 1, "32", "32", &[]);
}

#[test]
fn four_steps_non_square() {
    check_case("tiny-a/four-step-wide", "tiny-a", "7", 4, "48", "32", &[]);
}

#[test]
fn three_steps_on_the_base_model_without_guidance() {
    // guidance 1.0: diffusers runs no CFG on the base model either.
    check_case("tiny-b/three-step", "tiny-b", "0", 3, "32", "32", &["--guidance", "1"]);
}

#[test]
fn bf16_embeddings_give_the_golden_latents_within_their_rounding() {
    // The embeddings file holds the golden prompt embeddings rounded to bf16,
    // so the latents differ from diffusers' (made from the f32 embeddings) by
    // what that rounding (relative 2⁻⁹ per value) moves them: measured
    // 4.5e-5 relative L2 (2026-11-25), against 2.6e-6 from the f32 file.
    let err = final_latents_error("tiny-a/one-step", "tiny-a", "42", 1, ["32", "32"], &[], true);
    assert!(err <= 1.2e-4, "bf16 embeddings: final latents off by relative L2 {err:.3e}");
    // The rounding shows: the values were read as the bf16 numbers they are.
    assert!(err > F32_LATENTS, "bf16 embeddings gave the f32 file's latents ({err:.3e})");
}

fn expect_error(model: &str, args: &[&str], needle: &str, out: &Path) {
    let line = the_error_line(&gen(model, args));
    assert!(line.contains(needle), "{needle:?} not in {line:?}");
    assert!(!out.exists(), "a failed run left {}", out.display());
}

#[test]
fn bad_sizes_steps_and_embeddings_are_one_error_line_and_no_file() {
    let dir = scratch_dir("cli-errors");
    let embeds = embeddings_file("tiny-a/one-step", &dir, false);
    let e = embeds.to_str().unwrap();
    let out = dir.join("never.safetensors");
    let o = out.to_str().unwrap();
    // tiny-a's VAE has scale factor 2: sizes must be multiples of 4.
    expect_error("tiny-a", &["--embeddings", e, "--width", "30", "--height", "32", "--output-latents", o], "--width 30", &out);
    expect_error("tiny-a", &["--embeddings", e, "--width", "32", "--height", "0", "--output-latents", o], "--height 0", &out);
    expect_error("tiny-a", &["--embeddings", e, "--steps", "0", "--width", "32", "--height", "32", "--output-latents", o], "--steps 0", &out);
    // tiny-b expects 144-wide embeddings.
    expect_error("tiny-b", &["--embeddings", e, "--width", "32", "--height", "32", "--output-latents", o], "expected [512, 144]", &out);
    let missing = dir.join("missing.safetensors");
    expect_error("tiny-a", &["--embeddings", missing.to_str().unwrap(), "--output-latents", o], "missing.safetensors", &out);
}

/// Compiled pipelines are kept in the cache folder between runs where the
/// backend offers a pipeline cache (Vulkan): the first run fills it, the
/// second loads it, and `--verbose` says which; an empty folder setting
/// turns it off. (lavapipe's cache holds only its header: the loading is
/// what is checked here, not a saving in compile time.)
#[test]
fn compiled_pipelines_are_kept_between_runs_in_the_cache_folder() {
    let dir = scratch_dir("pipeline-cache");
    let cache = dir.join("cache");
    let out = dir.join("out.latents");
    let run = |cache: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
            .args(["gen", "--model"])
            .arg(model_dir("tiny-a"))
            .args(["--prompt", "a fox", "--steps", "1", "--width", "32", "--height", "32", "--verbose", "--quiet", "--precision", "f32", "--output-latents"])
            .arg(&out)
            .env("FLUX_LITE_CACHE_DIR", cache)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        stderr.lines().find(|l| l.starts_with("shaders: ")).unwrap_or_else(|| panic!("no shaders line: {stderr}")).to_string()
    };
    let first = run(&cache);
    if first.contains("not offered by this backend") {
        flux_lite_kernels::skip::skipped("this backend offers no pipeline cache");
        return;
    }
    assert!(first.contains("pipeline cache: empty"), "{first}");
    let files: Vec<_> = std::fs::read_dir(cache.join("pipelines")).unwrap().collect();
    assert_eq!(files.len(), 1, "one file per adapter and driver");
    let second = run(&cache);
    assert!(second.contains("bytes loaded") && !second.contains(" 0 bytes"), "{second}");
    assert!(run(Path::new("")).contains("pipeline cache: off"));
}

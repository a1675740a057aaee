//! `flux-lite gen --prompt … --output out.png` end to end against the
//! diffusers PNGs: tokenizer, text encoder, denoiser (with guidance on the
//! base model), VAE, PNG, within the f32 path's image tolerance
//! (`flux_lite_tests::tolerance::f32`: at most 1 level, tiny mean).

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{exact_bytes, model_dir, read_png, read_stderr_until, scratch_dir, the_error_line, Goldens};
use std::path::Path;
use std::process::{Command, Output, Stdio};


fn gen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite")).arg("gen").args(args).arg("--quiet").output().unwrap()
}

/// A golden case's value as a string.
fn case_value(c: &serde_json::Value, k: &str) -> String {
    match &c[k] {
        serde_json::Value::String(v) => v.clone(),
        v => v.to_string(),
    }
}

/// The case's reference image files (generate_references.py), if any.
fn case_references(case: &str, c: &serde_json::Value) -> Vec<String> {
    c["references"]
        .as_array()
        .map(|a| a.iter().map(|r| Goldens::dir(case).join(r["file"].as_str().unwrap()).to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// The `gen` flags of a golden case, writing `out`.
fn case_args(case: &str, out: &Path) -> Vec<String> {
    let c = Goldens::load(case).case_json();
    let s = |k: &str| case_value(&c, k);
    let model = model_dir(&s("model")).to_string_lossy().into_owned();
    let mut args = vec!["--model".into(), model, "--prompt".into(), s("prompt"), "--seed".into(), s("seed"), "--steps".into(), s("steps")];
    if let Some(negative) = c["negative_prompt"].as_str() {
        args.extend(["--negative-prompt".into(), negative.into()]);
    }
    let references = case_references(case, &c);
    for r in &references {
        args.extend(["--image".into(), r.clone()]);
    }
    // The size flags, unless the case leaves the size to the first reference.
    if !c["width_flag"].is_null() || references.is_empty() {
        args.extend(["--width".into(), s("width"), "--height".into(), s("height")]);
    }
    args.extend(["--output".into(), out.to_string_lossy().into_owned()]);
    args
}

/// Runs the golden case through `gen` with `extra` flags, compares the PNG
/// within the f32 path's tolerance, and returns stderr.
fn reproduce(case: &str, extra: &[&str]) -> String {
    let extra: Vec<&str> = extra.iter().copied().chain(["--precision", "f32"]).collect();
    reproduce_within(case, &extra, &|what, got, want| flux_lite_tests::tolerance::assert_png_close(what, got, want))
}

/// Compares a PNG's values with the golden's: `(what, got, want)`, panicking when apart.
type ImageCheck<'a> = dyn Fn(&str, &[u8], &[u8]) + 'a;

/// [`reproduce`] with the image comparison `check` (another tier's bar).
fn reproduce_within(case: &str, extra: &[&str], check: &ImageCheck<'_>) -> String {
    let g = Goldens::load(case);
    let c = g.case_json();
    let s = |k: &str| case_value(&c, k);
    // One folder per case and flags: runs of one case with other flags go on in parallel.
    let dir = scratch_dir(&format!("png-{}{}", case.replace('/', "-"), extra.join("").replace(['-', '/'], "")));
    let out = dir.join("out.png");
    let (prompt, seed, steps, width, height) = (s("prompt"), s("seed"), s("steps"), s("width"), s("height"));
    let references = case_references(case, &c);
    let mut args = case_args(case, &out);
    args.extend(extra.iter().map(|e| e.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = gen(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{case}: {stderr}");
    assert!(stderr.contains(&format!("seed: {seed}")), "{stderr}");
    assert!(stderr.contains("time: load"), "{stderr}");

    let got = read_png(&out);
    let want = read_png(&Goldens::dir(case).join("image.png"));
    assert_eq!((got.width, got.height), (want.width, want.height), "{case}: size");
    let diffs: Vec<u8> = got.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).collect();
    let max = diffs.iter().copied().max().unwrap();
    let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
    let off = diffs.iter().filter(|&&d| d > 0).count();
    eprintln!("{case}: max |Δ| {max}, mean |Δ| {mean:.4}, {off} of {} values differ", diffs.len());
    check(case, &got.rgb, &want.rgb);

    let text = |k: &str| got.text.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(text("prompt").as_deref(), Some(prompt.as_str()));
    assert_eq!(text("seed").as_deref(), Some(seed.as_str()));
    assert_eq!(text("steps").as_deref(), Some(steps.as_str()));
    assert_eq!(text("size"), Some(format!("{width}x{height}")));
    assert!(text("model").is_some_and(|m| m.contains(&s("model"))));
    let negative = c["negative_prompt"].as_str().unwrap_or_default();
    assert_eq!(text("negative_prompt").unwrap_or_default(), negative, "{case}: the negative prompt's chunk");
    // AUTOMATIC1111's `parameters`, read back as A1111 reads it.
    let (said_prompt, said_negative, fields) = a1111_fields(&text("parameters").unwrap_or_default());
    assert_eq!((said_prompt.as_str(), said_negative.as_str()), (prompt.as_str(), negative), "{case}: the parameters' prompts");
    let field = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{case}: no `{k}` in {fields:?}"));
    assert_eq!([field("Steps"), field("Seed"), field("Size"), field("Sampler")], [steps.clone(), seed.clone(), format!("{width}x{height}"), "Euler".into()]);
    assert_eq!(field("Model"), s("model"));
    assert!(field("CFG scale").parse::<f32>().is_ok() && field("Version").starts_with("flux-lite "), "{fields:?}");
    let named: Vec<&String> = got.text.iter().filter(|(k, _)| k == "reference").map(|(_, v)| v).collect();
    assert_eq!(named, references.iter().collect::<Vec<_>>(), "{case}: the reference files in the PNG's text");
    only_the_png_is_left(&dir);
    stderr.into_owned()
}

/// A `parameters` chunk as AUTOMATIC1111's `parse_generation_parameters`
/// reads it: the prompt (the lines before one starting `Negative prompt: `
/// or before the last), the negative prompt (from that line to the last),
/// then the last line's `Key: value` pairs joined by `, `, a value in
/// quotes a JSON string.
fn a1111_fields(parameters: &str) -> (String, String, Vec<(String, String)>) {
    let (prompts, last) = parameters.rsplit_once('\n').unwrap_or(("", parameters));
    let (prompt, negative) = match prompts.split_once("\nNegative prompt: ") {
        Some((p, n)) => (p, n),
        None => match prompts.strip_prefix("Negative prompt: ") {
            Some(n) => ("", n),
            None => (prompts, ""),
        },
    };
    let (mut fields, mut rest) = (Vec::new(), last.trim());
    while let Some((key, after)) = rest.split_once(": ") {
        let (value, next) = match after.starts_with('"') {
            true => {
                let mut values = serde_json::Deserializer::from_str(after).into_iter::<String>();
                let value = values.next().unwrap().unwrap();
                (value, &after[values.byte_offset()..])
            }
            false => {
                let (value, next) = after.split_once(", ").unwrap_or((after, ""));
                (value.to_string(), next)
            }
        };
        fields.push((key.to_string(), value));
        rest = next.trim_start_matches(", ");
    }
    (prompt.to_string(), negative.to_string(), fields)
}

fn only_the_png_is_left(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["out.png"], "temporary files left behind");
}

#[test]
fn one_step_distilled() {
    reproduce("tiny-a/one-step", &[]);
}

#[test]
fn four_steps_non_square_with_a_non_ascii_prompt() {
    reproduce("tiny-a/four-step-wide", &[]);
}

#[test]
fn three_steps_base_model_without_guidance() {
    reproduce("tiny-b/three-step", &["--guidance", "1"]);
}

#[test]
fn base_model_with_guidance_by_default() {
    // tiny-b is not distilled: 4.0 is the default guidance, with "" as the negative prompt.
    reproduce("tiny-b/cfg", &[]);
}

#[test]
fn a_negative_prompt_steers_as_diffusers_negative_prompt_embeds_do() {
    // The golden encodes its negative with the pipeline's own encode_prompt and passes it as
    // negative_prompt_embeds (generate_negative.py).
    let stderr = reproduce("tiny-b/cfg-negative", &[]);
    assert!(!stderr.contains("warning"), "{stderr}");
    // Without it the picture is another: the negative is read, not dropped.
    let dir = scratch_dir("png-negative-dropped");
    let out = dir.join("out.png");
    let args: Vec<String> = case_args("tiny-b/cfg-negative", &out).into_iter().filter(|a| !a.contains("stone wall") && a != "--negative-prompt").collect();
    let run = gen(&args.iter().map(String::as_str).chain(["--precision", "f32"]).collect::<Vec<_>>());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (got, want) = (read_png(&out), read_png(&Goldens::dir("tiny-b/cfg-negative").join("image.png")));
    let max = got.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(max > 16, "the empty negative gives nearly the golden's image (max |Δ| {max})");
    // An empty negative is the default one, pixel for pixel.
    let empty = dir.join("empty.png");
    let args: Vec<String> = args.into_iter().map(|a| if a == out.to_string_lossy() { empty.to_string_lossy().into_owned() } else { a }).collect();
    let run = gen(&args.iter().map(String::as_str).chain(["--precision", "f32", "--negative-prompt", ""]).collect::<Vec<_>>());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(read_png(&empty).rgb == got.rgb, "--negative-prompt \"\" changed the image");
}

#[test]
fn a_negative_prompt_without_guidance_warns_that_nothing_reads_it() {
    let dir = scratch_dir("png-negative-unguided");
    for (model, extra, why) in [("tiny-a", &[][..], "is guidance-distilled"), ("tiny-b", &["--guidance", "1"][..], "runs no guidance")] {
        let out = dir.join(format!("{model}.png"));
        let model_path = model_dir(model).to_string_lossy().into_owned();
        let mut args = vec!["--model", &model_path, "--prompt", "a fox", "--negative-prompt", "blur", "--width", "32", "--height", "32", "--steps", "1"];
        args.extend(extra);
        args.extend(["--output", out.to_str().unwrap()]);
        let run = gen(&args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{stderr}");
        assert!(stderr.contains(why) && stderr.contains("--negative-prompt is ignored"), "{model}: {stderr}");
    }
}

#[test]
fn the_9b_structure_at_a_tiny_scale() {
    // tiny-9b: 1 double to 3 single blocks, Qwen3 with 4 query heads per key head, joint = 3 × hidden.
    reproduce("tiny-9b/two-step", &[]);
}

#[test]
fn one_reference_image_sets_the_size() {
    // 66×90 RGB, centre-cropped to 64×88, which becomes the output size.
    reproduce("tiny-a/reference-one", &[]);
}

#[test]
fn two_reference_images_with_alpha_and_grey() {
    // 64×64 RGBA (alpha dropped) and 80×68 greyscale, at T = 10 and 20; output 32×48.
    reproduce("tiny-a/reference-two", &[]);
}

#[test]
fn a_reference_image_under_guidance() {
    // tiny-b is not distilled: both passes of each step see the reference tokens.
    reproduce("tiny-b/reference-cfg", &[]);
}

#[test]
fn the_kv_pipeline_caches_the_references_after_the_first_step() {
    // tiny-9b as Flux2KleinKVPipeline: two references (64×72, 80×64) extracted on step 0, cached for steps 1 and 2.
    let stderr = reproduce("tiny-9b-kv/reference-kv", &["--verbose"]);
    assert!(stderr.contains("transformer weights resident, expanded, the references' keys and values cached"), "{stderr}");
    // 288 + 320 reference tokens × 8 blocks × 2 × 64 × 4 bytes.
    assert!(stderr.contains("plan: the references' keys and values (608 tokens, 2.38 MiB in f32) extracted on the first step, read from the cache by every later step"), "{stderr}");
    // --kv-cache off runs Flux2KleinPipeline's recipe on the same model: another image.
    let dir = scratch_dir("png-kv-off");
    let out = dir.join("out.png");
    let mut args = case_args("tiny-9b-kv/reference-kv", &out);
    args.extend(["--kv-cache", "off", "--verbose"].map(String::from));
    let run = gen(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success() && !stderr.contains("keys and values cached"), "{stderr}");
    let want = read_png(&Goldens::dir("tiny-9b-kv/reference-kv").join("image.png"));
    assert_ne!(read_png(&out).rgb, want.rgb, "--kv-cache off made the KV pipeline's image");
    let run = gen(&["--model", "x", "--prompt", "x", "--kv-cache", "sometimes"]);
    assert!(String::from_utf8_lossy(&run.stderr).contains("--kv-cache sometimes: give auto, on or off"));
    let run = gen(&["--model", "x", "--prompt", "x", "--kv-precision", "bf16"]);
    assert!(String::from_utf8_lossy(&run.stderr).contains("--kv-precision bf16: give auto, f32 or f16"));
}

/// The diffusers PNGs without reference images, and the extra flags each needs.
const TEXT_TO_IMAGE_CASES: [(&str, &[&str]); 5] =
    [("tiny-a/one-step", &[]), ("tiny-a/four-step-wide", &[]), ("tiny-b/three-step", &["--guidance", "1"]), ("tiny-b/cfg", &[]), ("tiny-9b/two-step", &[])];

/// The diffusers PNGs with reference images.
const REFERENCE_CASES: [(&str, &[&str]); 4] =
    [("tiny-a/reference-one", &[]), ("tiny-a/reference-two", &[]), ("tiny-b/reference-cfg", &[]), ("tiny-9b-kv/reference-kv", &[])];

/// The diffusers PNGs of `cases` through `gen --precision TIER`, within
/// the project's image bar for tiers other than f32 (max 3 levels, mean 0.2).
fn pngs_within_the_tier_bar(tier: &str, cases: &[(&str, &[&str])]) {
    if !flux_lite_tests::tier_here(env!("CARGO_BIN_EXE_flux-lite"), tier) {
        return;
    }
    use flux_lite_tests::tolerance::{other_tiers, png_gap};
    let within_the_tier_bar = |what: &str, got: &[u8], want: &[u8]| {
        let (max, mean) = png_gap(got, want);
        println!("{what} on the {tier} tier: max |Δ| {max}, mean |Δ| {mean:.4}");
        assert!(max <= other_tiers::PNG_MAX_LEVELS && mean <= other_tiers::PNG_MEAN_LEVELS, "{what} on the {tier} tier: max |Δ| {max}, mean |Δ| {mean:.4}");
    };
    for (case, extra) in cases {
        let extra: Vec<&str> = extra.iter().copied().chain(["--precision", tier]).collect();
        reproduce_within(case, &extra, &within_the_tier_bar);
    }
}

/// The matrix tier with the transformer's attention as products on the
/// GEMM core (`FLUX_LITE_ATTENTION_KERNEL=products`: what runs it where the
/// flash kernel's check fails): two of the diffusers PNGs (one guided)
/// within the tier bar, the tier's line saying so, and the device's
/// measured peak within the planned bytes, which count the attention's
/// scratch.
#[test]
fn the_matrix_tier_reproduces_pngs_with_the_transformers_attention_on_products() {
    if !flux_lite_tests::tier_here(env!("CARGO_BIN_EXE_flux-lite"), "matrix") {
        return;
    }
    use flux_lite_tests::tolerance::{other_tiers, png_gap};
    for case in ["tiny-a/four-step-wide", "tiny-b/cfg"] {
        let dir = scratch_dir(&format!("png-products-{}", case.replace('/', "-")));
        let out = dir.join("out.png");
        let mut args = case_args(case, &out);
        args.extend(["--precision", "matrix", "--verbose"].map(String::from));
        let run = Command::new(env!("CARGO_BIN_EXE_flux-lite")).arg("gen").args(&args).arg("--quiet").env("FLUX_LITE_ATTENTION_KERNEL", "products").output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{case}: {stderr}");
        let tier = stderr.lines().find(|l| l.starts_with("precision: ")).unwrap_or_else(|| panic!("{stderr}"));
        assert!(tier.contains("; the transformer's and the text encoder's attention as products on the GEMM core"), "{tier}");
        let bytes = stderr.lines().find(|l| l.starts_with("device bytes: ")).unwrap_or_else(|| panic!("{stderr}"));
        let figure = |key: &str| -> u64 { bytes.split(&format!("{key} ")).nth(1).and_then(|a| a.split(',').next()).unwrap().trim().parse().unwrap() };
        assert!(figure("peak") <= figure("planned"), "{case}: {bytes}");
        let (got, want) = (read_png(&out), read_png(&Goldens::dir(case).join("image.png")));
        let (max, mean) = png_gap(&got.rgb, &want.rgb);
        println!("{case} on the matrix tier, attention on products: max |Δ| {max}, mean |Δ| {mean:.4}; {bytes}");
        assert!(max <= other_tiers::PNG_MAX_LEVELS && mean <= other_tiers::PNG_MEAN_LEVELS, "{case}: max |Δ| {max}, mean |Δ| {mean:.4}");
    }
}

// Each tier's PNGs in two tests, which the test threads run side by side.
#[test]
fn the_matrix_tier_reproduces_every_text_to_image_png_within_the_tier_bar() {
    pngs_within_the_tier_bar("matrix", &TEXT_TO_IMAGE_CASES);
}

#[test]
fn the_matrix_tier_reproduces_every_reference_png_within_the_tier_bar() {
    pngs_within_the_tier_bar("matrix", &REFERENCE_CASES);
}

#[test]
fn the_f16_tier_reproduces_every_text_to_image_png_within_the_tier_bar() {
    pngs_within_the_tier_bar("f16", &TEXT_TO_IMAGE_CASES);
}

#[test]
fn the_f16_tier_reproduces_every_reference_png_within_the_tier_bar() {
    pngs_within_the_tier_bar("f16", &REFERENCE_CASES);
}

#[test]
fn a_failing_run_leaves_no_file() {
    let dir = scratch_dir("png-failing");
    let model = dir.join("model");
    flux_lite_tests::copy_tree(&model_dir("tiny-a"), &model);
    // A VAE file cut short: found only when the decode stage opens it, after denoising.
    let vae = model.join("vae/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&vae).unwrap();
    std::fs::write(&vae, &bytes[..bytes.len() / 2]).unwrap();
    let out = dir.join("out.png");
    let run = gen(&["--model", model.to_str().unwrap(), "--prompt", "x", "--steps", "1", "--width", "16", "--height", "16", "--output", out.to_str().unwrap()]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("diffusion_pytorch_model.safetensors"), "{stderr}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["model"], "partial files left behind");
}

/// `gen` on tiny-a writing `out` at a `size`-pixel square, stderr piped, with `env` set.
fn spawn_gen(out: &Path, steps: &str, size: &str, env: &[(&str, &str)]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model_dir("tiny-a").to_str().unwrap(), "--prompt", "a fox", "--steps", steps])
        .args(["--width", size, "--height", size, "--output", out.to_str().unwrap()])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_run_leaves_no_file() {
    let dir = scratch_dir("png-killed");
    let out = dir.join("out.png");
    let mut child = spawn_gen(&out, "50", "64", &[]);
    // Wait until it is denoising, then kill it.
    read_stderr_until(child.stderr.as_mut().unwrap(), "denoise");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "partial files left behind");
}

#[test]
fn a_run_killed_in_the_middle_of_writing_the_png_leaves_no_png() {
    let dir = scratch_dir("png-killed-mid-write");
    let out = dir.join("out.png");
    // The write stops halfway for a minute: the kill lands inside it.
    let mut child = spawn_gen(&out, "1", "32", &[("FLUX_LITE_PAUSE_MID_WRITE", "60")]);
    read_stderr_until(child.stderr.as_mut().unwrap(), "paused mid-write");
    let partial: Vec<std::path::PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(std::fs::metadata(&partial[0]).unwrap().len() > 0, "the first half is on disk");
    assert!(!out.exists(), "the PNG's name exists before the write completed");
    child.kill().unwrap();
    child.wait().unwrap();
    // What a SIGKILL leaves is the hidden temporary file, never a partial out.png.
    assert!(!out.exists());
    let left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(left.len() == 1 && left[0].starts_with(".out.png.partial-"), "{left:?}");
}

#[test]
fn vae_tiles_much_smaller_than_the_image_keep_the_image() {
    // 8-pixel tiles on a 48×32 image: the decode runs by bands of a few rows.
    reproduce("tiny-a/four-step-wide", &["--vae-tile", "8"]);
}

#[test]
fn reference_images_encoded_by_small_tiles_keep_the_image() {
    // 16-pixel tiles on 64×64 and 80×68 references: the encoder runs by bands
    // (stride-2 downsampling included), and the decoder of the 32×48 image too.
    reproduce("tiny-a/reference-two", &["--vae-tile", "16"]);
}

#[test]
fn reference_images_at_the_smallest_budget_are_encoded_by_bands() {
    // reference-two at 32×48: the run's smallest budget (the transformer's, in chunks)
    // is below what encoding the 80×68 reference untiled needs, so the plan tiles the encoder.
    let case = "tiny-a/reference-two";
    let probe = scratch_dir("png-reference-budget-probe");
    let mut args = case_args(case, &probe.join("out.png"));
    args.extend(["--memory-budget".into(), "1KiB".into()]);
    let line = the_error_line(&gen(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(line.contains("the smallest budget that works"), "{line}");
    let budget = format!("{}B", exact_bytes(&line));
    let stderr = reproduce(case, &["--memory-budget", &budget, "--verbose"]);
    assert!(stderr.contains("plan: VAE encoder in bands"), "{stderr}");
}

/// `--output -`: the PNG on standard output, byte for byte the one a file
/// run writes, every message on standard error; the same PNG through a named
/// pipe to a reader; and `/dev/full` (as root,
/// where it exists): one error line, a failure, and the device left a device.
#[test]
fn the_png_goes_to_standard_output_and_a_full_device_is_an_error() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch_dir("png-stdout");
    let file = dir.join("out.png");
    let args = |out: &str| {
        ["--model", model_dir("tiny-a").to_str().unwrap(), "--prompt", "a fox", "--seed", "3", "--steps", "1", "--width", "32", "--height", "32", "--output", out]
            .map(String::from)
    };
    let run = gen(&args(file.to_str().unwrap()).each_ref().map(String::as_str));
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.stdout.is_empty(), "a file run printed on standard output");

    let piped = gen(&args("-").each_ref().map(String::as_str));
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.status.success(), "{stderr}");
    assert!(stderr.contains("wrote standard output"), "{stderr}");
    assert_eq!(piped.stdout, std::fs::read(&file).unwrap(), "standard output differs from the file");
    let png = png::Decoder::new(std::io::Cursor::new(&piped.stdout)).read_info().unwrap();
    assert_eq!((png.info().width, png.info().height), (32, 32));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "more than out.png in the folder");

    // A named pipe: a reader on the other end receives the same PNG, and the pipe stays a pipe.
    let fifo = dir.join("pipe.png");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let run = gen(&args(fifo.to_str().unwrap()).each_ref().map(String::as_str));
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(reader.join().unwrap(), std::fs::read(&file).unwrap(), "the pipe's reader got other bytes");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe was replaced");

    let full = Path::new("/dev/full");
    if !std::fs::metadata(full).is_ok_and(|m| m.file_type().is_char_device()) {
        flux_lite_tests::skipped("no /dev/full here");
        return;
    }
    let run = gen(&args("/dev/full").each_ref().map(String::as_str));
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert!(errors.len() == 1 && errors[0].contains("/dev/full") && errors[0].contains("No space left"), "{stderr}");
    assert!(std::fs::metadata(full).unwrap().file_type().is_char_device(), "/dev/full was replaced");
}

/// The PNG `args` write (their `--output` is `out`), read whole.
fn made(args: &[&str], out: &Path) -> Vec<u8> {
    let run = gen(args);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    std::fs::read(out).unwrap()
}

#[test]
fn an_image_made_again_from_itself_is_the_same_file() {
    let dir = scratch_dir("png-from");
    let first = dir.join("first.png");
    // Guided with a negative (tiny-b), and an inpainting with its init image and mask (tiny-a).
    let inpaint = Goldens::dir("tiny-a/inpaint-rect");
    let (init, mask) = (inpaint.join("init.png").to_string_lossy().into_owned(), inpaint.join("mask.png").to_string_lossy().into_owned());
    let tiny_a = model_dir("tiny-a").to_string_lossy().into_owned();
    let cases: Vec<Vec<String>> = vec![
        case_args("tiny-b/cfg-negative", &first),
        ["--model", &tiny_a, "--prompt", "a red fox in the snow", "--seed", "3", "--steps", "2", "--init-image", &init, "--mask", &mask, "--strength", "0.75"]
            .iter()
            .map(|s| s.to_string())
            .chain(["--output".into(), first.to_string_lossy().into_owned()])
            .collect(),
    ];
    for args in cases {
        let _ = std::fs::remove_file(&first);
        let args: Vec<&str> = args.iter().map(String::as_str).chain(["--precision", "f32"]).collect();
        let original = made(&args, &first);
        // Nothing but the image and where the copy goes: every setting comes from the image.
        let again = dir.join("again.png");
        let _ = std::fs::remove_file(&again);
        let copy = made(&["--from", first.to_str().unwrap(), "--output", again.to_str().unwrap()], &again);
        assert!(copy == original, "{args:?}: the image made again differs from the first");
        // A flag given wins over the image's setting.
        let other = dir.join("other-seed.png");
        let _ = std::fs::remove_file(&other);
        made(&["--from", first.to_str().unwrap(), "--seed", "999", "--output", other.to_str().unwrap()], &other);
        let text = read_png(&other).text;
        assert_eq!(text.iter().find(|(k, _)| k == "seed").map(|(_, v)| v.as_str()), Some("999"));
        assert!(read_png(&other).rgb != read_png(&first).rgb, "another seed, the same pixels");
    }
}

#[test]
fn info_prints_the_settings_an_image_carries() {
    let dir = scratch_dir("png-info");
    let out = dir.join("out.png");
    made(&case_args("tiny-b/cfg-negative", &out).iter().map(String::as_str).chain(["--precision", "f32"]).collect::<Vec<_>>(), &out);
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["info", out.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let c = Goldens::load("tiny-b/cfg-negative").case_json();
    for line in [
        format!("prompt: {}", c["prompt"].as_str().unwrap()),
        format!("negative prompt: {}", c["negative_prompt"].as_str().unwrap()),
        format!("seed: {}", c["seed"]),
        "size: 32x48".to_string(),
        "steps: 2".to_string(),
        "guidance: 4".to_string(),
        "precision: f32 on ".to_string(),
        format!("again: flux-lite gen --from {} --output again.png", out.display()),
    ] {
        assert!(stdout.lines().any(|l| l.starts_with(&line)), "no line {line:?} in:\n{stdout}");
    }
    assert!(stdout.lines().any(|l| l.starts_with("model: tiny-b (folder ") && l.contains("weights sha256:")), "{stdout}");
}

/// A PNG another tool wrote: the golden one-step image's pixels, with only
/// an A1111 `parameters` chunk saying its settings (as A1111 writes them).
fn a1111_png(path: &Path, parameters: &str) {
    let golden = read_png(&Goldens::dir("tiny-a/one-step").join("image.png"));
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(file, golden.width as u32, golden.height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.add_text_chunk("parameters".into(), parameters.into()).unwrap();
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(&golden.rgb).unwrap();
    writer.finish().unwrap();
}

#[test]
fn another_tools_settings_are_read_and_made_again_with_the_model_given() {
    let dir = scratch_dir("png-from-a1111");
    let c = Goldens::load("tiny-a/one-step").case_json();
    let settings = dir.join("a1111.png");
    let parameters = format!("{}\nSteps: {}, Sampler: Euler, CFG scale: 1, Seed: {}, Size: 32x32, Model: flux2-klein", c["prompt"].as_str().unwrap(), c["steps"], c["seed"]);
    a1111_png(&settings, &parameters);
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["info", settings.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("AUTOMATIC1111's settings") && stdout.contains(&format!("Seed: {}", c["seed"])), "{stdout}");
    // It names no model folder: --model is asked for.
    let out = dir.join("out.png");
    let line = the_error_line(&gen(&["--from", settings.to_str().unwrap(), "--output", out.to_str().unwrap()]));
    assert!(line.contains("--from") && line.contains("--model"), "{line}");
    // With it, the golden image again.
    let model = model_dir("tiny-a").to_string_lossy().into_owned();
    made(&["--from", settings.to_str().unwrap(), "--model", &model, "--precision", "f32", "--output", out.to_str().unwrap()], &out);
    flux_lite_tests::tolerance::assert_png_close("gen --from an A1111 PNG", &read_png(&out).rgb, &read_png(&settings).rgb);
}

#[test]
fn from_a_file_without_settings_is_one_error_naming_it() {
    let dir = scratch_dir("png-from-bad");
    let out = dir.join("out.png");
    let plain = Goldens::dir("tiny-a/inpaint-rect").join("mask.png");
    let line = the_error_line(&gen(&["--from", plain.to_str().unwrap(), "--output", out.to_str().unwrap()]));
    assert!(line.contains("--from") && line.contains("mask.png") && line.contains("carries no settings"), "{line}");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not an image").unwrap();
    let line = the_error_line(&gen(&["--from", text.to_str().unwrap(), "--output", out.to_str().unwrap()]));
    assert!(line.contains("notes.txt") && line.contains("not a PNG"), "{line}");
    assert!(!out.exists());
}

#[test]
fn jpeg_and_webp_by_extension_carry_their_settings_and_make_the_image_again() {
    let dir = scratch_dir("png-formats");
    let png = dir.join("fox.png");
    let base: Vec<String> = case_args("tiny-a/four-step-wide", &png);
    let with_output = |out: &Path, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = base.iter().map(|a| if *a == png.to_string_lossy() { out.to_string_lossy().into_owned() } else { a.clone() }).collect();
        args.extend(["--precision", "f32"].iter().chain(extra).map(|s| s.to_string()));
        args
    };
    let run = |args: &[String]| {
        let run = gen(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    };
    run(&with_output(&png, &[]));
    let reference = read_png(&png);
    let (webp, jpeg, small) = (dir.join("fox.webp"), dir.join("fox.jpg"), dir.join("fox-q40.jpeg"));
    run(&with_output(&webp, &[]));
    run(&with_output(&jpeg, &[]));
    run(&with_output(&small, &["--quality", "40"]));
    // WebP is lossless: the PNG's pixels. JPEG is near them, and smaller at a lower quality.
    let decoded = |p: &Path| image::open(p).unwrap().to_rgb8().into_raw();
    assert!(decoded(&webp) == reference.rgb, "the WebP's pixels differ from the PNG's");
    let off = |p: &Path| decoded(p).iter().zip(&reference.rgb).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / reference.rgb.len() as f64;
    // PIL (libjpeg) at quality 90 with full-resolution chroma gives this image back within mean
    // |Δ| 6.27 (18.4 with 4:2:0 chroma): JPEG's own loss on a noisy tiny-model image.
    assert!(off(&jpeg) <= 6.5, "JPEG at the default quality: mean |Δ| {} (PIL's at the same quality: 6.27)", off(&jpeg));
    assert!(std::fs::metadata(&small).unwrap().len() < std::fs::metadata(&jpeg).unwrap().len());
    for file in [&webp, &jpeg] {
        // The settings travel in EXIF (and XMP for WebP): info reads them, --from makes the PNG again.
        let info = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["info", file.to_str().unwrap()]).output().unwrap();
        let stdout = String::from_utf8_lossy(&info.stdout);
        assert!(stdout.contains("seed: 7") && stdout.contains("prompt: Ünïcödé café 東京 🦊 at night"), "{}: {stdout}", file.display());
        let again = dir.join("again.png");
        let _ = std::fs::remove_file(&again);
        made(&["--from", file.to_str().unwrap(), "--output", again.to_str().unwrap()], &again);
        assert!(read_png(&again).rgb == reference.rgb, "{}: made again, other pixels", file.display());
        // A1111 reads a JPEG's or WebP's settings from EXIF's UserComment, as A1111 writes them.
        let bytes = std::fs::read(file).unwrap();
        let exif = exif::Reader::new().read_from_container(&mut std::io::Cursor::new(&bytes)).unwrap();
        let comment = exif.get_field(exif::Tag::UserComment, exif::In::PRIMARY).unwrap();
        let exif::Value::Undefined(raw, _) = &comment.value else { panic!("UserComment is not UNDEFINED") };
        assert_eq!(&raw[..8], b"UNICODE\0");
        let units: Vec<u16> = raw[8..].chunks_exact(2).map(|p| u16::from_be_bytes([p[0], p[1]])).collect();
        let (prompt, _, fields) = a1111_fields(&String::from_utf16(&units).unwrap());
        assert_eq!(prompt, "Ünïcödé café 東京 🦊 at night");
        assert!(fields.contains(&("Seed".to_string(), "7".to_string())), "{fields:?}");
    }
}

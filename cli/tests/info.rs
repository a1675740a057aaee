//! `flux-lite info`: configs, sizes and the memory plan without running the
//! model, from a full folder or from its config files alone.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{copy_tree_where, exact_bytes, model_dir, scratch_dir, test_vectors, the_error_line};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GIB: u64 = 1 << 30;

fn info(model: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite")).arg("info").args(["--model", model.to_str().unwrap()]).args(extra).output().unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert!(out.status.success(), "info failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The option lines (`  strategy: peak (…)`) printed under `section:`.
fn section<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let mut lines = stdout.lines().skip_while(|l| !(l.starts_with(name) && l.ends_with(':'))).skip(1);
    let mut out = Vec::new();
    for l in lines.by_ref() {
        match l.strip_prefix("  ") {
            Some(option) => out.push(option),
            None => break,
        }
    }
    assert!(!out.is_empty(), "no {name} section in {stdout}");
    out
}

/// The exact byte count of `smallest budget for the whole run: X (N B)`.
fn minimum(stdout: &str) -> u64 {
    exact_bytes(stdout.lines().find(|l| l.starts_with("smallest budget for the whole run: ")).unwrap_or_else(|| panic!("{stdout}")))
}

/// A copy of a model folder with its config files only (no weights, no shard index).
fn configs_only(name: &str) -> PathBuf {
    let to = scratch_dir(&format!("info-configs-{name}"));
    let config = |path: &Path| path.extension().is_some_and(|e| e == "json") && !path.to_string_lossy().ends_with(".safetensors.index.json");
    copy_tree_where(&model_dir(name), &to, &config);
    to
}

/// Weights of one streamed slot, by hand from the published shapes (no
/// biases in FLUX.2's blocks): the largest block is a double block, two
/// streams of `q, k, v` and `out` (`4·D²`) and a feed-forward `D → 2F → F → D`
/// (`3·D·F`), in bf16; a slot also passes through the 64 MiB staging buffer.
fn one_slot_weights_mib(d: f64, f: f64) -> f64 {
    // A double block's bf16 weights, 64 MiB of staging, and (the sizes being
    // estimated as DF11) the 64 MiB area its compressed group streams through.
    2.0 * (4.0 * d * d + 3.0 * d * f) * 2.0 / (1u64 << 20) as f64 + 64.0 + 64.0
}

/// The `weights X` figure of an option line, in MiB.
fn weights_mib(line: &str) -> f64 {
    let figure = line.split("(weights ").nth(1).unwrap().split(',').next().unwrap();
    parse_gib(figure) * 1024.0
}

#[test]
fn the_published_4b_plans_from_its_config_files_alone() {
    let folder = test_vectors().join("configs/klein-4b");
    let stdout = stdout_of(&info(&folder, &[]));
    assert!(stdout.contains("transformer: 5 double + 20 single blocks, 24 heads × 128"), "{stdout}");
    assert_eq!(stdout.matches("no weight files").count(), 3, "{stdout}");
    assert!(stdout.contains("plan for 1024×1024 with 512 prompt tokens"), "{stdout}");
    let peak = |line: &str| parse_gib(line.split(": ").nth(1).unwrap().split(" = ").next().unwrap());
    // Pinned limits, so the list does not depend on this machine's adapter.
    // With 4 GiB bindings every strategy is listed unchunked, in token
    // chunks, and in token chunks with keys and values in f16, each smaller.
    let roomy = stdout_of(&info(&folder, &["--limits", "4GiB/4GiB"]));
    let transformer = section(&roomy, "transformer (sizes estimated");
    let (half_kv, transformer): (Vec<&str>, Vec<&str>) = transformer.iter().partition(|l| l.contains("-token chunks, keys and values in f16"));
    let (chunked, unchunked): (Vec<&str>, Vec<&str>) = transformer.iter().partition(|l| l.contains("-token chunks"));
    assert_eq!((half_kv.len(), chunked.len(), unchunked.len()), (5, 5, 5), "{roomy}");
    assert!(chunked.iter().zip(&unchunked).all(|(c, u)| peak(c) < peak(u)), "{transformer:?}");
    assert!(half_kv.iter().zip(&chunked).all(|(h, c)| peak(h) < peak(c)), "{half_kv:?}");
    // Under 128 MiB bindings (WebGPU's default, lavapipe's) the single blocks'
    // unchunked keys (4608 rows of the 27648-wide fused projection, 510 MB) do
    // not fit one binding: only the five chunked options are listed.
    let narrow = stdout_of(&info(&folder, &["--limits", "2GiB/128MiB"]));
    let transformer = section(&narrow, "transformer (sizes estimated");

    assert_eq!(without_f16(transformer), chunked, "{narrow}");
    // WebGPU's default 256 MiB buffers hold the 1024² arena by chunks (the
    // stream, keys and values whole: 170 MB), not 1536²'s (358 MB for those
    // three alone): refused up front, naming the buffer.
    let webgpu = stdout_of(&info(&folder, &["--limits", "webgpu"]));
    assert_eq!(without_f16(section(&webgpu, "transformer (sizes estimated")), chunked, "{webgpu}");
    let webgpu = info(&folder, &["--limits", "webgpu", "--width", "1536", "--height", "1536"]);
    let stderr = String::from_utf8_lossy(&webgpu.stderr);
    assert!(!webgpu.status.success() && stderr.contains("above the adapter's largest buffer of 268435456 bytes"), "{stderr}");
    // Each chunked option smaller than the one before; streaming fits the 4B's denoising in 2 GiB.
    assert!(chunked[3].starts_with("streamed per block from host memory into 2 slots, by"));
    assert!(chunked[4].starts_with("streamed per block from host memory into 1 slot, by"));
    assert!(peak(chunked[4]) <= 2.0, "streamed denoising of the 4B at 1024² needs {}", chunked[4]);
    assert!(chunked.windows(2).all(|w| peak(w[1]) < peak(w[0])), "{chunked:?}");
    // One slot holds a double block: 468 MiB of bf16 by hand, + 64 MiB of staging, + the 64 MiB DF11 area.
    let by_hand = one_slot_weights_mib(3072.0, 9216.0);
    assert_eq!(by_hand, 596.0);
    assert!((weights_mib(chunked[4]) - by_hand).abs() < 0.1, "{} vs {by_hand} MiB by hand", chunked[4]);
    let stdout = narrow;
    // The whole run's minimum works, one byte less does not.
    let least = minimum(&stdout);
    assert!(least < 2 * GIB, "{least}");
    let within = stdout_of(&info(&folder, &["--memory-budget", &format!("{least}B")]));
    assert!(within.contains("within --memory-budget"), "{within}");
    assert!(within.contains("transformer streamed per block from host memory into 1 slot, by") && within.contains("keys and values in f16"), "{within}");
    let line = the_error_line(&info(&folder, &["--memory-budget", &format!("{}B", least - 1)]));
    assert!(line.contains("too small") && line.contains(&format!("({least} B)")), "{line}");
}

/// `lines` without the options whose keys and values are in f16.
fn without_f16(lines: Vec<&str>) -> Vec<&str> {
    lines.into_iter().filter(|l| !l.contains("keys and values in f16")).collect()
}

fn parse_gib(figure: &str) -> f64 {
    let (value, unit) = figure.split_once(' ').unwrap();
    let scale = match unit {
        "GiB" => 1.0,
        "MiB" => 1.0 / 1024.0,
        "KiB" => 1.0 / (1024.0 * 1024.0),
        other => panic!("unit {other}"),
    };
    value.parse::<f64>().unwrap() * scale
}

#[test]
fn the_published_9b_plans_from_its_config_files_alone() {
    let stdout = stdout_of(&info(&test_vectors().join("configs/klein-9b"), &["--width", "1024", "--height", "1024", "--limits", "4GiB/4GiB"]));
    assert!(stdout.contains("transformer: 8 double + 24 single blocks, 32 heads × 128, inner 4096, mlp 12288, joint 12288"), "{stdout}");
    assert!(stdout.contains("text encoder: Qwen3 36 layers, hidden 4096"), "{stdout}");
    let transformer = section(&stdout, "transformer (sizes estimated");
    let one_slot = transformer.iter().find(|l| l.starts_with("streamed per block from host memory into 1 slot")).unwrap();
    // The 9B's double block: D 4096, F 12288: 832 MiB of bf16 by hand, + 64 MiB of staging, + the 64 MiB DF11 area.
    let by_hand = one_slot_weights_mib(4096.0, 12288.0);
    assert_eq!(by_hand, 960.0);
    assert!((weights_mib(one_slot) - by_hand).abs() < 0.1, "{one_slot} vs {by_hand} MiB by hand");
}

#[test]
fn estimates_from_configs_equal_the_sizes_of_a_bf16_folder() {
    for name in ["tiny-a", "tiny-b"] {
        let size = ["--width", "64", "--height", "48"];
        let files = stdout_of(&info(&model_dir(name), &size));
        let configs = stdout_of(&info(&configs_only(name), &size));
        assert!(!files.contains("no weight files") && configs.matches("no weight files").count() == 3, "{configs}");
        // A bf16 folder offers resident bf16 and streaming; the estimate adds DF11 residency.
        for (with_files, estimated) in [("text encoder:", "text encoder (sizes"), ("transformer:", "transformer (sizes"), ("vae decoder:", "vae decoder (sizes")] {
            // Streamed, the estimate (sizes as DF11) also counts the area DF11
            // groups stream through, which a bf16 folder does not need.
            let from_files = section(&files, with_files);
            let from_configs: Vec<&str> = section(&configs, estimated).into_iter().filter(|l| !l.starts_with("weights resident compressed")).collect();
            assert_eq!(from_files.len(), from_configs.len(), "{name} {with_files}");
            for (f, c) in from_files.iter().zip(&from_configs) {
                if f.starts_with("streamed") {
                    assert!(weights_mib(c) > weights_mib(f) && f.split(':').next() == c.split(':').next(), "{name}: {f} vs {c}");
                } else {
                    assert_eq!(f, c, "{name} {with_files}");
                }
            }
        }
        assert!(minimum(&files) <= minimum(&configs), "{name}");
    }
}

#[test]
fn info_refuses_a_size_that_is_not_whole_latent_tokens() {
    let line = the_error_line(&info(&test_vectors().join("configs/klein-4b"), &["--width", "1000"]));
    assert!(line.contains("--width 1000"), "{line}");
}

#[test]
fn reference_images_add_the_encoder_to_the_plan() {
    let dir = test_vectors().join("goldens/tiny-a/reference-two");
    let (a, b) = (dir.join("ref0.png"), dir.join("ref1.png"));
    let images = ["--image", a.to_str().unwrap(), "--image", b.to_str().unwrap()];
    let stdout = stdout_of(&info(&model_dir("tiny-a"), &images));
    // The size is the first reference's, as gen takes it; each reference as prepared.
    assert!(stdout.contains("plan for 64×64 with 512 prompt tokens and reference images of 64×64, 80×68, under"), "{stdout}");
    let encoder = section(&stdout, "vae encoder");
    assert_eq!(encoder.len(), 2, "{stdout}");
    assert!(encoder[0].starts_with("untiled: ") && encoder[1].starts_with("by bands of "), "{stdout}");
    // Without references: no encoder phase, and 128 fewer tokens in every transformer pass.
    let plain = stdout_of(&info(&model_dir("tiny-a"), &["--width", "64", "--height", "64"]));
    assert!(!plain.contains("vae encoder") && !plain.contains("reference images"), "{plain}");
    assert!(minimum(&plain) < minimum(&stdout));
    // At the run's smallest budget the encoder may have to tile; the plan line names its layout.
    let budget = format!("{}B", minimum(&stdout));
    let within = stdout_of(&info(&model_dir("tiny-a"), &[&images[..], &["--memory-budget", &budget]].concat()));
    assert!(within.lines().any(|l| l.starts_with("within --memory-budget") && l.contains("; VAE encoder ")), "{within}");

    let missing = dir.join("missing.png");
    let line = the_error_line(&info(&model_dir("tiny-a"), &["--image", missing.to_str().unwrap()]));
    assert!(line.contains("missing.png"), "{line}");
}

/// The `activations X` figure of an option line, in GiB.
fn activations_gib(line: &str) -> f64 {
    let figure = line.split("activations ").nth(1).unwrap().split(',').next().unwrap();
    let (value, unit) = figure.split_once(' ').unwrap();
    value.parse::<f64>().unwrap() / if unit == "MiB" { 1024.0 } else { 1.0 }
}

#[test]
fn the_matrix_tier_plans_the_vae_decode_in_about_half_the_activations() {
    // The 4B's untiled 1024² decode: f16 activations channels-last, a scale every 32 channels.
    let folder = test_vectors().join("configs/klein-4b");
    let plan = |tier: &str| stdout_of(&info(&folder, &["--limits", "16GiB/4GiB", "--precision", tier]));
    let (f32, matrix) = (plan("f32"), plan("matrix"));
    let untiled = |s: &str| activations_gib(section(s, "vae decoder").into_iter().find(|l| l.starts_with("untiled: ")).unwrap_or_else(|| panic!("{s}")));
    let (a, b) = (untiled(&f32), untiled(&matrix));
    println!("untiled 1024² decode's activations: f32 {a:.2} GiB, matrix {b:.2} GiB");
    assert!(b <= 0.56 * a && b >= 0.5 * a, "{f32}{matrix}");
    // Asked for a tier that does not exist: one error line naming the flag.
    let out = info(&folder, &["--precision", "f8"]);
    assert!(!out.status.success());
    assert!(the_error_line(&out).contains("--precision"), "{}", String::from_utf8_lossy(&out.stderr));
}

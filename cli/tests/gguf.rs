//! Quantized weights in `gen`: GGUF transformers (tiny-q's, every quantized type in one file),
//! a GGUF text encoder and a scaled-FP8 single file,
//! against diffusers' PNG on gguf-py's expansion of the same file
//! (`test_vectors/generate_gguf_model.py`), and the errors of files that
//! lie or belong to another model.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{model_dir, read_png, scratch_dir, the_error_line, Goldens};
use std::path::Path;
use std::process::{Command, Output};

mod support;

fn case_args() -> Vec<String> {
    let path = Goldens::dir("tiny-q").join("case.json");
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut args: Vec<String> = ["--prompt", c["prompt"].as_str().unwrap()].map(String::from).to_vec();
    for key in ["seed", "steps", "width", "height"] {
        args.extend([format!("--{key}"), c[key].to_string()]);
    }
    args
}

/// `gen` on `model` with tiny-q's golden case (prompt, seed, steps, size) and `extra`.
fn gen_case(model: &str, extra: &[&str], out: &Path) -> Output {
    gen_case_on("f32", model, extra, out)
}

/// [`gen_case`] on precision tier `tier`.
fn gen_case_on(tier: &str, model: &str, extra: &[&str], out: &Path) -> Output {
    let case = case_args();
    let mut args: Vec<&str> = case.iter().map(String::as_str).collect();
    args.extend(extra);
    support::gen_on(tier, model, &args, out)
}

fn gguf_file() -> std::path::PathBuf {
    model_dir("tiny-q").join("transformer/tiny-q.gguf")
}

/// Given with `--transformer FILE.gguf`, kept in its blocks under a budget
/// that holds only that: the diffusers PNG.
#[test]
fn a_gguf_transformer_makes_the_diffusers_png() {
    let dir = scratch_dir("gguf-png");
    let out = dir.join("q.png");
    let file = gguf_file();
    let run = gen_case("tiny-q", &["--transformer", file.to_str().unwrap(), "--memory-budget", "36MiB", "--verbose"], &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let (got, want) = (read_png(&out), read_png(&Goldens::dir("tiny-q").join("gguf.png")));
    flux_lite_tests::tolerance::assert_png_close("tiny-q gguf", &got.rgb, &want.rgb);
    let plan = stderr.lines().find(|l| l.starts_with("plan: ") && l.contains("transformer")).unwrap_or_else(|| panic!("no plan line: {stderr}"));
    assert!(plan.contains("resident compressed"), "36 MiB keeps the blocks quantized: {plan}");
}

/// On the f16 and matrix tiers (CI runs them on Mesa 26's lavapipe), the
/// GGUF transformer kept in its blocks (its linears over the expanded rows
/// on the tier's tiles), and expanded whole at load (on the matrix tier its
/// heads of 64 take the half-precision path's every epilogue: queries,
/// keys and values, attention and SwiGLU written as f16 pieces), makes the
/// diffusers PNG within the image bar of tiers other than f32 (max 3
/// levels, mean 0.2). So does the text encoder from llama.cpp's GGUF,
/// expanded at load (on the matrix tier into f16 rows), against its own
/// diffusers PNG.
#[test]
fn the_gguf_png_on_the_half_tiers_within_the_tier_bar() {
    use flux_lite_tests::tolerance::{other_tiers, png_gap};
    let dir = scratch_dir("gguf-tiers");
    let text_encoder = Goldens::dir("tiny-q").join("text-encoder.gguf");
    let cases = [
        ("transformer in blocks", vec!["--memory-budget", "40MiB"], "gguf.png"),
        ("transformer expanded", vec![], "gguf.png"),
        ("text encoder expanded", vec!["--text-encoder", text_encoder.to_str().unwrap()], "gguf-text-encoder.png"),
    ];
    for tier in ["f16", "matrix"] {
        if !flux_lite_tests::tier_here(env!("CARGO_BIN_EXE_flux-lite"), tier) {
            continue;
        }
        for (i, (kept, args, golden)) in cases.iter().enumerate() {
            let want = read_png(&Goldens::dir("tiny-q").join(golden));
            let out = dir.join(format!("{tier}-{i}.png"));
            let run = gen_case_on(tier, "tiny-q", args, &out);
            assert!(run.status.success(), "{tier}: {}", String::from_utf8_lossy(&run.stderr));
            let (max, mean) = png_gap(&read_png(&out).rgb, &want.rgb);
            println!("tiny-q gguf {kept} on the {tier} tier: max |Δ| {max}, mean |Δ| {mean:.4}");
            assert!(max <= other_tiers::PNG_MAX_LEVELS && mean <= other_tiers::PNG_MEAN_LEVELS, "{tier}, {kept}: max |Δ| {max}, mean |Δ| {mean:.4}");
        }
    }
}

/// A truncated file, one whose tensor lies about its type, one of another
/// model, and one for another architecture's widths: one error line each,
/// naming the file or tensor, and no PNG.
#[test]
fn files_that_lie_or_belong_elsewhere_are_one_error_line() {
    let dir = scratch_dir("gguf-errors");
    let bytes = std::fs::read(gguf_file()).unwrap();
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).unwrap();
    let other = dir.join("other.gguf");
    let q8 = vec![0u8; 34];
    std::fs::write(&other, flux_lite_platform::model::gguf::write("llama", &[("blk.0.attn_q.weight", &[32, 1], flux_lite_core::ggml::GgmlType::Q8_0, &q8)])).unwrap();
    let cases = [
        ("tiny-q", &truncated, "runs past the end of the file"),
        ("tiny-q", &other, "none of its 1 tensors has a FLUX.2 transformer's name"),
        // tiny-a's transformer is 64 wide: the file's 256-wide tensors do not fit it.
        ("tiny-a", &gguf_file(), "`x_embedder.weight` should be a float tensor of shape [64, 16] but is F32 of shape [256, 16]"),
    ];
    for (model, file, says) in cases {
        let out = dir.join("never.png");
        let line = the_error_line(&gen_case(model, &["--transformer", file.to_str().unwrap()], &out));
        assert!(line.contains(says), "{}: {line}", file.display());
        assert!(!out.exists(), "{}: a PNG was written", file.display());
    }
}

/// With the text encoder from a GGUF file as llama.cpp writes Qwen3
/// (`--text-encoder`: Q8_0 embeddings and attention, Q4_1 and Q5_0 MLP, F32
/// norms), tiny-q makes diffusers' PNG with that text encoder's expanded
/// weights (which differs from the plain one's by up to 5 levels).
#[test]
fn a_gguf_text_encoder_makes_the_diffusers_png() {
    let dir = scratch_dir("gguf-text-encoder");
    let out = dir.join("te.png");
    let file = Goldens::dir("tiny-q").join("text-encoder.gguf");
    let run = gen_case("tiny-q", &["--text-encoder", file.to_str().unwrap()], &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (got, want) = (read_png(&out), read_png(&Goldens::dir("tiny-q").join("gguf-text-encoder.png")));
    flux_lite_tests::tolerance::assert_png_close("tiny-q gguf text encoder", &got.rgb, &want.rgb);
    // The transformer's GGUF given as a text encoder names what is wrong.
    let transformer = gguf_file();
    let line = the_error_line(&gen_case("tiny-q", &["--text-encoder", transformer.to_str().unwrap()], &dir.join("never.png")));
    assert!(line.contains("a Qwen3 text encoder's name as llama.cpp writes it"), "{line}");
}

/// BFL's scaled FP8 as one safetensors file (`--transformer FILE.safetensors`:
/// F8_E4M3 weights with `weight_scale` or `scale_weight`, one with none,
/// `input_scale` hints, the rest bf16), kept in its bytes under a budget:
/// diffusers' PNG on torch's expansion (`w.to(float32) * scale`). A scale
/// that is not one number is one error line.
#[test]
fn a_scaled_fp8_single_file_makes_the_diffusers_png() {
    let dir = scratch_dir("fp8");
    let out = dir.join("f8.png");
    let file = Goldens::dir("tiny-q").join("transformer-fp8.safetensors");
    let run = gen_case("tiny-q", &["--transformer", file.to_str().unwrap(), "--memory-budget", "40MiB", "--verbose"], &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("not read"), "the scales are part of the format, not unread tensors: {stderr}");
    let (got, want) = (read_png(&out), read_png(&Goldens::dir("tiny-q").join("fp8.png")));
    flux_lite_tests::tolerance::assert_png_close("tiny-q fp8", &got.rgb, &want.rgb);

    // One scale made a pair of numbers.
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    let (name, _) = tensors.iter().find(|(n, _)| n.ends_with(".weight_scale")).unwrap().clone();
    let pair = [0u8; 8];
    for (n, view) in tensors.iter_mut() {
        if *n == name {
            *view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &pair).unwrap();
        }
    }
    let broken = dir.join("broken-fp8.safetensors");
    safetensors::serialize_to_file(tensors, None, &broken).unwrap();
    let line = the_error_line(&gen_case("tiny-q", &["--transformer", broken.to_str().unwrap()], &dir.join("never.png")));
    assert!(line.contains(&name) && line.contains("should be one float"), "{line}");
}

/// A LoRA in BFL's layout on the GGUF transformer kept in its blocks: the
/// adapted linears include quantized ones (every block linear, a
/// modulation) and plain ones (`img_in`, `txt_in`): diffusers' PNG with the
/// same adapter on gguf-py's weights.
#[test]
fn a_lora_applies_on_top_of_gguf_weights() {
    let dir = scratch_dir("gguf-lora");
    let out = dir.join("lora.png");
    let lora = Goldens::dir("tiny-q").join("lora-bfl.safetensors");
    let run = gen_case("tiny-q", &["--lora", lora.to_str().unwrap(), "--memory-budget", "40MiB"], &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (got, want) = (read_png(&out), read_png(&Goldens::dir("tiny-q").join("gguf-lora.png")));
    flux_lite_tests::tolerance::assert_png_close("tiny-q gguf + lora", &got.rgb, &want.rgb);
    let plain = read_png(&Goldens::dir("tiny-q").join("gguf.png"));
    let moved = plain.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(moved > 10, "the adapter changes the image ({moved} levels at most)");
}

/// `flux-lite quantize` on tiny-a's transformer, every type it writes:
/// each tensor's name, type, shape and bytes as gguf-py's quantizers make
/// them under ComfyUI-GGUF's rule (`test_vectors/generate_quantize.py`'s
/// manifest: byte counts and CRC-32s); the file reads back and runs. tiny-a's
/// rows are not whole K-quant blocks (256), so its K-quant files keep every
/// matrix in BF16 (the K-quant blocks themselves are checked against
/// llama.cpp's in tests/tests/gguf.rs). A type it does not write is one
/// error line naming those it does.
#[test]
fn quantize_writes_what_gguf_py_writes() {
    let dir = scratch_dir("quantize");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(flux_lite_tests::test_vectors().join("goldens/quantize/manifest.json")).unwrap()).unwrap();
    let quantize = |ty: &str, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_flux-lite"))
            .args(["quantize", "--model"])
            .arg(model_dir("tiny-a"))
            .args(["--type", ty, "--output"])
            .arg(out)
            .output()
            .unwrap()
    };
    for (ty, want) in manifest.as_object().unwrap() {
        let out = dir.join(format!("{ty}.gguf"));
        let run = quantize(&ty.to_ascii_lowercase(), &out);
        assert!(run.status.success(), "{ty}: {}", String::from_utf8_lossy(&run.stderr));
        let bytes = std::fs::read(&out).unwrap();
        let header = flux_lite_platform::model::gguf::parse(&bytes).unwrap();
        let want = want.as_object().unwrap();
        assert_eq!(header.tensors.len(), want.len(), "{ty}");
        for t in &header.tensors {
            let w = &want[&t.name];
            let ne: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
            let data = &bytes[t.range.clone()];
            assert_eq!(t.ggml.name(), w["type"].as_str().unwrap(), "{ty} {}", t.name);
            assert_eq!(serde_json::json!(ne), w["ne"], "{ty} {}", t.name);
            assert_eq!(data.len() as u64, w["bytes"].as_u64().unwrap(), "{ty} {}", t.name);
            assert_eq!(crc32(data) as u64, w["crc32"].as_u64().unwrap(), "{ty} {}: bytes differ from gguf-py's", t.name);
        }
    }
    // The Q8_0 file runs: tiny-a's folder with it as the transformer.
    let png = dir.join("q8.png");
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model"])
        .arg(model_dir("tiny-a"))
        .args(["--transformer", dir.join("Q8_0.gguf").to_str().unwrap(), "--prompt", "a red fox", "--steps", "1", "--width", "32", "--height", "32", "--quiet", "--output"])
        .arg(&png)
        .output()
        .unwrap();
    assert!(run.status.success() && png.exists(), "{}", String::from_utf8_lossy(&run.stderr));
    let line = the_error_line(&quantize("f32", &dir.join("never.gguf")));
    assert!(line.contains("F32 is not a type quantize writes") && line.contains("q4_k"), "{line}");
    assert!(!dir.join("never.gguf").exists());
}

/// CRC-32 (IEEE, reflected: zlib's `crc32`), for comparing bytes with the manifest.
fn crc32(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |crc, &b| (0..8).fold(crc ^ b as u32, |c, _| if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 }))
}

//! The error catalogue as a user meets it: each broken model folder, bad
//! flag or unusable environment gives one `error:` line naming the culprit,
//! a non-zero exit, and no output file.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{copy_tree, model_dir, read_stderr_until, scratch_dir, test_vectors, the_error_line};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A writable copy of tiny-a for one case.
fn broken_copy(case: &str) -> PathBuf {
    let dir = scratch_dir(&format!("catalogue-{case}")).join("model");
    copy_tree(&model_dir("tiny-a"), &dir);
    dir
}

fn gen(model: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flux-lite"));
    cmd.arg("gen").args(["--model", model.to_str().unwrap(), "--prompt", "a red fox", "--seed", "1", "--quiet", "--output", out.to_str().unwrap()]);
    // Defaults for what `extra` does not set.
    for (flag, value) in [("--steps", "1"), ("--width", "32"), ("--height", "32")] {
        if !extra.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    cmd.args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Runs `gen` on `model` and checks: failure, one error line containing every needle, no output file.
fn expect_one_error(model: &Path, extra: &[&str], env: &[(&str, &str)], needles: &[&str]) -> String {
    let out = model.parent().unwrap().join("out.png");
    let line = the_error_line(&gen(model, &out, extra, env));
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
    }
    assert!(!out.exists(), "a failed run left {}", out.display());
    line
}

fn transformer_file(model: &Path) -> PathBuf {
    model.join("transformer/diffusion_pytorch_model.safetensors")
}

/// Rewrites a safetensors file's JSON header with `edit`; the data stays as it was, `extra` bytes appended.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>), extra: &[u8]) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    out.extend_from_slice(extra);
    std::fs::write(path, out).unwrap();
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn missing_folder_or_component() {
    let model = broken_copy("missing-component");
    std::fs::remove_dir_all(model.join("vae")).unwrap();
    expect_one_error(&model, &[], &[], &["vae/config.json"]);
    let gone = model.parent().unwrap().join("no-such-model");
    let out = model.parent().unwrap().join("out.png");
    let run = gen(&gone, &out, &[], &[]);
    assert!(!run.status.success() && String::from_utf8_lossy(&run.stderr).contains("no-such-model"));
    assert!(!out.exists());
}

#[test]
fn invalid_json_and_unknown_architecture_values() {
    let model = broken_copy("json");
    std::fs::write(model.join("transformer/config.json"), "{ \"num_layers\": 2,").unwrap();
    expect_one_error(&model, &[], &[], &["transformer/config.json", "invalid JSON"]);

    let model = broken_copy("rope-axes");
    edit_json(&model.join("transformer/config.json"), |v| v["axes_dims_rope"] = serde_json::json!([4, 4, 4]));
    expect_one_error(&model, &[], &[], &["transformer/config.json", "axes_dims_rope"]);

    let model = broken_copy("rope-type");
    edit_json(&model.join("text_encoder/config.json"), |v| v["rope_parameters"]["rope_type"] = "yarn".into());
    expect_one_error(&model, &[], &[], &["text_encoder/config.json", "rope_type"]);

    let model = broken_copy("heads");
    edit_json(&model.join("transformer/config.json"), |v| v["num_attention_heads"] = "four".into());
    expect_one_error(&model, &[], &[], &["transformer/config.json", "num_attention_heads"]);

    // Values the engine cannot run are the config's fault, named by file and field (they were
    // internal errors from deep in the components before).
    let model = broken_copy("vae-out");
    edit_json(&model.join("vae/config.json"), |v| v["out_channels"] = 4.into());
    expect_one_error(&model, &[], &[], &["vae/config.json", "`out_channels`", "RGB"]);
    let model = broken_copy("sinusoid");
    edit_json(&model.join("transformer/config.json"), |v| v["timestep_guidance_channels"] = 2048.into());
    expect_one_error(&model, &[], &[], &["transformer/config.json", "`timestep_guidance_channels`", "1024"]);
}

/// Sizes no model has, which the planner would otherwise loop over or multiply past 64 bits.
#[test]
fn absurd_architecture_sizes() {
    for (file, field, value) in [
        ("transformer/config.json", "num_layers", serde_json::json!(1_000_000_000_000u64)),
        ("transformer/config.json", "num_attention_heads", serde_json::json!(u64::MAX)),
        ("transformer/config.json", "mlp_ratio", serde_json::json!(1e300)),
        ("text_encoder/config.json", "intermediate_size", serde_json::json!(1u64 << 62)),
        ("text_encoder/config.json", "vocab_size", serde_json::json!(1u64 << 40)),
        ("vae/config.json", "layers_per_block", serde_json::json!(1u64 << 40)),
    ] {
        let model = broken_copy(&format!("absurd-{field}"));
        edit_json(&model.join(file), |v| v[field] = value);
        expect_one_error(&model, &[], &[], &[file, field]);
    }
}

#[test]
fn bad_safetensors_headers_and_data() {
    let model = broken_copy("header-size");
    let path = transformer_file(&model);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    expect_one_error(&model, &[], &[], &["diffusion_pytorch_model.safetensors"]);

    let model = broken_copy("truncated");
    let path = transformer_file(&model);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    expect_one_error(&model, &[], &[], &["diffusion_pytorch_model.safetensors"]);

    let model = broken_copy("overlap");
    edit_header(&transformer_file(&model), |h| {
        let other = h["proj_out.weight"]["data_offsets"].clone();
        h.get_mut("x_embedder.weight").unwrap()["data_offsets"] = other;
    }, &[]);
    expect_one_error(&model, &[], &[], &["diffusion_pytorch_model.safetensors"]);

    let model = broken_copy("out-of-range");
    edit_header(&transformer_file(&model), |h| {
        h.get_mut("x_embedder.weight").unwrap()["data_offsets"] = serde_json::json!([0, 1u64 << 40]);
    }, &[]);
    expect_one_error(&model, &[], &[], &["diffusion_pytorch_model.safetensors"]);
}

#[test]
fn wrong_or_missing_tensors_and_an_unread_one() {
    let model = broken_copy("shape");
    edit_header(&transformer_file(&model), |h| {
        let t = h.get_mut("x_embedder.weight").unwrap();
        let shape = t["shape"].as_array().unwrap().clone();
        t["shape"] = serde_json::json!([shape[1], shape[0]]);
    }, &[]);
    expect_one_error(&model, &[], &[], &["x_embedder.weight"]);

    let model = broken_copy("dtype");
    edit_header(&transformer_file(&model), |h| {
        let t = h.get_mut("x_embedder.weight").unwrap();
        let shape = t["shape"].as_array().unwrap().clone();
        t["dtype"] = "U8".into();
        t["shape"] = serde_json::json!([shape[0], 2 * shape[1].as_u64().unwrap()]);
    }, &[]);
    expect_one_error(&model, &[], &[], &["x_embedder.weight"]);

    let model = broken_copy("missing-tensor");
    edit_header(&transformer_file(&model), |h| {
        let t = h.remove("x_embedder.weight").unwrap();
        h.insert("x_embedder.weights".into(), t);
    }, &[]);
    expect_one_error(&model, &[], &[], &["x_embedder.weight"]);

    let model = broken_copy("unexpected-tensor");
    let data_len = {
        let bytes = std::fs::read(transformer_file(&model)).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (bytes.len() - 8 - n) as u64
    };
    edit_header(&transformer_file(&model), |h| {
        h.insert("extra.weight".into(), serde_json::json!({"dtype": "BF16", "shape": [2], "data_offsets": [data_len, data_len + 4]}));
    }, &[0; 4]);
    // A tensor the architecture does not read loads, as diffusers loads it, with a warning naming it.
    let out = model.parent().unwrap().join("out.png");
    let run = gen(&model, &out, &[], &[]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success() && out.exists(), "{stderr}");
    let warning = stderr.lines().find(|l| l.contains("extra.weight")).unwrap_or_else(|| panic!("no warning names extra.weight: {stderr}"));
    assert!(warning.starts_with("warning: transformer: 1 tensors in the files are not part of this architecture"), "{warning}");
}

#[test]
fn missing_or_invalid_tokenizer() {
    let model = broken_copy("no-tokenizer");
    std::fs::remove_file(model.join("tokenizer/tokenizer.json")).unwrap();
    expect_one_error(&model, &[], &[], &["tokenizer.json"]);

    let model = broken_copy("bad-tokenizer");
    std::fs::write(model.join("tokenizer/tokenizer.json"), "{}").unwrap();
    expect_one_error(&model, &[], &[], &["tokenizer.json"]);
}

#[test]
fn bad_flags() {
    let model = broken_copy("flags");
    expect_one_error(&model, &["--width", "30"], &[], &["--width 30"]);
    expect_one_error(&model, &["--steps", "0"], &[], &["--steps 0"]);
    for (extra, needles) in [
        (&["--output-name", "x.gif"][..], &["--output", "x.gif", ".gif is not written"][..]),
        (&["--output-name", "x.png", "--quality", "80"][..], &["--output", "only JPEG has a quality"][..]),
        (&["--output-name", "x.jpg", "--quality", "101"][..], &["--output", "quality 101", "1 to 100"][..]),
    ] {
        let out = model.parent().unwrap().join(extra[1]);
        let line = the_error_line(&gen(&model, &out, &extra[2..], &[]));
        assert!(needles.iter().all(|n| line.contains(n)), "{line}");
        assert!(!out.exists());
    }
    expect_one_error(&model, &["--negative-prompt", "blur", "--embeddings", "e.safetensors"], &[], &["--negative-prompt", "--embeddings", "holds the negative"]);
    expect_one_error(&model, &["--mask-marks", "grey"], &[], &["--mask-marks grey", "white, black or transparent"]);
    expect_one_error(&model, &["--steps", "1000000"], &[], &["--steps 1000000"]);
    expect_one_error(&model, &["--memory-budget", "3GB"], &[], &["--memory-budget"]);
    expect_one_error(&model, &["--memory-budget", "1KiB"], &[], &["--memory-budget", "smallest budget"]);
    // 2^28 latent tokens: no budget helps, the attention keys alone exceed any binding; said before any work.
    expect_one_error(&model, &["--width", "65536", "--height", "65536", "--memory-budget", "1GiB"], &[], &["268435968 tokens", "adapter's limit"]);
}

#[test]
fn no_adapter_and_unwritable_output() {
    let model = broken_copy("environment");
    // No DX12 adapter exists on Linux or macOS.
    if cfg!(not(windows)) {
        expect_one_error(&model, &[], &[("FLUX_LITE_BACKEND", "dx12")], &["adapter"]);
    }
    let out = model.parent().unwrap().join("no-such-dir/out.png");
    let line = the_error_line(&gen(&model, &out, &[], &[]));
    assert!(line.contains("no-such-dir"), "{line}");
    assert!(!out.exists());
}

#[test]
fn df11_invariants_violated() {
    let dir = scratch_dir("catalogue-df11");
    let model = dir.join("model");
    copy_tree(&model_dir("tiny-b"), &model);
    let df11 = dir.join("df11");
    copy_tree(&test_vectors().join("goldens/df11/tiny-b-transformer"), &df11);
    // The first group's last output position pointed far past its elements.
    let file = df11.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut positions: Vec<&String> = header.keys().filter(|k| k.ends_with(".output_positions")).collect();
    positions.sort();
    let module = positions[0].strip_suffix(".output_positions").unwrap().to_string();
    let end = header[positions[0]]["data_offsets"][1].as_u64().unwrap() as usize;
    bytes[8 + n + end - 4..8 + n + end].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    expect_one_error(&model, &["--transformer", df11.to_str().unwrap()], &[], &["DF11 group", &module]);
}

#[test]
fn device_lost_mid_run() {
    let model = broken_copy("device-lost");
    // Lost after the text encoder's first submissions: in the middle of its blocks.
    let line = expect_one_error(&model, &[], &[("FLUX_LITE_LOSE_DEVICE_AFTER", "3")], &["GPU device was lost"]);
    assert!(!line.contains('\n'));
    let files: Vec<_> = std::fs::read_dir(model.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["model"], "only the model folder is left");
}

#[test]
fn interrupted_run_stops_at_a_block_and_writes_nothing() {
    let dir = scratch_dir("catalogue-interrupt");
    let out = dir.join("out.png");
    let latents = dir.join("latents.safetensors");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model_dir("tiny-a").to_str().unwrap(), "--prompt", "a red fox", "--seed", "1"])
        .args(["--steps", "1000", "--width", "32", "--height", "32", "--output", out.to_str().unwrap()])
        .args(["--output-latents", latents.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Interrupt once the progress bar shows the denoising loop under way.
    let mut seen = read_stderr_until(&mut stderr, "denoise");
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    std::io::Read::read_to_end(&mut stderr, &mut seen).unwrap();
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    let errors: Vec<&str> = text.split(['\r', '\n']).filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors, ["error: interrupted; stopped at the end of a block, nothing was written"]);
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "an interrupted run left {left:?}");
}

/// `flux-lite encode` on tiny-a with `args`, writing `out`.
fn encode(out: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["encode", "--quiet", "--model", model_dir("tiny-a").to_str().unwrap(), "--output", out.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn prompts_from_files_empty_long_and_huge() {
    let dir = scratch_dir("catalogue-prompts");
    let (from_flag, from_file) = (dir.join("flag.safetensors"), dir.join("file.safetensors"));
    let text = dir.join("prompt.txt");
    std::fs::write(&text, "a red fox in the snow\n").unwrap();
    assert!(encode(&from_flag, &["--prompt", "a red fox in the snow"]).status.success());
    assert!(encode(&from_file, &["--prompt-file", text.to_str().unwrap()]).status.success());
    assert_eq!(std::fs::read(&from_flag).unwrap(), std::fs::read(&from_file).unwrap(), "the file's final line break is dropped");

    // Empty: accepted, as diffusers accepts it (its negative prompt is "").
    let empty = dir.join("empty.safetensors");
    assert!(encode(&empty, &["--prompt", ""]).status.success());

    // Long (300 KB): encoded, cut to 512 tokens with a warning.
    let long = dir.join("long.txt");
    std::fs::write(&long, "a red fox in the snow, ".repeat(13_000)).unwrap();
    let long_out = dir.join("long.safetensors");
    let run = encode(&long_out, &["--prompt-file", long.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stderr).contains("were dropped"));

    // Huge (2 MiB), not UTF-8, missing, or given twice: one error line naming the culprit, nothing written.
    let huge = dir.join("huge.txt");
    std::fs::write(&huge, "a".repeat(2 << 20)).unwrap();
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").unwrap();
    let out = dir.join("out.safetensors");
    for (args, needle) in [
        (vec!["--prompt-file", huge.to_str().unwrap()], "over 1024 KiB"),
        (vec!["--prompt-file", latin1.to_str().unwrap()], "not UTF-8"),
        (vec!["--prompt-file", dir.join("none.txt").to_str().unwrap()], "none.txt"),
        (vec!["--prompt", "x", "--prompt-file", text.to_str().unwrap()], "not both"),
        (vec![], "--prompt"),
    ] {
        let line = the_error_line(&encode(&out, &args));
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
        assert!(!out.exists());
    }
    let huge_png = dir.join("huge.png");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model_dir("tiny-a").to_str().unwrap(), "--prompt-file", huge.to_str().unwrap()])
        .args(["--output", huge_png.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(the_error_line(&run).contains("--prompt-file"));
    assert!(!huge_png.exists());
}

/// CRC-32 (IEEE, reflected) of PNG chunks, bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A 16-bit greyscale PNG of `w × h`.
fn gray16_png(path: &Path, w: u32, h: u32) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Sixteen);
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(&vec![0x80; (w * h * 2) as usize]).unwrap();
}

#[test]
fn bad_reference_images() {
    let model = broken_copy("references");
    let dir = model.parent().unwrap().to_path_buf();
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let rgb = |name: &str, w: u32, h: u32| {
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7])).save(dir.join(name)).unwrap();
        path(name)
    };
    let good = rgb("good.png", 64, 64);
    // Missing, a directory, not an image, cut short.
    expect_one_error(&model, &["--image", &path("missing.png")], &[], &["--image", "missing.png", "cannot read"]);
    expect_one_error(&model, &["--image", dir.to_str().unwrap()], &[], &["--image", "not a file"]);
    std::fs::write(dir.join("notes.png"), "this is text, not pixels").unwrap();
    expect_one_error(&model, &["--image", &path("notes.png")], &[], &["notes.png", "not a PNG or JPEG"]);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(dir.join("cut.png"), &bytes[..bytes.len() / 2]).unwrap();
    expect_one_error(&model, &["--image", &path("cut.png")], &[], &["cut.png", "cannot decode"]);
    // Zero width in the header (with a valid checksum).
    let mut zero = bytes.clone();
    zero[16..20].copy_from_slice(&0u32.to_be_bytes());
    let crc = crc32(&zero[12..29]);
    zero[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(dir.join("zero.png"), &zero).unwrap();
    expect_one_error(&model, &["--image", &path("zero.png")], &[], &["zero.png"]);
    // Too small, too narrow: diffusers' check_image_input.
    expect_one_error(&model, &["--image", &rgb("small.png", 63, 200)], &[], &["small.png", "63×200", "at least 64"]);
    expect_one_error(&model, &["--image", &rgb("strip.png", 580, 64)], &[], &["strip.png", "8:1"]);
    // 16-bit grey: PIL would clip it to white; refused instead.
    gray16_png(&dir.join("gray16.png"), 64, 64);
    expect_one_error(&model, &["--image", &path("gray16.png")], &[], &["gray16.png", "16-bit greyscale"]);
    // Another format, known by its magic bytes.
    std::fs::write(dir.join("image.bmp"), [b"BM".as_slice(), &[0u8; 60]].concat()).unwrap();
    expect_one_error(&model, &["--image", &path("image.bmp")], &[], &["image.bmp", "give a PNG or JPEG"]);
    // More than 16.
    let many: Vec<&str> = (0..17).flat_map(|_| ["--image", good.as_str()]).collect();
    expect_one_error(&model, &many, &[], &["17 reference images", "at most 16"]);
}

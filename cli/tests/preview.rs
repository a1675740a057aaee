//! `gen --preview`: the latents drawn after each step into a PNG that is
//! rewritten atomically, and the final image unchanged by it.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::model_dir;
use std::path::Path;
use std::process::{Command, Output};

fn gen(out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .arg("gen")
        .args(["--model", model_dir("tiny-a").to_str().unwrap(), "--prompt", "a red fox", "--seed", "3", "--steps", "2"])
        .args(["--width", "32", "--height", "48", "--quiet", "--output", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn the_preview_is_a_png_of_the_image_size_and_the_image_is_unchanged() {
    let dir = std::env::temp_dir().join(format!("flux-lite-preview-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (plain, with, preview) = (dir.join("plain.png"), dir.join("with.png"), dir.join("preview.png"));
    let run = gen(&plain, &[]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run = gen(&with, &["--preview", preview.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(std::fs::read(&plain).unwrap(), std::fs::read(&with).unwrap(), "--preview changed the final image");
    // The last rewrite: the image's size, and the step it shows.
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&preview).unwrap()));
    let reader = decoder.read_info().unwrap();
    let info = reader.info();
    assert_eq!((info.width, info.height, info.color_type), (32, 48, png::ColorType::Rgb));
    let text: Vec<String> = info.uncompressed_latin1_text.iter().map(|t| format!("{}={}", t.keyword, t.text)).chain(info.utf8_text.iter().map(|t| format!("{}={}", t.keyword, t.get_text().unwrap()))).collect();
    assert!(text.iter().any(|t| t == "Preview=step 2 of 2"), "{text:?}");
    // No temporary file left beside it.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left.len(), 3, "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_preview_every_zero_steps_is_one_error_line() {
    let dir = std::env::temp_dir().join(format!("flux-lite-preview-zero-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = gen(&dir.join("a.png"), &["--preview", dir.join("p.png").to_str().unwrap(), "--preview-every", "0"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.trim() == "error: --preview-every 0: give a number of steps, 1 or more", "{stderr}");
    let run = gen(&dir.join("a.png"), &["--preview", "-"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.trim().starts_with("error: --preview -: ") && stderr.trim().lines().count() == 1, "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The preview can be read while the run goes on: it appears after the
/// first step, and every read of it is a whole PNG (the rewrites are atomic).
#[test]
fn the_preview_is_readable_while_the_run_goes_on() {
    let dir = std::env::temp_dir().join(format!("flux-lite-preview-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, preview) = (dir.join("out.png"), dir.join("preview.png"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .arg("gen")
        .args(["--model", model_dir("tiny-a").to_str().unwrap(), "--prompt", "a red fox", "--seed", "3", "--steps", "6"])
        .args(["--width", "32", "--height", "48", "--quiet", "--output", out.to_str().unwrap(), "--preview", preview.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut steps_seen_running = Vec::new();
    while child.try_wait().unwrap().is_none() {
        if let Ok(bytes) = std::fs::read(&preview) {
            let reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().expect("a whole PNG at every read");
            let info = reader.info();
            let latin1 = info.uncompressed_latin1_text.iter().find(|t| t.keyword == "Preview").map(|t| t.text.clone());
            let step = latin1.or_else(|| info.utf8_text.iter().find(|t| t.keyword == "Preview").map(|t| t.get_text().unwrap()));
            if let Some(step) = step.filter(|s| !steps_seen_running.contains(s)) {
                steps_seen_running.push(step);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(child.wait().unwrap().success());
    assert!(steps_seen_running.iter().any(|s| s != "step 6 of 6"), "no preview was seen before the last step: {steps_seen_running:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--preview-decoder`: the previews come from the tiny decoder (the last
/// one is the decoder's image of the final latents, byte for byte), and the
/// final image is the one a run without previews makes.
#[test]
fn a_tiny_decoder_draws_the_previews_and_leaves_the_image_alone() {
    use flux_lite_platform::components::tiny_decoder::{TinyDecoder, TinyDecoderFile};
    use flux_lite_platform::model::{Component, ModelFolder};
    let dir = std::env::temp_dir().join(format!("flux-lite-preview-decoder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let decoder = flux_lite_tests::test_vectors().join("goldens/tiny_decoder/taesd.safetensors");
    let (plain, with, preview, latents) = (dir.join("plain.png"), dir.join("with.png"), dir.join("preview.png"), dir.join("latents.safetensors"));
    let run = gen(&plain, &[]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run = gen(&with, &["--preview", preview.to_str().unwrap(), "--preview-decoder", decoder.to_str().unwrap(), "--output-latents", latents.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(std::fs::read(&plain).unwrap(), std::fs::read(&with).unwrap(), "--preview-decoder changed the final image");
    let shown = flux_lite_tests::read_png(&preview);
    assert_eq!((shown.width, shown.height), (32, 48));
    // The decoder's own image of the final latents.
    let bytes = std::fs::read(&latents).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let packed: Vec<f32> = file.tensor("latents").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let tiny = TinyDecoder::new(flux_lite_tests::gpu(), &TinyDecoderFile::open(&decoder).unwrap(), &model.vae, &model.weights(Component::Vae).unwrap(), 32, 48, flux_lite_platform::exec::activations::Bands::Whole).unwrap();
    let (_, rgb) = tiny.decode(flux_lite_tests::gpu(), &packed, false).unwrap();
    assert_eq!(shown.rgb, rgb, "the last preview is not the tiny decoder's image of the final latents");
    // And not the latent-to-RGB map's.
    let run = gen(&dir.join("map.png"), &["--preview", dir.join("map-preview.png").to_str().unwrap()]);
    assert!(run.status.success());
    assert_ne!(flux_lite_tests::read_png(&dir.join("map-preview.png")).rgb, rgb);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_preview_decoder_that_cannot_serve_is_one_error_line() {
    let dir = std::env::temp_dir().join(format!("flux-lite-preview-decoder-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let decoder = flux_lite_tests::test_vectors().join("goldens/tiny_decoder/diffusers.safetensors");
    let run = gen(&dir.join("a.png"), &["--preview-decoder", decoder.to_str().unwrap()]);
    assert_eq!(flux_lite_tests::only_an_error_line(&run), "error: --preview-decoder draws the previews of --preview: give --preview FILE.png too");
    // tiny-a's own VAE weights are not a tiny decoder.
    let vae = model_dir("tiny-a").join("vae/diffusion_pytorch_model.safetensors");
    let run = gen(&dir.join("a.png"), &["--preview", dir.join("p.png").to_str().unwrap(), "--preview-decoder", vae.to_str().unwrap()]);
    let line = flux_lite_tests::only_an_error_line(&run);
    assert!(line.starts_with("error: --preview-decoder: ") && line.contains("not a tiny decoder: no decoder tensors"), "{line}");
    // A decoder for tiny-a's VAE does not fit tiny-b's (scale 4).
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .arg("gen")
        .args(["--model", model_dir("tiny-b").to_str().unwrap(), "--prompt", "a red fox", "--steps", "1", "--quiet"])
        .args(["--output", dir.join("b.png").to_str().unwrap(), "--preview", dir.join("p.png").to_str().unwrap(), "--preview-decoder", decoder.to_str().unwrap()])
        .output()
        .unwrap();
    let line = flux_lite_tests::only_an_error_line(&run);
    assert!(line.contains("diffusers.safetensors: a decoder of 4 latent channels at 2× cannot preview this model's VAE"), "{line}");
    assert!(!dir.join("a.png").exists() && !dir.join("b.png").exists() && !dir.join("p.png").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

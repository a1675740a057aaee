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

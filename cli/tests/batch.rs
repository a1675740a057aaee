//! `gen --count` and `gen --batch-file`: each image of a batch is the image a
//! single run with its seed makes (the first against the diffusers golden),
//! each distinct prompt is encoded once, and a batch never overwrites a file.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{model_dir, read_png, scratch_dir, the_error_line, Goldens};
use std::collections::HashMap;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};

const FOX: &str = "a red fox in the snow";

/// `gen` of tiny-a at the one-step golden's settings with `extra` flags.
fn gen(extra: &[&str]) -> Output {
    let model = model_dir("tiny-a");
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model.to_str().unwrap(), "--steps", "1", "--width", "32", "--height", "32", "--precision", "f32"])
        .args(extra)
        .output()
        .unwrap()
}

fn succeeded(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The RGB of a single run of `prompt` with `seed`, made once for the whole
/// binary: the tests compare their batches with the same singles (the fox
/// with seeds 42 and 44 in three and two of them), each its own `gen` process.
fn single(prompt: &str, seed: u64) -> Vec<u8> {
    type Singles = Mutex<HashMap<(String, u64), Arc<OnceLock<Vec<u8>>>>>;
    static SINGLES: OnceLock<Singles> = OnceLock::new();
    let slot = SINGLES.get_or_init(Default::default).lock().unwrap().entry((prompt.to_string(), seed)).or_default().clone();
    // Tests running side by side wait for the one making it, not for each other's.
    slot.get_or_init(|| {
        let dir = scratch_dir(&format!("batch-single-{seed}-{}", prompt.replace(' ', "-")));
        let out = dir.join("single.png");
        succeeded(&gen(&["--prompt", prompt, "--seed", &seed.to_string(), "--output", out.to_str().unwrap(), "--quiet"]));
        read_png(&out).rgb
    })
    .clone()
}

fn text(png: &flux_lite_tests::Png, key: &str) -> Option<String> {
    png.text.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

#[test]
fn count_makes_each_seed_the_image_of_a_single_run() {
    let dir = scratch_dir("batch-count");
    let out = dir.join("fox.png");
    succeeded(&gen(&["--prompt", FOX, "--seed", "42", "--count", "3", "--output", out.to_str().unwrap(), "--quiet"]));
    let names: Vec<String> = {
        let mut n: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    };
    assert_eq!(names, ["fox-0001.png", "fox-0002.png", "fox-0003.png"]);
    let first = read_png(&dir.join("fox-0001.png"));
    let golden = read_png(&Goldens::dir("tiny-a/one-step").join("image.png"));
    flux_lite_tests::tolerance::assert_png_close("image 1 (seed 42) against diffusers", &first.rgb, &golden.rgb);
    for (i, seed) in [(2, 43), (3, 44)] {
        let png = read_png(&dir.join(format!("fox-{i:04}.png")));
        assert_eq!(text(&png, "seed"), Some(seed.to_string()));
        assert!(png.rgb == single(FOX, seed), "image {i} differs from a single run with seed {seed}");
    }
    assert!(first.rgb == single(FOX, 42), "image 1 differs from a single run with seed 42");
}

#[test]
fn a_batch_file_makes_one_image_per_line_and_encodes_each_prompt_once() {
    let dir = scratch_dir("batch-file");
    let list = dir.join("prompts.txt");
    std::fs::write(&list, format!("{FOX}\n\na lighthouse at dusk\r\n{FOX}\n")).unwrap();
    let out = dir.join("out.png");
    let stderr = succeeded(&gen(&["--batch-file", list.to_str().unwrap(), "--seed", "42", "--output", out.to_str().unwrap(), "--verbose"]));
    assert!(stderr.contains("batch: 3 images from 2 distinct prompts"), "{stderr}");
    // Progress off a terminal: one line as each prompt's encoding starts.
    assert!(stderr.contains("encode 1/2 …") && stderr.contains("encode 2/2 …") && !stderr.contains("encode 3/"), "{stderr}");
    let pngs: Vec<_> = (1..=3).map(|i| read_png(&dir.join(format!("out-{i:04}.png")))).collect();
    let golden = read_png(&Goldens::dir("tiny-a/one-step").join("image.png"));
    flux_lite_tests::tolerance::assert_png_close("line 1 (seed 42) against diffusers", &pngs[0].rgb, &golden.rgb);
    for (png, (prompt, seed)) in pngs.iter().zip([(FOX, 42), ("a lighthouse at dusk", 43), (FOX, 44)]) {
        assert_eq!(text(png, "prompt").as_deref(), Some(prompt));
        assert_eq!(text(png, "seed"), Some(seed.to_string()));
        assert!(png.rgb == single(prompt, seed), "{prompt:?} with seed {seed} differs from its single run");
    }
}

#[test]
fn a_batch_never_overwrites_a_file_and_writes_nothing_when_one_is_in_the_way() {
    let dir = scratch_dir("batch-no-overwrite");
    std::fs::write(dir.join("out-0002.png"), b"keep me").unwrap();
    let out = dir.join("out.png");
    let run = gen(&["--prompt", FOX, "--seed", "1", "--count", "2", "--output", out.to_str().unwrap(), "--quiet"]);
    let line = the_error_line(&run);
    assert!(line.contains("out-0002.png exists") && line.contains("never overwrites"), "{line}");
    assert_eq!(std::fs::read(dir.join("out-0002.png")).unwrap(), b"keep me");
    assert!(!dir.join("out-0001.png").exists(), "nothing is written when a name is taken");
}

#[test]
fn bad_batch_flags_are_one_error_line_each() {
    let dir = scratch_dir("batch-bad-flags");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    let out = dir.join("out.png");
    let out = out.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["--prompt", FOX, "--count", "0", "--output", out], "--count 0"),
        (vec!["--prompt", FOX, "--count", "2", "--output", "-"], "cannot all go to standard output"),
        (vec!["--batch-file", empty.to_str().unwrap(), "--output", out], "no prompts"),
        (vec!["--batch-file", empty.to_str().unwrap(), "--prompt", FOX, "--output", out], "leave out --prompt"),
    ];
    for (args, want) in cases {
        let line = the_error_line(&gen(&args));
        assert!(line.contains(want), "{args:?}: {line}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the prompt file is there");
}

/// The library door: a pipeline opened with `keep_loaded` makes the same
/// pixels as `gen` twice, the second time with every component reused; under
/// a budget with no room beside the plan, it keeps nothing.
#[test]
fn the_library_reuses_what_it_keeps_and_makes_the_pixels_gen_makes() {
    use flux_lite_platform::{Job, Limits, Options, Pipeline, Prompt, Silent};
    let want = single(FOX, 42);
    let gpu = flux_lite_platform::GpuOptions { precision: flux_lite_platform::Precision::F32, ..Default::default() };
    let pipeline = Pipeline::open(&model_dir("tiny-a"), Options { gpu, transformer: None, text_encoder: None, keep_loaded: true, preview_decoder: None, scratch_dir: None }).unwrap();
    let job = Job { width: Some(32), height: Some(32), steps: Some(1), seed: Some(42), ..Job::new(Prompt::text(FOX)) };
    let resolve = |job: &Job| job.clone().resolve(pipeline.model(), &Limits::default()).unwrap();
    let run = |job: &Job| {
        let mut images = Vec::new();
        let finished = pipeline
            .run(&resolve(job), &mut Silent, &mut |made| {
                images.push(made.image.unwrap().rgb);
                Ok(())
            })
            .unwrap();
        (finished.reused, images)
    };
    let (reused, images) = run(&job);
    assert!(reused.is_empty(), "{reused:?}");
    assert!(images == [want.clone()], "the library's first image differs from gen's");
    let (reused, images) = run(&job);
    assert_eq!(reused, ["text encoder", "transformer", "VAE decoder"]);
    assert!(images == [want.clone()], "the library's second image (everything reused) differs from gen's");
    // The smallest budget leaves no room to keep anything beside the largest phase.
    let job = Job { memory_budget: Some(pipeline.plan(&resolve(&job)).unwrap().peak()), ..job };
    let (_, images) = run(&job);
    assert!(images == [want.clone()]);
    let (reused, images) = run(&job);
    assert!(reused.is_empty(), "kept {reused:?} beyond the budget");
    assert!(images == [want], "under a budget");
}

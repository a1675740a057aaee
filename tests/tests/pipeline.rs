//! The engine as a library: `Pipeline::open` once, then a resolved `Job`
//! run twice, each image the diffusers PNG (within the end-to-end tolerance)
//! and the second equal to the first byte for byte; the plan is available
//! before running; the observer sees every step. And the front door: a job
//! is checked by the same rules `gen` applies, whoever calls.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::pipeline::reference_image;
use flux_lite_platform::{Job, Limits, Made, Observer, Options, OutputType, Pipeline, Progress, Prompt, RequestError, Setting};
use flux_lite_tests::{model_dir, read_png, Goldens};

/// Counts finished denoising steps and warnings.
#[derive(Default)]
struct Counts {
    steps: usize,
    warnings: usize,
}

impl Observer for Counts {
    fn progress(&mut self, p: Progress) {
        if let Progress::Denoise(s) = p {
            self.steps += usize::from(s.block.done == s.block.total);
        }
    }

    fn warning(&mut self, _message: &str) {
        self.warnings += 1;
    }
}

/// Runs `job`, collecting what it makes.
fn run(pipeline: &Pipeline, job: Job, counts: &mut Counts) -> (Vec<Made>, flux_lite_platform::Finished) {
    let job = job.resolve(pipeline.model(), &Limits::default()).unwrap();
    let mut made = Vec::new();
    let finished = pipeline
        .run(&job, counts, &mut |m| {
            made.push(m);
            Ok(())
        })
        .unwrap();
    (made, finished)
}

#[test]
fn one_open_pipeline_generates_twice_the_diffusers_image() {
    let case = "tiny-a/one-step";
    let c = Goldens::load(case).case_json();
    let n = |k: &str| c[k].as_u64().unwrap();
    let pipeline = Pipeline::open(&model_dir(c["model"].as_str().unwrap()), Options::default()).unwrap();
    let prompt = Prompt::text(c["prompt"].as_str().unwrap());
    let steps = n("steps") as usize;
    let job = Job {
        width: Some(n("width") as usize),
        height: Some(n("height") as usize),
        steps: Some(steps),
        seed: Some(n("seed")),
        guidance: Some(1.0),
        ..Job::new(prompt)
    };
    let plan = pipeline.plan(&job.clone().resolve(pipeline.model(), &Limits::default()).unwrap()).unwrap();
    assert_eq!(plan.decode.tile, None, "tiny-a at this size decodes untiled");
    let want = read_png(&Goldens::dir(case).join("image.png"));
    let mut images = Vec::new();
    let mut latents = Vec::new();
    for _ in 0..2 {
        let mut counts = Counts::default();
        let (mut made, finished) = run(&pipeline, job.clone(), &mut counts);
        assert_eq!((counts.steps, counts.warnings), (steps, 0));
        assert_eq!(finished.timings.steps.len(), steps);
        let out = made.pop().unwrap();
        latents.push(out.latents);
        let image = out.image.unwrap();
        assert_eq!((image.width, image.height), (want.width, want.height));
        let max = image.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let mean = image.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / want.rgb.len() as f64;
        eprintln!("{case} through Pipeline: max |Δ| {max}, mean {mean:.4}");
        flux_lite_tests::tolerance::assert_png_close(&format!("{case} through Pipeline"), &image.rgb, &want.rgb);
        images.push(image.rgb);
    }
    assert!(images[0] == images[1], "a second run differs from the first");
    // Latents alone: no decode, the same latents as the full generation's.
    let (made, _) = run(&pipeline, Job { output: OutputType::Latents, ..job }, &mut Counts::default());
    assert!(made[0].image.is_none());
    assert!(made[0].latents == latents[0] && latents[0] == latents[1], "the latents differ between runs");
}

/// A library caller meets the rules `gen` applies: each job `gen` refuses
/// is refused here too, naming the setting (a `Resolved` job has no other
/// constructor, so nothing unchecked reaches `Pipeline::run`).
#[test]
fn a_library_caller_cannot_run_what_gen_refuses() {
    let pipeline = Pipeline::open(&model_dir("tiny-a"), Options::default()).unwrap();
    let model = pipeline.model();
    let job = || Job { width: Some(32), height: Some(32), ..Job::new(Prompt::text("x")) };
    let refused = |job: Job| job.resolve(model, &Limits::default()).unwrap_err();
    // tiny-a's latent cell is 4 pixels.
    let reference = |w: usize, h: usize| flux_lite_platform::ReferenceImage { path: "made.png".into(), original: (w, h), width: w, height: h, pixels: vec![0.0; 3 * w * h] };
    let cases: Vec<(Job, Setting, &str)> = vec![
        (Job { steps: Some(0), ..job() }, Setting::Steps, "steps 0: give 1 to 1000"),
        (Job { steps: Some(1001), ..job() }, Setting::Steps, "steps 1001"),
        (Job { width: Some(30), ..job() }, Setting::Width, "width 30: not a positive multiple of 4"),
        (Job { height: Some(0), ..job() }, Setting::Height, "height 0"),
        (Job { images_per_prompt: 0, ..job() }, Setting::Images, "images 0: 0 images in all"),
        (Job { images_per_prompt: 5001, ..Job::prompts(vec![Prompt::text("a"), Prompt::text("b")]) }, Setting::Images, "10002 images in all; give 1 to 10000"),
        (Job { guidance: Some(f32::NAN), ..job() }, Setting::Guidance, "guidance NaN"),
        (Job { guidance: Some(-1.0), ..job() }, Setting::Guidance, "guidance -1"),
        (Job { vae_tile: Some(6), ..job() }, Setting::VaeTile, "VAE tile 6: not a positive multiple of 4 pixels"),
        (Job { references: vec![reference(64, 64); 17], ..job() }, Setting::References, "17 reference images; at most 16"),
        (Job { references: vec![reference(66, 64)], ..job() }, Setting::Reference, "made.png: 66×64 is not made of whole 4-pixel latent cells"),
        (Job::prompts(Vec::new()), Setting::Prompt, "give a prompt"),
        (Job { ..Job::new(Prompt::text("x".repeat(2 << 20))) }, Setting::Prompt, "over the 1048576-byte limit"),
        (Job { ..Job::new(Prompt::with_negative("x", "x".repeat(2 << 20))) }, Setting::NegativePrompt, "negative prompt: prompt 1: 2097152 bytes is over"),
        (Job { ..Job::new(Prompt::Embeddings { positive: vec![0.0; 10], negative: None }) }, Setting::Embeddings, "expected [512, "),
    ];
    for (job, setting, says) in cases {
        let e: RequestError = refused(job);
        assert_eq!(e.setting(), setting, "{e}");
        assert!(e.to_string().contains(says), "{e:?} should say {says:?}: {e}");
    }
    // The defaults `gen` applies, applied here: tiny-a is distilled.
    let resolved = Job::new(Prompt::text("x")).resolve(model, &Limits::default()).unwrap();
    let r = resolved.request();
    assert_eq!((r.width, r.height, r.steps, r.guidance), (1024, 1024, 4, 1.0));
    // The size comes from the first reference image, as diffusers takes it.
    let g = Goldens::load("tiny-a/reference-two");
    let first = reference_image::load(&g.dir.join("ref0.png"), model.vae.latent_cell()).unwrap();
    let (w, h) = (first.width, first.height);
    let resolved = Job { references: vec![first], ..Job::new(Prompt::text("x")) }.resolve(model, &Limits::default()).unwrap();
    assert_eq!((resolved.request().width, resolved.request().height), (w, h));
    // A server's tighter limits are the same rules with other bounds.
    let tight = Limits { max_steps: 8, max_side: 64, ..Limits::default() };
    let e = Job { steps: Some(9), ..job() }.resolve(model, &tight).unwrap_err();
    assert_eq!(e.to_string(), "steps 9: give 1 to 8");
    let e = Job { width: Some(128), ..job() }.resolve(model, &tight).unwrap_err();
    assert_eq!(e.to_string(), "width 128: at most 64");
}

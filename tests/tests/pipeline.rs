//! The engine as a library: `Pipeline::open` once, then `generate` twice,
//! each image the diffusers PNG (within the end-to-end tolerance) and the
//! second equal to the first byte for byte; the plan is available before
//! running; the observer sees every step.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::pipeline::{Observer, Options, Pipeline, Progress, Prompt, Request};
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

#[test]
fn one_open_pipeline_generates_twice_the_diffusers_image() {
    let case = "tiny-a/one-step";
    let c = Goldens::load(case).case_json();
    let n = |k: &str| c[k].as_u64().unwrap();
    let pipeline = Pipeline::open(&model_dir(c["model"].as_str().unwrap()), Options::default()).unwrap();
    let request = Request {
        width: n("width") as usize,
        height: n("height") as usize,
        steps: n("steps") as usize,
        seed: n("seed"),
        guidance: 1.0,
        vae_tile: None,
        memory_budget: None,
        references: Vec::new(),
        lora: Default::default(),
    };
    let plan = pipeline.plan(&request).unwrap();
    assert_eq!(plan.decode.tile, None, "tiny-a at this size decodes untiled");
    let prompt = Prompt::Text(c["prompt"].as_str().unwrap().into());
    let want = read_png(&Goldens::dir(case).join("image.png"));
    let mut images = Vec::new();
    let mut latents = Vec::new();
    for _ in 0..2 {
        let mut counts = Counts::default();
        let out = pipeline.generate(&prompt, &request, &[], &mut counts).unwrap();
        assert_eq!((counts.steps, counts.warnings), (request.steps, 0));
        assert_eq!(out.timings.steps.len(), request.steps);
        latents.push(out.latents);
        let image = out.image.unwrap();
        assert_eq!((image.width, image.height), (want.width, want.height));
        let max = image.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let mean = image.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / want.rgb.len() as f64;
        eprintln!("{case} through Pipeline: max |Δ| {max}, mean {mean:.4}");
        flux_lite_tests::tolerance::assert_png_close(&format!("{case} through Pipeline"), &image.rgb, &want.rgb);
        images.push(image.rgb);
    }
    assert!(images[0] == images[1], "a second generate differs from the first");
    // Latents alone: no decode, the same latents as the full generation's.
    let only = pipeline.latents(&prompt, &request, &[], &mut Counts::default()).unwrap();
    assert!(only.image.is_none());
    assert!(only.latents == latents[0] && latents[0] == latents[1], "the latents differ between runs");
}

#[test]
fn a_request_whose_references_do_not_match_the_images_is_refused() {
    let pipeline = Pipeline::open(&model_dir("tiny-a"), Options::default()).unwrap();
    let request = Request { width: 32, height: 32, steps: 1, seed: 0, guidance: 1.0, vae_tile: None, memory_budget: None, references: vec![(64, 64)], lora: Default::default() };
    let err = pipeline.generate(&Prompt::Text("x".into()), &request, &[], &mut Counts::default()).unwrap_err();
    assert!(err.to_string().contains("reference"), "{err}");
}

//! The pieces of inpainting against `Flux2KleinInpaintPipeline`'s own
//! tensors (`test_vectors/generate_inpaint.py`): the mask on the token grid
//! (grey, binarized, bilinear), the start (`scale_noise` at the first step
//! run) and the init image's latents.

#![allow(clippy::unwrap_used)]

use flux_lite_core::numerics::schedule;
use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::inpaint;
use flux_lite_platform::pipeline::reference_image::{self, Fit};
use flux_lite_tests::{model_dir, Goldens};

const CASES: [&str; 5] = ["tiny-a/inpaint-rect", "tiny-a/inpaint-blob", "tiny-a/img2img-reference", "tiny-a/inpaint-mask-rescaled", "tiny-b/inpaint-cfg"];

#[test]
fn the_mask_reaches_the_token_grid_as_the_pipeline_interpolates_it() {
    for case in CASES {
        let g = Goldens::load(case);
        let c = g.case_json();
        let model = ModelFolder::open(&model_dir(c["model"].as_str().unwrap())).unwrap();
        let init = reference_image::load_fitted(&g.dir.join("init.png"), model.vae.latent_cell(), Fit::Resize).unwrap();
        let mask = inpaint::load_mask(&g.dir.join("mask.png"), init.width, init.height).unwrap();
        let cell = model.vae.latent_cell();
        let tokens = inpaint::token_mask(&mask, init.height / cell, init.width / cell);
        let (want, _) = g.f32("mask");
        assert_eq!(tokens.len(), want.len(), "{case}");
        let worst = tokens.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert_eq!(worst, 0.0, "{case}: the token mask differs by {worst}");
    }
}

#[test]
fn the_run_starts_from_the_init_latents_noised_to_the_first_step() {
    for case in CASES {
        let g = Goldens::load(case);
        let c = g.case_json();
        let model = ModelFolder::open(&model_dir(c["model"].as_str().unwrap())).unwrap();
        let (steps, strength) = (c["steps"].as_u64().unwrap() as usize, c["strength"].as_f64().unwrap());
        let first = inpaint::first_step(steps, strength);
        assert_eq!(steps - first, c["steps_run"].as_u64().unwrap() as usize, "{case}: steps run");
        let (noise, _) = g.f32("noise");
        let (x0, _) = g.f32("init_latents");
        let mut sigmas = vec![0f32; steps + 1];
        let tokens = (c["width"].as_u64().unwrap() * c["height"].as_u64().unwrap()) as usize / model.vae.latent_cell().pow(2);
        schedule::sigmas(&model.scheduler, tokens, steps, &mut sigmas).unwrap();
        let start = inpaint::noised(sigmas[first], &noise, &x0);
        let (want, _) = g.f32("start");
        assert!(start == want, "{case}: the start differs from scale_noise's");
    }
}

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

/// `padding_mask_crop`'s image steps, each against diffusers' own function
/// on seeded masks and pictures (`test_vectors/generate_mask_crop.py`):
/// the crop region for blobs at edges and corners with several pads and
/// ratios, the `fill` resize (LANCZOS, edge strips on both sides, RGB and
/// grey), Flux2's centre `crop` (also past the image), `apply_overlay`, and PIL's resize itself (either
/// pass first, boxes, BICUBIC), pixel for pixel.
#[test]
fn mask_crop_steps_are_diffusers() {
    use flux_lite_platform::pipeline::mask_crop::{apply_overlay, crop_region, resize_and_fill, rgba8, CropBox};
    use flux_lite_platform::pipeline::resample::center_crop;
    use flux_lite_platform::pipeline::resample::{resize_box, Filter, Pixels};
    let bytes = std::fs::read(flux_lite_tests::test_vectors().join("goldens/mask_crop/cases.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let pixels = |name: &str| {
        let t = file.tensor(name).unwrap();
        Pixels::new(t.shape()[1], t.shape()[0], t.shape()[2], t.data().to_vec())
    };
    let size = |c: &serde_json::Value, key: &str| c[key].as_u64().unwrap() as usize;
    for (i, c) in cases["regions"].as_array().unwrap().iter().enumerate() {
        let b: Vec<usize> = c["box"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let got = crop_region(&pixels(&format!("region.{i}.in")), size(c, "width"), size(c, "height"), size(c, "pad"));
        assert_eq!(got, Some(CropBox { x1: b[0], y1: b[1], x2: b[2], y2: b[3] }), "region {i}");
    }
    for (kind, resize) in [("fill", resize_and_fill as fn(&Pixels, usize, usize) -> Pixels), ("crop", center_crop)] {
        for (i, c) in cases[kind].as_array().unwrap().iter().enumerate() {
            let got = resize(&pixels(&format!("{kind}.{i}.in")), size(c, "width"), size(c, "height"));
            let want = pixels(&format!("{kind}.{i}.out"));
            assert_eq!((got.width, got.height, got.channels), (want.width, want.height, want.channels), "{kind} {i}");
            let differing = got.data.iter().zip(&want.data).filter(|(a, b)| a != b).count();
            assert_eq!(differing, 0, "{kind} {i}: {differing} of {} samples differ from diffusers'", want.data.len());
        }
    }
    for (i, c) in cases["resize"].as_array().unwrap().iter().enumerate() {
        let filter = if c["filter"] == "bicubic" { Filter::Bicubic } else { Filter::Lanczos };
        let bx: Vec<f64> = c["box"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let got = resize_box(&pixels(&format!("resize.{i}.in")), filter, size(c, "width"), size(c, "height"), [bx[0], bx[1], bx[2], bx[3]]);
        assert!(got == pixels(&format!("resize.{i}.out")), "resize {i} ({c}) differs from PIL's");
    }
    for (i, c) in cases["overlay"].as_array().unwrap().iter().enumerate() {
        let b: Vec<usize> = c["box"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let part = |p: &str| pixels(&format!("overlay.{i}.{p}"));
        let got = apply_overlay(&part("mask"), &rgba8(&part("original")), &part("decoded"), CropBox { x1: b[0], y1: b[1], x2: b[2], y2: b[3] });
        let want = part("out");
        let differing = got.data.iter().zip(&want.data).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "overlay {i}: {differing} of {} samples differ from diffusers'", want.data.len());
    }
    let black = Pixels::new(8, 8, 1, vec![0; 64]);
    assert_eq!(crop_region(&black, 16, 16, 4), None, "an all-black mask has no region");
}

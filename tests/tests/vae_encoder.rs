//! The VAE encoder against diffusers: the posterior mean of an image and
//! the reference tokens the pipeline makes of it (`_encode_vae_image` then
//! `_pack_latents`), on both tiny models.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::vae_encoder::VaeEncoder;
use flux_lite_tests::{assert_rel_l2, gpu, model_dir, rel_l2, Goldens};

fn check(model: &str) {
    let g = Goldens::load(&format!("{model}/vae-encode"));
    let case = g.case_json();
    let (height, width) = (case["height"].as_u64().unwrap() as usize, case["width"].as_u64().unwrap() as usize);
    let folder = ModelFolder::open(&model_dir(model)).unwrap();
    let store = folder.weights(Component::Vae).unwrap();
    let encoder = VaeEncoder::new(gpu(), &folder.vae, &store, width, height).unwrap();
    let (image, shape) = g.f32("image");
    assert_eq!(shape, [3, height, width]);

    let (want_mean, mean_shape) = g.f32("posterior_mean");
    let (h, w) = encoder.latent_size();
    assert_eq!(mean_shape, [folder.vae.latent_channels, h, w]);
    let mean = encoder.posterior_mean(gpu(), &image).unwrap();
    assert_rel_l2(&format!("{model} posterior mean"), &mean, &want_mean, 1e-4);
    eprintln!("{model}: posterior mean relative L2 {:.2e}", rel_l2(&mean, &want_mean).0);

    let (want_tokens, token_shape) = g.f32("image_latents");
    assert_eq!(token_shape, [h * w / 4, 4 * folder.vae.latent_channels]);
    let tokens = encoder.reference_tokens(gpu(), &image).unwrap();
    assert_rel_l2(&format!("{model} reference tokens"), &tokens, &want_tokens, 1e-4);
    eprintln!("{model}: reference tokens relative L2 {:.2e}", rel_l2(&tokens, &want_tokens).0);
}

#[test]
fn tiny_a_encodes_as_diffusers_does() {
    check("tiny-a");
}

#[test]
fn tiny_b_encodes_as_diffusers_does() {
    check("tiny-b");
}

#[test]
fn an_image_size_the_latent_cannot_pack_is_refused() {
    let folder = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    let store = folder.weights(Component::Vae).unwrap();
    // tiny-b's scale factor is 4: sides must be multiples of 8.
    let err = VaeEncoder::new(gpu(), &folder.vae, &store, 36, 32).unwrap_err().to_string();
    assert!(err.contains("36×32") && err.contains("multiple of 8"), "{err}");
}

#[test]
fn encoding_references_stays_within_the_planned_bytes() {
    use flux_lite_platform::pipeline::{self, Request, Timings};
    use flux_lite_platform::{planning, reference_image, Gpu, GpuOptions};
    let g = Goldens::load("tiny-a/reference-two");
    let folder = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let unit = 2 * folder.vae.scale_factor();
    let refs: Vec<_> = ["ref0.png", "ref1.png"].iter().map(|f| reference_image::load(&g.dir.join(f), unit).unwrap()).collect();
    // A fresh device, so its high-water mark is this phase's alone.
    let device = Gpu::new(&GpuOptions::default()).unwrap();
    let request = Request {
        width: 32,
        height: 48,
        steps: 1,
        seed: 0,
        guidance: 1.0,
        vae_tile: None,
        memory_budget: None,
        references: refs.iter().map(|r| (r.width, r.height)).collect(),
    };
    let planned = planning::plan(&device, &folder, &request).unwrap().references.expect("a reference phase");
    let live_before = device.memory().live;
    let encoded = pipeline::encode_references(&device, &folder, &refs, &mut Timings::default(), &mut |_| {}).unwrap();
    assert_eq!(encoded.grids, [(16, 16), (17, 20)]);
    let high_water = device.memory().high_water;
    eprintln!("reference encode: high-water {high_water} B, planned {} B", planned.peak());
    assert!(high_water <= planned.peak(), "measured {high_water} B above the planned {} B", planned.peak());
    assert_eq!(device.memory().live, live_before, "the encoder's buffers are released");
}

//! The VAE encoder against diffusers: the posterior mean of an image and
//! the reference tokens the pipeline makes of it (`_encode_vae_image` then
//! `_pack_latents`), on both tiny models, untiled and by bands; and the
//! banded encode against the untiled one, in an arena fixed by the tile.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::components::vae_encoder::VaeEncoder;
use flux_lite_platform::RunError;
use flux_lite_tests::{assert_rel_l2, assert_same_bits, gpu, model_dir, rel_l2, Goldens};

use flux_lite_tests::tolerance::f32::{REFERENCE_TOKENS, VAE_ENCODER_MEAN as MEAN_TOL};

fn encoder(model: &str, width: usize, height: usize, tile_px: Option<usize>) -> (ModelFolder, VaeEncoder) {
    let folder = ModelFolder::open(&model_dir(model)).unwrap();
    let store = folder.weights(Component::Vae).unwrap();
    let encoder = VaeEncoder::new(gpu(), &folder.vae, &store, width, height, tile_px).unwrap_or_else(|e| panic!("{e}"));
    (folder, encoder)
}

/// The golden case of `model`, encoded whole (`tile_px: None`) or in `tile_px` tiles.
fn check(model: &str, tile_px: Option<usize>) {
    let g = Goldens::load(&format!("{model}/vae-encode"));
    let case = g.case_json();
    let (height, width) = (case["height"].as_u64().unwrap() as usize, case["width"].as_u64().unwrap() as usize);
    let (folder, encoder) = encoder(model, width, height, tile_px);
    assert_eq!(encoder.is_banded(), tile_px.is_some());
    let (image, shape) = g.f32("image");
    assert_eq!(shape, [3, height, width]);
    let what = format!("{model} ({})", tile_px.map_or("untiled".to_string(), |t| format!("{t}-px tiles")));

    let (want_mean, mean_shape) = g.f32("posterior_mean");
    let (h, w) = encoder.latent_size();
    assert_eq!(mean_shape, [folder.vae.latent_channels, h, w]);
    let mean = encoder.posterior_mean(gpu(), &image).unwrap();
    assert_rel_l2(&format!("{what} posterior mean"), &mean, &want_mean, MEAN_TOL);
    eprintln!("{what}: posterior mean relative L2 {:.2e}", rel_l2(&mean, &want_mean).0);

    let (want_tokens, token_shape) = g.f32("image_latents");
    assert_eq!(token_shape, [h * w / 4, 4 * folder.vae.latent_channels]);
    let tokens = encoder.reference_tokens(gpu(), &image).unwrap();
    assert_rel_l2(&format!("{what} reference tokens"), &tokens, &want_tokens, REFERENCE_TOKENS);
    eprintln!("{what}: reference tokens relative L2 {:.2e}", rel_l2(&tokens, &want_tokens).0);
}

#[test]
fn tiny_a_encodes_as_diffusers_does() {
    check("tiny-a", None);
}

#[test]
fn tiny_b_encodes_as_diffusers_does() {
    check("tiny-b", None);
}

/// Small tiles, so that every op runs in several bands and the attention
/// in several key chunks (the smallest tile each golden image's rows fit).
#[test]
fn banded_encodes_match_diffusers() {
    check("tiny-a", Some(8));
    check("tiny-a", Some(16));
    check("tiny-b", Some(8));
    check("tiny-b", Some(16));
}

/// Values in [-1, 1] from a fixed seed, `[3, height, width]`.
fn random_image(width: usize, height: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(747796405).wrapping_add(2891336453);
    (0..3 * width * height)
        .map(|_| {
            state = state.wrapping_mul(747796405).wrapping_add(2891336453);
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn a_banded_encode_matches_the_untiled_encode() {
    let (width, height) = (64, 96);
    let image = random_image(width, height, 3);
    let (_, banded) = encoder("tiny-a", width, height, Some(16));
    let (_, whole) = encoder("tiny-a", width, height, None);
    assert!(banded.is_banded() && !whole.is_banded());
    let (tiled, untiled) = (banded.posterior_mean(gpu(), &image).unwrap(), whole.posterior_mean(gpu(), &image).unwrap());
    assert_same_bits("banded (16-px tiles) vs untiled 64×96 posterior mean", &tiled, &untiled);
}

#[test]
fn an_image_no_larger_than_the_tile_is_encoded_whole() {
    let (_, e) = encoder("tiny-a", 32, 16, Some(32));
    assert!(!e.is_banded());
}

#[test]
fn a_tile_too_small_for_one_band_is_a_layout_error_saying_so() {
    // A 4-pixel tile holds fewer values than one convolution row of a 1024-pixel-wide image; the
    // plan refuses such a forced tile before a job gets here (PlanError::VaeTileTooSmall).
    let (_, e) = encoder("tiny-a", 1024, 16, Some(4));
    let err = e.posterior_mean(gpu(), &random_image(1024, 16, 5)).unwrap_err();
    assert!(matches!(&err, RunError::Layout { component: "banded VAE", .. }), "{err}");
    assert!(err.to_string().contains("too few for one") && err.to_string().contains("larger tile"), "{err}");
}

#[test]
fn an_image_size_the_latent_cannot_pack_is_refused() {
    let folder = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    let store = folder.weights(Component::Vae).unwrap();
    // tiny-b's scale factor is 4: sides must be multiples of 8.
    let err = VaeEncoder::new(gpu(), &folder.vae, &store, 36, 32, None).unwrap_err().to_string();
    assert!(err.contains("36×32") && err.contains("multiple of 8"), "{err}");
    let err = VaeEncoder::new(gpu(), &folder.vae, &store, 32, 32, Some(12)).unwrap_err().to_string();
    assert!(err.contains("12-pixel tile") && err.contains("multiple of 8"), "{err}");
}

#[test]
fn encoding_references_stays_within_the_planned_bytes() {
    use flux_lite_platform::pipeline::{self, Request, Timings};
    use flux_lite_platform::pipeline::{planning, reference_image};
    use flux_lite_platform::{Gpu, GpuOptions};
    let g = Goldens::load("tiny-a/reference-two");
    let folder = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let unit = folder.vae.latent_cell();
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
        lora: Default::default(),
        init: None,
        kv_cache: false,
        kv_precision: Default::default(),
    };
    let planned = planning::plan(&device, &folder, &planning::ModelSizes::from_files(&folder).unwrap(), &request).unwrap().references.expect("a reference phase");
    let live_before = device.memory().live;
    let encoded = pipeline::encode_references(&device, &folder, &refs, None, &std::env::temp_dir(), &mut Timings::default(), &mut |_| {}).unwrap();
    assert_eq!(encoded.grids, [(16, 16), (17, 20)]);
    let high_water = device.memory().high_water;
    eprintln!("reference encode: high-water {high_water} B, planned {} B", planned.device());
    assert!(high_water <= planned.device(), "measured {high_water} B above the planned {} B", planned.device());
    assert_eq!(device.memory().live, live_before, "the encoder's buffers are released");
}

/// A `size`-pixel square image encoded in 16-pixel tiles on a fresh device.
struct TiledEncode {
    /// The encoder's tile arena.
    arena: u64,
    /// The device's high-water and the plan's peak for that tile.
    high_water: u64,
    planned: u64,
}

fn tiled_encode(size: usize) -> TiledEncode {
    use flux_lite_core::plan;
    use flux_lite_platform::pipeline::planning;
    use flux_lite_platform::{Gpu, GpuOptions};
    let folder = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = folder.weights(Component::Vae).unwrap();
    let device = Gpu::new(&GpuOptions::default()).unwrap();
    let encoder = VaeEncoder::new(&device, &folder.vae, &store, size, size, Some(16)).unwrap();
    assert!(encoder.is_banded());
    let tokens = encoder.reference_tokens(&device, &random_image(size, size, 6)).unwrap();
    let (h, w) = encoder.latent_size();
    assert_eq!(tokens.len(), 4 * h * w, "{size}²: the image encodes in the tile arena");
    let high_water = device.memory().high_water;
    let sizes = planning::ModelSizes::from_files(&folder).unwrap();
    let refs = [(size as u64, size as u64)];
    let input = sizes.plan_input(&folder, 32, 32, &refs, device.plan_limits(), None);
    let planned = plan::reference_options(&input).unwrap().find(|p| p.tile == Some(16)).expect("a 16-pixel tile option");
    TiledEncode { arena: encoder.arena_bytes(), high_water, planned: planned.device() }
}

/// Once `the_encoder_tile_arena_does_not_grow_with_the_image` and
/// `the_encoder_phase_high_water_does_not_grow_with_the_image_when_tiled`,
/// which encoded the same 128² image in 16-pixel tiles: the tile arena is
/// the same at 64² and 128² (and smaller than the untiled 64² one), the
/// 128² image encodes in it, and the phase's measured high-water is within
/// the plan at both sizes, a plan which does not depend on the size. (The
/// high-water itself moves by a band row's readback either way: a band holds
/// as many whole rows as fit, 17 of 64 pixels or 8 of 128 here.)
#[test]
fn the_encoder_tile_arena_and_phase_high_water_do_not_grow_with_the_image() {
    let (small, large) = (tiled_encode(64), tiled_encode(128));
    let (_, whole) = encoder("tiny-a", 64, 64, None);
    println!("banded encoder arena {} and {} bytes at 64² and 128²; untiled 64²: {} bytes", small.arena, large.arena, whole.arena_bytes());
    assert_eq!(small.arena, large.arena);
    assert!(small.arena < whole.arena_bytes());
    let (small, small_planned, large, large_planned) = (small.high_water, small.planned, large.high_water, large.planned);
    println!("tiled VAE encode high-water: {small} B at 64², {large} B at 128² (planned {small_planned} and {large_planned} B)");
    assert_eq!(small_planned, large_planned, "the plan of a tiled encode does not depend on the image size");
    for (size, measured) in [(64, small), (128, large)] {
        assert!(measured <= large_planned, "{size}²: measured {measured} B above the planned {large_planned} B");
    }
}

#![allow(clippy::unwrap_used)]
//! The VAE decoder on the GPU against the diffusers goldens (de-normalised
//! latent, decoded output, PNG), and the banded decode against the untiled one.

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::components::vae::{DecodedImage, TileProgress, VaeDecoder};
use flux_lite_core::numerics::rng::TorchGenerator;
use flux_lite_platform::pipeline::planning;
use flux_lite_platform::RunError;
use flux_lite_tests::{assert_same_bits, gpu, model_dir, read_png, rel_l2, Goldens, CASES};

const DECODED_TOL: f64 = flux_lite_tests::tolerance::f32::VAE_DECODED;
const LATENT_TOL: f64 = flux_lite_tests::tolerance::f32::DENORM_LATENT;

fn decoder(model: &str, width: usize, height: usize, tile_px: Option<usize>) -> VaeDecoder {
    let m = ModelFolder::open(&model_dir(model)).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    VaeDecoder::new(gpu(), &m.vae, &store, width, height, tile_px).unwrap_or_else(|e| panic!("{e}"))
}

/// The case's model, image size and final latents.
fn case_inputs(g: &Goldens) -> (String, usize, usize, Vec<f32>) {
    let json = g.case_json();
    let size = |k: &str| json[k].as_u64().unwrap() as usize;
    let steps = size("steps");
    let (latents, _) = g.f32(&format!("latents.{}", steps - 1));
    (json["model"].as_str().unwrap().to_string(), size("width"), size("height"), latents)
}

/// image.png as interleaved RGB bytes, with its width and height.
fn png_rgb(g: &Goldens) -> (usize, usize, Vec<u8>) {
    let png = read_png(&g.dir.join("image.png"));
    (png.width, png.height, png.rgb)
}

/// Largest |Δ| between two byte images and how many bytes differ.
fn byte_diff(a: &[u8], b: &[u8]) -> (u8, usize) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0, 0), |(m, n), (&x, &y)| (m.max(x.abs_diff(y)), n + (x != y) as usize))
}

#[test]
fn decodes_every_golden_case_like_diffusers() {
    for case in CASES {
        let g = Goldens::load(case);
        let (model, width, height, latents) = case_inputs(&g);
        let mut vae = decoder(&model, width, height, None);
        let mut ticks = Vec::new();
        let out = vae.decode(gpu(), &latents, true, &mut |p| ticks.push(p)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(ticks, [TileProgress { done: 1, total: 1 }], "{case}: one untiled pass");

        let (want, _) = g.f32("denorm_latent");
        let (err, at) = rel_l2(&vae.last_latent(gpu()).unwrap(), &want);
        println!("{case}: denorm_latent relative L2 {err:.2e}");
        assert!(err <= LATENT_TOL, "{case}: denorm_latent relative L2 {err:.3e} > {LATENT_TOL:.0e} (worst element {at})");

        let (want, shape) = g.f32("decoded");
        assert_eq!(shape, [3, height, width]);
        let (err, at) = rel_l2(out.decoded(), &want);
        let worst = (out.decoded()[at] - want[at]).abs();
        println!("{case}: decoded relative L2 {err:.2e}, worst |Δ| {worst:.2e} at {at} (got {} want {})", out.decoded()[at], want[at]);
        assert!(
            err <= DECODED_TOL,
            "{case}: decoded relative L2 {err:.3e} > {DECODED_TOL:.0e}; worst element {at}: got {} want {}",
            out.decoded()[at],
            want[at]
        );

        let (w, h, png) = png_rgb(&g);
        assert_eq!((out.width, out.height), (w, h), "{case}: image size");
        // Without the raw values kept, the same image from the one readback of its levels.
        let levels_only = vae.decode(gpu(), &latents, false, &mut |_| {}).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(levels_only.decoded().is_empty() && levels_only.rgb == out.rgb, "{case}: the image without the raw values");
        let (max, count) = byte_diff(&out.rgb, &png);
        println!("{case}: image vs image.png: max |Δ| {max}, {count} of {} bytes differ", png.len());
        assert!(max <= 1, "{case}: image differs from image.png by up to {max} levels ({count} bytes differ)");
    }
}

#[test]
fn levels_of_the_golden_decoded_output_reproduce_image_png_bit_for_bit() {
    for case in CASES {
        let g = Goldens::load(case);
        let (model, width, height, _) = case_inputs(&g);
        let vae = decoder(&model, width, height, None);
        let (decoded, _) = g.f32("decoded");
        let planar = vae.pixel_levels(gpu(), &decoded).unwrap();
        let (_, _, png) = png_rgb(&g);
        let pixels = width * height;
        let rgb: Vec<u8> = (0..pixels).flat_map(|i| [planar[i], planar[pixels + i], planar[2 * pixels + i]]).collect();
        assert_eq!(byte_diff(&rgb, &png), (0, 0), "{case}");
    }
}

fn decode(vae: &mut VaeDecoder, latents: &[f32]) -> (DecodedImage, Vec<TileProgress>) {
    let mut ticks = Vec::new();
    let out = vae.decode(gpu(), latents, true, &mut |p| ticks.push(p)).unwrap_or_else(|e| panic!("{e}"));
    (out, ticks)
}

/// Random packed latents for a `width × height` tiny-a image (scale 2: 16 features per token).
fn random_latents(width: usize, height: usize, seed: u64) -> Vec<f32> {
    let mut out = vec![0f32; (width / 4) * (height / 4) * 16];
    TorchGenerator::new(seed).fill_randn_f32(&mut out);
    out
}

/// Largest and mean |Δ| between two byte images.
fn level_gap(a: &[u8], b: &[u8]) -> (u8, f64) {
    let (max, _) = byte_diff(a, b);
    (max, a.iter().zip(b).map(|(&x, &y)| x.abs_diff(y) as f64).sum::<f64>() / a.len() as f64)
}

/// The banded decode runs every op of the program over bands of rows with
/// halos, the GroupNorms' row moments merged as the whole run merges them
/// and the attention's online softmax carried over chunks of keys, so it
/// equals the untiled decode bit for bit: here a 64×96 image in 16-pixel
/// tiles (bands of a few rows, several key chunks in the mid-block
/// attention); and the golden cases' own latents in 8-pixel tiles against
/// diffusers' images.
#[test]
fn banded_decode_matches_the_untiled_decode() {
    let (width, height) = (64, 96);
    let latents = random_latents(width, height, 7);
    let mut banded = decoder("tiny-a", width, height, Some(16));
    assert!(banded.is_banded());
    let (tiled, ticks) = decode(&mut banded, &latents);
    let (whole, _) = decode(&mut decoder("tiny-a", width, height, None), &latents);
    assert_eq!(ticks.last().map(|t| (t.done, t.total)), Some((ticks.len(), ticks.len())), "one tick per op");
    assert_same_bits("banded (16-px tiles) vs untiled 64×96 decoded", tiled.decoded(), whole.decoded());
    assert_eq!(tiled.rgb, whole.rgb, "banded vs untiled: the 8-bit image");

    for case in CASES {
        let g = Goldens::load(case);
        let (model, width, height, latents) = case_inputs(&g);
        let (tiled, _) = decode(&mut decoder(&model, width, height, Some(8)), &latents);
        let (_, _, png) = png_rgb(&g);
        let (max, mean) = level_gap(&tiled.rgb, &png);
        println!("{case}: banded in 8-px tiles vs image.png: max |Δ| {max}, mean |Δ| {mean:.5}");
        flux_lite_tests::tolerance::assert_png_close(&format!("{case}: banded decode vs image.png"), &tiled.rgb, &png);
    }
}

#[test]
fn a_tile_too_small_for_one_band_is_a_layout_error_saying_so() {
    // A 4-pixel tile holds fewer values than one convolution row of a 1024-pixel-wide image. A
    // job never gets here: the plan refuses such a forced tile, naming it (PlanError::VaeTileTooSmall).
    let mut vae = decoder("tiny-a", 1024, 16, Some(4));
    let err = vae.decode(gpu(), &random_latents(1024, 16, 9), false, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, RunError::Layout { component: "banded VAE", .. }), "{err}");
    assert!(err.to_string().contains("too few for one") && err.to_string().contains("larger tile"), "{err}");
}

#[test]
fn bad_sizes_and_latents_are_errors() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let new = |w, h, t| VaeDecoder::new(gpu(), &m.vae, &store, w, h, t);
    // tiny-a's scale factor is 2: sizes and tiles must be multiples of 4.
    // A size or tile the component cannot take is a library caller's mistake (a job checks both
    // first, naming the setting): the component says what it was given.
    let given = |r: Result<VaeDecoder, RunError>, what: &str| matches!(r, Err(RunError::Input { component: "VAE", detail }) if detail.contains(what));
    assert!(given(new(30, 32, None), "30×32"));
    assert!(given(new(32, 32, Some(6)), "6-pixel tile"));
    assert!(given(new(32, 32, Some(0)), "0-pixel tile"));
    assert!(given(new(0, 32, None), "0×32"));
    let mut vae = new(32, 32, None).unwrap();
    let err = vae.decode(gpu(), &[0.0; 10], false, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, RunError::Input { component: "VAE decoder", detail } if detail.starts_with("latents of 10 values")), "{err}");
    assert!(matches!(vae.last_latent(gpu()), Err(RunError::Input { component: "VAE decoder", .. })));
}

#[test]
fn the_planned_tile_is_untiled_when_it_fits_and_bounded_by_the_binding_otherwise() {
    use flux_lite_platform::pipeline::Request;
    use flux_lite_platform::{Gpu, GpuOptions};
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let request = Request { width: 64, height: 96, steps: 1, seed: 0, guidance: 1.0, vae_tile: None, memory_budget: None, references: Vec::new(), lora: Default::default(), init: None, kv_cache: false, kv_precision: Default::default() };
    assert_eq!(planning::plan(gpu(), &m, &planning::ModelSizes::from_files(&m).unwrap(), &request).unwrap().decode.tile, None);
    // A device whose storage bindings hold 64 KiB: tiny-a's largest activation
    // (64 channels at full resolution) fits 256 pixels, a 16-pixel square tile,
    // whose band holds one row of the 64-pixel-wide image's widest convolution.
    // (The whole run cannot plan there: the transformer's attention keys, 896 × 64 floats, exceed
    // 64 KiB. The decode phase's own options are what this test is about.)
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(64 * 1024), ..Default::default() }).unwrap();
    let err = planning::plan(&small, &m, &planning::ModelSizes::from_files(&m).unwrap(), &request).unwrap_err().to_string();
    assert!(err.contains("attention over 896 tokens"), "{err}");
    let sizes = planning::ModelSizes::from_files(&m).unwrap();
    let input = sizes.plan_input(&m, 64, 96, &[], small.plan_limits(), None);
    // The fastest layout keeps the image's activations on the device (next test); the host's largest tile:
    let tile = flux_lite_core::plan::decode_options(&input).unwrap().find(|p| !p.on_device).and_then(|p| p.tile).map(|t| t as usize);
    assert_eq!(tile, Some(16));
    // 96 pixels wide, one convolution row (3 input rows of 64 channels) exceeds any band there: refused, naming the width.
    let wide_sizes = planning::ModelSizes::from_files(&m).unwrap();
    let wide = wide_sizes.plan_input(&m, 96, 64, &[], small.plan_limits(), None);
    let err = flux_lite_core::plan::decode_options(&wide).map(|o| o.count()).unwrap_err().to_string();
    assert!(err.contains("96-pixel-wide image") && err.contains("binding of 65536 bytes"), "{err}");
    let store = m.weights(Component::Vae).unwrap();
    let mut vae = VaeDecoder::new(&small, &m.vae, &store, 64, 96, tile).unwrap();
    assert!(vae.is_banded());
    let image = vae.decode(&small, &random_latents(64, 96, 10), false, &mut |_| {}).unwrap();
    assert_eq!(image.rgb.len(), 64 * 96 * 3);
}

/// Where no binding holds the decode (64 KiB bindings, tiny-a at 64×96),
/// the plan's fastest layout keeps the image's activations on the device
/// and runs each op by bands of one binding: that decode matches the
/// untiled one within the banded bound, as the host's 16-pixel bands do,
/// and its 8-bit image differs from theirs by at most one level.
#[test]
fn a_decode_with_its_activations_on_the_device_matches_the_untiled_one() {
    use flux_lite_platform::exec::activations::Bands;
    use flux_lite_platform::{Gpu, GpuOptions};
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(64 * 1024), ..Default::default() }).unwrap();
    let (width, height) = (64, 96);
    let sizes = planning::ModelSizes::from_files(&m).unwrap();
    let input = sizes.plan_input(&m, width, height, &[], small.plan_limits(), None);
    let first = flux_lite_core::plan::decode_options(&input).unwrap().next().unwrap();
    assert_eq!((first.tile, first.on_device), (Some(96), true), "{first:?}");
    assert_eq!(Bands::from(first), Bands::OnDevice { tile: 96 });
    let latents = random_latents(width, height, 12);
    let mut on_device = VaeDecoder::laid_out(&small, &m.vae, &store, width, height, Bands::from(first)).unwrap_or_else(|e| panic!("{e}"));
    assert!(on_device.is_banded());
    let mut ticks = 0;
    let device_image = on_device.decode(&small, &latents, true, &mut |_| ticks += 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(ticks > 1, "one progress tick an op of the program");
    let host_image = VaeDecoder::new(&small, &m.vae, &store, width, height, Some(16)).unwrap().decode(&small, &latents, true, &mut |_| {}).unwrap();
    let whole_image = decoder("tiny-a", width, height, None).decode(gpu(), &latents, true, &mut |_| {}).unwrap();
    for (name, image) in [("on the device", &device_image), ("on the host", &host_image)] {
        assert_same_bits(&format!("bands {name} vs the untiled decode"), image.decoded(), whole_image.decoded());
        assert_eq!(image.rgb, whole_image.rgb, "bands {name}: the 8-bit image");
    }
}

/// A `size`-pixel square image decoded in 16-pixel tiles on a fresh device.
struct TiledDecode {
    /// The decoder's tile arena.
    arena: u64,
    /// The device's high-water and the plan's peak for that tile.
    high_water: u64,
    planned: u64,
}

fn tiled_decode(size: usize) -> TiledDecode {
    use flux_lite_core::plan::{self, PlanInput};
    use flux_lite_platform::{Gpu, GpuOptions};
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let device = Gpu::new(&GpuOptions::default()).unwrap();
    let mut vae = VaeDecoder::new(&device, &m.vae, &store, size, size, Some(16)).unwrap();
    assert!(vae.is_banded());
    let image = vae.decode(&device, &random_latents(size, size, 11), false, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(image.rgb.len(), size * size * 3, "{size}²: the image decodes in the tile arena");
    let high_water = device.memory().high_water;
    let sizes = planning::ModelSizes::from_files(&m).unwrap();
    let input: PlanInput<'_> = sizes.plan_input(&m, size, size, &[], device.plan_limits(), None);
    let planned = plan::decode_options(&input).unwrap().find(|p| p.tile == Some(16)).unwrap();
    TiledDecode { arena: vae.arena_bytes(), high_water, planned: planned.device() }
}

/// Once `the_tile_arena_does_not_grow_with_the_image` and
/// `the_vae_phase_high_water_does_not_grow_with_the_image_when_tiled`, which
/// decoded the same 128² image in 16-pixel tiles: the tile arena is the same
/// at 64² and 128² (and smaller than the untiled 64² one), the 128² image
/// decodes in it, and the phase's measured high-water is the same at both
/// sizes, within the plan, which does not depend on the size either.
#[test]
fn the_tile_arena_and_the_vae_phase_high_water_do_not_grow_with_the_image() {
    let (small, large) = (tiled_decode(64), tiled_decode(128));
    let whole = decoder("tiny-a", 64, 64, None);
    println!("banded arena {} and {} bytes at 64² and 128²; untiled 64²: {} bytes", small.arena, large.arena, whole.arena_bytes());
    assert_eq!(small.arena, large.arena);
    assert!(small.arena < whole.arena_bytes());
    let (small, small_planned, large, large_planned) = (small.high_water, small.planned, large.high_water, large.planned);
    println!("tiled VAE decode high-water: {small} B at 64², {large} B at 128² (planned {small_planned} and {large_planned} B)");
    assert_eq!(small, large, "4× the pixels in the same tile");
    assert_eq!(small_planned, large_planned, "the plan of a tiled decode does not depend on the image size");
    assert!(large <= large_planned, "measured {large} B above the planned {large_planned} B");
}

/// Each decoder by bands on the host keeps its scratch file in its own
/// folder (no process-wide setting): in one process, a decoder whose folder
/// does not exist fails naming it, and one beside it in a folder that does
/// decodes.
#[test]
fn each_decoder_keeps_its_scratch_file_in_its_own_folder() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let (width, height) = (64, 64);
    let latents = random_latents(width, height, 13);
    let missing = std::env::temp_dir().join("flux-lite-no-such-scratch-folder");
    let _ = std::fs::remove_dir_all(&missing);
    let banded = |dir: &std::path::Path| VaeDecoder::new(gpu(), &m.vae, &store, width, height, Some(16)).unwrap().in_scratch(dir);
    let mut lost = banded(&missing);
    let mut found = banded(&std::env::temp_dir());
    assert!(lost.is_banded() && found.is_banded());
    match lost.decode(gpu(), &latents, false, &mut |_| {}) {
        Err(RunError::Scratch { dir, .. }) => assert_eq!(dir, missing),
        other => panic!("a missing scratch folder gave {:?}", other.map(|i| i.rgb.len())),
    }
    assert_eq!(found.decode(gpu(), &latents, false, &mut |_| {}).unwrap().rgb.len(), width * height * 3);
}

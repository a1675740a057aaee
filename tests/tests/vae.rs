#![allow(clippy::unwrap_used)]
//! The VAE decoder on the GPU against the diffusers goldens (de-normalised
//! latent, decoded output, PNG), and tiled against untiled decoding.

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::vae::{DecodedImage, TileProgress, VaeDecoder};
use flux_lite_platform::RunError;
use flux_lite_tests::{gpu, model_dir, read_png, rel_l2, Goldens, CASES};

/// Stage tolerance of the issue for the decoded image: relative L2 ≤ 1e-4.
const DECODED_TOL: f64 = 1e-4;
/// The de-normalisation is one multiply-add per element.
const LATENT_TOL: f64 = 1e-6;

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
        let out = vae.decode(gpu(), &latents, &mut |p| ticks.push(p)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(ticks, [TileProgress { done: 1, total: 1 }], "{case}: one untiled pass");

        let (want, _) = g.f32("denorm_latent");
        let (err, at) = rel_l2(&vae.last_latent(gpu()).unwrap(), &want);
        println!("{case}: denorm_latent relative L2 {err:.2e}");
        assert!(err <= LATENT_TOL, "{case}: denorm_latent relative L2 {err:.3e} > {LATENT_TOL:.0e} (worst element {at})");

        let (want, shape) = g.f32("decoded");
        assert_eq!(shape, [3, height, width]);
        let (err, at) = rel_l2(&out.decoded, &want);
        let worst = (out.decoded[at] - want[at]).abs();
        println!("{case}: decoded relative L2 {err:.2e}, worst |Δ| {worst:.2e} at {at} (got {} want {})", out.decoded[at], want[at]);
        assert!(
            err <= DECODED_TOL,
            "{case}: decoded relative L2 {err:.3e} > {DECODED_TOL:.0e}; worst element {at}: got {} want {}",
            out.decoded[at],
            want[at]
        );

        let (w, h, png) = png_rgb(&g);
        assert_eq!((out.width, out.height), (w, h), "{case}: image size");
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
    let out = vae.decode(gpu(), latents, &mut |p| ticks.push(p)).unwrap_or_else(|e| panic!("{e}"));
    (out, ticks)
}

fn assert_decoded(what: &str, got: &[f32], want: &[f32]) {
    let (err, at) = rel_l2(got, want);
    println!("{what}: relative L2 {err:.2e}, worst element {at}: got {} want {}", got[at], want[at]);
    assert!(err <= DECODED_TOL, "{what}: relative L2 {err:.3e} > {DECODED_TOL:.0e}; worst element {at}: got {} want {}", got[at], want[at]);
}

/// Tiled decoding against diffusers' own `tiled_decode` on the same latent
/// (`test_vectors/generate_vae_tiling.py`): tiny-a (scale 2), a 64×96 image
/// (a 32×48 latent) in 32-pixel tiles, i.e. 16-cell tiles every 12 cells: 4
/// rows × 3 columns with short tiles at the bottom and right, 8-pixel blends.
///
/// The issue asked for tiled within 3 levels of untiled. diffusers itself is
/// 84 levels apart here (mean 7.7): each tile's GroupNorm statistics and
/// attention see only the tile, and this tiny random VAE's receptive field is
/// wider than its 16-cell tiles. So the test holds our tiled image to
/// diffusers' tiled image, and our tiled-vs-untiled gap to diffusers' gap.
#[test]
fn tiled_decode_matches_diffusers_tiled_decode() {
    let g = Goldens::load("tiny-a/tiled-decode");
    let (latents, _) = g.f32("latents");
    let (width, height) = (64, 96);
    let (whole, _) = decode(&mut decoder("tiny-a", width, height, None), &latents);
    let mut vae = decoder("tiny-a", width, height, Some(32));
    let (tiled, ticks) = decode(&mut vae, &latents);
    assert_eq!((vae.grid().rows(), vae.grid().cols()), (4, 3));
    assert_eq!(ticks, (1..=12).map(|done| TileProgress { done, total: 12 }).collect::<Vec<_>>());

    let (want_whole, _) = g.f32("decoded");
    let (want_tiled, _) = g.f32("decoded_tiled");
    assert_decoded("untiled decode", &whole.decoded, &want_whole);
    assert_decoded("tiled decode", &tiled.decoded, &want_tiled);

    let rgb = |planar: &[u8]| {
        let n = width * height;
        (0..n).flat_map(|i| [planar[i], planar[n + i], planar[2 * n + i]]).collect::<Vec<u8>>()
    };
    let reference_tiled = rgb(&vae.pixel_levels(gpu(), &want_tiled).unwrap());
    let reference_whole = rgb(&vae.pixel_levels(gpu(), &want_whole).unwrap());
    let (max, count) = byte_diff(&tiled.rgb, &reference_tiled);
    println!("tiled image vs diffusers' tiled image: max |Δ| {max}, {count} bytes differ");
    assert!(max <= 1, "tiled image differs from diffusers' tiled image by up to {max} levels ({count} bytes)");

    let (gap, _) = byte_diff(&tiled.rgb, &whole.rgb);
    let (reference_gap, _) = byte_diff(&reference_tiled, &reference_whole);
    let mean = tiled.rgb.iter().zip(&whole.rgb).map(|(&a, &b)| a.abs_diff(b) as f64).sum::<f64>() / whole.rgb.len() as f64;
    println!("tiled vs untiled: max |Δ| {gap} (diffusers: {reference_gap}), mean |Δ| {mean:.3}");
    assert!(gap.abs_diff(reference_gap) <= 1, "tiled vs untiled gap {gap}, diffusers' {reference_gap}");
}

/// Away from every blend, a tiled image is each tile decoded on its own: the
/// top-left tile's kept 24×24 pixels equal an untiled decode of its latent alone.
#[test]
fn the_first_tile_is_its_latent_decoded_alone() {
    let g = Goldens::load("tiny-a/tiled-decode");
    let (latents, _) = g.f32("latents");
    let (width, height) = (64, 96);
    let (tiled, _) = decode(&mut decoder("tiny-a", width, height, Some(32)), &latents);
    // The 16×16-cell tile is the first 8 × 8 of the 16-token-wide grid of 16 features.
    let tokens: Vec<f32> = (0..8).flat_map(|y| latents[y * 16 * 16..(y * 16 + 8) * 16].to_vec()).collect();
    let (alone, _) = decode(&mut decoder("tiny-a", 32, 32, None), &tokens);
    for c in 0..3 {
        for y in 0..24 {
            let row = &tiled.decoded[(c * height + y) * width..][..24];
            assert_eq!(row, &alone.decoded[(c * 32 + y) * 32..][..24], "channel {c} row {y}");
        }
    }
}

#[test]
fn the_tile_arena_does_not_grow_with_the_image() {
    let small = decoder("tiny-a", 64, 64, Some(32));
    let large = decoder("tiny-a", 256, 256, Some(32));
    let whole = decoder("tiny-a", 64, 64, None);
    println!("tile arena {} bytes; untiled 64×64: {} bytes", small.arena_bytes(), whole.arena_bytes());
    assert_eq!(small.arena_bytes(), large.arena_bytes());
    assert!(small.arena_bytes() < whole.arena_bytes());
    assert_eq!(large.grid().count(), 11 * 11);
}

#[test]
fn bad_sizes_and_latents_are_errors() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let new = |w, h, t| VaeDecoder::new(gpu(), &m.vae, &store, w, h, t);
    // tiny-a's scale factor is 2: sizes must be multiples of 4, tiles of 16.
    assert!(matches!(new(30, 32, None), Err(RunError::Input(_))));
    assert!(matches!(new(32, 32, Some(24)), Err(RunError::Input(_))));
    assert!(matches!(new(0, 32, None), Err(RunError::Input(_))));
    let mut vae = new(32, 32, None).unwrap();
    let err = vae.decode(gpu(), &[0.0; 10], &mut |_| {}).unwrap_err();
    assert!(matches!(err, RunError::Input(_)), "{err}");
    assert!(matches!(vae.last_latent(gpu()), Err(RunError::Input(_))));
}

#[test]
fn the_automatic_tile_is_untiled_when_it_fits_and_bounded_by_the_binding_otherwise() {
    use flux_lite_platform::{Gpu, GpuOptions};
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    assert_eq!(VaeDecoder::automatic_tile(gpu(), &m.vae, 64, 96), None);
    // A device whose storage bindings hold 64 KiB: tiny-a's largest activation
    // (64 channels at full resolution) fits 256 pixels, a 16-pixel square tile.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(64 * 1024), ..Default::default() }).unwrap();
    let tile = VaeDecoder::automatic_tile(&small, &m.vae, 64, 96);
    assert_eq!(tile, Some(16));
    let store = m.weights(Component::Vae).unwrap();
    let mut vae = VaeDecoder::new(&small, &m.vae, &store, 64, 96, tile).unwrap();
    let latents = Goldens::load("tiny-a/tiled-decode").f32("latents").0;
    let image = vae.decode(&small, &latents, &mut |_| {}).unwrap();
    assert_eq!(image.rgb.len(), 64 * 96 * 3);
}

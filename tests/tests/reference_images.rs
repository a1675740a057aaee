//! Reference images against diffusers and PIL: files of every PNG mode
//! converted to RGB as PIL converts them, LANCZOS and NEAREST resizes
//! byte for byte, the size `_resize_to_target_area` picks, the prepared
//! pixels the pipeline encodes, the reference tokens and their RoPE
//! positions, and the latents of denoising with references in every pass.

#![allow(clippy::unwrap_used)]

use flux_lite_core::models::transformer::KvMode;
use flux_lite_core::plan::WeightStrategy;
use flux_lite_platform::pipeline::denoise::{denoise, Conditioning};
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::pipeline::{self, Timings};
use flux_lite_platform::pipeline::reference_image::{self, ReferenceImage};
use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
use flux_lite_tests::{assert_rel_l2, gpu, model_dir, rel_l2, Goldens, REFERENCE_CASES};
use serde_json::Value;

const STEP_TOL: f64 = flux_lite_tests::tolerance::f32::STEP;

/// JPEG is not decoded bit for bit as PIL (libjpeg-turbo) decodes it. With
/// full-resolution chroma only the inverse DCT and the YCbCr → RGB rounding
/// differ, each by at most one level (IEEE 1180 accuracy; round-to-nearest).
const JPEG_444_MAX_LEVELS: u8 = 2;
/// With 4:2:0 chroma the two decoders' upsampling filters differ too. This
/// bound is the measured difference (max 4, mean 0.39 levels on the noisy
/// test pattern), kept as a regression guard, not a claim of equivalence.
const JPEG_420_MAX_LEVELS: u8 = 4;
const JPEG_420_MEAN_LEVELS: f64 = 0.4;

fn images() -> (Goldens, Value) {
    let g = Goldens::load("images");
    let cases = g.json("cases.json");
    (g, cases)
}

fn usize_pair(v: &Value) -> (usize, usize) {
    (v[0].as_u64().unwrap() as usize, v[1].as_u64().unwrap() as usize)
}

#[test]
fn every_png_mode_converts_to_the_rgb_pil_gives() {
    let (g, cases) = images();
    let loads = cases["loads"].as_array().unwrap();
    assert_eq!(loads.len(), 10);
    for case in loads {
        let file = case["file"].as_str().unwrap();
        let (mode, pixels) = reference_image::decode(&g.dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let (want, shape) = g.u8(&format!("load.{file}"));
        assert_eq!(shape, [pixels.height, pixels.width, 3], "{file}");
        assert_eq!(usize_pair(&case["size"]), (pixels.width, pixels.height));
        let got = reference_image::rgb8(&pixels);
        let diffs: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let off = diffs.iter().filter(|&&d| d > 0).count();
        let max = diffs.iter().copied().max().unwrap();
        let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
        eprintln!("{file}: {off} of {} bytes differ from PIL's, max |Δ| {max}, mean |Δ| {mean:.4}", got.len());
        if file == "photo444.jpg" {
            assert!(max <= JPEG_444_MAX_LEVELS, "{file}: max |Δ| {max} against PIL");
        } else if file == "photo.jpg" {
            assert!(max <= JPEG_420_MAX_LEVELS && mean <= JPEG_420_MEAN_LEVELS, "{file}: max |Δ| {max}, mean |Δ| {mean:.4} against PIL");
        } else {
            assert_eq!(off, 0, "{file} (PIL mode {}, ours {mode:?}): {off} bytes differ", case["pil_mode"]);
        }
    }
}

#[test]
fn lanczos_and_nearest_resizes_match_pil_byte_for_byte() {
    let (g, cases) = images();
    for case in cases["resizes"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let (w, h) = usize_pair(&case["size"]);
        let (mode, pixels) = reference_image::decode(&g.dir.join(file)).unwrap();
        let resized = reference_image::resize(pixels, mode, w, h);
        let got = reference_image::rgb8(&resized);
        let (want, shape) = g.u8(case["tensor"].as_str().unwrap());
        assert_eq!(shape, [h, w, 3]);
        let diffs: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let off = diffs.iter().filter(|&&d| d > 0).count();
        let max = diffs.iter().copied().max().unwrap();
        assert_eq!(off, 0, "{file} ({mode:?}) to {w}×{h}: {off} of {} bytes differ, by up to {max}", got.len());
    }
}

#[test]
fn large_images_are_scaled_to_the_size_diffusers_picks() {
    let (_, cases) = images();
    for case in cases["target_area"].as_array().unwrap() {
        let (w, h) = usize_pair(&case["size"]);
        assert_eq!(reference_image::target_size(w, h), Some(usize_pair(&case["resized"])), "{w}×{h}");
    }
}

/// The reference files of a pipeline case, prepared.
fn prepared(g: &Goldens, model: &ModelFolder) -> Vec<ReferenceImage> {
    let unit = model.vae.latent_cell();
    let refs = g.case_json()["references"].as_array().unwrap().clone();
    refs.iter().map(|r| reference_image::load(&g.dir.join(r["file"].as_str().unwrap()), unit).unwrap()).collect()
}

fn open_model(g: &Goldens) -> ModelFolder {
    ModelFolder::open(&model_dir(g.case_json()["model"].as_str().unwrap())).unwrap()
}

#[test]
fn prepared_references_are_the_pixels_the_pipeline_encodes() {
    for case in REFERENCE_CASES {
        let g = Goldens::load(case);
        let model = open_model(&g);
        let refs = prepared(&g, &model);
        for (i, r) in refs.iter().enumerate() {
            let (want, shape) = g.f32(&format!("reference.{i}"));
            assert_eq!(shape, [3, r.height, r.width], "{case} reference {i}");
            assert!(r.pixels.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{case} reference {i}: pixels differ");
        }
    }
}

#[test]
fn reference_tokens_and_positions_follow_the_pipeline() {
    for case in REFERENCE_CASES {
        let g = Goldens::load(case);
        let model = open_model(&g);
        let refs = prepared(&g, &model);
        let encoded = pipeline::encode_references(gpu(), &model, &refs, None, &std::env::temp_dir(), &mut Timings::default(), &mut |_| {}).unwrap();
        let (want, shape) = g.f32("image_latents");
        assert_eq!(shape[0], encoded.grids.iter().map(|(h, w)| h * w).sum::<usize>(), "{case}: token count");
        assert_rel_l2(&format!("{case} reference tokens"), &encoded.tokens, &want, flux_lite_tests::tolerance::f32::REFERENCE_TOKENS);
        eprintln!("{case}: reference tokens relative L2 {:.2e}", rel_l2(&encoded.tokens, &want).0);
        // The positions after the noise grid are the pipeline's image_latent_ids.
        let grids = LatentGrids { noise: (1, 1), references: encoded.grids.clone(), kv_cache: Default::default(), half_kv: false };
        let got: Vec<i64> = grids.positions().skip(1).flat_map(|p| p.map(|v| v as i64)).collect();
        assert_eq!(got, g.i64("image_latent_ids").0, "{case}: reference positions");
    }
}

#[test]
fn denoising_with_references_follows_diffusers() {
    for case in REFERENCE_CASES {
        let g = Goldens::load(case);
        let json = g.case_json();
        let model = open_model(&g);
        let (want_refs, ref_shape) = g.f32("image_latents");
        let unit = model.vae.latent_cell();
        let (w, h) = (json["width"].as_u64().unwrap() as usize, json["height"].as_u64().unwrap() as usize);
        let reference_grids = json["references"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let (w, h) = usize_pair(&r["processed"]);
                (h / unit, w / unit)
            })
            .collect::<Vec<_>>();
        // The KV pipeline's cache kept (with resident and with streamed weights), and recomputed
        // each step (as a tight budget plans it): the same numbers.
        let streamed = WeightStrategy::Streamed { slots: 1 };
        let modes: &[(KvMode, WeightStrategy)] = if model.index.kv_cache {
            &[(KvMode::Keep, WeightStrategy::ResidentBf16), (KvMode::Keep, streamed), (KvMode::Recompute, WeightStrategy::ResidentBf16)]
        } else {
            &[(KvMode::Off, WeightStrategy::ResidentBf16)]
        };
        for &(mode, strategy) in modes {
            let grids = LatentGrids { noise: (h / unit, w / unit), references: reference_grids.clone(), kv_cache: mode, half_kv: false };
            let store = model.weights(Component::Transformer).unwrap();
            let t = Transformer::new(gpu(), &model.transformer, store, strategy, None, 512, &grids).unwrap();
            assert_eq!(ref_shape, [t.layout.image as usize - t.layout.noise as usize, t.layout.in_channels as usize]);
            t.set_references(gpu(), &want_refs).unwrap();
            let positive = g.f32("prompt_embeds").0;
            let guidance = json["guidance"].as_f64().unwrap() as f32;
            let negative = if guidance > 1.0 && !model.index.is_distilled { Some(g.f32("negative_prompt_embeds").0) } else { None };
            let conditioning = match &negative {
                Some(negative) => Conditioning::Guided { positive: &positive, negative, scale: guidance },
                None => Conditioning::Prompt(&positive),
            };
            let steps = json["steps"].as_u64().unwrap() as usize;
            let got = denoise(gpu(), &t, &model.scheduler, steps, &g.f32("noise").0, None, conditioning, &mut |_| {}).unwrap();
            let want = g.f32(&format!("latents.{}", steps - 1)).0;
            assert_rel_l2(&format!("{case} ({mode:?}, {strategy:?}) final latents"), &got, &want, STEP_TOL);
            eprintln!("{case} ({mode:?}, {strategy:?}): final latents relative L2 {:.2e}", rel_l2(&got, &want).0);
        }
    }
}

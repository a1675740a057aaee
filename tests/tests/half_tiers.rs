//! The stages on the half tiers (f16 and, where the adapter offers it,
//! matrix) against the same diffusers/transformers goldens as the f32 path,
//! each within the bound `tolerance::other_tiers` states for it: the text
//! encoder's embedding, every step's velocity, and the VAE's decode and encode.

#![allow(clippy::unwrap_used)]

use flux_lite_core::config::VaeConfig;
use flux_lite_core::ir::{Op, RopeStyle};
use flux_lite_core::models::{vae as vae_program, vae_encoder, vae_encoder_nhwc, vae_nhwc};
use flux_lite_platform::components::text_encoder::TextEncoder;
use flux_lite_platform::components::vae::{self, VaeDecoder};
use flux_lite_platform::components::vae_encoder::VaeEncoder;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::{Gpu, Precision};
use flux_lite_kernels::{AttentionChoice, GpuOptions};
use flux_lite_tests::tolerance::other_tiers;
use flux_lite_tests::{has_f16_tiles, model_dir, rel_l2, tier_gpu, with_f16_tiles, Goldens, TransformerCase, CASES};
use flux_lite_kernels::test_devices::tier_gpu_with;

/// Each half tier this adapter runs.
fn half_tiers() -> Vec<Gpu> {
    [Precision::F16, Precision::Matrix].into_iter().filter_map(tier_gpu).collect()
}

/// The smallest tile from `tile` up, in steps of 8 pixels, whose band holds
/// a banded decode of a `width × height` image on `gpu`'s data path: on the
/// matrix tier a band holds a chunk of the chunked attention's keys (or all
/// of them), which the tiny models' 8- and 16-pixel tiles do not.
fn decode_tile(gpu: &Gpu, cfg: &VaeConfig, (width, height): (usize, usize), tile: usize) -> usize {
    let (channels_last, scale) = (gpu.plan_limits().half_operands, cfg.scale_factor());
    let need = vae_nhwc::decode_band_minimum(cfg, (height / scale) as u64, (width / scale) as u64, channels_last).unwrap();
    (tile..).step_by(8).find(|&t| vae_program::band_capacity(cfg, (t / scale) as u64, gpu.max_binding(), channels_last).unwrap() >= need).unwrap()
}

/// [`decode_tile`] for a banded encode.
fn encode_tile(gpu: &Gpu, cfg: &VaeConfig, (width, height): (usize, usize), tile: usize) -> usize {
    let channels_last = gpu.plan_limits().half_operands;
    let need = vae_encoder_nhwc::encode_band_minimum(cfg, height as u64, width as u64, channels_last).unwrap();
    (tile..).step_by(8).find(|&t| vae_encoder::band_capacity(cfg, t as u64, gpu.max_binding(), channels_last).unwrap() >= need).unwrap()
}

fn check(what: &str, got: &[f32], want: &[f32], tol: f64) -> f64 {
    let (err, worst) = rel_l2(got, want);
    println!("{what}: relative L2 {err:.2e}");
    assert!(err <= tol, "{what}: relative L2 {err:.3e} > {tol:.0e}; worst element {worst}: got {} want {}", got[worst], want[worst]);
    err
}

#[test]
fn text_encoder_on_the_half_tiers() {
    for gpu in half_tiers() {
        let tier = gpu.precision().name();
        for case in CASES {
            let g = Goldens::load(case);
            let folder = ModelFolder::open(&model_dir(g.case_json()["model"].as_str().unwrap())).unwrap();
            let store = folder.weights(Component::TextEncoder).unwrap();
            let picks = folder.text_encoder.output_layers();
            let enc = TextEncoder::new(&gpu, &folder.text_encoder, store, flux_lite_core::plan::WeightStrategy::ResidentBf16, 512, picks).unwrap();
            let ids = |name: &str| -> Vec<u32> { g.i64(name).0.iter().map(|&v| u32::try_from(v).unwrap()).collect() };
            let got = enc.encode(&gpu, &ids("input_ids"), &ids("attention_mask"), &mut |_| {}).unwrap();
            check(&format!("{tier} {case} prompt_embeds"), &got, &g.f32("prompt_embeds").0, other_tiers::TEXT_ENCODER);
        }
    }
}

/// On the matrix tier the text encoder's products read f16 operands: its
/// norms and SwiGLU write them, and where heads split into pieces (the
/// wide-heads encoder's 32; the tiny models' 8 stay f32) so do the
/// projections, the norm + RoPE and attention.
#[test]
fn the_text_encoder_runs_the_half_precision_data_path_on_the_matrix_tier() {
    let Some(gpu) = tier_gpu(Precision::Matrix).and_then(with_f16_tiles) else { return };
    let (enc, g) = flux_lite_tests::wide_heads_text_encoder(&gpu);
    let ops: Vec<&Op> = enc.blocks().iter().flatten().collect();
    let half_norms = ops.iter().filter(|op| matches!(op, Op::RmsNorm { dst, .. } if dst.is_half())).count();
    let half_swiglus = ops.iter().filter(|op| matches!(op, Op::SwiGlu { dst, .. } if dst.is_half())).count();
    let projections = ops.iter().filter(|op| matches!(op, Op::LinearHalf { .. })).count();
    let rotations = ops.iter().filter(|op| matches!(op, Op::RmsNormRope { data, pairs: RopeStyle::RotateHalf, .. } if data.is_half())).count();
    let attentions = ops.iter().filter(|op| matches!(op, Op::CausalAttention { q, o, .. } if q.is_half() && o.is_half())).count();
    // Three layers: two norms, one SwiGLU, three projections, two rotations and one attention each.
    assert_eq!([half_norms, half_swiglus, projections, rotations, attentions], [6, 3, 9, 6, 3]);
    let got = flux_lite_tests::encode_goldens(&gpu, &enc, &g);
    check("matrix wide-heads prompt_embeds", &got, &g.f32("prompt_embeds").0, other_tiers::TEXT_ENCODER);
}

/// The text encoder's causal attention as products on the GEMM core (what
/// runs it where the flash kernel's check fails, asked for here where it
/// passes): the wide-heads encoder (4 query heads on 2 kv heads of 32, the
/// prompt's padding keys hidden) within the half tiers' bound.
#[test]
fn the_text_encoders_attention_on_products() {
    let options = GpuOptions { precision: Precision::Matrix, attention: AttentionChoice::Products, ..flux_lite_kernels::test_devices::options() };
    let Some(gpu) = tier_gpu_with(options).and_then(with_f16_tiles) else { return };
    let (enc, g) = flux_lite_tests::wide_heads_text_encoder(&gpu);
    assert!(enc.runner().products_scratch.is_some(), "the wide-heads encoder's attention is not on products");
    let got = flux_lite_tests::encode_goldens(&gpu, &enc, &g);
    check("matrix, attention on products, wide-heads prompt_embeds", &got, &g.f32("prompt_embeds").0, other_tiers::TEXT_ENCODER);
}

#[test]
fn a_text_encoder_with_heads_of_32_on_the_half_tiers() {
    for gpu in half_tiers() {
        let (enc, g) = flux_lite_tests::wide_heads_text_encoder(&gpu);
        let got = flux_lite_tests::encode_goldens(&gpu, &enc, &g);
        check(&format!("{} wide-heads prompt_embeds", gpu.precision().name()), &got, &g.f32("prompt_embeds").0, other_tiers::TEXT_ENCODER);
    }
}

#[test]
fn velocities_on_the_half_tiers() {
    for gpu in half_tiers() {
        let on_products = velocities_within_bound(&gpu, gpu.precision().name());
        // Where the flash kernel passed its check, it runs the attention.
        assert_eq!(on_products > 0, gpu.plan_limits().attention_products.any());
    }
}

/// The transformer's attention as products on the GEMM core (what runs it
/// where the flash kernel's check over f16 pieces fails, asked for here
/// where it passes): every case's every step's velocity within the matrix
/// tier's bound.
#[test]
fn velocities_with_the_transformers_attention_on_products() {
    let options = GpuOptions { precision: Precision::Matrix, attention: AttentionChoice::Products, ..flux_lite_kernels::test_devices::options() };
    let Some(gpu) = tier_gpu_with(options).and_then(with_f16_tiles) else { return };
    assert!(gpu.attention_on_products(true) && gpu.attention_on_products(false) && gpu.plan_limits().attention_products.any());
    let on_products = velocities_within_bound(&gpu, "matrix, attention on products,");
    println!("{on_products} of {} cases' attention on products", CASES.len());
    assert!(on_products > 0, "no case's attention ran on products");
}

/// Each case's steps from diffusers' own latents on `gpu` (`tier` names
/// it), each velocity within the half tiers' bound; the cases whose
/// attention ran as products on the GEMM core, counted.
fn velocities_within_bound(gpu: &Gpu, tier: &str) -> usize {
    let mut on_products = 0;
    for name in CASES {
        let c = TransformerCase::load_on(gpu, name);
        on_products += c.transformer.runner().products_scratch.is_some() as usize;
        let g = &c.goldens;
        c.transformer.set_prompt(gpu, &g.f32("prompt_embeds").0).unwrap();
        let (timesteps, _) = g.f32("timesteps");
        // Each step from diffusers' own latents, so every step's error is the tier's alone.
        for (i, &t) in timesteps.iter().enumerate().take(c.steps) {
            let input = if i == 0 { g.f32("noise").0 } else { g.f32(&format!("latents.{}", i - 1)).0 };
            c.transformer.set_latents(gpu, &input).unwrap();
            c.transformer.forward(gpu, t, &mut |_| {}).unwrap();
            let velocity = if c.cfg { format!("velocity_pos.{i}") } else { format!("velocity.{i}") };
            check(&format!("{tier} {name} {velocity}"), &c.transformer.velocity(gpu).unwrap(), &g.f32(&velocity).0, other_tiers::VELOCITY);
        }
    }
    on_products
}

#[test]
fn vae_decode_on_the_half_tiers() {
    for gpu in half_tiers() {
        let tier = gpu.precision().name();
        for case in CASES {
            let g = Goldens::load(case);
            let json = g.case_json();
            let size = |k: &str| json[k].as_u64().unwrap() as usize;
            let m = ModelFolder::open(&model_dir(json["model"].as_str().unwrap())).unwrap();
            let store = m.weights(Component::Vae).unwrap();
            let mut vae = VaeDecoder::new(&gpu, &m.vae, &store, size("width"), size("height"), None).unwrap();
            // The matrix tier keeps each product weight's row scales beside it, as planned.
            let scales = if gpu.measures_weight_rows() { vae::decoder_row_scale_bytes(&m.vae) } else { 0 };
            assert_eq!(vae.weight_bytes(), vae::decoder_weight_bytes(&m.vae, &store).unwrap() + scales, "{tier} {case}: the decoder's weight bytes");
            assert_eq!(scales > 0, has_f16_tiles(&gpu), "{tier}: row scales kept on the matrix tier's f16 tiles only");
            let latents = g.f32(&format!("latents.{}", size("steps") - 1)).0;
            let out = vae.decode(&gpu, &latents, true, &mut |_| {}).unwrap();
            check(&format!("{tier} {case} decoded"), out.decoded(), &g.f32("decoded").0, other_tiers::VAE_DECODED);
        }
    }
}

/// A decode by bands equals the whole one bit for bit on each half tier
/// (the same program by bands: the convolutions' halos, the GroupNorms' row
/// moments, the attention carried over chunks of keys; on the matrix tier
/// channels-last, the upsampled convolutions' bands starting on odd rows):
/// a 64×96 image in 16-pixel tiles, its activations on the host, and the
/// golden cases' latents in 8-pixel tiles.
#[test]
fn a_decode_by_bands_equals_the_whole_decode_on_the_half_tiers() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let mut latents = vec![0f32; 16 * 24 * 16];
    flux_lite_core::numerics::rng::TorchGenerator::new(13).fill_randn_f32(&mut latents);
    for gpu in half_tiers() {
        let tier = gpu.precision().name();
        let decode = |tile: Option<usize>, latents: &[f32], (width, height): (usize, usize)| {
            let mut vae = VaeDecoder::new(&gpu, &m.vae, &store, width, height, tile).unwrap();
            assert_eq!(vae.is_banded(), tile.is_some());
            vae.decode(&gpu, latents, true, &mut |_| {}).unwrap_or_else(|e| panic!("{tier}: {e}"))
        };
        let tile = decode_tile(&gpu, &m.vae, (64, 96), 16);
        let (banded, whole) = (decode(Some(tile), &latents, (64, 96)), decode(None, &latents, (64, 96)));
        flux_lite_tests::assert_same_bits(&format!("{tier}: 64×96 in {tile}-pixel tiles vs whole"), banded.decoded(), whole.decoded());
        assert_eq!(banded.rgb, whole.rgb, "{tier}: the 8-bit image");
        for case in CASES.iter().filter(|c| c.starts_with("tiny-a")) {
            let g = Goldens::load(case);
            let json = g.case_json();
            let size = (json["width"].as_u64().unwrap() as usize, json["height"].as_u64().unwrap() as usize);
            let latents = g.f32(&format!("latents.{}", json["steps"].as_u64().unwrap() - 1)).0;
            let tile = decode_tile(&gpu, &m.vae, size, 8);
            let (banded, whole) = (decode(Some(tile), &latents, size), decode(None, &latents, size));
            assert_eq!(banded.rgb, whole.rgb, "{tier} {case}: in {tile}-pixel tiles vs whole");
        }
    }
}

/// The encoder's posterior mean and the reference tokens made of it against
/// diffusers on each half tier, whole and in 8-pixel tiles; on the matrix
/// tier the channels-last program (f16 activations, the downsamplers
/// strided convolutions of the stream).
#[test]
fn vae_encode_on_the_half_tiers() {
    for gpu in half_tiers() {
        let tier = gpu.precision().name();
        for model in ["tiny-a", "tiny-b"] {
            let g = Goldens::load(&format!("{model}/vae-encode"));
            let json = g.case_json();
            let size = |k: &str| json[k].as_u64().unwrap() as usize;
            let m = ModelFolder::open(&model_dir(model)).unwrap();
            let store = m.weights(Component::Vae).unwrap();
            let image = g.f32("image").0;
            for tile in [None, Some(encode_tile(&gpu, &m.vae, (size("width"), size("height")), 8))] {
                let encoder = VaeEncoder::new(&gpu, &m.vae, &store, size("width"), size("height"), tile).unwrap_or_else(|e| panic!("{tier}: {e}"));
                assert_eq!(encoder.is_channels_last(), has_f16_tiles(&gpu), "{tier}: the channels-last encoder on the matrix tier's f16 tiles only");
                let what = format!("{tier} {model} ({})", tile.map_or("whole".into(), |t| format!("{t}-px tiles")));
                check(&format!("{what} posterior mean"), &encoder.posterior_mean(&gpu, &image).unwrap(), &g.f32("posterior_mean").0, other_tiers::VAE_ENCODER_MEAN);
                check(&format!("{what} reference tokens"), &encoder.reference_tokens(&gpu, &image).unwrap(), &g.f32("image_latents").0, other_tiers::VAE_ENCODER_MEAN);
            }
        }
    }
}

/// An encode by bands equals the whole one bit for bit on each half tier
/// (on the matrix tier channels-last: the strided downsamplers' bands, the
/// GroupNorms' row moments, the attention carried over chunks of keys): a
/// 64×96 image in 16-pixel tiles.
#[test]
fn an_encode_by_bands_equals_the_whole_encode_on_the_half_tiers() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let store = m.weights(Component::Vae).unwrap();
    let mut image = vec![0f32; 3 * 64 * 96];
    flux_lite_core::numerics::rng::TorchGenerator::new(17).fill_randn_f32(&mut image);
    image.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
    for gpu in half_tiers() {
        let tier = gpu.precision().name();
        let encode = |tile: Option<usize>| {
            let encoder = VaeEncoder::new(&gpu, &m.vae, &store, 64, 96, tile).unwrap();
            assert_eq!(encoder.is_banded(), tile.is_some());
            encoder.posterior_mean(&gpu, &image).unwrap_or_else(|e| panic!("{tier}: {e}"))
        };
        let tile = encode_tile(&gpu, &m.vae, (64, 96), 16);
        flux_lite_tests::assert_same_bits(&format!("{tier}: 64×96 posterior mean in {tile}-pixel tiles vs whole"), &encode(Some(tile)), &encode(None));
    }
}

/// The range rule on a whole model: the tiny transformer's prompt rows
/// scaled to 1e5 and to 1e-6 (far above f16's 65504, far below its smallest
/// normal) and noise with outliers of 1e5. Where the f32 tier's velocity is
/// finite, each half tier's is too, and as close to it as on ordinary input.
#[test]
fn the_half_tiers_stay_finite_where_f32_does_on_inputs_outside_f16() {
    let case = "tiny-a/one-step";
    let reference = flux_lite_tests::gpu();
    let g = Goldens::load(case);
    let mut prompt = g.f32("prompt_embeds").0;
    let width = prompt.len() / 512;
    prompt[..width].iter_mut().for_each(|v| *v *= 1e5);
    prompt[width..2 * width].iter_mut().for_each(|v| *v *= 1e-6);
    let mut noise = g.f32("noise").0;
    noise.iter_mut().step_by(97).for_each(|v| *v = 1e5);
    let t = g.f32("timesteps").0[0];
    let velocity = |gpu: &Gpu| {
        let c = TransformerCase::load_on(gpu, case);
        c.transformer.set_prompt(gpu, &prompt).unwrap();
        c.transformer.set_latents(gpu, &noise).unwrap();
        c.transformer.forward(gpu, t, &mut |_| {}).unwrap();
        c.transformer.velocity(gpu).unwrap()
    };
    let want = velocity(reference);
    assert!(want.iter().all(|v| v.is_finite()), "the f32 tier itself is not finite here");
    for gpu in half_tiers() {
        let got = velocity(&gpu);
        let tier = gpu.precision().name();
        assert!(got.iter().all(|v| v.is_finite()), "{tier}: Inf or NaN where f32 is finite");
        check(&format!("{tier} velocity on outliers vs the f32 tier"), &got, &want, other_tiers::VELOCITY);
    }
}

/// On the matrix tier, each linear's weight has its rows' range scales
/// measured once where it reaches the device: at load for resident weights
/// (plain, or DF11 groups expanded at load), and as each block fills its
/// slot for the rest (groups expanded per block, weights streamed plain or
/// compressed). Each is packed as f16 where it is measured, slots as their
/// block refills them: every placement reads as many packed weights. Every
/// placement gives the velocity bit for bit of the plain
/// model's resident weights, over two passes (the second finding slots
/// holding the first's weights), within the planned device bytes, which
/// count the scales.
#[test]
fn the_matrix_tier_measures_weights_where_they_reach_the_device_under_every_strategy() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    let Some(gpu) = tier_gpu(Precision::Matrix).and_then(with_f16_tiles) else { return };
    assert!(gpu.measures_weight_rows(), "the matrix tier here rounds operands to f16 and should keep weights' row scales");
    let (text, lat_h, lat_w) = (8, 2, 3);
    let run = |model: &ModelFolder, placement: WeightStrategy| {
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(&gpu, &model.transformer, store, placement, None, text, &LatentGrids::noise_only(lat_h, lat_w)).unwrap();
        (flux_lite_tests::velocity_of_two_passes(&gpu, &t, text), t.weight_bytes(), t.half_packed_weights())
    };
    let plain = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    let (want, _, packed) = run(&plain, WeightStrategy::ResidentBf16);
    assert!(packed > 0, "no weight packed as f16 on the matrix tier");
    assert!(want.iter().all(|v| v.is_finite()), "the resident velocity is not finite");
    let df11 = ModelFolder::open(&model_dir("tiny-b"))
        .and_then(|m| m.with_transformer(&flux_lite_tests::test_vectors().join("goldens/df11/tiny-b-transformer")))
        .unwrap();
    let mut sizes = {
        let store = df11.weights(Component::Transformer).unwrap();
        Transformer::weight_sizes(&df11.transformer, &store, text, lat_h * lat_w).unwrap()
    };
    assert!(sizes.row_scales > 0, "the transformer's linears have rows to scale");
    sizes.keep_row_scales();
    for (model, placement) in [
        (&plain, WeightStrategy::Streamed { slots: 1 }),
        (&df11, WeightStrategy::ResidentBf16),
        (&df11, WeightStrategy::ResidentDf11 { slots: 1 }),
        (&df11, WeightStrategy::ResidentDf11 { slots: 2 }),
        (&df11, WeightStrategy::Streamed { slots: 2 }),
    ] {
        let (got, bytes, packed_here) = run(model, placement);
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "{placement:?}: the velocity differs from the resident weights'");
        assert_eq!(packed_here, packed, "{placement:?}: weights packed as f16");
        if std::ptr::eq(model, &df11) {
            assert!(bytes <= sizes.bytes(placement), "{placement:?}: {bytes} device bytes of weights, planned {}", sizes.bytes(placement));
        }
        println!("matrix tier, {placement:?}: velocity as resident, {packed_here} weights packed, {bytes} device bytes of weights");
    }
}

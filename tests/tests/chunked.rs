//! Token-chunked blocks: the transformer with every per-token stage
//! (modulation, projections, norms, RoPE, the queries' attention, the
//! feed-forward and MLP, residuals) run over a few token rows at a time,
//! the keys, values and stream whole, computes the unchunked velocity bit
//! for bit, in a smaller activation arena. With keys and values in half
//! precision (the half-K/V layout) it stays within that layout's bound of
//! diffusers' velocities.

#![allow(clippy::unwrap_used)]

use flux_lite_core::plan::WeightStrategy;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
use flux_lite_tests::{gpu, model_dir, velocity_of_two_passes};

const TEXT: usize = 8;
const LAT_H: usize = 4;
const LAT_W: usize = 5;

/// The velocity of two forward passes, and the arena's bytes.
fn run(model: &ModelFolder, strategy: WeightStrategy, chunk: Option<usize>) -> (Vec<f32>, u64) {
    run_laid_out(model, strategy, chunk, false)
}

/// [`run`], with keys and values in half precision where `half_kv`.
fn run_laid_out(model: &ModelFolder, strategy: WeightStrategy, chunk: Option<usize>, half_kv: bool) -> (Vec<f32>, u64) {
    let gpu = gpu();
    let store = model.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
    let grids = LatentGrids { half_kv, ..LatentGrids::noise_only(LAT_H, LAT_W) };
    let t = Transformer::new(gpu, &model.transformer, store, strategy, chunk, TEXT, &grids).unwrap_or_else(|e| panic!("{e}"));
    (velocity_of_two_passes(gpu, &t, TEXT), t.arena_bytes)
}

/// The half-K/V layout against diffusers: each golden case's every step,
/// from diffusers' own latents, within the layout's bound (the only
/// difference from the f32 path is the keys' and values' f16 rounding);
/// chunks of 64 rows (the cases' 512 prompt rows and their image rows in
/// several) and of all rows at once.
#[test]
fn half_keys_and_values_stay_within_their_bound_of_diffusers() {
    use flux_lite_tests::{rel_l2, TransformerCase, CASES};
    let bound = flux_lite_tests::tolerance::half_kv::VELOCITY;
    for name in CASES {
        for chunk in [64, 4096] {
            let c = TransformerCase::load_laid_out(gpu(), name, Some(chunk), true);
            assert!(c.transformer.layout.kv_scales.is_some() && c.transformer.layout.by_chunks());
            let g = &c.goldens;
            c.transformer.set_prompt(gpu(), &g.f32("prompt_embeds").0).unwrap();
            let (timesteps, _) = g.f32("timesteps");
            for (i, &t) in timesteps.iter().enumerate().take(c.steps) {
                let input = if i == 0 { g.f32("noise").0 } else { g.f32(&format!("latents.{}", i - 1)).0 };
                c.transformer.set_latents(gpu(), &input).unwrap();
                c.transformer.forward(gpu(), t, &mut |_| {}).unwrap();
                let velocity = if c.cfg { format!("velocity_pos.{i}") } else { format!("velocity.{i}") };
                let got = c.transformer.velocity(gpu()).unwrap();
                let (err, worst) = rel_l2(&got, &g.f32(&velocity).0);
                println!("{name} {velocity}, half keys and values by chunks of {chunk}: relative L2 {err:.2e}");
                assert!(err <= bound, "{name} {velocity}, chunks of {chunk}: relative L2 {err:.3e} > {bound:.0e} (worst element {worst})");
            }
        }
    }
}

/// The half-K/V layout runs by chunks of any size (1, 5, 16 rows and all
/// 28 at once) to the same velocity, close to the f32 layout's, in a
/// smaller arena than the f32 layout's chunks.
#[test]
fn half_keys_and_values_by_any_chunk_agree() {
    for name in ["tiny-a", "tiny-b"] {
        let model = ModelFolder::open(&model_dir(name)).unwrap_or_else(|e| panic!("{e}"));
        let (exact, _) = run(&model, WeightStrategy::ResidentBf16, None);
        let (want, _) = run_laid_out(&model, WeightStrategy::ResidentBf16, Some(1), true);
        for (strategy, chunk) in [(WeightStrategy::ResidentBf16, 5), (WeightStrategy::ResidentBf16, 16), (WeightStrategy::ResidentBf16, 28), (WeightStrategy::Streamed { slots: 1 }, 5)] {
            let (got, bytes) = run_laid_out(&model, strategy, Some(chunk), true);
            let same = got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits()));
            assert!(same, "{name}, {strategy:?}, chunks of {chunk}: the half-K/V velocity depends on the chunk");
            let (_, f32_bytes) = run(&model, strategy, Some(chunk));
            assert!(bytes < f32_bytes, "{name}, chunks of {chunk}: arena {bytes} B, with f32 keys and values {f32_bytes} B");
        }
        let (err, _) = flux_lite_tests::rel_l2(&want, &exact);
        println!("{name}: half keys and values, relative L2 {err:.2e} from the f32 layout's velocity");
        assert!(err > 0.0 && err <= flux_lite_tests::tolerance::half_kv::VS_F32_LAYOUT, "{name}: {err:.3e}");
    }
}

#[test]
fn chunked_feed_forward_gives_the_unchunked_velocity_bit_for_bit() {
    for name in ["tiny-a", "tiny-b"] {
        let model = ModelFolder::open(&model_dir(name)).unwrap_or_else(|e| panic!("{e}"));
        let (want, unchunked_bytes) = run(&model, WeightStrategy::ResidentBf16, None);
        // 28 token rows: chunks of 1, of 5 (the last one 3 rows) and of 16 (the text stream's 8 rows in one).
        for (strategy, chunk) in [
            (WeightStrategy::ResidentBf16, 1),
            (WeightStrategy::ResidentBf16, 5),
            (WeightStrategy::ResidentBf16, 16),
            (WeightStrategy::Streamed { slots: 1 }, 5),
        ] {
            let (got, bytes) = run(&model, strategy, Some(chunk));
            let same = got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits()));
            assert!(same, "{name}, {strategy:?}, chunks of {chunk}: the velocity differs");
            assert!(bytes < unchunked_bytes, "{name}, chunks of {chunk}: arena {bytes} B, unchunked {unchunked_bytes} B");
            println!("{name}: chunks of {chunk} under {strategy:?}: arena {bytes} B (unchunked {unchunked_bytes} B), velocity identical");
        }
    }
}

/// On a device whose bindings cannot hold the unchunked single blocks'
/// attention keys (a window of the fused projection, `3D + 2F` floats a
/// row), the plan picks chunks, which keep keys in `D`-wide rows; the
/// chunked pass runs there and gives the velocity of the unchunked pass on
/// a device without that limit, bit for bit.
#[test]
fn the_plan_chunks_when_attention_keys_exceed_a_binding() {
    use flux_lite_platform::error::{GpuError, RunError};
    use flux_lite_platform::pipeline::Request;
    use flux_lite_platform::pipeline::planning;
    use flux_lite_platform::{Gpu, GpuOptions};
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    // 32×32 pixels: 512 + 64 tokens. Keys: 576 × 576 × 4 = 1.3 MB unchunked, 576 × 64 × 4 = 147 KB chunked.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(512 * 1024), ..Default::default() }).unwrap();
    let request = Request { width: 32, height: 32, steps: 1, seed: 0, guidance: 1.0, vae_tile: None, memory_budget: None, references: Vec::new(), lora: Default::default(), init: None, kv_cache: false, kv_precision: Default::default() };
    let chunk = planning::plan(&small, &model, &planning::ModelSizes::from_files(&model).unwrap(), &request).unwrap().denoise.chunk.expect("the plan chunks");
    let on = |gpu: &Gpu, chunk: Option<usize>| {
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(gpu, &model.transformer, store, WeightStrategy::ResidentBf16, chunk, 512, &LatentGrids::noise_only(8, 8))?;
        let prompt = vec![0.25; 512 * t.layout.joint_dim as usize];
        t.set_prompt(gpu, &prompt)?;
        t.set_latents(gpu, &vec![0.5; 64 * t.layout.in_channels as usize])?;
        t.forward(gpu, 700.0, &mut |_| {})?;
        Ok::<_, RunError>(t.velocity(gpu)?)
    };
    // Without chunks the small device cannot bind the keys: the test bites.
    let err = on(&small, None).unwrap_err();
    assert!(matches!(err, RunError::Gpu(GpuError::BindingTooLarge { what: "attention keys", .. })), "{err}");
    let got = on(&small, Some(chunk as usize)).unwrap();
    let want = on(gpu(), None).unwrap();
    assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "chunks of {chunk}: the velocity differs");
}

/// With reference images and the KV pipeline's passes (extracting, then
/// reading the cache), the blocks by chunks of tokens give the unchunked
/// velocity bit for bit: each chunk's queries are split at the reference
/// rows as the whole pass splits them.
#[test]
fn chunked_kv_passes_give_the_unchunked_velocity_bit_for_bit() {
    use flux_lite_core::models::transformer::KvMode;
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let grids = LatentGrids { noise: (LAT_H, LAT_W), references: vec![(3, 2), (2, 2)], kv_cache: KvMode::Keep, half_kv: false };
    let refs: Vec<f32> = (0..10 * model.transformer.in_channels).map(|i| ((i * 29 % 83) as f32 / 41.0) - 1.0).collect();
    let run = |chunk: Option<usize>| {
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(gpu(), &model.transformer, store, WeightStrategy::ResidentBf16, chunk, TEXT, &grids).unwrap();
        t.set_references(gpu(), &refs).unwrap();
        let mut velocities = Vec::new();
        for cached in [false, true] {
            t.use_kv_cache(cached);
            velocities.extend(velocity_of_two_passes(gpu(), &t, TEXT));
        }
        (velocities, t.arena_bytes)
    };
    let (want, unchunked_bytes) = run(None);
    // 8 text + 20 noise + 10 reference rows: chunks of 7 straddle the text/noise and noise/reference boundaries.
    for chunk in [1, 7, 16] {
        let (got, bytes) = run(Some(chunk));
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "chunks of {chunk}: the velocity differs");
        assert!(bytes < unchunked_bytes, "chunks of {chunk}: arena {bytes} B, unchunked {unchunked_bytes} B");
    }
}

/// The half-K/V layout with the KV pipeline's references, recomputed each
/// step (a kept cache copies f32 rows, so that layout keeps f32 keys):
/// chunks of 1, 7 and all 38 rows give one velocity, close to the f32
/// layout's (the reference rows attend to themselves only, over packed keys).
#[test]
fn half_keys_and_values_with_recomputed_references() {
    use flux_lite_core::models::transformer::KvMode;
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let refs: Vec<f32> = (0..10 * model.transformer.in_channels).map(|i| ((i * 29 % 83) as f32 / 41.0) - 1.0).collect();
    let run = |chunk: Option<usize>, half_kv: bool| {
        let grids = LatentGrids { noise: (LAT_H, LAT_W), references: vec![(3, 2), (2, 2)], kv_cache: KvMode::Recompute, half_kv };
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(gpu(), &model.transformer, store, WeightStrategy::ResidentBf16, chunk, TEXT, &grids).unwrap();
        assert_eq!(t.layout.kv_scales.is_some(), half_kv);
        t.set_references(gpu(), &refs).unwrap();
        velocity_of_two_passes(gpu(), &t, TEXT)
    };
    let exact = run(None, false);
    let want = run(Some(1), true);
    for chunk in [7, 38] {
        let got = run(Some(chunk), true);
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "chunks of {chunk}: the half-K/V velocity depends on the chunk");
    }
    let (err, _) = flux_lite_tests::rel_l2(&want, &exact);
    println!("tiny-a with recomputed references: half keys and values, relative L2 {err:.2e} from the f32 layout's velocity");
    assert!(err > 0.0 && err <= flux_lite_tests::tolerance::half_kv::VS_F32_LAYOUT, "{err:.3e}");
}

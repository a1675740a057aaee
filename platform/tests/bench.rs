//! `bench kernels`' transformer rows on a device whose bindings cannot hold
//! the fused projection's keys: the blocks and the step run in token chunks,
//! as `gen`'s plan would, instead of failing.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::bench::ShapeBench;
use flux_lite_platform::model::ModelFolder;
use flux_lite_kernels::test_devices::{gpu, small_binding_gpu};
use std::path::Path;

#[test]
fn blocks_and_steps_chunk_when_the_keys_exceed_a_binding() {
    let model = ModelFolder::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models/tiny-a")).unwrap();
    let cfg = &model.transformer;
    // 96 tokens of fused rows (3·64 + 2·192 = 576 wide) are 221 KB, and a
    // 32² step's 576 (512 prompt tokens and 8² image tokens: tiny-a's VAE
    // packs 4×4 pixels a token) are 1.3 MB: 192 KiB bindings refuse both,
    // but hold the step's 64-wide keys (147 KB).
    let small = small_binding_gpu(192 << 10);
    let bench = ShapeBench::new(&small, 1);
    let blocks = bench.blocks(cfg, 96).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(blocks.len(), 2);
    for f in &blocks {
        assert!(f.shape.ends_with(", by 48-token chunks"), "{f:?}");
        assert!(f.seconds > 0.0 && f.flops > 0, "{f:?}");
    }
    let step = bench.step(cfg, 32, model.vae.latent_cell() as u64).unwrap_or_else(|e| panic!("{e}"));
    assert!(step.shape.starts_with("32×32: 512 + 64 tokens"), "{step:?}");
    assert!(step.shape.ends_with("chunks"), "{step:?}");
    // Where the keys fit, nothing is chunked.
    let device = gpu();
    let roomy = ShapeBench::new(device, 1);
    for f in roomy.blocks(cfg, 96).unwrap_or_else(|e| panic!("{e}")) {
        assert!(!f.shape.contains("chunks"), "{f:?}");
    }
}

#[test]
fn an_untiled_vae_above_the_bindings_is_reported_not_run() {
    let model = ModelFolder::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models/tiny-a")).unwrap();
    // 128² through tiny-a's decoder: its full-resolution activations are 32 × 128² × 4 = 2 MiB.
    let small = small_binding_gpu(1 << 20);
    let why = ShapeBench::new(&small, 1).vae_unfit(&model.vae, 128).expect("refused");
    assert!(why.contains("above the adapter's largest binding, 1048576 bytes"), "{why}");
    let device = gpu();
    assert_eq!(ShapeBench::new(device, 1).vae_unfit(&model.vae, 128), None);
    // The encoder's row likewise: its 128² image and first activations take 32 × 128² × 4 bytes too.
    let why = ShapeBench::new(&small, 1).vae_encode_unfit(&model.vae, 128).expect("refused");
    assert!(why.contains("above the adapter's largest binding, 1048576 bytes"), "{why}");
    assert_eq!(ShapeBench::new(device, 1).vae_encode_unfit(&model.vae, 128), None);
}

/// The encoder's row times the encode program `gen` runs on a reference:
/// all of its operations, as many dispatches as the runner prepares.
#[test]
fn the_vae_encode_row_runs_the_whole_encoder() {
    use flux_lite_core::models::vae_encoder;
    let model = ModelFolder::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models/tiny-a")).unwrap();
    let encode = ShapeBench::new(gpu(), 1).vae_encode(&model.vae, 32).unwrap_or_else(|e| panic!("{e}"));
    let channels_last = gpu().plan_limits().half_operands;
    let layout = vae_encoder::VaeEncoderLayout::new(&model.vae, 32, 32, channels_last, &mut flux_lite_core::arena::BumpArena::new(u64::MAX)).unwrap();
    let mut flops = 0;
    flux_lite_core::models::vae_encoder_nhwc::encode_whole(&layout, |op| flops += op.flops());
    assert_eq!((encode.what.as_str(), encode.shape.as_str(), encode.flops), ("VAE encode", "32×32", flops));
    assert!(encode.seconds > 0.0 && encode.dispatches.is_some_and(|d| d > 0), "{encode:?}");
}

/// Where the adapter cannot hold the decodes whole, the VAE's and the
/// preview decoder's rows run by bands, as `gen` runs them, and say so.
#[test]
fn decodes_above_the_bindings_run_by_bands() {
    let model = ModelFolder::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models/tiny-a")).unwrap();
    // 32²: tiny-a's decoder binds 128 KiB at full resolution, the TAEF2-shaped preview decoder 256 KiB.
    let small = small_binding_gpu(64 << 10);
    let bench = ShapeBench::new(&small, 1);
    let decode = bench.vae_decode_banded(&model.vae, 32).unwrap_or_else(|e| panic!("{e}"));
    // The plan's first choice there: bands of one binding with the activations on the device.
    assert_eq!(decode.shape, "32×32, bands of a binding, activations on the device, wall clock", "{decode:?}");
    let tiny = bench.tiny_decode(&model.vae, 32).unwrap_or_else(|e| panic!("{e}"));
    assert!(tiny.shape.contains(", by bands in a 32² tile's arena, activations on the device"), "{tiny:?}");
    // The work is the whole decode's, whatever the layout.
    let roomy = ShapeBench::new(gpu(), 1);
    let (whole, whole_tiny) = (roomy.vae_decode(&model.vae, 32).unwrap(), roomy.tiny_decode(&model.vae, 32).unwrap());
    assert_eq!((decode.flops, tiny.flops), (whole.flops, whole_tiny.flops));
    assert!(!whole_tiny.shape.contains("bands") && decode.seconds > 0.0 && tiny.seconds > 0.0);
}

//! Token-chunked feed-forward: the transformer with its feed-forward and
//! single-block MLP projections run over a few token rows at a time computes
//! the unchunked velocity bit for bit, in a smaller activation arena.

#![allow(clippy::unwrap_used)]

use flux_lite_core::plan::WeightStrategy;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::transformer::{LatentGrids, Transformer};
use flux_lite_tests::{gpu, model_dir, velocity_of_two_passes};

const TEXT: usize = 8;
const LAT_H: usize = 4;
const LAT_W: usize = 5;

/// The velocity of two forward passes, and the arena's bytes.
fn run(model: &ModelFolder, strategy: WeightStrategy, chunk: Option<usize>) -> (Vec<f32>, u64) {
    let gpu = gpu();
    let store = model.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
    let t = Transformer::new(gpu, &model.transformer, store, strategy, chunk, TEXT, &LatentGrids::noise_only(LAT_H, LAT_W)).unwrap_or_else(|e| panic!("{e}"));
    (velocity_of_two_passes(gpu, &t, TEXT), t.arena_bytes)
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

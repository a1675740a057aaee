//! The VAE's phases: the decode's tiles and layouts, the reference
//! images' tokens and their encode.

use super::*;

#[test]
fn the_vae_tiles_when_the_budget_is_tight_and_its_arena_stops_growing() {
    let model = Model::klein_4b(false);
    let untiled = plan(&model.input(1024, None)).unwrap().decode;
    assert_eq!(untiled.tile, None);
    let budget = untiled.peak() * 3 / 4;
    let tight = plan(&model.input(1024, Some(budget))).unwrap_or_else(|e| panic!("{e}"));
    let tile = tight.decode.tile.expect("tiled under half the untiled bytes");
    assert!(tile.is_multiple_of(16) && tile < 1024);
    assert!(tight.decode.peak() <= budget);
    // A 4× larger image (2× per side) under the same budget decodes in the same arena.
    // (The transformer needs more at 2048²: the decode phase alone is checked.)
    let larger = decode_options(&model.input(2048, None)).unwrap().find(|p| p.peak() <= budget).expect("the decode fits");
    assert_eq!(larger.tile, Some(tile));
    assert_eq!(larger.arena_bytes, tight.decode.arena_bytes);
}

#[test]
fn reference_images_add_their_tokens_and_an_encoder_phase() {
    let model = Model::klein_4b(false);
    let plain = plan(&model.input(1024, None)).unwrap();
    assert_eq!(plain.references, None);
    let refs = [(1024, 1024), (512, 768)];
    let with = PlanInput { references: &refs, ..model.input(1024, None) };
    let p = plan(&with).unwrap();
    let r = p.references.expect("an encoder phase");
    // The arena is the largest reference's: 3 activations of 128 channels at full resolution, at least.
    assert!(r.arena_bytes >= 3 * 128 * 1024 * 1024 * 4, "{}", r.arena_bytes);
    assert_eq!(r.arena_bytes, vae_encoder::arena_bytes(&model.vae, 1024, 1024, with.limits.half_operands).unwrap());
    assert_eq!(r.weight_bytes, vae_encoder_weights(&model.vae));
    // 4096 + 3072 more image tokens in every activation of the transformer.
    assert!(p.denoise.arena_bytes > plain.denoise.arena_bytes * 2, "{} vs {}", p.denoise.arena_bytes, plain.denoise.arena_bytes);
    assert!(p.peak() >= r.peak());
    assert_eq!(r.tile, None, "untiled when the budget allows");
    // The smallest budget for the run covers the encoder's smallest layout, and runs.
    let min = minimum_budget(&with).unwrap();
    let smallest = reference_options(&with).unwrap().map(|o| o.peak()).min().unwrap();
    assert!(min >= smallest);
    assert!(plan(&PlanInput { budget: Some(min), ..with }).is_ok());
}

#[test]
fn the_reference_encode_tiles_under_a_tight_budget_and_its_arena_stops_growing() {
    // bf16 weights: a DF11 model's streaming area would set the budget's floor above the encode's.
    let model = Model::klein_4b(false);
    let one = [(1024, 1024)];
    let with = |refs, budget| PlanInput { references: refs, ..model.input(512, budget) };
    let untiled = plan(&with(&one, None)).unwrap().references.unwrap();
    assert_eq!(untiled.tile, None);
    // A budget below the untiled encode's peak: the encoder takes the largest tile that fits.
    let budget = untiled.peak() * 3 / 4;
    let p = plan(&with(&one, Some(budget))).unwrap_or_else(|e| panic!("{e}"));
    let r = p.references.unwrap();
    let tile = r.tile.expect("a tiled encode");
    assert!(r.peak() <= budget && r.arena_bytes < untiled.arena_bytes, "{r:?}");
    println!("1024² reference under {}: {tile}-px tiles, peak {}", Bytes(budget), Bytes(r.peak()));
    // The next larger tile would not have fitted.
    let larger = reference_options(&with(&one, None)).unwrap().find(|o| o.tile == Some(tile + 16)).unwrap();
    assert!(larger.peak() > budget);
    // The same tile for a reference of 4× the pixels (as sizes go past what the
    // pipeline prepares): the same arena, the same peak.
    let four = [(2048, 2048)];
    // The host holds the prepared image (f32 RGB) and its tokens, which grow with it.
    let big = reference_options(&with(&four, None)).unwrap().find(|o| o.tile == Some(tile)).unwrap();
    assert_eq!((big.arena_bytes, big.device()), (r.arena_bytes, r.device()));
    let (pixels, tokens) = (4 * 3 * (2048 * 2048 - 1024 * 1024), 4 * 128 * (128 * 128 - 64 * 64));
    assert_eq!(big.host_bytes - r.host_bytes, pixels + tokens);
    // A reference smaller than the tile is encoded whole, costing the device no more than the tile.
    let mixed = [(1024, 1024), (256, 256)];
    let m = reference_options(&with(&mixed, None)).unwrap().find(|o| o.tile == Some(tile)).unwrap();
    assert_eq!(m.device(), r.device());
    // Every option is listed fastest first: untiled, then tiles from the largest down.
    let tiles: Vec<Option<u64>> = reference_options(&with(&one, None)).unwrap().map(|o| o.tile).collect();
    assert_eq!(tiles[0], None);
    assert!(tiles[1..].windows(2).all(|w| w[0] > w[1]), "{tiles:?}");
}

#[test]
fn a_reference_beyond_the_adapters_binding_is_tiled_or_refused_up_front() {
    let model = Model::klein_4b(false);
    // 4096² × 128 channels × 4 bytes exceeds a 4 GiB binding: no untiled option, tiles instead.
    let refs = [(4096, 4096)];
    let input = PlanInput { references: &refs, ..model.input(1024, None) };
    let r = plan(&input).unwrap_or_else(|e| panic!("{e}")).references.unwrap();
    assert!(r.tile.is_some_and(|t| t < 4096), "{r:?}");
    assert!(reference_options(&input).unwrap().all(|o| o.tile.is_some()));
    // Bindings of 64 KiB hold no band with one 4096-pixel convolution row (131 channels of it).
    let tiny = DeviceLimits { max_buffer: 1 << 20, max_binding: 64 << 10, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    match reference_options(&PlanInput { limits: tiny, ..input }).map(|mut o| o.next()) {
        Err(e @ PlanError::ReferenceTooLarge { width: 4096, height: 4096, bytes, limit }) => {
            assert!(bytes > limit);
            assert!(e.to_string().contains("4096×4096 reference image"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let odd = [(1000, 1024)];
    assert!(matches!(plan(&PlanInput { references: &odd, ..model.input(1024, None) }), Err(PlanError::Size(_))));
}

/// Where the adapter cannot bind the decode, the fastest layout keeps the
/// image's activations on the device (bands of one binding between them),
/// counted whole on the device; a budget without room for them takes the
/// host's tiles; a forced tile stays on the host.
#[test]
fn a_decode_the_adapter_cannot_bind_keeps_its_activations_on_the_device_where_the_budget_holds_them() {
    let model = Model::klein_4b(false);
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    let input = PlanInput { limits: lavapipe, ..model.input(1024, None) };
    let options: Vec<VaePlan> = decode_options(&input).unwrap().collect();
    let first = options[0];
    assert_eq!((first.tile, first.on_device), (Some(1024), true), "{options:?}");
    let activations = vae::arena_bytes(&model.vae, 128, 128, false).unwrap();
    assert!(first.other_bytes > activations && first.arena_bytes <= lavapipe.max_buffer, "the activations in pages, the band arena one buffer: {first:?}");
    assert!(options[1..].iter().all(|p| !p.on_device && p.tile.is_some_and(|t| t < 1024)) && options.len() > 2, "{options:?}");
    // It costs the image's activations more than the host's largest tile: a budget chooses.
    assert!(options[1].device() + activations / 2 < first.device(), "{options:?}");
    let planned = plan(&input).unwrap().decode;
    assert_eq!((planned.tile, planned.on_device), (Some(1024), true));
    // A forced tile bands on the host; an adapter that binds the decode takes it whole.
    assert!(decode_options(&PlanInput { vae_tile: Some(256), ..input }).unwrap().all(|p| !p.on_device));
    assert_eq!(plan(&model.input(1024, None)).unwrap().decode.tile, None);
}

#[test]
fn a_forced_vae_tile_is_the_only_layout_and_is_checked_against_the_budget() {
    let model = Model::klein_4b(false);
    let free = model.input(1024, None);
    let forced = |tile, budget| PlanInput { vae_tile: Some(tile), budget, ..free };
    // The forced tile is planned (and printed by `gen --verbose`), not patched in after planning.
    let options: Vec<VaePlan> = decode_options(&forced(256, None)).unwrap().collect();
    assert_eq!(options.iter().map(|p| p.tile).collect::<Vec<_>>(), [Some(256)]);
    assert_eq!(plan(&forced(256, None)).unwrap().decode.tile, Some(256));
    // A tile that covers the image decodes it untiled, as the decoder does.
    assert_eq!(plan(&forced(1024, None)).unwrap().decode.tile, None);
    // The planned run fits its minimum; a forced untiled decode does not, and
    // is refused up front with the smallest budget that works with that tile.
    let budget = minimum_budget(&free).unwrap();
    assert!(plan(&PlanInput { budget: Some(budget), ..free }).is_ok());
    match plan(&forced(1024, Some(budget))) {
        Err(PlanError::TooSmall { phase: "the VAE decoder", minimum, .. }) => {
            assert!(minimum > budget, "{minimum} ≤ {budget}");
            assert_eq!(minimum, minimum_budget(&forced(1024, None)).unwrap());
            assert!(plan(&forced(1024, Some(minimum))).is_ok());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan(&forced(100, None)).unwrap_err(), PlanError::VaeTileSize { tile: 100, unit: 16 });
    // 16-pixel bands cannot hold one 1024-pixel row of the full-resolution convolutions (the smallest tile is 48).
    assert_eq!(plan(&forced(16, None)).unwrap_err(), PlanError::VaeTileTooSmall { tile: 16, what: "the VAE decoder" });
    assert!(plan(&forced(48, None)).is_ok());
}

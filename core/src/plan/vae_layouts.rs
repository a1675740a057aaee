//! The VAE phases' layouts: the decode and the reference images' encode,
//! untiled or by bands in an arena fixed by a tile, or the one tile the
//! caller forces.

use super::{host, Need, count, latent_grid, overhead, PlanError, PlanInput, VaePlan, DeviceLimits, REFERENCE_SIZE};
use crate::arena::BumpArena;
use crate::ir::level_words;
use crate::config::VaeConfig;
use crate::models::{vae, vae_encoder, vae_encoder_nhwc, vae_nhwc};

/// Every layout of the reference images' encode, fastest first (empty
/// without references): untiled when the adapter can bind every reference,
/// then square tiles from the largest reference's side down to the
/// smallest tile whose band holds one convolution row of each banded
/// reference. Each costs the encoder's weights and, for its costliest
/// reference, the arena and what goes through staging buffers.
pub fn reference_options<'a>(input: &'a PlanInput<'a>) -> Result<impl Iterator<Item = VaePlan> + 'a, PlanError> {
    let steps = encoder_steps(input.vae, input.limits.half_operands);
    let forced = forced_tile(input)?;
    let mut untiled = Ok(None);
    // A forced tile is the only layout (references it covers go in one pass).
    for &(width, height) in input.references.iter().filter(|_| forced.is_none()) {
        let cost = encode_whole(input, width, height, steps)?;
        untiled = match (untiled, cost) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            (Ok(most), Ok(cost)) => Ok(costlier(most, cost)),
        };
    }
    let plan_of = |tile: Option<u64>, (arena_bytes, other_bytes)| {
        // In bands the host copies one band's operands and results at a time.
        let host_bytes = host::references(input, tile.map(|_| arena_bytes));
        VaePlan { tile, on_device: false, weight_bytes: input.vae_encoder_weight_bytes, arena_bytes, other_bytes, host_bytes }.with_staging()
    };
    let unit = input.vae.latent_cell() as u64;
    let forced_plan = match (forced, input.references) {
        (Some(tile), [_, ..]) => {
            Some(encode_tiled(input, tile, steps).map(|c| plan_of(Some(tile), c)).ok_or(PlanError::VaeTileTooSmall { tile, what: "a reference image" })?)
        }
        _ => None,
    };
    let largest = if forced.is_some() { 0 } else { input.references.iter().map(|&(w, h)| w.max(h) / unit).max().unwrap_or(0) };
    let mut tiles = (1..largest).rev().filter_map(move |n| encode_tiled(input, n * unit, steps).map(|cost| plan_of(Some(n * unit), cost))).peekable();
    let whole = match untiled {
        Ok(cost) => cost.map(|c| plan_of(None, c)),
        // Refused untiled, and no tile holds the references either.
        Err(e) if tiles.peek().is_none() => return Err(e),
        Err(_) => None,
    };
    Ok(forced_plan.into_iter().chain(whole).chain(tiles))
}

/// The request's forced VAE tile, checked against the latent cell.
fn forced_tile(input: &PlanInput<'_>) -> Result<Option<u64>, PlanError> {
    let unit = input.vae.latent_cell() as u64;
    match input.vae_tile {
        Some(tile) if tile == 0 || !tile.is_multiple_of(unit) => Err(PlanError::VaeTileSize { tile, unit }),
        tile => Ok(tile),
    }
}

/// The costlier of two `(arena, other)` costs by their sum.
fn costlier(a: Option<(u64, u64)>, b: (u64, u64)) -> Option<(u64, u64)> {
    Some(a.filter(|a| a.0 + a.1 >= b.0 + b.1).unwrap_or(b))
}

/// The VAE encoder's program steps on a data path (its parameter bytes depend on them).
fn encoder_steps(cfg: &VaeConfig, channels_last: bool) -> u64 {
    let mut arena = BumpArena::new(u64::MAX);
    let unit = cfg.latent_cell() as u64;
    vae_encoder::VaeEncoderLayout::new(cfg, unit, unit, channels_last, &mut arena).map_or(0, |l| count(|emit| vae_encoder_nhwc::encode_whole(&l, emit)))
}

/// A reference encoded in one pass: `Ok(Ok((arena, other)))`, with its
/// image upload, mean readback and the parameters of the encoder's `steps`
/// as other bytes, or `Ok(Err(ReferenceTooLarge))` when the adapter cannot
/// hold it in one pass.
fn encode_whole(input: &PlanInput<'_>, width: u64, height: u64, steps: u64) -> Result<Result<(u64, u64), PlanError>, PlanError> {
    let cfg = input.vae;
    let channels_last = input.limits.half_operands;
    let arena = vae_encoder::arena_bytes(cfg, height, width, channels_last).map_err(|_| PlanError::Size(REFERENCE_SIZE))?;
    let binding = vae_encoder::largest_binding(cfg, height, width, channels_last);
    for (bytes, limit) in [(arena, input.limits.max_buffer), (binding, input.limits.max_binding)] {
        if bytes > limit {
            return Ok(Err(PlanError::ReferenceTooLarge { width, height, bytes, limit }));
        }
    }
    let scale = cfg.scale_factor() as u64;
    let mean = 4 * cfg.latent_channels as u64 * (width / scale) * (height / scale);
    let io = 4 * vae_encoder::image_row(cfg.in_channels as u64, channels_last) * width * height + mean;
    Ok(Ok((arena, io + overhead(steps) + vae::attention_operand_bytes(cfg, channels_last))))
}

/// The costliest reference's `(arena, other)` bytes when each reference
/// wider or taller than `tile` is encoded by bands, `None` when the tile
/// does not fit the adapter or its band cannot hold a banded reference's row.
fn encode_tiled(input: &PlanInput<'_>, tile: u64, steps: u64) -> Option<(u64, u64)> {
    let cfg = input.vae;
    encode_whole(input, tile, tile, steps).ok()?.ok()?;
    let capacity = vae_encoder::band_capacity(cfg, tile, input.limits.max_binding, input.limits.half_operands).ok()?;
    let band_arena = vae::band_arena_bytes(capacity);
    if band_arena > input.limits.max_buffer {
        return None;
    }
    let mut costliest: Option<(u64, u64)> = None;
    for &(width, height) in input.references {
        let cost = if width.max(height) <= tile {
            encode_whole(input, width, height, steps).ok()?.ok()?
        } else if vae_encoder_nhwc::encode_band_minimum(cfg, height, width, input.limits.half_operands).ok()? <= capacity {
            // Each band's operands and results go through a staging buffer of at most the arena.
            (band_arena, band_arena + overhead(steps) + vae::attention_operand_bytes(cfg, input.limits.half_operands))
        } else {
            return None;
        };
        costliest = costlier(costliest, cost);
    }
    costliest
}

/// Every layout of the VAE decode, fastest first: untiled when the adapter
/// can bind it; else by bands of a binding with the image's activations on
/// the device; then square tiles from the largest down to the smallest
/// whose band holds one row of the image's widest convolution, the
/// activations in a host scratch file.
pub fn decode_options<'a>(input: &'a PlanInput<'a>) -> Result<impl Iterator<Item = VaePlan> + 'a, PlanError> {
    latent_grid(input)?;
    let mut options = decode_candidates(input).peekable();
    if let (Some(tile), None) = (forced_tile(input)?, options.peek()) {
        return Err(PlanError::VaeTileTooSmall { tile, what: "the VAE decoder" });
    }
    if options.peek().is_none() {
        let scale = input.vae.scale_factor() as u64;
        let row = vae_nhwc::decode_band_minimum(input.vae, input.height / scale, input.width / scale, input.limits.half_operands).unwrap_or(u64::MAX);
        return Err(PlanError::VaeTooWide { width: input.width, bytes: row.saturating_mul(4), limit: input.limits.max_binding });
    }
    Ok(options)
}

/// Arena bytes of an untiled decode of a `lat_h × lat_w`-cell latent, if
/// the adapter can bind it (channels-last where its products take f16 inputs).
pub fn vae_arena(cfg: &VaeConfig, lat_h: u64, lat_w: u64, limits: DeviceLimits) -> Option<u64> {
    let bytes = vae::arena_bytes(cfg, lat_h, lat_w, limits.half_operands).ok().filter(|&b| b <= limits.max_buffer)?;
    (vae::largest_binding(cfg, lat_h * lat_w, limits.half_operands) <= limits.max_binding).then_some(bytes)
}

/// The decode layout with the smallest peak (both sides at `u64::MAX / 2` when none fits).
pub(super) fn smallest_decode(input: &PlanInput<'_>) -> Need {
    decode_candidates(input).min_by_key(VaePlan::peak).map(Need::from).unwrap_or(Need { device: u64::MAX / 2, host: u64::MAX / 2 })
}

/// The elements a band of a `tile`-pixel VAE tile holds in a decode whose
/// longer side is `side` pixels, if the adapter holds the tile untiled and,
/// when the tile is smaller than the image, its band holds `row` elements
/// (one row of the image's widest convolution, [`vae_nhwc::decode_band_minimum`]).
pub fn decode_tile_capacity(cfg: &VaeConfig, tile: u64, side: u64, row: u64, limits: DeviceLimits) -> Option<u64> {
    let scale = cfg.scale_factor() as u64;
    vae_arena(cfg, tile / scale, tile / scale, limits)?;
    let capacity = vae::band_capacity(cfg, tile / scale, limits.max_binding, limits.half_operands).ok()?;
    (capacity >= row || tile >= side).then_some(capacity)
}

/// The elements a band holds when a decode whose longer side is `side`
/// pixels runs by bands of one binding with the image's activations on the
/// device, if such a band holds `row` elements (one row of the image's
/// widest convolution, [`vae_nhwc::decode_band_minimum`]) and its arena fits one buffer.
pub fn decode_device_capacity(cfg: &VaeConfig, side: u64, row: u64, limits: DeviceLimits) -> Option<u64> {
    let capacity = vae::band_capacity(cfg, side / cfg.scale_factor() as u64, limits.max_binding, limits.half_operands).ok().filter(|&c| c >= row)?;
    (vae::band_arena_bytes(capacity) <= limits.max_buffer).then_some(capacity)
}

/// Decode layouts from the fastest (untiled) to the smallest tile.
fn decode_candidates<'a>(input: &'a PlanInput<'a>) -> impl Iterator<Item = VaePlan> + 'a {
    let cfg = input.vae;
    let scale = cfg.scale_factor() as u64;
    let (w, h) = (input.width, input.height);
    let weights = input.vae_weight_bytes;
    let steps = {
        let mut arena = BumpArena::new(u64::MAX);
        vae::VaeLayout::new(cfg, 2, 2, input.limits.half_operands, &mut arena).map_or(0, |l| count(|emit| vae_nhwc::decode_whole(&l, input.limits.half_operands, emit)))
    };
    // Beside every layout's arena: the programs' parameters and the chunked
    // attention's right operands (channels-last).
    let overhead_bytes = overhead(steps) + vae::attention_operand_bytes(cfg, input.limits.half_operands);
    // Untiled, the image's 8-bit levels (a byte each) come back through one staging buffer.
    let levels = 4 * level_words(3 * w * h);
    let whole = vae_arena(cfg, h / scale, w / scale, input.limits)
        .map(|arena| VaePlan { tile: None, on_device: false, weight_bytes: weights, arena_bytes: arena, other_bytes: levels + overhead_bytes, host_bytes: host::decode(input, None) }.with_staging());
    let unit = 2 * scale;
    let largest = w.max(h) / unit;
    // A band must hold one row of the image's widest convolution.
    let row = vae_nhwc::decode_band_minimum(cfg, h / scale, w / scale, input.limits.half_operands).unwrap_or(u64::MAX);
    // A forced tile is the only layout: untiled when it covers the image.
    let forced = input.vae_tile;
    let covers = forced.is_some_and(|t| t >= w.max(h));
    let whole = whole.filter(|_| forced.is_none() || covers);
    // Where the adapter cannot bind the decode: the activations in device
    // buffers no kernel binds (the whole image's arena, in pages of the
    // largest buffer), bands of one binding between them and the band
    // arena; the decoded values come back as an untiled decode's do.
    let on_device = match (&whole, forced) {
        (None, None) => vae::arena_bytes(cfg, h / scale, w / scale, input.limits.half_operands).ok().zip(decode_device_capacity(cfg, w.max(h), row, input.limits)).map(|(activations, capacity)| {
            let arena = vae::band_arena_bytes(capacity);
            let host_bytes = host::decode_device_bands(input);
            // The activations' pages are other device bytes: no kernel binds them.
            VaePlan { tile: Some(w.max(h)), on_device: true, weight_bytes: weights, arena_bytes: arena, other_bytes: activations + levels + overhead_bytes, host_bytes }.with_staging()
        }),
        _ => None,
    };
    // Tile sizes in cells of `unit` pixels; none when a forced tile covers the image.
    let (first, last) = match forced {
        Some(_) if covers => (1, 0),
        Some(t) => (t / unit, t / unit),
        None => (1, largest),
    };
    let sizes = first..=last;
    let tiles = sizes.rev().filter_map(move |n| {
        let tile = n * unit;
        let capacity = decode_tile_capacity(cfg, tile, w.max(h), row, input.limits)?;
        let arena = vae::band_arena_bytes(capacity);
        // Each band's result, and each chunk of levels, comes back through a
        // staging buffer of at most the arena: nothing grows with the image.
        let host_bytes = host::decode(input, Some(arena));
        Some(VaePlan { tile: Some(tile), on_device: false, weight_bytes: weights, arena_bytes: arena, other_bytes: arena + overhead_bytes, host_bytes }.with_staging())
    });
    whole.into_iter().chain(on_device).chain(tiles)
}

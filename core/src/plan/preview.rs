//! The tiny preview decoder's layouts, resident beside the transformer
//! while it denoises: the whole image in one pass when the adapter can
//! bind it; by bands of the binding's size with the whole image's
//! activations on the device, when one buffer, or a few, can hold them;
//! then by bands in the arena of ever smaller square tiles with the
//! activations in a host scratch file (as the VAE decodes a large image),
//! each with its device and host bytes. The planner takes the fastest one
//! the budget holds with the transformer.

use super::{overhead, DeviceLimits, PlanError};
use crate::models::tiny_decoder::{self as tiny, TinyDecoderConfig};
use crate::models::vae::band_arena_bytes;
use crate::ir::level_words;

/// One way to run the preview decoder, and what it holds while the transformer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PreviewLayout {
    /// `None`: the whole image in one pass; else by bands in the arena a
    /// `tile`-pixel square would take in one pass.
    pub tile: Option<u64>,
    /// Where a banded decode keeps the whole image's activations between
    /// its ops: on the device (moved to and from the band by copies there),
    /// or in a host scratch file. `true` for a whole decode.
    pub on_device: bool,
    /// Device bytes: its weights, its arena, what its results come back
    /// through, its dispatches' parameters.
    pub device: u64,
    /// Host bytes: what a decode copies and holds (a banded one's
    /// activations live in a scratch file, as the banded VAE's).
    pub host: u64,
}

/// The most layouts [`preview_layouts`] lists (tiles halve from the image's
/// side, so 64 cover any size).
pub const MAX_PREVIEW_LAYOUTS: usize = 64;

/// Preview layouts, fastest first.
pub type PreviewLayouts = heapless::Vec<PreviewLayout, MAX_PREVIEW_LAYOUTS>;

/// Every layout of a `width × height` preview decode (channels-last where
/// the device's products take f16 inputs), fastest first:
/// whole when the adapter can bind it (and no tile is forced, or the
/// forced one covers the image); else by bands of the largest binding with
/// the activations on the device (no tile forced); then with them on the
/// host, by bands at the forced tile only, or at tiles halving from below
/// the image's longer side while a band holds one row of the widest
/// convolution. `weights`: the decoder's
/// device bytes of weights. Fails, naming the bytes, when none fits.
pub fn preview_layouts(cfg: &TinyDecoderConfig, width: u64, height: u64, weights: u64, limits: DeviceLimits, forced: Option<u64>) -> Result<PreviewLayouts, PlanError> {
    let scale = cfg.scale();
    let unit = 2 * scale;
    if width == 0 || height == 0 || !width.is_multiple_of(unit) || !height.is_multiple_of(unit) {
        return Err(PlanError::Size("the preview decoder takes sides that are positive multiples of twice its scale factor"));
    }
    let too_large = PlanError::Size("the image is too large for the preview decoder");
    if let Some(tile) = forced.filter(|&t| t == 0 || !t.is_multiple_of(unit)) {
        return Err(PlanError::VaeTileSize { tile, unit });
    }
    let (lat_h, lat_w) = (height / scale, width / scale);
    let pixels = width * height;
    let nhwc = limits.half_operands;
    let steps = crate::models::tiny_decoder_nhwc::steps(cfg, nhwc);
    let mut layouts = PreviewLayouts::new();
    let covers = forced.is_none_or(|t| t >= width.max(height));
    let whole_arena = tiny::arena_bytes(cfg, lat_h, lat_w, nhwc).map_err(|_| too_large)?;
    let binding = cfg.largest_binding(lat_h * lat_w, nhwc);
    if covers && whole_arena <= limits.max_buffer && binding <= limits.max_binding {
        // The levels come back (a byte each) through a staging buffer, then become RGB on the host.
        let levels = 4 * level_words(3 * pixels);
        let _ = layouts.push(PreviewLayout { tile: None, on_device: true, device: weights + whole_arena + levels + overhead(steps), host: levels + 3 * pixels });
    }
    let row = crate::models::tiny_decoder_nhwc::band_minimum(cfg, lat_h, lat_w, nhwc).map_err(|_| too_large)?;
    if layouts.is_empty() && forced.is_none() {
        // The image's activations in buffers no kernel binds, bands of the
        // binding's size between them; the levels come back as whole ones do.
        let side = width.max(height);
        let capacity = tiny::band_capacity(cfg, side / scale, limits.max_binding, nhwc).map_err(|_| too_large)?;
        let arena = band_arena_bytes(capacity);
        if capacity >= row && arena <= limits.max_buffer {
            let levels = 4 * level_words(3 * pixels);
            let device = weights + whole_arena + arena + levels + overhead(steps);
            let _ = layouts.push(PreviewLayout { tile: Some(side), on_device: true, device, host: levels + 3 * pixels });
        }
    }
    let halving = core::iter::successors(Some(width.max(height).div_ceil(2).next_multiple_of(unit)), move |&t| (t > unit).then(|| (t / 2).next_multiple_of(unit)));
    let tiles: heapless::Vec<u64, MAX_PREVIEW_LAYOUTS> = match forced {
        Some(t) if !covers => core::iter::once(t).collect(),
        Some(_) => heapless::Vec::new(),
        None => halving.filter(|&t| t < width.max(height)).take(MAX_PREVIEW_LAYOUTS - 1).collect(),
    };
    let mut smallest_band = None;
    for tile in tiles {
        let Ok(capacity) = tiny::band_capacity(cfg, tile / scale, limits.max_binding, nhwc) else { continue };
        smallest_band = Some(capacity);
        let arena = band_arena_bytes(capacity);
        // Each band's operands and results go through a staging buffer of at
        // most the arena, and through the host's memory; the RGB is whole.
        let banded = PreviewLayout { tile: Some(tile), on_device: false, device: weights + 2 * arena + overhead(steps), host: arena + 3 * pixels };
        // A tile whose band the binding caps as it capped the last one's is the same layout.
        let same = layouts.last().is_some_and(|l| l.tile.is_some() && !l.on_device && l.device == banded.device);
        if capacity < row || arena > limits.max_buffer || same {
            continue;
        }
        let _ = layouts.push(banded);
    }
    if layouts.is_empty() {
        if let (Some(tile), false) = (forced, covers) {
            if smallest_band.is_none_or(|c| c < row) {
                return Err(PlanError::VaeTileTooSmall { tile, what: "the preview decoder" });
            }
        }
        return Err(PlanError::PreviewTooWide { width, bytes: 4 * row, limit: limits.max_binding });
    }
    Ok(layouts)
}

//! The transformer's phase in the plan: its layouts (unchunked, or every
//! per-token stage of its blocks over chunks of tokens; then, by chunks,
//! with keys and values in half precision), each checked against the
//! adapter's largest buffer and binding, under every weight strategy.

use super::*;
use crate::models::transformer::KvMode;

/// The transformer's token rows: the prompt's, the image's and the references'.
pub(super) fn transformer_rows(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    let (lat_h, lat_w) = latent_grid(input)?;
    Ok(input.prompt_tokens + lat_h * lat_w + reference_tokens(input)?)
}

/// The transformer's largest storage binding: attention binds the keys of
/// every token at once, `D`-wide rows when the projections are chunked
/// (`chunk: Some`; `D/2` words with keys in half precision), a column
/// window of the fused projection's `3D + 2F`-wide rows when not.
pub(super) fn attention_binding(input: &PlanInput<'_>, rows: u64, chunk: Option<u64>, half_kv: bool) -> u64 {
    let c = input.transformer;
    let (d, f) = (c.inner_dim() as u64, c.mlp_hidden_dim() as u64);
    let width = match (chunk, half_kv) {
        (Some(_), true) => d / 2,
        (Some(_), false) => d,
        (None, _) => 3 * d + 2 * f,
    };
    rows.saturating_mul(width).saturating_mul(4)
}

/// The transformer's phase: for each weight strategy, unchunked or with
/// its blocks' per-token stages over chunks of tokens, and with the
/// KV pipeline the reference cache kept, else recomputed every step. The
/// bytes that do not depend on the strategy are laid out once per chunk size.
#[derive(Debug, Clone)]
pub(super) struct DenoiseOptions {
    weights: WeightSizes,
    /// The layouts of each way to treat the references, preferred first,
    /// with f32 keys and values, then (by chunks) with half-precision ones.
    modes: heapless::Vec<ModeLayouts, 4>,
    /// Host bytes (the same chunked or not).
    host: u64,
    /// The preview decoder's layout, resident beside the transformer.
    preview: Option<PreviewLayout>,
}

/// The layouts of one [`KvMode`] and key-value precision.
#[derive(Debug, Clone)]
struct ModeLayouts {
    mode: KvMode,
    /// Keys and values in half precision (the half-K/V layout: by chunks only).
    half_kv: bool,
    /// Arena and other bytes unchunked; `None` when the unchunked single
    /// blocks' keys (a column window of the fused projection, whose rows are
    /// `3D + 2F` wide) exceed one storage binding.
    unchunked: Option<(u64, u64)>,
    /// `(chunk, (arena, other))` for each chunk `CHUNK_ROWS · 2ᵏ` below the token count, largest first.
    chunked: heapless::Vec<(u64, (u64, u64)), 64>,
}

impl DenoiseOptions {
    pub(super) fn new(input: &PlanInput<'_>) -> Result<Self, PlanError> {
        let rows = transformer_rows(input)?;
        let keys = |chunk: Option<u64>, half_kv: bool| attention_binding(input, rows, chunk, half_kv);
        let limit = input.limits.max_binding;
        if keys(Some(CHUNK_ROWS), true) > limit {
            return Err(PlanError::AttentionTooLarge { tokens: rows, bytes: keys(Some(CHUNK_ROWS), true), limit });
        }
        // The arena is one device buffer: layouts larger than the adapter's
        // largest buffer are not offered.
        let max_buffer = input.limits.max_buffer;
        let mut smallest_arena = u64::MAX;
        let mut fits = |fixed: (u64, u64)| {
            smallest_arena = smallest_arena.min(fixed.0);
            fixed.0 <= max_buffer
        };
        let kv_pipeline = input.kv_cache && !input.references.is_empty();
        // The half-K/V layout does not keep the KV cache (its copies move f32 rows).
        let wanted: &[(KvMode, bool)] = if kv_pipeline {
            &[(KvMode::Keep, false), (KvMode::Recompute, false), (KvMode::Recompute, true)]
        } else {
            &[(KvMode::Off, false), (KvMode::Off, true)]
        };
        let mut modes = heapless::Vec::new();
        for &(mode, half_kv) in wanted.iter().filter(|(_, half_kv)| input.kv_precision.allows(*half_kv)) {
            // Keys wider than a binding rule a layout out (f32 ones first).
            if keys(Some(CHUNK_ROWS), half_kv) > limit {
                continue;
            }
            let unchunked = if !half_kv && keys(None, false) <= limit { Some(denoise_fixed(input, rows, mode, false)?).filter(|&u| fits(u)) } else { None };
            let mut chunked = heapless::Vec::new();
            let largest_shift = u64::BITS - 1 - CHUNK_ROWS.ilog2();
            for chunk in (0..=largest_shift).rev().map(|k| CHUNK_ROWS << k).filter(|&c| c < rows) {
                let fixed = denoise_fixed(input, chunk, mode, half_kv)?;
                if fits(fixed) {
                    // At most 58 shifts fit in 64 bits: the list never overflows.
                    let _ = chunked.push((chunk, fixed));
                }
            }
            if unchunked.is_some() || !chunked.is_empty() {
                // At most three modes.
                let _ = modes.push(ModeLayouts { mode, half_kv, unchunked, chunked });
            }
        }
        if modes.is_empty() {
            if smallest_arena != u64::MAX {
                return Err(PlanError::ArenaTooLarge { phase: "the transformer", bytes: smallest_arena, limit: max_buffer });
            }
            return Err(PlanError::AttentionTooLarge { tokens: rows, bytes: keys(None, false), limit });
        }
        Ok(Self { weights: input.transformer_weights, modes, host: host::denoise(input)?, preview: input.previews.first().copied() })
    }

    /// The same layouts with `preview` beside the transformer (`None`: no preview decoder).
    pub(super) fn with_preview(&self, preview: Option<PreviewLayout>) -> Self {
        Self { preview, ..self.clone() }
    }

    /// The phase under `weights` with `chunk` rows per pass (`None`: all),
    /// given its arena and other bytes (the preview decoder's added to them
    /// and to the host's).
    fn phase(&self, m: &ModeLayouts, weights: WeightStrategy, chunk: Option<u64>, fixed: (u64, u64)) -> PhasePlan {
        self.phase_beside(self.preview, m, weights, chunk, fixed)
    }

    /// [`Self::phase`] with `preview` beside the transformer instead.
    fn phase_beside(&self, preview: Option<PreviewLayout>, m: &ModeLayouts, weights: WeightStrategy, chunk: Option<u64>, (arena_bytes, other_bytes): (u64, u64)) -> PhasePlan {
        let preview = preview.unwrap_or_default();
        let other_bytes = other_bytes + preview.device;
        let host_bytes = self.host + preview.host;
        let weight_bytes = self.weights.bytes(weights);
        PhasePlan { weights, chunk, weight_bytes, arena_bytes, other_bytes, host_bytes, kv_cache: m.mode, half_kv: m.half_kv }.with_staging()
    }

    /// The phase under `weights` with each chunk size of `m`, largest first.
    fn mode_chunked<'a>(&'a self, m: &'a ModeLayouts, weights: WeightStrategy) -> impl Iterator<Item = PhasePlan> + 'a {
        m.chunked.iter().map(move |&(chunk, fixed)| self.phase(m, weights, Some(chunk), fixed))
    }

    /// The phase under `weights` with each chunk size, largest first, mode by mode.
    #[cfg(test)]
    pub(super) fn chunked(&self, weights: WeightStrategy) -> impl Iterator<Item = PhasePlan> + '_ {
        self.modes.iter().flat_map(move |m| self.mode_chunked(m, weights))
    }

    /// For each mode, the phase under `weights` unchunked, then with the
    /// chunk that needs the least memory if the tokens span more than one
    /// (smaller chunks need less scratch but more dispatch parameters).
    pub(super) fn least_of(&self, weights: WeightStrategy) -> impl Iterator<Item = PhasePlan> + '_ {
        self.modes.iter().flat_map(move |m| {
            let smallest = self.mode_chunked(m, weights).min_by_key(PhasePlan::peak);
            [m.unchunked.map(|u| self.phase(m, weights, None, u)), smallest].into_iter().flatten()
        })
    }

    /// With f32 keys and values (exact) before half-precision ones, each
    /// weight strategy in turn, fastest first, and in each the references'
    /// cache kept before recomputed: unchunked if it fits, else with the
    /// largest chunk that fits; each layout with the fastest of `previews`
    /// (the preview decoder's layouts, fastest first) that fits beside it,
    /// so the transformer's speed comes before the preview's. Empty
    /// `previews`: no preview decoder.
    pub(super) fn fastest_within(&self, budget: u64, previews: &[PreviewLayout]) -> Option<(PhasePlan, Option<PreviewLayout>)> {
        let none = [None];
        let some: heapless::Vec<Option<PreviewLayout>, 32> = previews.iter().take(32).map(|&p| Some(p)).collect();
        let choices: &[Option<PreviewLayout>] = if previews.is_empty() { &none } else { &some };
        [false, true].into_iter().find_map(|half_kv| {
            self.weights.strategies().find_map(|s| {
                self.modes.iter().filter(|m| m.half_kv == half_kv).find_map(|m| {
                    let unchunked = m.unchunked.map(|u| (None, u));
                    let layouts = unchunked.into_iter().chain(m.chunked.iter().map(|&(chunk, fixed)| (Some(chunk), fixed)));
                    layouts.into_iter().find_map(|(chunk, fixed)| {
                        choices.iter().find_map(|&p| Some((self.phase_beside(p, m, s, chunk, fixed), p)).filter(|(d, _)| d.peak() <= budget))
                    })
                })
            })
        })
    }

    pub(super) fn smallest(&self) -> Need {
        self.weights.strategies().flat_map(|s| self.least_of(s)).min_by_key(PhasePlan::peak).map(Need::from).unwrap_or_default()
    }
}

/// The transformer's arena with `chunk` token rows per pass of its
/// per-token stages (and keys and values in half precision with
/// `half_kv`), and its other bytes: RoPE tables, the unconditional
/// velocity, readback of the latents, dispatch parameters.
pub(super) fn denoise_fixed(input: &PlanInput<'_>, chunk: u64, mode: KvMode, half_kv: bool) -> Result<(u64, u64), PlanError> {
    let c = input.transformer;
    let (lat_h, lat_w) = latent_grid(input)?;
    let image = lat_h * lat_w;
    let text = input.prompt_tokens;
    let tokens = transformer::Tokens { text, noise: image, references: reference_tokens(input)?, kv_cache: mode, half_kv, half_operands: input.limits.half_operands };
    let mut arena = BumpArena::new(u64::MAX);
    let l = transformer::TransformerLayout::chunked(c, tokens, chunk, &mut arena)
        .map_err(|_| PlanError::Size("the image is too large to lay out"))?;
    // With the KV cache kept, both passes' programs are prepared.
    let passes = match l.kv {
        Some(kv) if kv.cache.is_some() => [Some(l.with_pass(transformer::KvPass::Extract)), Some(l.with_pass(transformer::KvPass::Cached))],
        _ => [Some(l.clone()), None],
    };
    // Where the blocks' attention runs as products on the GEMM core (over every row, unchunked): their buffers.
    let (mut steps, mut products) = (1, crate::ir::ProductBuffers::default());
    for l in passes.iter().flatten() {
        steps += count(|emit| transformer::prologue(l, emit)) + count(|emit| transformer::epilogue(l, emit));
        if c.num_layers > 0 {
            steps += c.num_layers as u64 * count_sizing(|emit| transformer::double_block(l, 0, emit), &mut products, &input.limits);
        }
        if c.num_single_layers > 0 {
            steps += c.num_single_layers as u64 * count_sizing(|emit| transformer::single_block(l, 0, emit), &mut products, &input.limits);
        }
    }
    let tables = 2 * 4 * (text + tokens.image()) * c.attention_head_dim as u64;
    let unconditional = 4 * image * c.out_channels as u64;
    let readback = 4 * image * c.in_channels as u64;
    Ok((arena.high_water(), tables + unconditional + readback + products.bytes() + overhead(steps)))
}

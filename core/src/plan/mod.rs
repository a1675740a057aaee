//! The memory plan. For an image size, a prompt length and a budget it lays
//! out every device byte of each phase (encode, denoise, decode), beside the
//! host bytes the engine allocates in it ([`host`]), and picks, per phase,
//! the fastest way to hold the weights whose device and host bytes together
//! fit:
//!
//! 1. all weights resident as bf16 (DF11 groups expanded once at load);
//! 2. DF11 groups resident compressed, expanded per block into two, then one, bf16 slot;
//! 3. every block's weights streamed from host memory into two, then one, slot.
//!
//! The VAE decodes untiled when that fits, else in the largest tile that
//! does. When nothing fits, the error names the smallest budget that would.
//! Pure arithmetic over the configs: no weights are read.

use crate::arena::BumpArena;
use crate::config::{ImageSize, Qwen3Config, TransformerConfig, VaeConfig};
use crate::ir::Op;
use crate::models::{text_encoder, transformer};
use core::fmt;

/// Device bytes for what the plan does not itemise: the placeholder binding,
/// the parameter buffers of dispatches (a few dozen bytes each) and the
/// matrix tier's range scales (RANGE_SCALES_BYTES).
pub const FIXED_OVERHEAD: u64 = (64 << 10) + RANGE_SCALES_BYTES;
/// The matrix tier's range scales: 4 bytes for each row of a product's two
/// operands, measured before the product; a product with more rows runs in pieces.
pub const RANGE_SCALES_BYTES: u64 = 512 << 10;
/// Parameter bytes allowed per program step (a step may split into several dispatches).
pub const OVERHEAD_PER_STEP: u64 = 512;
/// Host-visible bytes streamed weights pass through on their way to a slot
/// (at most; a smaller model's largest block if less).
pub const STREAM_STAGING: u64 = 64 << 20;
/// Most device bytes streamed DF11 groups pass through compressed on their
/// way to a slot; a larger group streams through in runs of its blocks.
pub const DF11_STREAM_AREA: u64 = 64 << 20;
/// Host bytes that weights uploaded to stay resident pass through (16 MiB:
/// a smaller figure only adds waits, a larger one is held while loading): the
/// uploads are flushed whenever this much waits in staging, so loading a
/// model never holds a second copy of it on the host.
pub const UPLOAD_STAGING: u64 = 16 << 20;
/// Byte alignment of each weight in a slot: a binding offset (`df11_decode`
/// starts groups on 128 elements); device weight sizes are counted in it.
pub const SLOT_ALIGN: u64 = 256;
/// Compressed size of a DF11 group as a fraction of its bf16 bytes, for
/// plans made without the files: 70.1% measured on the tiny test model,
/// 70% in the published klein DF11 checkpoints.
pub const DF11_ESTIMATE_PERCENT: u64 = 71;

/// The device and host bytes of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhasePlan {
    pub weights: WeightStrategy,
    /// Token rows per pass of the transformer's per-token stages (a
    /// multiple of [`CHUNK_ROWS`]); `None`: all rows at once.
    pub chunk: Option<u64>,
    pub weight_bytes: u64,
    /// The activation arena.
    pub arena_bytes: u64,
    /// Tables, masks, result buffers, readback staging and dispatch parameters.
    pub other_bytes: u64,
    /// What the engine allocates on the host meanwhile ([`host`]).
    pub host_bytes: u64,
    /// How the transformer treats the references with the KV pipeline
    /// (`Off` for every other phase and pipeline).
    pub kv_cache: crate::models::transformer::KvMode,
    /// The transformer's keys and values in half precision (the half-K/V
    /// layout, by chunks; `false` for every other phase).
    pub half_kv: bool,
}

impl PhasePlan {
    /// Device bytes.
    pub fn device(&self) -> u64 {
        self.weight_bytes + self.arena_bytes + self.other_bytes
    }

    /// Device and host bytes: what the budget bounds.
    pub fn peak(&self) -> u64 {
        self.device() + self.host_bytes
    }

    /// With the host staging its uploads pass through.
    fn with_staging(self) -> Self {
        Self { host_bytes: self.host_bytes + host::staging(self.device()), ..self }
    }
}

impl fmt::Display for PhasePlan {
    /// The strategy, and the chunking when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.weights)?;
        if let Some(rows) = self.chunk {
            write!(f, ", by {rows}-token chunks")?;
        }
        if self.half_kv {
            write!(f, ", keys and values in f16")?;
        }
        match self.kv_cache {
            crate::models::transformer::KvMode::Keep => write!(f, ", the references' keys and values cached"),
            crate::models::transformer::KvMode::Recompute => write!(f, ", the references' keys and values recomputed each step"),
            crate::models::transformer::KvMode::Off => Ok(()),
        }
    }
}

/// Token rows per chunk of chunked linears are this (the linear kernel's
/// row tile) times a power of two.
pub const CHUNK_ROWS: u64 = 64;

/// A VAE phase, the decode or the reference images' encode: untiled
/// (`tile: None`), or by bands in an arena the size a `tile`-pixel square
/// needs untiled (no larger than one binding). The encode takes the
/// references one after another, each no larger than the tile in one pass;
/// its bytes are the costliest reference's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VaePlan {
    pub tile: Option<u64>,
    /// Banded, where the image's activations wait between bands: in device
    /// buffers no kernel binds (`true`: a band moves by copies on the
    /// device), or in a host scratch file. `false` when untiled.
    pub on_device: bool,
    pub weight_bytes: u64,
    pub arena_bytes: u64,
    pub other_bytes: u64,
    /// What the engine allocates on the host meanwhile ([`host`]).
    pub host_bytes: u64,
}

impl VaePlan {
    /// Device bytes.
    pub fn device(&self) -> u64 {
        self.weight_bytes + self.arena_bytes + self.other_bytes
    }

    /// Device and host bytes: what the budget bounds.
    pub fn peak(&self) -> u64 {
        self.device() + self.host_bytes
    }

    /// With the host staging its uploads pass through.
    pub(crate) fn with_staging(self) -> Self {
        Self { host_bytes: self.host_bytes + host::staging(self.device()), ..self }
    }
}

/// Every device and host byte of a run, phase by phase. Phases run one
/// after another and each frees its memory before the next allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub encode: PhasePlan,
    /// `None` without reference images.
    pub references: Option<VaePlan>,
    pub denoise: PhasePlan,
    pub decode: VaePlan,
    /// The preview decoder's layout (counted in `denoise`); `None` without one.
    pub preview: Option<PreviewLayout>,
}

impl Plan {
    /// The largest phase's device and host bytes together: what the budget bounds.
    pub fn peak(&self) -> u64 {
        self.largest(PhasePlan::peak, VaePlan::peak)
    }

    /// The most device bytes of any phase.
    pub fn device_peak(&self) -> u64 {
        self.largest(PhasePlan::device, VaePlan::device)
    }

    /// The most host bytes of any phase.
    pub fn host_peak(&self) -> u64 {
        self.largest(|p| p.host_bytes, |v| v.host_bytes)
    }

    /// The largest buffer the run creates: a phase's activation arena (each
    /// phase's arena is one buffer; every weight tensor is smaller).
    pub fn largest_buffer(&self) -> u64 {
        self.largest(|p| p.arena_bytes, |v| v.arena_bytes)
    }

    fn largest(&self, phase: impl Fn(&PhasePlan) -> u64, vae: impl Fn(&VaePlan) -> u64) -> u64 {
        let references = self.references.as_ref().map_or(0, &vae);
        phase(&self.encode).max(references).max(phase(&self.denoise)).max(vae(&self.decode))
    }
}

/// What the adapter allows for one buffer and one binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_buffer: u64,
    pub max_binding: u64,
    /// Whether the device's products take f16 inputs under range scales
    /// (the matrix tier with f16 operands), which halves the bytes of the
    /// transformer's normalised rows ([`crate::models::transformer::Tokens::half_operands`]).
    pub half_operands: bool,
    /// Which attentions run as products on the GEMM core
    /// ([`crate::ir::HeadsOnProducts`]: the matrix tier's, on the paths where
    /// its flash kernel's check failed), which take a scratch beside the arena.
    pub attention_products: crate::ir::AttentionProducts,
}

impl DeviceLimits {
    /// WebGPU's default limits, which every adapter grants: 256 MiB buffers, 128 MiB bindings.
    pub const WEBGPU_DEFAULT: DeviceLimits = DeviceLimits { max_buffer: 256 << 20, max_binding: 128 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
}

/// Everything a plan depends on.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    pub transformer: &'a TransformerConfig,
    pub text_encoder: &'a Qwen3Config,
    pub vae: &'a VaeConfig,
    pub width: u64,
    pub height: u64,
    pub prompt_tokens: u64,
    /// The reference images' sizes `(width, height)` in pixels, as encoded
    /// (multiples of twice the VAE scale factor); empty without references.
    pub references: &'a [(u64, u64)],
    pub transformer_weights: WeightSizes,
    pub text_encoder_weights: WeightSizes,
    /// The VAE decoder's weights, always resident.
    pub vae_weight_bytes: u64,
    /// The VAE encoder's weights (read only with references), always resident.
    pub vae_encoder_weight_bytes: u64,
    pub limits: DeviceLimits,
    /// `None`: no limit; every phase takes its fastest strategy.
    pub budget: Option<u64>,
    /// Host bytes of the loaded tokenizer.
    pub tokenizer_bytes: u64,
    /// A VAE tile (pixels) the caller forces on the decode and the
    /// references' encode instead of choosing one; `None`: planned. A tile
    /// that covers an image runs it untiled, as the decoder and encoder do.
    pub vae_tile: Option<u64>,
    /// Whether the reference tokens' keys and values are cached after the
    /// first step (the klein KV pipeline): the cache is in the transformer's
    /// arena, and a second program (the cached pass) is prepared.
    pub kv_cache: bool,
    /// The tiny preview decoder's layouts ([`preview_layouts`]), fastest
    /// first, one of them resident beside the transformer while it
    /// denoises; empty without one.
    pub previews: &'a [PreviewLayout],
    /// The precisions the transformer's keys and values may take.
    pub kv_precision: KvPrecision,
}

/// The precisions the transformer's keys and values may take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvPrecision {
    /// f32 where a layout with them fits the budget, else f16 (the half-K/V layout).
    #[default]
    Auto,
    /// f32 only: the exact path; what only f16 keys and values would fit is refused.
    F32,
    /// f16 only (the half-K/V layout, by chunks), whatever fits.
    F16,
}

impl KvPrecision {
    /// Whether keys and values in half precision (`half_kv`) are allowed.
    pub fn allows(self, half_kv: bool) -> bool {
        match self {
            KvPrecision::Auto => true,
            KvPrecision::F32 => !half_kv,
            KvPrecision::F16 => half_kv,
        }
    }
}

/// Plans a run: each phase's fastest strategy within the budget.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let encode = encode_input(input)?;
    let denoise = DenoiseOptions::new(input)?;
    let budget = input.budget.unwrap_or(u64::MAX);
    let references = reference_options(input)?;
    let too_small = |phase: &'static str| {
        let need = run_minimum(encode, &denoise, input);
        PlanError::TooSmall { budget, phase, minimum: need.total(), device: need.device, host: need.host }
    };
    let references = match input.references {
        [] => None,
        _ => Some(references.into_iter().find(|r| r.peak() <= budget).ok_or_else(|| too_small("the VAE encoder"))?),
    };
    let (denoise, preview) = denoise.fastest_within(budget, input.previews).ok_or_else(|| too_small("the transformer"))?;
    Ok(Plan {
        encode: encode.fastest_within(budget).ok_or_else(|| too_small("the text encoder"))?,
        references,
        denoise,
        decode: decode_options(input)?.find(|p| p.peak() <= budget).ok_or_else(|| too_small("the VAE decoder"))?,
        preview,
    })
}

/// The largest storage binding of `plan` that the planner checks against
/// the adapter's limit: the transformer's attention keys, the VAE decoder's
/// largest activation (the image's untiled, else a tile's), and each
/// reference encoded in one pass. Other windows (weights, linears' rows)
/// are split under the limit by the dispatcher.
pub fn largest_binding(input: &PlanInput<'_>, plan: &Plan) -> Result<u64, PlanError> {
    let attention = denoise::attention_binding(input, denoise::transformer_rows(input)?, plan.denoise.chunk, plan.denoise.half_kv);
    let cfg = input.vae;
    let scale = cfg.scale_factor() as u64;
    let (lat_h, lat_w) = match plan.decode.tile {
        None => (input.height / scale, input.width / scale),
        Some(t) => (t / scale, t / scale),
    };
    let decode = match plan.decode.on_device {
        // Bands of one binding: their operands take at most the band's capacity.
        true => 4 * crate::models::vae::band_capacity(cfg, lat_h, input.limits.max_binding, input.limits.half_operands).map_err(|_| PlanError::Size("the VAE decode's bands"))?,
        false => crate::models::vae::largest_binding(cfg, lat_h * lat_w, input.limits.half_operands),
    };
    let encode_tile = plan.references.and_then(|r| r.tile);
    let whole = |&&(w, h): &&(u64, u64)| encode_tile.is_none_or(|t| w.max(h) <= t);
    let encoded = input.references.iter().filter(whole).copied().chain(encode_tile.map(|t| (t, t)));
    let references = encoded.map(|(w, h)| crate::models::vae_encoder::largest_binding(cfg, h, w, input.limits.half_operands));
    Ok(references.fold(attention.max(decode), u64::max))
}

/// Plans the text encoder's phase alone (`flux-lite encode`): its fastest
/// strategy within `budget` for `prompt_tokens` tokens, one prompt's
/// embedding held at a time (on the half-precision data path where the
/// device's `limits` have f16 operands).
pub fn plan_encode(c: &Qwen3Config, prompt_tokens: u64, limits: DeviceLimits, weights: WeightSizes, tokenizer_bytes: u64, budget: Option<u64>) -> Result<PhasePlan, PlanError> {
    let options = encode_phase(c, prompt_tokens, limits, weights, host::text_encoder(c, prompt_tokens, tokenizer_bytes, 1))?;
    let budget = budget.unwrap_or(u64::MAX);
    let need = options.smallest();
    options.fastest_within(budget).ok_or(PlanError::TooSmall { budget, phase: "the text encoder", minimum: need.total(), device: need.device, host: need.host })
}

/// The smallest budget under which the whole run works: the largest of the
/// phases' smallest peaks (each phase frees its memory before the next).
pub fn minimum_budget(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    Ok(minimum_need(input)?.total())
}

/// The smallest budget's two sides, in the phase that needs it.
pub fn minimum_need(input: &PlanInput<'_>) -> Result<Need, PlanError> {
    let encode = encode_input(input)?;
    let denoise = DenoiseOptions::new(input)?;
    let _ = reference_options(input)?;
    let _ = decode_options(input)?;
    Ok(run_minimum(encode, &denoise, input))
}

/// A phase's bytes on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Need {
    pub device: u64,
    pub host: u64,
}

impl Need {
    pub fn total(&self) -> u64 {
        self.device + self.host
    }
}

impl From<PhasePlan> for Need {
    fn from(p: PhasePlan) -> Self {
        Need { device: p.device(), host: p.host_bytes }
    }
}

impl From<VaePlan> for Need {
    fn from(p: VaePlan) -> Self {
        Need { device: p.device(), host: p.host_bytes }
    }
}

/// The costliest phase's smallest layout: the run's minimum budget.
fn run_minimum(encode: PhaseOptions, denoise: &DenoiseOptions, input: &PlanInput<'_>) -> Need {
    let references = reference_options(input).ok().and_then(|o| o.map(Need::from).min_by_key(Need::total)).unwrap_or_default();
    // The preview decoder's smallest layout is its last.
    let denoise = denoise.with_preview(input.previews.last().copied()).smallest();
    [encode.smallest(), references, denoise, smallest_decode(input)].into_iter().max_by_key(Need::total).unwrap_or_default()
}

/// Every strategy for the text encoder's phase, fastest first, with its bytes.
pub fn encode_options(input: &PlanInput<'_>) -> Result<impl Iterator<Item = PhasePlan>, PlanError> {
    Ok(encode_input(input)?.iter())
}

/// Every strategy for the transformer's phase, fastest first, with its
/// bytes: each weight strategy unchunked, then with the chunk that needs
/// the least memory when the tokens span more than one chunk.
pub fn denoise_options(input: &PlanInput<'_>) -> Result<impl Iterator<Item = PhasePlan>, PlanError> {
    let options = DenoiseOptions::new(input)?;
    let all: heapless::Vec<PhasePlan, 20> = input.transformer_weights.strategies().flat_map(|s| options.least_of(s)).collect();
    Ok(all.into_iter())
}

/// A phase's weight sizes and its bytes that do not depend on the strategy.
#[derive(Debug, Clone, Copy)]
struct PhaseOptions {
    weights: WeightSizes,
    /// Arena bytes and other bytes.
    fixed: (u64, u64),
    /// Host bytes.
    host: u64,
}

impl PhaseOptions {
    /// The phase under each strategy, fastest first.
    fn iter(self) -> impl Iterator<Item = PhasePlan> {
        let (arena_bytes, other_bytes) = self.fixed;
        let (w, host_bytes) = (self.weights, self.host);
        w.strategies().map(move |s| PhasePlan { weights: s, chunk: None, weight_bytes: w.bytes(s), arena_bytes, other_bytes, host_bytes, kv_cache: Default::default(), half_kv: false }.with_staging())
    }

    fn fastest_within(self, budget: u64) -> Option<PhasePlan> {
        self.iter().find(|p| p.peak() <= budget)
    }

    fn smallest(self) -> Need {
        self.iter().min_by_key(PhasePlan::peak).map(Need::from).unwrap_or_default()
    }
}

/// Parameter bytes for a program of `steps` steps.
pub(crate) fn overhead(steps: u64) -> u64 {
    FIXED_OVERHEAD + OVERHEAD_PER_STEP * steps
}

/// The text encoder's options for a run.
fn encode_input(input: &PlanInput<'_>) -> Result<PhaseOptions, PlanError> {
    encode_phase(input.text_encoder, input.prompt_tokens, input.limits, input.text_encoder_weights, host::encode(input))
}

/// The text encoder's options (its activations on the half-precision data
/// path where the device has f16 operands); its other bytes are the RoPE
/// tables, the key mask, the readback of the embedding and, where its
/// attention runs as products on the GEMM core (into f16 pieces, the flash
/// kernel not proven), their scratch; `host`: its host bytes.
fn encode_phase(c: &Qwen3Config, tokens: u64, limits: DeviceLimits, weights: WeightSizes, host: u64) -> Result<PhaseOptions, PlanError> {
    let mut arena = BumpArena::new(u64::MAX);
    let l = text_encoder::TextEncoderLayout::new(c, tokens, c.output_layers(), limits.half_operands, &mut arena)
        .map_err(|_| PlanError::Size("the text encoder's picked layers do not exist"))?;
    // Where its attention runs as products on the GEMM core: their buffers.
    let mut products = crate::ir::ProductBuffers::default();
    let mut steps = count(|emit| text_encoder::prologue(&l, emit));
    for i in 0..l.layers_to_run() {
        steps += count_sizing(|emit| text_encoder::layer(&l, i, emit), &mut products, &limits);
    }
    let tables = 2 * 4 * tokens * c.head_dim as u64 + 4 * tokens.max(1);
    let readback = 4 * tokens * 3 * c.hidden_size as u64;
    Ok(PhaseOptions { weights, fixed: (arena.high_water(), tables + readback + products.bytes() + overhead(steps)), host })
}

const REFERENCE_SIZE: &str = "a reference image's size is not a positive multiple of 2 × the VAE scale factor";

/// The reference images' tokens, all together.
fn reference_tokens(input: &PlanInput<'_>) -> Result<u64, PlanError> {
    let unit = input.vae.latent_cell() as u64;
    let mut tokens = 0u64;
    for &(w, h) in input.references {
        if w == 0 || h == 0 || !w.is_multiple_of(unit) || !h.is_multiple_of(unit) {
            return Err(PlanError::Size(REFERENCE_SIZE));
        }
        tokens = tokens.checked_add((w / unit) * (h / unit)).ok_or(PlanError::Size("the reference images hold too many tokens"))?;
    }
    Ok(tokens)
}

/// Packed latent tokens `(rows, cols)` of the image.
fn latent_grid(input: &PlanInput<'_>) -> Result<(u64, u64), PlanError> {
    let size = ImageSize::new(input.vae, input.width, input.height).map_err(|_| PlanError::Size("the image size is not a positive multiple of 2 × the VAE scale factor"))?;
    Ok(size.latent_grid())
}

fn count(program: impl FnOnce(&mut dyn FnMut(Op))) -> u64 {
    let mut n = 0;
    program(&mut |_| n += 1);
    n
}

/// [`count`], each op's buffers for an attention on products on a device
/// of `limits` gathered into `products` on the way.
fn count_sizing(program: impl FnOnce(&mut dyn FnMut(Op)), products: &mut crate::ir::ProductBuffers, limits: &DeviceLimits) -> u64 {
    let mut n = 0;
    program(&mut |op| {
        n += 1;
        products.add(&op, limits.attention_products, limits.max_buffer);
    });
    n
}

mod denoise;
mod error;
mod weights;
mod preview;
mod estimates;
pub mod host;
mod vae_layouts;

pub use crate::bytes::Bytes;
pub use error::{PlanError, Sides};
pub use weights::{BlockWeights, WeightSizes, WeightStrategy};
pub use estimates::*;
pub use preview::{preview_layouts, PreviewLayout, PreviewLayouts, MAX_PREVIEW_LAYOUTS};
pub use vae_layouts::{decode_device_capacity, decode_options, decode_tile_capacity, reference_options, vae_arena};
use vae_layouts::smallest_decode;
use denoise::DenoiseOptions;
#[cfg(test)]
use denoise::denoise_fixed;

#[cfg(test)]
mod tests;

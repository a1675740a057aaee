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

/// Weight bytes of one block of a component's program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockWeights {
    /// Weights outside DF11 groups, as the device holds them.
    pub plain: u64,
    /// DF11 group weights expanded to bf16 (slot bytes, alignment included).
    pub grouped: u64,
    /// The same groups compressed, as the device holds them.
    pub compressed: u64,
    /// The largest of the block's groups as the streaming area lays it out
    /// (its compressed arrays, each at a [`SLOT_ALIGN`] offset).
    pub largest_group: u64,
    /// Weights in GGML blocks as the device holds them (resident, or
    /// streamed into the slot like plain ones); each linear expands them a
    /// few rows at a time into the packed scratch.
    pub packed: u64,
    /// The same weights expanded to f32 once at load (resident only).
    pub packed_expanded: u64,
}

/// A component's weight bytes, summed and maximised over its blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightSizes {
    pub blocks: u64,
    pub plain: u64,
    pub grouped: u64,
    pub compressed: u64,
    /// Largest `plain + grouped` of one block: a streaming slot.
    pub max_block: u64,
    /// Largest `grouped` of one block: a DF11 expansion slot.
    pub max_block_grouped: u64,
    /// Largest group as the streaming area would hold it whole: streamed DF11
    /// groups are copied there compressed, one at a time (in runs of blocks
    /// past [`DF11_STREAM_AREA`]), and expanded into the slot.
    pub max_group: u64,
    /// Weights several blocks read, resident under every strategy.
    pub shared: u64,
    pub packed: u64,
    pub packed_expanded: u64,
    /// Shared weights in GGML blocks: resident in their blocks, or expanded
    /// to f32 at load when everything is.
    pub shared_packed: u64,
    pub shared_packed_expanded: u64,
    /// Where a linear over weights in GGML blocks expands rows of them
    /// (0 without such weights); not needed when they are expanded at load.
    pub packed_scratch: u64,
    /// The range scales of the linears' weights' rows, which a device that
    /// rounds products' operands to f16 (the matrix tier) measures once and
    /// keeps under every strategy; not counted by [`Self::bytes`] until
    /// [`Self::keep_row_scales`].
    pub row_scales: u64,
}

impl WeightSizes {
    pub fn add_block(&mut self, b: BlockWeights) {
        self.blocks += 1;
        self.plain += b.plain;
        self.grouped += b.grouped;
        self.compressed += b.compressed;
        self.packed += b.packed;
        self.packed_expanded += b.packed_expanded;
        self.max_block = self.max_block.max(b.plain + b.packed + b.grouped);
        self.max_block_grouped = self.max_block_grouped.max(b.grouped);
        self.max_group = self.max_group.max(b.largest_group);
    }

    /// Counts the weights' row scales as kept (resident, with the shared weights).
    pub fn keep_row_scales(&mut self) {
        self.shared += self.row_scales;
        self.row_scales = 0;
    }

    /// Whether some weights are held compressed (DF11 groups or GGML
    /// blocks), so keeping them compressed is a strategy.
    pub fn has_df11(&self) -> bool {
        self.compressed > 0 || self.packed > 0
    }

    /// Device bytes of the weights under `s`.
    pub fn bytes(&self, s: WeightStrategy) -> u64 {
        let packed = self.shared_packed + self.packed_scratch;
        self.shared
            + match s {
                WeightStrategy::ResidentBf16 => self.plain + self.grouped + self.packed_expanded + self.shared_packed_expanded,
                WeightStrategy::ResidentDf11 { slots } => packed + self.plain + self.packed + self.compressed + slots as u64 * self.max_block_grouped,
                WeightStrategy::Streamed { slots } => {
                    packed + slots as u64 * self.max_block + self.max_block.min(STREAM_STAGING) + self.max_group.min(DF11_STREAM_AREA)
                }
            }
    }

    /// The strategies that apply, fastest first.
    pub fn strategies(&self) -> impl Iterator<Item = WeightStrategy> {
        let df11 = self.has_df11();
        // GGML blocks need no slot: a second one only serves DF11 groups.
        [
            Some(WeightStrategy::ResidentBf16),
            (self.max_block_grouped > 0).then_some(WeightStrategy::ResidentDf11 { slots: 2 }),
            df11.then_some(WeightStrategy::ResidentDf11 { slots: 1 }),
            Some(WeightStrategy::Streamed { slots: 2 }),
            Some(WeightStrategy::Streamed { slots: 1 }),
        ]
        .into_iter()
        .flatten()
    }
}

/// How a component's weights are held on the device while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStrategy {
    /// Every weight resident as bf16 (DF11 groups expanded once at load;
    /// GGML blocks once, to f32).
    ResidentBf16,
    /// Plain weights and compressed DF11 groups resident; each block's
    /// groups expanded into bf16 slot `block mod slots` as it starts. GGML
    /// blocks stay resident in their blocks; each linear expands a few rows
    /// at a time as it runs.
    ResidentDf11 { slots: u8 },
    /// Nothing resident: each block's weights are copied from the mapped
    /// files into slot `block mod slots` as it starts (DF11 groups
    /// compressed, expanded on the device).
    Streamed { slots: u8 },
}

impl fmt::Display for WeightStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: u8| if n == 1 { "" } else { "s" };
        match self {
            WeightStrategy::ResidentBf16 => f.write_str("weights resident, expanded"),
            WeightStrategy::ResidentDf11 { slots } => {
                write!(f, "weights resident compressed (DF11 or GGML blocks), expanded per block into {slots} slot{}", plural(*slots))
            }
            WeightStrategy::Streamed { slots } => write!(f, "streamed per block from host memory into {slots} slot{}", plural(*slots)),
        }
    }
}

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
}

impl DeviceLimits {
    /// WebGPU's default limits, which every adapter grants: 256 MiB buffers, 128 MiB bindings.
    pub const WEBGPU_DEFAULT: DeviceLimits = DeviceLimits { max_buffer: 256 << 20, max_binding: 128 << 20, half_operands: false };
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanError {
    /// The size cannot be laid out at all (not a multiple of the latent cell, or beyond 64 bits).
    Size(&'static str),
    /// A reference image needs a larger buffer or binding than the adapter allows.
    ReferenceTooLarge { width: u64, height: u64, bytes: u64, limit: u64 },
    /// One row of the VAE decode's widest convolution exceeds what the adapter can bind, in any tile.
    VaeTooWide { width: u64, bytes: u64, limit: u64 },
    /// One row of the preview decoder's widest convolution exceeds what the adapter can bind, in any tile.
    PreviewTooWide { width: u64, bytes: u64, limit: u64 },
    /// The transformer's attention keys (all tokens, one binding) exceed the adapter's binding.
    AttentionTooLarge { tokens: u64, bytes: u64, limit: u64 },
    /// Every layout of `phase`'s activation arena (one device buffer) is larger
    /// than the adapter's largest buffer; `bytes`: the smallest of them.
    ArenaTooLarge { phase: &'static str, bytes: u64, limit: u64 },
    /// A forced VAE tile that is not a positive multiple of the latent cell (`unit` pixels).
    VaeTileSize { tile: u64, unit: u64 },
    /// A forced VAE tile whose band cannot hold one row of `what`'s widest convolution.
    VaeTileTooSmall { tile: u64, what: &'static str },
    /// No strategy of `phase` fits the budget; `minimum` is the smallest
    /// budget that works for the run, `device` and `host` its two sides (in
    /// the phase that needs it).
    TooSmall { budget: u64, phase: &'static str, minimum: u64, device: u64, host: u64 },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Size(why) => f.write_str(why),
            PlanError::AttentionTooLarge { tokens, bytes, limit } => write!(
                f,
                "the transformer's attention over {tokens} tokens binds {bytes} bytes of keys at once, above the adapter's limit of {limit} bytes; use a smaller size or fewer reference images"
            ),
            PlanError::VaeTooWide { width, bytes, limit } => write!(
                f,
                "the VAE cannot decode a {width}-pixel-wide image on this adapter: one row of its widest convolution needs {bytes} bytes, above the adapter's binding of {limit} bytes; use a smaller width"
            ),
            PlanError::PreviewTooWide { width, bytes, limit } => write!(
                f,
                "one row of the preview decoder's widest convolution at {width} pixels wide needs {bytes} bytes, above the adapter's binding of {limit} bytes; preview without a preview decoder, or use a smaller width"
            ),
            PlanError::ReferenceTooLarge { width, height, bytes, limit } => write!(
                f,
                "encoding a {width}×{height} reference image needs a {bytes}-byte buffer, above the adapter's limit of {limit} bytes"
            ),
            PlanError::ArenaTooLarge { phase, bytes, limit } => write!(
                f,
                "{phase} needs an activation buffer of at least {bytes} bytes at this size, above the adapter's largest buffer of {limit} bytes; use a smaller size or fewer reference images"
            ),
            PlanError::VaeTileSize { tile, unit } => write!(f, "the VAE tile {tile} is not a positive multiple of {unit} pixels"),
            PlanError::VaeTileTooSmall { tile, what } => write!(
                f,
                "a {tile}-pixel VAE tile cannot hold one row of {what}'s widest convolution on this adapter; use a larger tile or none"
            ),
            PlanError::TooSmall { budget, phase, minimum, device, host } => write!(
                f,
                "a budget of {} is too small ({phase} needs more); the smallest budget that works for this size is {} ({minimum} B): {}",
                Bytes(*budget),
                Bytes(*minimum),
                Sides(*device, *host)
            ),
        }
    }
}

/// The two sides of a minimum, as the refusal words them.
#[derive(Debug, Clone, Copy)]
pub struct Sides(pub u64, pub u64);

impl fmt::Display for Sides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on the device and {} on the host", Bytes(self.0), Bytes(self.1))
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
        true => 4 * crate::models::vae::band_capacity(cfg, lat_h, input.limits.max_binding).map_err(|_| PlanError::Size("the VAE decode's bands"))?,
        false => 4 * crate::models::vae::largest_activation(cfg, lat_h * lat_w),
    };
    let encode_tile = plan.references.and_then(|r| r.tile);
    let whole = |&&(w, h): &&(u64, u64)| encode_tile.is_none_or(|t| w.max(h) <= t);
    let encoded = input.references.iter().filter(whole).copied().chain(encode_tile.map(|t| (t, t)));
    let references = encoded.map(|(w, h)| crate::models::vae_encoder::largest_binding(cfg, h, w));
    Ok(references.fold(attention.max(decode), u64::max))
}

/// Plans the text encoder's phase alone (`flux-lite encode`): its fastest
/// strategy within `budget` for `prompt_tokens` tokens, one prompt's
/// embedding held at a time.
pub fn plan_encode(c: &Qwen3Config, prompt_tokens: u64, weights: WeightSizes, tokenizer_bytes: u64, budget: Option<u64>) -> Result<PhasePlan, PlanError> {
    let options = encode_phase(c, prompt_tokens, weights, host::text_encoder(c, prompt_tokens, tokenizer_bytes, 1))?;
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
    encode_phase(input.text_encoder, input.prompt_tokens, input.text_encoder_weights, host::encode(input))
}

/// The text encoder's options; its other bytes are the RoPE tables, the key
/// mask and the readback of the embedding; `host`: its host bytes.
fn encode_phase(c: &Qwen3Config, tokens: u64, weights: WeightSizes, host: u64) -> Result<PhaseOptions, PlanError> {
    let mut arena = BumpArena::new(u64::MAX);
    let l = text_encoder::TextEncoderLayout::new(c, tokens, c.output_layers(), &mut arena)
        .map_err(|_| PlanError::Size("the text encoder's picked layers do not exist"))?;
    let mut steps = count(|emit| text_encoder::prologue(&l, emit));
    for i in 0..l.layers_to_run() {
        steps += count(|emit| text_encoder::layer(&l, i, emit));
    }
    let tables = 2 * 4 * tokens * c.head_dim as u64 + 4 * tokens.max(1);
    let readback = 4 * tokens * 3 * c.hidden_size as u64;
    Ok(PhaseOptions { weights, fixed: (arena.high_water(), tables + readback + overhead(steps)), host })
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

mod denoise;
mod preview;
mod estimates;
pub mod host;
mod vae_layouts;

pub use crate::bytes::Bytes;
pub use estimates::*;
pub use preview::{preview_layouts, PreviewLayout, PreviewLayouts, MAX_PREVIEW_LAYOUTS};
pub use vae_layouts::{decode_device_capacity, decode_options, decode_tile_capacity, reference_options, vae_arena};
use vae_layouts::smallest_decode;
use denoise::DenoiseOptions;
#[cfg(test)]
use denoise::denoise_fixed;

#[cfg(test)]
mod tests;

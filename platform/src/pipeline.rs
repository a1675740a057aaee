//! Text to image in stages, as `Flux2KleinPipeline` runs them: tokenize,
//! encode, denoise, decode. Each stage's device memory is released before
//! the next one allocates its own.

use crate::denoise::{self, Conditioning, StepProgress};
use crate::error::RunError;
use flux_lite_kernels::Gpu;
use crate::model::{Component, ModelFolder};
use crate::reference_image::ReferenceImage;
use crate::text_encoder::TextEncoder;
use crate::tokenizer::PromptTokenizer;
use crate::runner::BlockProgress;
use crate::transformer::{LatentGrids, Transformer};
use crate::vae::VaeDecoder;
use crate::vae_encoder::VaeEncoder;
use flux_lite_core::plan::{PhasePlan, WeightStrategy};
use std::time::{Duration, Instant};

/// Tokens per prompt: diffusers' `max_sequence_length`, which the transformer attends over in full.
pub const PROMPT_TOKENS: usize = 512;

/// Where a run is, for the progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Prompt `prompt` of `prompts`, block by block.
    Encode { prompt: usize, prompts: usize, block: BlockProgress },
    /// Reference image `done` of `total` encoded.
    References { done: usize, total: usize },
    Denoise(StepProgress),
    /// Step `done` of `total` of the VAE decode (one untiled; one per decoder op when banded).
    Decode { done: usize, total: usize },
}

/// Wall time of each stage. Loading counts weight uploads and layout, wherever they happen.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    pub load: Duration,
    /// The prompts and the reference images.
    pub encode: Duration,
    pub steps: Vec<Duration>,
    pub decode: Duration,
}

/// One prompt's embedding `[PROMPT_TOKENS, 3·hidden]`, and the warning to print if it was truncated.
#[derive(Debug, Clone)]
pub struct PromptEmbedding {
    pub values: Vec<f32>,
    pub truncation_warning: Option<String>,
}

/// Tokenizes and encodes each prompt with one text encoder, which is
/// dropped (its device memory released) before this returns.
pub fn encode_prompts(
    gpu: &Gpu,
    model: &ModelFolder,
    strategy: WeightStrategy,
    prompts: &[&str],
    timings: &mut Timings,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<PromptEmbedding>, RunError> {
    let started = Instant::now();
    let tokenizer = PromptTokenizer::load(&model.component_dir("tokenizer"))?;
    let store = model.weights(Component::TextEncoder)?;
    let encoder = TextEncoder::new(gpu, &model.text_encoder, store, strategy, PROMPT_TOKENS, model.text_encoder.output_layers())?;
    timings.load += started.elapsed();
    let started = Instant::now();
    let mut out = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let tokens = tokenizer.encode_prompt(prompt, PROMPT_TOKENS).map_err(|e| RunError::Input(e.to_string()))?;
        let values = encoder.encode(gpu, &tokens.input_ids, &tokens.attention_mask, &mut |block| {
            progress(Progress::Encode { prompt: i, prompts: prompts.len(), block })
        })?;
        out.push(PromptEmbedding { values, truncation_warning: tokens.truncation_warning() });
    }
    timings.encode += started.elapsed();
    Ok(out)
}

/// What to generate, with every default already resolved.
#[derive(Debug, Clone)]
pub struct Request {
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    pub seed: u64,
    /// Classifier-free guidance scale; applied only when > 1 and the model is not distilled.
    pub guidance: f32,
    /// A VAE tile in pixels the plan must use (checked against the budget); `None`: planned.
    pub vae_tile: Option<usize>,
    /// Device bytes the run may allocate; `None` keeps everything resident.
    pub memory_budget: Option<u64>,
    /// The prepared reference images' `(width, height)`, in order; empty for text to image.
    pub references: Vec<(usize, usize)>,
}

/// The reference images' tokens, encoded once before denoising.
#[derive(Debug, Clone, Default)]
pub struct References {
    /// Each reference's latent token grid `(height, width)`.
    pub grids: Vec<(usize, usize)>,
    /// `[tokens, 4·latent_channels]`, the references one after another.
    pub tokens: Vec<f32>,
}

/// Encodes each reference image with the VAE encoder into the tokens the
/// transformer reads after the noise tokens, each image larger than
/// `tile_px` by bands (`None`: all in one pass). The weights are uploaded
/// once; the arena is laid out again for each new image size, the previous
/// one released first.
pub fn encode_references(
    gpu: &Gpu,
    model: &ModelFolder,
    images: &[ReferenceImage],
    tile_px: Option<usize>,
    timings: &mut Timings,
    progress: &mut dyn FnMut(Progress),
) -> Result<References, RunError> {
    let mut out = References::default();
    if images.is_empty() {
        return Ok(out);
    }
    let started = Instant::now();
    let mut store = model.weights(Component::Vae)?;
    store.expand_df11_on_host()?;
    let mut encoder = VaeEncoder::new(gpu, &model.vae, &store, images[0].width, images[0].height, tile_px)?;
    timings.load += started.elapsed();
    for (i, image) in images.iter().enumerate() {
        let started = Instant::now();
        encoder.lay_out(gpu, image.width, image.height)?;
        timings.load += started.elapsed();
        let started = Instant::now();
        out.tokens.extend(encoder.reference_tokens(gpu, &image.pixels)?);
        out.grids.push(encoder.token_grid());
        timings.encode += started.elapsed();
        progress(Progress::References { done: i + 1, total: images.len() });
    }
    Ok(out)
}

/// Whether `Flux2KleinPipeline` would run classifier-free guidance.
pub fn uses_guidance(model: &ModelFolder, guidance: f32) -> bool {
    guidance > 1.0 && !model.index.is_distilled
}

/// The decoded image, 8-bit RGB, row-major.
#[derive(Debug, Clone)]
pub struct Image {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

/// Denoises from the seed's noise under `positive` (and `negative` when
/// guided), with the reference tokens after the noise tokens in every pass,
/// and returns the packed latents `[tokens, channels]`, with the weights and
/// chunking the plan's phase says. The transformer's device memory is
/// released before this returns.
#[allow(clippy::too_many_arguments)]
pub fn denoise(
    gpu: &Gpu,
    model: &ModelFolder,
    request: &Request,
    phase: &PhasePlan,
    positive: &[f32],
    negative: Option<&[f32]>,
    references: &References,
    timings: &mut Timings,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<f32>, RunError> {
    let (lat_h, lat_w) = denoise::latent_grid(&model.vae, request.width, request.height).map_err(RunError::Input)?;
    let started = Instant::now();
    let store = model.weights(Component::Transformer)?;
    let grids = LatentGrids { noise: (lat_h, lat_w), references: references.grids.clone() };
    let chunk = phase.chunk.map(|c| c as usize);
    let transformer = Transformer::new(gpu, &model.transformer, store, phase.weights, chunk, PROMPT_TOKENS, &grids)?;
    transformer.set_references(gpu, &references.tokens)?;
    timings.load += started.elapsed();
    let noise = denoise::packed_noise(request.seed, model.transformer.in_channels, lat_h, lat_w);
    let conditioning = match negative {
        Some(negative) if uses_guidance(model, request.guidance) => Conditioning::Guided { positive, negative, scale: request.guidance },
        _ => Conditioning::Prompt(positive),
    };
    let mut step_started = Instant::now();
    let steps = &mut timings.steps;
    denoise::denoise(gpu, &transformer, &model.scheduler, request.steps, &noise, conditioning, &mut |p| {
        progress(Progress::Denoise(p));
        if p.block.done == p.block.total {
            steps.push(step_started.elapsed());
            step_started = Instant::now();
        }
    })
}

/// Decodes packed latents to the image in the plan's tiles (`None`: untiled).
pub fn decode(
    gpu: &Gpu,
    model: &ModelFolder,
    request: &Request,
    tile: Option<u64>,
    latents: &[f32],
    timings: &mut Timings,
    progress: &mut dyn FnMut(Progress),
) -> Result<Image, RunError> {
    let started = Instant::now();
    let mut store = model.weights(Component::Vae)?;
    store.expand_df11_on_host()?;
    let mut vae = VaeDecoder::new(gpu, &model.vae, &store, request.width, request.height, tile.map(|t| t as usize))?;
    timings.load += started.elapsed();
    let started = Instant::now();
    let image = vae.decode(gpu, latents, &mut |t| progress(Progress::Decode { done: t.done, total: t.total }))?;
    timings.decode += started.elapsed();
    Ok(Image { width: image.width, height: image.height, rgb: image.rgb })
}

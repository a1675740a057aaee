//! Memory plans for a model folder. Each component's weight sizes come from
//! its files, or, for a folder that holds only configs (`flux-lite info`),
//! are estimated from its config: once, where the model is opened
//! ([`ModelSizes`], the catalogue a `Pipeline` keeps); the core planner lays
//! out each run from them.

use crate::pipeline::denoise;
use crate::error::RunError;
use flux_lite_kernels::Gpu;
use crate::model::{Component, ModelFolder};
use crate::pipeline::{Request, PROMPT_TOKENS};
use crate::model::lora::LoraSet;
use crate::components::text_encoder::TextEncoder;
use crate::components::transformer::Transformer;
use flux_lite_core::plan::{self as planner, DeviceLimits, PhasePlan, Plan, PlanInput, PreviewLayouts, WeightSizes};

/// The weight sizes every plan of a model needs, whatever the image's size:
/// read once when the model is opened.
#[derive(Debug, Clone)]
pub struct ModelSizes {
    pub text_encoder: WeightSizes,
    pub transformer: WeightSizes,
    /// The VAE decoder's weights, always resident.
    pub vae_decoder: u64,
    /// The VAE encoder's weights, resident while references are encoded.
    pub vae_encoder: u64,
    /// Host bytes of the loaded tokenizer, estimated from its file's size.
    pub tokenizer: u64,
    /// Device bytes of the preview decoder's weights (0 without one); its
    /// layouts at the run's size are [`Self::preview_layouts`].
    pub preview_decoder: u64,
    /// Components whose folders hold no weight files: their sizes are
    /// estimated from the config, as DF11 (so every strategy is listed).
    pub estimated: Vec<Component>,
    /// The VAE decoder's, encoder's and preview decoder's weights' row
    /// scales, counted by [`Self::keep_row_scales`].
    pub vae_row_scales: [u64; 3],
}

impl ModelSizes {
    /// From the weight files, which every component must have.
    pub fn from_files(model: &ModelFolder) -> Result<Self, RunError> {
        Self::read(model, false)
    }

    /// From the files where a component has them, else estimated from its config.
    pub fn from_files_or_configs(model: &ModelFolder) -> Result<Self, RunError> {
        Self::read(model, true)
    }

    fn read(model: &ModelFolder, estimate_missing: bool) -> Result<Self, RunError> {
        let mut estimated = Vec::new();
        let mut from_files = |c: Component| {
            let files = !estimate_missing || model.has_weight_files(c);
            if !files {
                estimated.push(c);
            }
            files
        };
        let text_encoder = if from_files(Component::TextEncoder) {
            text_encoder_sizes(model)?
        } else {
            planner::text_encoder_weights(&model.text_encoder, true)
        };
        let transformer = if from_files(Component::Transformer) {
            // Which block reads which weight does not depend on the image's tokens: one will do.
            Transformer::weight_sizes(&model.transformer, &model.weights(Component::Transformer)?, PROMPT_TOKENS, 1)?
        } else {
            planner::transformer_weights(&model.transformer, true)
        };
        let (vae_decoder, vae_encoder) = if from_files(Component::Vae) {
            let store = model.weights(Component::Vae)?;
            (crate::components::vae::decoder_weight_bytes(&model.vae, &store)?, crate::components::vae_encoder::encoder_weight_bytes(&model.vae, &store)?)
        } else {
            (planner::vae_decoder_weights(&model.vae), planner::vae_encoder_weights(&model.vae))
        };
        let preview_decoder = model.preview_decoder.as_ref().map_or(0, |d| d.weight_bytes(&model.vae));
        let vae_row_scales = [
            crate::components::vae::decoder_row_scale_bytes(&model.vae),
            crate::components::vae_encoder::encoder_row_scale_bytes(&model.vae),
            model.preview_decoder.as_ref().map_or(0, |d| crate::components::tiny_decoder::row_scale_bytes(d)),
        ];
        Ok(Self { text_encoder, transformer, vae_decoder, vae_encoder, tokenizer: tokenizer_bytes(model), preview_decoder, estimated, vae_row_scales })
    }

    /// Counts every component's weights' row scales, which a device that
    /// measures them once (`Gpu::measures_weight_rows`) keeps beside them.
    pub fn keep_row_scales(&mut self) {
        self.text_encoder.keep_row_scales();
        self.transformer.keep_row_scales();
        let [decoder, encoder, preview] = std::mem::take(&mut self.vae_row_scales);
        self.vae_decoder += decoder;
        self.vae_encoder += encoder;
        self.preview_decoder += preview;
    }

    /// Counts the weights in GGML blocks that are expanded at load as the
    /// half-precision data path expands them (f16 rows and their scales).
    pub fn expand_half(&mut self) {
        self.text_encoder.expand_half();
        self.transformer.expand_half();
    }

    /// Counts `lora` for a transformer over `rows` token rows: its matrices
    /// and scratch on the device, resident under every strategy. On the host
    /// it holds only its mapped files (and one module's matrices while they
    /// are uploaded).
    pub fn add_lora(&mut self, lora: &LoraSet, rows: u64) {
        self.transformer.shared += lora.device_bytes(rows);
    }

    /// The preview decoder's layouts for a `width × height` image on an
    /// adapter of `limits`, fastest first, banded at `forced` (the
    /// request's VAE tile) if given; empty without a preview decoder.
    pub fn preview_layouts(&self, model: &ModelFolder, width: usize, height: usize, limits: DeviceLimits, forced: Option<u64>) -> Result<PreviewLayouts, RunError> {
        match &model.preview_decoder {
            Some(d) => Ok(d.layouts(width, height, self.preview_decoder, limits, forced)?),
            None => Ok(PreviewLayouts::new()),
        }
    }

    /// The planner's input for a `width × height` image of this model, with
    /// reference images of the sizes `(width, height)` in `references`
    /// (without the preview decoder's layouts: [`plan`] adds them).
    pub fn plan_input<'a>(
        &self,
        model: &'a ModelFolder,
        width: usize,
        height: usize,
        references: &'a [(u64, u64)],
        limits: DeviceLimits,
        budget: Option<u64>,
    ) -> PlanInput<'a> {
        PlanInput {
            transformer: &model.transformer,
            text_encoder: &model.text_encoder,
            vae: &model.vae,
            width: width as u64,
            height: height as u64,
            prompt_tokens: PROMPT_TOKENS as u64,
            references,
            transformer_weights: self.transformer,
            text_encoder_weights: self.text_encoder,
            vae_weight_bytes: self.vae_decoder,
            vae_encoder_weight_bytes: self.vae_encoder,
            tokenizer_bytes: self.tokenizer,
            limits,
            budget,
            vae_tile: None,
            kv_cache: model.index.kv_cache && !references.is_empty(),
            previews: &[],
            kv_precision: Default::default(),
        }
    }
}

/// Host bytes of the model's tokenizer once loaded, from its tokenizer.json's
/// size; Qwen3's when the folder has none (`info` on configs alone).
pub fn tokenizer_bytes(model: &ModelFolder) -> u64 {
    let file = model.component_dir("tokenizer").join("tokenizer.json");
    planner::tokenizer_bytes(std::fs::metadata(file).map_or(planner::TOKENIZER_FILE_BYTES, |m| m.len()))
}

/// The text encoder's weight bytes by block, from its files.
fn text_encoder_sizes(model: &ModelFolder) -> Result<WeightSizes, RunError> {
    let picks = model.text_encoder.output_layers();
    TextEncoder::weight_sizes(&model.text_encoder, &model.weights(Component::TextEncoder)?, PROMPT_TOKENS, picks)
}

/// Lays out every device byte of a run (text encoder, transformer, VAE)
/// for the request's size and budget, from the model's weight sizes (read
/// when it was opened) and the adapter's limits; fails at once, naming the
/// smallest budget that would work, when nothing fits.
pub fn plan(gpu: &Gpu, model: &ModelFolder, sizes: &ModelSizes, request: &Request) -> Result<Plan, RunError> {
    denoise::latent_grid(&model.vae, request.width, request.height)?;
    let mut sizes = sizes.clone();
    let references: Vec<(u64, u64)> = request.references.iter().map(|&(w, h)| (w as u64, h as u64)).collect();
    sizes.add_lora(&request.lora, transformer_rows(model, request.width, request.height, &request.references)?);
    if gpu.measures_weight_rows() {
        sizes.keep_row_scales();
    }
    if gpu.plan_limits().half_operands {
        sizes.expand_half();
    }
    let forced = request.vae_tile.map(|t| t as u64);
    let previews = sizes.preview_layouts(model, request.width, request.height, gpu.plan_limits(), forced)?;
    let input = PlanInput {
        previews: &previews,
        vae_tile: forced,
        kv_cache: request.kv_cache && !references.is_empty(),
        kv_precision: request.kv_precision,
        ..sizes.plan_input(model, request.width, request.height, &references, gpu.plan_limits(), request.memory_budget)
    };
    Ok(planner::plan(&input)?)
}

/// The transformer's token rows for a `width × height` image with
/// reference images of the sizes `(width, height)` in `references`: prompt,
/// noise and reference tokens.
pub fn transformer_rows(model: &ModelFolder, width: usize, height: usize, references: &[(usize, usize)]) -> Result<u64, RunError> {
    let grid = |w: usize, h: usize| denoise::latent_grid(&model.vae, w, h).map(|(lh, lw)| (lh * lw) as u64).map_err(RunError::from);
    let mut rows = PROMPT_TOKENS as u64 + grid(width, height)?;
    for &(w, h) in references {
        rows += grid(w, h)?;
    }
    Ok(rows)
}

/// The text encoder's phase alone (for `encode`): its fastest strategy within `budget`.
/// `row_scales`: the device keeps the weights' row scales (`Gpu::measures_weight_rows`);
/// `limits`: the device's (its half-precision data path, where its attention runs).
pub fn plan_encode(model: &ModelFolder, sizes: &ModelSizes, budget: Option<u64>, row_scales: bool, limits: DeviceLimits) -> Result<PhasePlan, RunError> {
    let mut sizes = sizes.text_encoder;
    if row_scales {
        sizes.keep_row_scales();
    }
    if limits.half_operands {
        sizes.expand_half();
    }
    Ok(planner::plan_encode(&model.text_encoder, PROMPT_TOKENS as u64, limits, sizes, tokenizer_bytes(model), budget)?)
}

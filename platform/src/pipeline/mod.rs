//! Text to image in stages, as `Flux2KleinPipeline` runs them: tokenize,
//! encode, denoise, decode. Each stage's device memory is released before
//! the next one allocates its own. [`Pipeline`] is the entry point: open
//! once, then [`Pipeline::generate`] any number of times.

pub mod denoise;
pub mod embeddings_file;
pub mod generation;
pub mod image_file;
pub mod init_image;
pub mod inpaint;
pub mod job;
pub mod kept;
pub mod mask_crop;
/// Writing files (moved below the model code, which writes them too; the old path kept).
pub use crate::output;
pub mod planning;
pub mod preview;
pub mod reference_image;
pub mod resample;


pub use generation::{Finished, Made};
pub use job::{Batch, Item};
pub use job::{InitImage, Job, Limits, OutputType, RequestError, Resolved, Setting};
use denoise::StepProgress;
use crate::error::{LoadError, RunError};
use flux_lite_kernels::{Gpu, GpuOptions};
use crate::model::lora::LoraSet;
use crate::model::{Component, ModelFolder};
use crate::pipeline::reference_image::ReferenceImage;
use crate::exec::runner::BlockProgress;
use crate::components::vae::VaeDecoder;
use crate::exec::activations::Bands;
use crate::components::vae_encoder::VaeEncoder;
pub use flux_lite_core::plan::KvPrecision;
use flux_lite_core::plan::Plan;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::request::PROMPT_TOKENS;

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

/// What a resolved job runs with ([`Resolved::request`]): every default
/// applied and every rule met.
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
    /// LoRA adapters for the transformer ([`LoraSet::open`]); empty: none.
    pub lora: std::sync::Arc<LoraSet>,
    /// Image-to-image or inpainting: the init image is `references[0]`.
    pub init: Option<job::InitRequest>,
    /// The klein KV pipeline's recipe for the references (meaningful with references).
    pub kv_cache: bool,
    /// The precisions the transformer's keys and values may take under the budget.
    pub kv_precision: KvPrecision,
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
    scratch: &Path,
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
    let mut encoder = VaeEncoder::new(gpu, &model.vae, &store, images[0].width, images[0].height, tile_px)?.in_scratch(scratch);
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

/// Opens a model folder, with its transformer read from `transformer` when
/// given (how every command opens a model; [`Pipeline::open`] then adds the GPU).
pub fn open_model(dir: &Path, transformer: Option<&Path>, text_encoder: Option<&Path>) -> Result<ModelFolder, LoadError> {
    let mut model = ModelFolder::open(dir)?;
    if let Some(t) = transformer {
        model = model.with_transformer(t)?;
    }
    if let Some(t) = text_encoder {
        model = model.with_text_encoder(t)?;
    }
    Ok(model)
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

/// The VAE decoder for `width × height` images, laid out as `bands` says
/// (the plan's choice), its weights uploaded; by bands on the host, the
/// activations in a scratch file in `scratch`.
pub fn load_vae_decoder(gpu: &Gpu, model: &ModelFolder, width: usize, height: usize, bands: Bands, scratch: &Path) -> Result<VaeDecoder, RunError> {
    let mut store = model.weights(Component::Vae)?;
    store.expand_df11_on_host()?;
    Ok(VaeDecoder::laid_out(gpu, &model.vae, &store, width, height, bands)?.in_scratch(scratch))
}

/// What the caller learns while a generation runs: each phase as it
/// starts (before it loads anything), progress, and warnings (a prompt cut
/// to 512 tokens) to show. All default to doing nothing.
pub trait Observer {
    fn phase(&mut self, _phase: Phase) {}
    fn progress(&mut self, _progress: Progress) {}
    fn warning(&mut self, _message: &str) {}
    /// Image `index` (0-based) of the batch's `count` starts its denoising, then its decoding.
    fn image(&mut self, _index: usize, _count: usize) {}
    /// Whether to draw a preview after each `every`-th step (`None`: no
    /// previews, and nothing extra runs).
    fn previews(&self) -> Option<usize> {
        None
    }
    /// A preview of the image being denoised, when [`Observer::previews`] asks.
    fn preview(&mut self, _preview: &Preview<'_>) {}
}

/// The latents after a step as an RGB image of the output's size, by the
/// VAE's latent-to-RGB map (`flux_lite_core::preview`).
#[derive(Debug, Clone, Copy)]
pub struct Preview<'a> {
    /// Steps done (1-based) of `steps`.
    pub step: usize,
    pub steps: usize,
    pub width: usize,
    pub height: usize,
    pub rgb: &'a [u8],
}

/// The phases of a run, in order; each frees its memory before the next
/// starts, as the plan lays them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Encode,
    References,
    Denoise,
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Encode => "encode",
            Phase::References => "references",
            Phase::Denoise => "denoise",
            Phase::Decode => "decode",
        }
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Silent;

impl Observer for Silent {}

/// How to open a [`Pipeline`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Backend, binding cap and the interrupt flag (set it, e.g. from a
    /// Ctrl-C handler, to stop a run at its next block: cancellation).
    pub gpu: GpuOptions,
    /// A transformer folder to use instead of the model's `transformer/`
    /// (an official DF11 folder, or another diffusers transformer).
    pub transformer: Option<PathBuf>,
    /// A GGUF text encoder to use instead of the model's `text_encoder/`
    /// (llama.cpp's Qwen3 layout).
    pub text_encoder: Option<PathBuf>,
    /// Keep each component loaded after its phase for the next generation
    /// while everything kept and the request's largest phase fit its budget
    /// together (a server; `kept` explains the rule). Off: every phase
    /// releases its memory, and a single run's peak is the plan's.
    pub keep_loaded: bool,
    /// A tiny decoder (diffusers' `AutoencoderTiny` layout or TAESD's, e.g.
    /// TAEF2) that draws [`Observer::preview`]s instead of the VAE's
    /// latent-to-RGB map; its device memory is counted in the plan.
    pub preview_decoder: Option<PathBuf>,
    /// Where a VAE by bands on the host keeps the image's activations (a
    /// file without a name; a tmpfs keeps them in memory or swap, so point
    /// this at a disk for very large images); `None`: the OS's temporary folder.
    pub scratch_dir: Option<PathBuf>,
}

/// The conditioning of a generation.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Texts to tokenize and encode: what to draw and, when guided, what to
    /// steer away from (the empty text by default, as diffusers encodes `""`).
    Text { positive: String, negative: String },
    /// Embeddings `[512, joint]` encoded before (`flux-lite encode`); the
    /// negative is encoded from the empty prompt when guided and absent.
    Embeddings { positive: Vec<f32>, negative: Option<Vec<f32>> },
}

impl Prompt {
    /// A text prompt with the empty negative.
    pub fn text(positive: impl Into<String>) -> Self {
        Prompt::Text { positive: positive.into(), negative: String::new() }
    }

    /// A text prompt and its negative.
    pub fn with_negative(positive: impl Into<String>, negative: impl Into<String>) -> Self {
        Prompt::Text { positive: positive.into(), negative: negative.into() }
    }

    /// Whether a negative other than the default (the empty text) was given.
    pub fn has_negative(&self) -> bool {
        match self {
            Prompt::Text { negative, .. } => !negative.is_empty(),
            Prompt::Embeddings { negative, .. } => negative.is_some(),
        }
    }
}

/// The engine's entry point: a model folder and a device, opened once; then
/// any number of generations. Each generation plans its own memory and runs
/// encode → references → denoise → decode, each stage releasing its device
/// memory before the next (the budget bounds every stage). What outlives a
/// generation: the device and its compiled pipelines, the memory-mapped
/// weight files, the configs, and with [`Options::keep_loaded`] the
/// components that fit the budget beside the next request (`kept`).
/// A job of many images loads each component once.
///
/// ```no_run
/// use flux_lite_platform::{Job, Limits, Options, Pipeline, Prompt, Silent};
/// # fn main() -> Result<(), flux_lite_platform::RunError> {
/// let pipeline = Pipeline::open("FLUX.2-klein-4B".as_ref(), Options::default())?;
/// let job = Job { width: Some(512), height: Some(512), seed: Some(42), ..Job::new(Prompt::text("a red fox in the snow")) };
/// let job = job.resolve(pipeline.model(), &Limits::default())?;
/// let mut images = Vec::new();
/// pipeline.run(&job, &mut Silent, &mut |made| {
///     images.push(made.image.expect("decoded"));
///     Ok(())
/// })?;
/// assert_eq!(images[0].rgb.len(), 3 * 512 * 512);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Pipeline {
    gpu: Gpu,
    model: ModelFolder,
    keep_loaded: bool,
    kept: std::sync::Mutex<kept::Kept>,
    /// [`Options::scratch_dir`], resolved.
    scratch_dir: PathBuf,
    /// Every component's weight sizes, read once from the files: what each plan starts from.
    sizes: planning::ModelSizes,
}

impl Pipeline {
    /// Opens the diffusers model folder `dir` (configs, tokenizer, memory-mapped
    /// weights) and the GPU.
    pub fn open(dir: &Path, options: Options) -> Result<Self, RunError> {
        let mut model = open_model(dir, options.transformer.as_deref(), options.text_encoder.as_deref())?;
        if let Some(file) = &options.preview_decoder {
            model = model.with_preview_decoder(file)?;
        }
        let mut pipeline = Self::with_model(model, &options.gpu)?;
        pipeline.keep_loaded = options.keep_loaded;
        Ok(pipeline.scratch_dir(options.scratch_dir))
    }

    /// A pipeline over a model folder already opened (a caller that checks its
    /// own inputs against the configs before touching the GPU).
    pub fn with_model(model: ModelFolder, gpu: &GpuOptions) -> Result<Self, RunError> {
        let sizes = planning::ModelSizes::from_files(&model)?;
        Ok(Self { gpu: Gpu::new(gpu)?, model, keep_loaded: false, kept: Default::default(), scratch_dir: std::env::temp_dir(), sizes })
    }

    /// Keeps the VAE's activations by bands on the host in `dir` (see
    /// [`Options::scratch_dir`]; `None`: the OS's temporary folder).
    pub fn scratch_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.scratch_dir = dir.unwrap_or_else(std::env::temp_dir);
        self
    }

    /// Keeps components loaded between generations (see [`Options::keep_loaded`]).
    pub fn keep_loaded(mut self, keep: bool) -> Self {
        self.keep_loaded = keep;
        self
    }

    pub fn model(&self) -> &ModelFolder {
        &self.model
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The memory plan `job` would run under, or the planner's refusal;
    /// nothing is uploaded.
    pub fn plan(&self, job: &Resolved) -> Result<Plan, RunError> {
        planning::plan(&self.gpu, &self.model, &self.sizes, &self.budgeted(&job.request))
    }

    /// The budget a run takes when its job gives none: the adapter's
    /// memory less a margin ([`flux_lite_kernels::AdapterMemory::default_budget`]),
    /// where the adapter's memory can be known; else none (everything resident).
    pub fn default_budget(&self) -> Option<u64> {
        self.gpu.memory_offered().map(|m| m.default_budget())
    }

    /// `request` with the default budget where it gives none.
    fn budgeted(&self, request: &Request) -> Request {
        Request { memory_budget: request.memory_budget.or_else(|| self.default_budget()), ..request.clone() }
    }

    /// Makes every image of `job`, handing each to `take` as it is made
    /// (decoded, unless the job asks for latents only); `take` may write it
    /// out, and its error stops the job.
    pub fn run(&self, job: &Resolved, observer: &mut dyn Observer, take: &mut dyn FnMut(Made) -> Result<(), RunError>) -> Result<Finished, RunError> {
        generation::run_job(self, job, &self.budgeted(&job.request), observer, take)
    }

    /// Encodes prompts alone within `budget` (`flux-lite encode`).
    pub fn encode(&self, prompts: &[&str], budget: Option<u64>, observer: &mut dyn Observer) -> Result<(Vec<Vec<f32>>, Timings), RunError> {
        let plan = planning::plan_encode(&self.model, &self.sizes, budget.or_else(|| self.default_budget()), self.gpu.measures_weight_rows(), self.gpu.plan_limits())?;
        let encoded = generation::encode_alone(self, plan.weights, prompts, observer)?;
        self.gpu.check_interrupt()?;
        Ok(encoded)
    }

    /// Starts `phase`: the one before has dropped its buffers; the heap
    /// gives what they freed back to the OS before the observer hears of it.
    pub(crate) fn begin(phase: Phase, observer: &mut dyn Observer) {
        crate::host_memory::give_back_freed();
        observer.phase(phase);
    }
}

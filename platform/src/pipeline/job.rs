//! The one front door: a [`Job`] says what a caller wants (as the arguments
//! of diffusers' `Flux2KleinPipeline.__call__`), [`Job::resolve`] applies
//! every default and every rule once, and only a [`Resolved`] job runs
//! ([`super::Pipeline::run`]). `gen`, `serve` and library callers all come
//! through here, so none can run what another refuses.

use crate::error::RunError;
use super::reference_image::{ReferenceImage, MAX_REFERENCES};
use super::{denoise, KvPrecision, Prompt, Request, PROMPT_TOKENS};
use crate::model::lora::LoraSet;
use crate::model::ModelFolder;
use std::sync::Arc;

/// The image side without a size or a reference image to take it from.
pub const DEFAULT_SIDE: usize = 1024;
/// Image-to-image's strength when none is asked for, as diffusers' `strength` defaults.
pub const DEFAULT_STRENGTH: f64 = 0.8;
/// The strength of AUTOMATIC1111's img2img when a request gives no
/// `denoising_strength` (its API's own default).
pub const A1111_STRENGTH: f64 = 0.75;
/// The strength of OpenAI's image edits with a mask: the transparent area
/// is made anew, as that API defines it.
pub const OPENAI_EDIT_STRENGTH: f64 = 1.0;
/// Steps above this are refused as a typo rather than run for hours.
pub const MAX_STEPS: usize = 1000;
/// Images one job makes at most.
pub const MAX_IMAGES: usize = 10_000;
/// A prompt's text at most (the text encoder reads 512 tokens of it).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

/// What a job hands back for each image, as diffusers' `output_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputType {
    /// The decoded image (and its final latents).
    #[default]
    Image,
    /// The final latents only: no VAE decode.
    Latents,
}

/// One image of a batch: which of the batch's prompts, and its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub prompt: usize,
    pub seed: u64,
}

/// Images that share a request's size, steps, guidance and reference images:
/// distinct prompts, and the images to make from them, in order.
#[derive(Debug, Clone)]
pub struct Batch {
    pub prompts: Vec<Prompt>,
    pub items: Vec<Item>,
}

impl Batch {
    /// What `Job::resolve` makes: at least one item, each naming one of the prompts.
    pub(super) fn check(&self) -> Result<(), RunError> {
        match self.items.is_empty() || self.items.iter().any(|i| i.prompt >= self.prompts.len()) {
            true => Err(RunError::Internal(format!("a batch of {} items over {} prompts that no resolved job makes", self.items.len(), self.prompts.len()))),
            false => Ok(()),
        }
    }
}

/// What to generate. Everything but the prompts is optional: `None` takes
/// the model's default (steps and guidance by whether it is distilled, the
/// size from the first reference image or [`DEFAULT_SIDE`], a random seed).
#[derive(Debug, Clone)]
pub struct Job {
    /// The distinct conditionings, each made `images_per_prompt` times;
    /// equal texts are encoded once.
    pub prompts: Vec<Prompt>,
    /// Images per prompt, seeds counting up from `seed` across the whole job
    /// (each image is the one a single run with its seed makes).
    pub images_per_prompt: usize,
    /// Prepared reference images ([`super::reference_image::load`]), in order.
    pub references: Vec<ReferenceImage>,
    pub width: Option<usize>,
    pub height: Option<usize>,
    pub steps: Option<usize>,
    /// Classifier-free guidance scale; distilled models ignore it.
    pub guidance: Option<f32>,
    /// The first image's seed.
    pub seed: Option<u64>,
    /// LoRA adapters for the transformer ([`LoraSet::open`]).
    pub lora: Arc<LoraSet>,
    /// A VAE tile in pixels the plan must use; `None`: planned.
    pub vae_tile: Option<usize>,
    /// Device bytes the run may allocate; `None`: no limit.
    pub memory_budget: Option<u64>,
    pub output: OutputType,
    /// Image-to-image or inpainting: the picture to change, and how.
    pub init: Option<InitImage>,
    /// The klein KV pipeline's reference cache: `None` as the model's
    /// `model_index.json` names its pipeline, `Some` forced on or off.
    pub kv_cache: Option<bool>,
    /// The precisions the transformer's keys and values may take: f32 where
    /// that fits the budget, else f16 (`Auto`, the default), f32 only (the
    /// exact path), or f16 only.
    pub kv_precision: KvPrecision,
}

/// The picture image-to-image and inpainting start from
/// (`Flux2KleinInpaintPipeline`'s `image`, `mask_image` and `strength`).
#[derive(Debug, Clone)]
pub struct InitImage {
    /// Prepared with [`super::reference_image::Fit::Resize`]; it sets the
    /// output's size and is also the first reference image.
    pub image: ReferenceImage,
    /// White repaints ([`super::inpaint::load_mask`], at the image's size);
    /// `None`: everything (image-to-image).
    pub mask: Option<super::inpaint::Mask>,
    /// How far from the image to start, in (0, 1]: 1 repaints from pure noise.
    pub strength: f64,
    /// `padding_mask_crop`: `image` and `mask` are the crop around the
    /// mask, and the output goes back over the original
    /// ([`super::mask_crop::prepare`]); `None`: the whole image.
    pub overlay: Option<std::sync::Arc<super::mask_crop::Overlay>>,
}

/// What a resolved job carries of its init image: where the schedule
/// starts, and the mask on the token grid.
#[derive(Debug, Clone, PartialEq)]
pub struct InitRequest {
    pub strength: f64,
    /// The first step run, of `steps`.
    pub first_step: usize,
    /// Per token, 1 where repainted; `None`: every token.
    pub mask: Option<Vec<f32>>,
    /// Where a masked crop puts each decoded image back.
    pub overlay: Option<std::sync::Arc<super::mask_crop::Overlay>>,
}

impl Job {
    /// One image of `prompt`, everything else by default.
    pub fn new(prompt: Prompt) -> Self {
        Self::prompts(vec![prompt])
    }

    /// One image of each prompt, in order.
    pub fn prompts(prompts: Vec<Prompt>) -> Self {
        Self {
            prompts,
            images_per_prompt: 1,
            references: Vec::new(),
            width: None,
            height: None,
            steps: None,
            guidance: None,
            seed: None,
            lora: Arc::default(),
            vae_tile: None,
            memory_budget: None,
            output: OutputType::Image,
            init: None,
            kv_cache: None,
            kv_precision: KvPrecision::Auto,
        }
    }

    /// Applies the defaults and checks every rule a request must meet,
    /// before anything is loaded: the first rule broken is the error.
    /// The memory plan is checked later, against the device
    /// ([`super::Pipeline::plan`]).
    pub fn resolve(self, model: &ModelFolder, limits: &Limits) -> Result<Resolved, RequestError> {
        if self.prompts.is_empty() {
            return Err(RequestError::NoPrompt);
        }
        let joint = model.transformer.joint_attention_dim;
        for (index, prompt) in self.prompts.iter().enumerate() {
            check_prompt(index, prompt, joint, limits.max_prompt_bytes)?;
        }
        let images = self.prompts.len().saturating_mul(self.images_per_prompt);
        if self.images_per_prompt == 0 || images > limits.max_images {
            return Err(RequestError::Images { per_prompt: self.images_per_prompt, total: images, limit: limits.max_images });
        }
        check_reference_count(self.references.len() + usize::from(self.init.is_some()))?;
        let cell = model.vae.latent_cell();
        for r in self.init.iter().map(|i| &i.image).chain(&self.references) {
            check_reference(r, cell)?;
        }
        // The init image sets the size, as the pipeline takes it; it goes first among the references.
        if let Some(init) = &self.init {
            if self.kv_cache.unwrap_or(model.index.kv_cache) {
                return Err(RequestError::InitWithKvCache);
            }
            for (side, asked, pixels) in [(Side::Width, self.width, init.image.width), (Side::Height, self.height, init.image.height)] {
                if asked.is_some_and(|a| a != pixels) {
                    return Err(RequestError::InitSize { side, asked: asked.unwrap_or_default(), pixels });
                }
            }
            if !(init.strength > 0.0 && init.strength <= 1.0) {
                return Err(RequestError::Strength { strength: init.strength, why: "give a number in (0, 1]".into() });
            }
            if let Some(mask) = &init.mask {
                super::inpaint::check_mask(mask, init.image.width, init.image.height)?;
            }
        }
        let first = self.init.as_ref().map(|i| &i.image).or(self.references.first());
        let width = self.width.or(first.map(|r| r.width)).unwrap_or(DEFAULT_SIDE);
        let height = self.height.or(first.map(|r| r.height)).unwrap_or(DEFAULT_SIDE);
        for (side, pixels) in [(Side::Width, width), (Side::Height, height)] {
            if pixels > limits.max_side {
                return Err(RequestError::SideTooLarge { side, pixels, limit: limits.max_side });
            }
        }
        let (rows, cols) = denoise::latent_grid(&model.vae, width, height)?;
        let steps = self.steps.unwrap_or_else(|| default_steps(model));
        if steps == 0 || steps > limits.max_steps {
            return Err(RequestError::Steps { steps, limit: limits.max_steps });
        }
        let guidance = self.guidance.unwrap_or_else(|| default_guidance(model));
        if !guidance.is_finite() || guidance < 0.0 {
            return Err(RequestError::Guidance { guidance });
        }
        if let Some(tile) = self.vae_tile {
            if tile == 0 || !tile.is_multiple_of(cell) {
                return Err(RequestError::VaeTile { tile: Some(tile), why: format!("not a positive multiple of {cell} pixels") });
            }
        }
        let init = match &self.init {
            Some(i) => {
                // A strength in (0, 1] leaves at least one step: int(steps − steps·strength) < steps.
                let first_step = super::inpaint::first_step(steps, i.strength);
                let mask = i.mask.as_ref().map(|m| super::inpaint::token_mask(m, rows, cols));
                Some(InitRequest { strength: i.strength, first_step, mask, overlay: i.overlay.clone() })
            }
            None => None,
        };
        let seed = self.seed.unwrap_or_else(random_seed);
        let batch = batch(self.prompts, self.images_per_prompt, seed);
        let references: Vec<ReferenceImage> = self.init.map(|i| i.image).into_iter().chain(self.references).collect();
        let request = Request {
            width,
            height,
            steps,
            seed,
            guidance,
            vae_tile: self.vae_tile,
            memory_budget: self.memory_budget,
            references: references.iter().map(|r| (r.width, r.height)).collect(),
            lora: self.lora,
            init,
            kv_cache: self.kv_cache.unwrap_or(model.index.kv_cache),
            kv_precision: self.kv_precision,
        };
        let guidance_ignored = model.index.is_distilled && guidance > 1.0;
        let negative_ignored = !super::uses_guidance(model, guidance) && batch.prompts.iter().any(Prompt::has_negative);
        Ok(Resolved { batch, request, references, output: self.output, guidance_ignored, negative_ignored })
    }
}

/// A caller's limits on one job, beyond the model's own rules. The default
/// is `gen`'s: a server sets tighter ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_images: usize,
    pub max_steps: usize,
    /// Each image side at most (the memory plan bounds it too).
    pub max_side: usize,
    pub max_prompt_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_images: MAX_IMAGES, max_steps: MAX_STEPS, max_side: usize::MAX, max_prompt_bytes: MAX_PROMPT_BYTES }
    }
}

/// A job with every default applied and every rule met: the only thing
/// [`super::Pipeline::run`] takes. Made by [`Job::resolve`] alone:
///
/// ```compile_fail
/// // Its fields are the engine's: a caller cannot build one unchecked.
/// let job = flux_lite_platform::Resolved { output: flux_lite_platform::OutputType::Image, guidance_ignored: false, negative_ignored: false };
/// ```
#[derive(Debug, Clone)]
pub struct Resolved {
    pub(crate) batch: Batch,
    pub(crate) request: Request,
    pub(crate) references: Vec<ReferenceImage>,
    pub(crate) output: OutputType,
    guidance_ignored: bool,
    negative_ignored: bool,
}

impl Resolved {
    /// The size, steps, first seed, guidance and budget the job runs with.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The distinct prompts and the images made of them, with their seeds.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    pub fn references(&self) -> &[ReferenceImage] {
        &self.references
    }

    pub fn output(&self) -> OutputType {
        self.output
    }

    /// Images the job makes.
    pub fn images(&self) -> usize {
        self.batch.items.len()
    }

    /// A guidance scale above 1 asked of a guidance-distilled model, which ignores it.
    pub fn guidance_ignored(&self) -> bool {
        self.guidance_ignored
    }

    /// A negative prompt given where no guidance runs (a distilled model, or
    /// a scale of 1 or less), so nothing reads it. A warning rather than a
    /// refusal: A1111's clients send their negative with every request, to
    /// every model, as they send a guidance scale.
    pub fn negative_ignored(&self) -> bool {
        self.negative_ignored
    }
}

/// Denoising steps when none are asked for, as diffusers' model cards use:
/// 4 for guidance-distilled models, 50 otherwise.
pub fn default_steps(model: &ModelFolder) -> usize {
    default_steps_for(model.index.is_distilled)
}

/// [`default_steps`] for a model that is guidance-distilled or not.
pub fn default_steps_for(distilled: bool) -> usize {
    if distilled { 4 } else { 50 }
}

/// A generation's encodes of the text encoder and passes of the
/// transformer over `steps` denoising steps: under classifier-free guidance
/// the negative prompt is encoded too and each step runs two passes.
pub fn generation_passes(steps: u64, guided: bool) -> GenerationPasses {
    let per = if guided { 2 } else { 1 };
    GenerationPasses { encodes: per, transformer: per * steps }
}

/// What [`generation_passes`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationPasses {
    pub encodes: u64,
    pub transformer: u64,
}

/// The guidance scale when none is asked for: 1.0 (none) for distilled models, 4.0 otherwise.
pub fn default_guidance(model: &ModelFolder) -> f32 {
    if model.index.is_distilled { 1.0 } else { 4.0 }
}

/// A seed from the clock and the process: 63 bits, as a torch user would pass.
pub fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (std::process::id() as u64).rotate_left(32)) & (u64::MAX >> 1)
}

/// Each prompt `images_per_prompt` times, seeds `seed`, `seed + 1`, … in
/// order; equal texts are one prompt.
fn batch(prompts: Vec<Prompt>, images_per_prompt: usize, seed: u64) -> Batch {
    let mut distinct: Vec<Prompt> = Vec::new();
    let mut items = Vec::with_capacity(prompts.len() * images_per_prompt);
    for prompt in prompts {
        let same = |d: &Prompt| {
            matches!((d, &prompt), (Prompt::Text { positive: a, negative: n }, Prompt::Text { positive: b, negative: m }) if a == b && n == m)
        };
        let index = match distinct.iter().position(same) {
            Some(i) => i,
            None => {
                distinct.push(prompt);
                distinct.len() - 1
            }
        };
        for _ in 0..images_per_prompt {
            items.push(Item { prompt: index, seed: seed.wrapping_add(items.len() as u64) });
        }
    }
    Batch { prompts: distinct, items }
}

fn check_prompt(index: usize, prompt: &Prompt, joint: usize, max_bytes: usize) -> Result<(), RequestError> {
    let expected = PROMPT_TOKENS * joint;
    let embeddings = |which: &'static str, values: usize| RequestError::Embeddings { index, which, values, expected: (PROMPT_TOKENS, joint) };
    match prompt {
        Prompt::Text { positive, .. } if positive.len() > max_bytes => Err(RequestError::PromptTooLong { index, bytes: positive.len(), limit: max_bytes }),
        Prompt::Text { negative, .. } if negative.len() > max_bytes => Err(RequestError::NegativePromptTooLong { index, bytes: negative.len(), limit: max_bytes }),
        Prompt::Text { .. } => Ok(()),
        Prompt::Embeddings { positive, .. } if positive.len() != expected => Err(embeddings("prompt", positive.len())),
        Prompt::Embeddings { negative: Some(negative), .. } if negative.len() != expected => Err(embeddings("negative prompt", negative.len())),
        Prompt::Embeddings { .. } => Ok(()),
    }
}

/// The reference images' count (the init image among them) within the
/// pipeline's limit: `resolve`'s rule, which a caller may check before it
/// decodes a request's images.
pub fn check_reference_count(count: usize) -> Result<(), RequestError> {
    match count > MAX_REFERENCES {
        true => Err(RequestError::References { count, limit: MAX_REFERENCES }),
        false => Ok(()),
    }
}

/// A reference prepared for another VAE (or built by hand) is refused.
fn check_reference(r: &ReferenceImage, cell: usize) -> Result<(), RequestError> {
    let name = r.path.display().to_string();
    if r.width == 0 || r.height == 0 || !r.width.is_multiple_of(cell) || !r.height.is_multiple_of(cell) {
        return Err(RequestError::Reference { name, why: format!("{}×{} is not made of whole {cell}-pixel latent cells", r.width, r.height) });
    }
    if r.pixels.len() != 3 * r.width * r.height {
        return Err(RequestError::Reference { name, why: format!("holds {} values; {}×{} RGB needs {}", r.pixels.len(), r.width, r.height, 3 * r.width * r.height) });
    }
    Ok(())
}

pub use crate::request::{RequestError, Setting, Side};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_seeds_across_prompts_and_encodes_equal_texts_once() {
        let text = |t: &str| Prompt::text(t);
        let b = batch(vec![text("a"), text("b"), text("a")], 2, 7);
        assert_eq!(b.prompts.len(), 2);
        let got: Vec<(usize, u64)> = b.items.iter().map(|i| (i.prompt, i.seed)).collect();
        assert_eq!(got, [(0, 7), (0, 8), (1, 9), (1, 10), (0, 11), (0, 12)]);
        // The same text under another negative is another conditioning.
        let b = batch(vec![text("a"), Prompt::with_negative("a", "blur"), Prompt::with_negative("a", "blur")], 1, 0);
        assert_eq!(b.prompts.len(), 2);
        assert_eq!(b.items.iter().map(|i| i.prompt).collect::<Vec<_>>(), [0, 1, 1]);
    }

    #[test]
    fn errors_name_the_setting_and_its_value() {
        let e = RequestError::Steps { steps: 0, limit: 1000 };
        assert_eq!(e.to_string(), "steps 0: give 1 to 1000");
        assert_eq!(e.line("--steps"), "--steps 0: give 1 to 1000");
        let e = RequestError::Reference { name: "image[0]".into(), why: "not a PNG or JPEG image".into() };
        assert_eq!(e.line(""), "image[0]: not a PNG or JPEG image");
        assert_eq!(RequestError::NoPrompt.to_string(), "prompt: give a prompt (text or embeddings)");
    }
}

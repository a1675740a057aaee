//! One generation of any number of images ([`Batch`]): the prompts are
//! encoded once each, then every image is denoised, then every image is
//! decoded, so each component loads once per round, not once per image.
//! A round holds the embeddings of its prompts and the latents of its images
//! on the host; a large batch runs in several rounds of at most
//! [`ROUND_HOST_BYTES`] (less when the budget has less room).

use super::job::{Batch, Item};
use crate::exec::activations::Bands;
use super::kept::{Keepable, Kept, PromptEncoder, TransformerKey};
use super::job::{OutputType, Resolved};
use super::{denoise, uses_guidance, Image, Observer, Phase, Pipeline, Progress, Prompt, Request, Timings, PROMPT_TOKENS};
use crate::components::text_encoder::TextEncoder;
use crate::components::transformer::{LatentGrids, Transformer};
use crate::error::RunError;
use crate::model::tokenizer::PromptTokenizer;
use crate::model::Component;
use crate::pipeline::denoise::Conditioning;
use flux_lite_core::plan::{Plan, WeightStrategy};
use std::time::Instant;

/// Host bytes a round may hold in prompt embeddings and latents (a round
/// holds at least one image, whatever its size).
pub const ROUND_HOST_BYTES: u64 = 256 << 20;


/// One finished image of a batch, handed over as soon as it is decoded.
#[derive(Debug, Clone)]
pub struct Made {
    /// Its place in the batch's items.
    pub index: usize,
    pub seed: u64,
    /// The final packed latents `[tokens, in_channels]`.
    pub latents: Vec<f32>,
    /// `None` when only the latents were asked for.
    pub image: Option<Image>,
}

/// What a batch ran under, once every image was handed over.
#[derive(Debug, Clone)]
pub struct Finished {
    pub plan: Plan,
    pub timings: Timings,
    /// Components reused from an earlier generation (`keep_loaded`).
    pub reused: Vec<&'static str>,
}

/// A prompt's positive and (when guided) negative embeddings.
type Embeddings = (Vec<f32>, Option<Vec<f32>>);

/// Makes every image of `job` with `pipeline` ([`Pipeline::run`]) under
/// `request` (the job's, budgeted), handing each to `take` as it is made.
pub(super) fn run_job(pipeline: &Pipeline, job: &Resolved, request: &Request, observer: &mut dyn Observer, take: &mut dyn FnMut(Made) -> Result<(), RunError>) -> Result<Finished, RunError> {
    let (batch, references, decode_image) = (&job.batch, &job.references, job.output == OutputType::Image);
    batch.check()?;
    let sizes: Vec<(usize, usize)> = references.iter().map(|r| (r.width, r.height)).collect();
    if sizes != request.references {
        return Err(RunError::Internal("the request's reference sizes differ from the reference images given".into()));
    }
    let plan = super::planning::plan(&pipeline.gpu, &pipeline.model, &pipeline.sizes, request)?;
    // A VAE in bands on the host keeps the image's activations in a scratch
    // file: find out now, not after the denoising, if its folder cannot take one.
    let banded_encode = plan.references.is_some_and(|r| r.tile.is_some());
    if (decode_image && matches!(Bands::from(plan.decode), Bands::OnHost { .. })) || banded_encode {
        crate::exec::activations::HostTensors::scratch_in(&pipeline.scratch_dir, 1)?;
    }
    let mut kept = pipeline.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match pipeline.keep_loaded {
        true => kept.make_room(&plan, request.memory_budget),
        false => *kept = Kept::default(),
    }
    let mut run = BatchRun { pipeline, plan: &plan, request, kept: &mut kept, count: batch.items.len(), timings: Timings::default(), reused: Vec::new() };
    let rounds = run.rounds(batch);
    let mut encoded_references = None;
    for round in rounds {
        let round_start = round.start;
        let items = &batch.items[round];
        Pipeline::begin(Phase::Encode, observer);
        let embeddings = run.encode(batch, items, observer)?;
        let encoded = match &encoded_references {
            Some(e) => e,
            None => {
                if !references.is_empty() {
                    Pipeline::begin(Phase::References, observer);
                }
                let tile = plan.references.and_then(|r| r.tile).map(|t| t as usize);
                let e = super::encode_references(&pipeline.gpu, &pipeline.model, references, tile, &pipeline.scratch_dir, &mut run.timings, &mut |p| observer.progress(p))?;
                encoded_references.insert(e)
            }
        };
        Pipeline::begin(Phase::Denoise, observer);
        let latents = run.denoise(round_start, items, &embeddings, encoded, observer)?;
        drop(embeddings);
        if decode_image {
            Pipeline::begin(Phase::Decode, observer);
        }
        run.hand_over(round_start, items, latents, decode_image, observer, take)?;
    }
    let BatchRun { timings, reused, .. } = run;
    Ok(Finished { plan, timings, reused })
}

/// One batch in progress.
struct BatchRun<'a> {
    pipeline: &'a Pipeline,
    plan: &'a Plan,
    request: &'a Request,
    kept: &'a mut Kept,
    /// Images in the whole batch.
    count: usize,
    timings: Timings,
    reused: Vec<&'static str>,
}

impl BatchRun<'_> {
    /// The batch's items cut into rounds whose embeddings and latents fit
    /// [`ROUND_HOST_BYTES`] and the budget's room beside the plan.
    fn rounds(&self, batch: &Batch) -> Vec<std::ops::Range<usize>> {
        let model = &self.pipeline.model;
        let embedding = (PROMPT_TOKENS * model.transformer.joint_attention_dim * 4) as u64;
        let latents = denoise::latent_grid(&model.vae, self.request.width, self.request.height)
            .map_or(0, |(h, w)| (h * w * model.transformer.in_channels * 4) as u64);
        let room = self.request.memory_budget.map_or(ROUND_HOST_BYTES, |b| b.saturating_sub(self.plan.peak()).min(ROUND_HOST_BYTES));
        let guided = uses_guidance(model, self.request.guidance);
        let base = if guided { embedding } else { 0 };
        let mut rounds = Vec::new();
        let (mut start, mut prompts, mut bytes) = (0, Vec::new(), base);
        for (i, item) in batch.items.iter().enumerate() {
            let cost = |prompts: &Vec<usize>| latents + if prompts.contains(&item.prompt) { 0 } else { embedding };
            if i > start && bytes + cost(&prompts) > room {
                rounds.push(start..i);
                (start, bytes) = (i, base);
                prompts.clear();
            }
            bytes += cost(&prompts);
            if !prompts.contains(&item.prompt) {
                prompts.push(item.prompt);
            }
        }
        rounds.push(start..batch.items.len());
        rounds
    }

    /// The embeddings of each prompt the round's items use (`None` for the others).
    fn encode(&mut self, batch: &Batch, items: &[Item], observer: &mut dyn Observer) -> Result<Vec<Option<Embeddings>>, RunError> {
        let guided = uses_guidance(&self.pipeline.model, self.request.guidance);
        let used: Vec<usize> = (0..batch.prompts.len()).filter(|p| items.iter().any(|i| i.prompt == *p)).collect();
        // The texts to encode, each once; each text prompt's negative is one of them when guided.
        let mut texts: Vec<&str> = Vec::new();
        for &p in &used {
            match &batch.prompts[p] {
                Prompt::Text { positive, negative } => {
                    push_once(&mut texts, positive);
                    if guided {
                        push_once(&mut texts, negative);
                    }
                }
                Prompt::Embeddings { negative: None, .. } if guided => push_once(&mut texts, ""),
                Prompt::Embeddings { .. } => {}
            }
        }
        let encoded = self.encode_texts(&texts, observer)?;
        let of = |t: &str| texts.iter().position(|x| *x == t).map(|i| encoded[i].clone());
        Ok((0..batch.prompts.len())
            .map(|p| {
                if !used.contains(&p) {
                    return None;
                }
                Some(match &batch.prompts[p] {
                    Prompt::Text { positive, negative } => (of(positive).unwrap_or_default(), if guided { of(negative) } else { None }),
                    Prompt::Embeddings { positive, negative: Some(n) } => (positive.clone(), Some(n.clone())),
                    Prompt::Embeddings { positive, negative: None } => (positive.clone(), if guided { of("") } else { None }),
                })
            })
            .collect())
    }

    /// Tokenizes and encodes `texts` with one text encoder (kept from before
    /// when it can be), passing truncation warnings to the observer.
    fn encode_texts(&mut self, texts: &[&str], observer: &mut dyn Observer) -> Result<Vec<Vec<f32>>, RunError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (pipeline, strategy) = (self.pipeline, self.plan.encode.weights);
        let started = Instant::now();
        let encoder = self.get_or_load(&strategy, || load_prompt_encoder(pipeline, strategy, observer))?;
        self.timings.load += started.elapsed();
        let started = Instant::now();
        let out = encode_texts(pipeline, &encoder, texts, observer)?;
        self.timings.encode += started.elapsed();
        self.keep(strategy, encoder, self.plan.encode.peak());
        Ok(out)
    }

    /// The component laid out for `key`: kept from an earlier generation
    /// (named among the reused), else `load`'s.
    fn get_or_load<T: Keepable>(&mut self, key: &T::Key, load: impl FnOnce() -> Result<T, RunError>) -> Result<T, RunError> {
        let got = self.kept.get_or_load(key, load)?;
        if got.reused {
            self.reused.push(T::NAME);
        }
        Ok(got.value)
    }

    /// Keeps `value` for a later generation where the pipeline keeps
    /// components and it fits beside the plan, charged `cost`.
    fn keep<T: Keepable>(&mut self, key: T::Key, value: T, cost: u64) {
        if self.pipeline.keep_loaded {
            self.kept.keep(key, value, cost, self.plan, self.request.memory_budget);
        }
    }

    /// Denoises each item from its seed's noise and returns its latents; one
    /// transformer serves them all.
    fn denoise(&mut self, first: usize, items: &[Item], embeddings: &[Option<Embeddings>], references: &super::References, observer: &mut dyn Observer) -> Result<Vec<Vec<f32>>, RunError> {
        let (pipeline, request) = (self.pipeline, self.request);
        let (gpu, model) = (&pipeline.gpu, &pipeline.model);
        let (lat_h, lat_w) = denoise::latent_grid(&model.vae, request.width, request.height)?;
        let started = Instant::now();
        let key = TransformerKey {
            strategy: self.plan.denoise.weights,
            chunk: self.plan.denoise.chunk.map(|c| c as usize),
            grids: LatentGrids { noise: (lat_h, lat_w), references: references.grids.clone(), kv_cache: self.plan.denoise.kv_cache, half_kv: self.plan.denoise.half_kv },
            lora: request.lora.key(),
        };
        let transformer = self.get_or_load(&key, || {
            let store = model.weights(Component::Transformer)?;
            if let Some(warning) = store.unread_warning() {
                observer.warning(&warning);
            }
            Transformer::adapted(gpu, &model.transformer, store, key.strategy, key.chunk, PROMPT_TOKENS, &key.grids, &request.lora)
        })?;
        transformer.set_references(gpu, &references.tokens)?;
        self.timings.load += started.elapsed();
        // Image-to-image and inpainting start from the init image: the first reference's tokens.
        let channels = model.transformer.in_channels;
        let init_tokens = &references.tokens[..(lat_h * lat_w * channels).min(references.tokens.len())];
        let init = request.init.as_ref().map(|i| denoise::Init { first_step: i.first_step, image: init_tokens, mask: i.mask.as_deref() });
        // Previews are drawn on the GPU from the latents in place, one drawer for
        // every image of the round; nothing runs without them.
        let every = observer.previews();
        let drawer = match every {
            Some(_) => Some(super::preview::Drawer::new(gpu, model, &transformer, (lat_h, lat_w), (request.width, request.height), self.plan.preview, &pipeline.scratch_dir)?),
            None => None,
        };
        let total = request.steps - request.init.as_ref().map_or(0, |i| i.first_step);
        let mut out = Vec::with_capacity(items.len());
        for (n, item) in items.iter().enumerate() {
            observer.image(first + n, self.count);
            let Some((positive, negative)) = &embeddings[item.prompt] else {
                return Err(RunError::Internal(format!("prompt {} was not encoded", item.prompt)));
            };
            let conditioning = match negative.as_deref() {
                Some(negative) if uses_guidance(model, request.guidance) => Conditioning::Guided { positive, negative, scale: request.guidance },
                _ => Conditioning::Prompt(positive),
            };
            let noise = denoise::packed_noise(item.seed, channels, lat_h, lat_w);
            let previews = every.zip(drawer.as_ref()).map(|(every, drawer)| Previews { every, total, drawer });
            let mut watch = ImageWatch { gpu, observer: &mut *observer, steps: &mut self.timings.steps, step_started: Instant::now(), previews };
            out.push(denoise::denoise(gpu, &transformer, &model.scheduler, request.steps, &noise, init, conditioning, &mut watch)?);
        }
        self.keep(key, transformer, self.plan.denoise.peak());
        Ok(out)
    }

    /// Decodes each item's latents (when asked) and hands the image over.
    fn hand_over(
        &mut self,
        first: usize,
        items: &[Item],
        latents: Vec<Vec<f32>>,
        decode_image: bool,
        observer: &mut dyn Observer,
        take: &mut dyn FnMut(Made) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        let (pipeline, request) = (self.pipeline, self.request);
        let key = (request.width, request.height, Bands::from(self.plan.decode));
        let mut vae = None;
        if decode_image {
            let started = Instant::now();
            vae = Some(self.get_or_load(&key, || super::load_vae_decoder(&pipeline.gpu, &pipeline.model, request.width, request.height, key.2, &pipeline.scratch_dir))?);
            self.timings.load += started.elapsed();
        }
        for (n, (item, latents)) in items.iter().zip(latents).enumerate() {
            let image = match vae.as_mut() {
                Some(vae) => {
                    observer.image(first + n, self.count);
                    let started = Instant::now();
                    let image = vae.decode(&pipeline.gpu, &latents, false, &mut |t| observer.progress(Progress::Decode { done: t.done, total: t.total }))?;
                    self.timings.decode += started.elapsed();
                    match request.init.as_ref().and_then(|i| i.overlay.as_ref()) {
                        Some(o) => {
                            let put_back = o.apply(image.width, image.height, image.rgb);
                            Some(Image { width: put_back.width, height: put_back.height, rgb: put_back.data })
                        }
                        None => Some(Image { width: image.width, height: image.height, rgb: image.rgb }),
                    }
                }
                None => None,
            };
            // Interrupted after the last block: nothing more is handed over.
            pipeline.gpu.check_interrupt()?;
            take(Made { index: first + n, seed: item.seed, latents, image })?;
        }
        if let Some(value) = vae {
            self.keep(key, value, self.plan.decode.peak());
        }
        Ok(())
    }
}

/// Previews of the steps of an image: every `every` steps and after the
/// last of `total`, drawn by `drawer`.
struct Previews<'d> {
    every: usize,
    total: usize,
    drawer: &'d super::preview::Drawer,
}

/// What the observer sees of one image's denoising: its progress, each
/// step's time once its last block is done, and its previews.
struct ImageWatch<'w> {
    gpu: &'w flux_lite_kernels::Gpu,
    observer: &'w mut dyn Observer,
    steps: &'w mut Vec<std::time::Duration>,
    step_started: Instant,
    previews: Option<Previews<'w>>,
}

impl denoise::Watch for ImageWatch<'_> {
    fn progress(&mut self, p: denoise::StepProgress) {
        self.observer.progress(Progress::Denoise(p));
        if p.block.done == p.block.total {
            self.steps.push(self.step_started.elapsed());
            self.step_started = Instant::now();
        }
    }

    fn after_step(&mut self, step: usize, transformer: &Transformer) -> Result<(), RunError> {
        let Some(p) = &self.previews else { return Ok(()) };
        if !(step + 1).is_multiple_of(p.every.max(1)) && step + 1 != p.total {
            return Ok(());
        }
        let (width, height, rgb) = p.drawer.draw(self.gpu, transformer)?;
        self.observer.preview(&super::Preview { step: step + 1, steps: p.total, width, height, rgb: &rgb });
        Ok(())
    }
}

fn push_once<'t>(texts: &mut Vec<&'t str>, text: &'t str) {
    if !texts.contains(&text) {
        texts.push(text);
    }
}

/// Loads the tokenizer and the text encoder with its weights placed as
/// `strategy` says, warning of the encoder's unread tensors.
fn load_prompt_encoder(pipeline: &Pipeline, strategy: WeightStrategy, observer: &mut dyn Observer) -> Result<PromptEncoder, RunError> {
    let model = &pipeline.model;
    let tokenizer = PromptTokenizer::load(&model.component_dir("tokenizer"))?;
    let store = model.weights(Component::TextEncoder)?;
    if let Some(warning) = store.unread_warning() {
        observer.warning(&warning);
    }
    let encoder = TextEncoder::new(&pipeline.gpu, &model.text_encoder, store, strategy, PROMPT_TOKENS, model.text_encoder.output_layers())?;
    Ok(PromptEncoder { strategy, tokenizer, encoder })
}

/// The one way prompts are encoded, for a generation and for `flux-lite
/// encode` alike: each text tokenized and encoded with `e`, its truncation
/// warned of, progress as prompt `index` of them all.
fn encode_texts(pipeline: &Pipeline, e: &PromptEncoder, texts: &[&str], observer: &mut dyn Observer) -> Result<Vec<Vec<f32>>, RunError> {
    let mut out = Vec::with_capacity(texts.len());
    for (index, text) in texts.iter().enumerate() {
        let tokens = e.tokenizer.encode_prompt(text, PROMPT_TOKENS)?;
        let values = e.encoder.encode(&pipeline.gpu, &tokens.input_ids, &tokens.attention_mask, &mut |block| {
            observer.progress(Progress::Encode { prompt: index, prompts: texts.len(), block })
        })?;
        if let Some(w) = tokens.truncation_warning() {
            observer.warning(&w);
        }
        out.push(values);
    }
    Ok(out)
}

/// Encodes prompts alone with a text encoder laid out as `strategy` says,
/// dropped (its device memory released) before this returns ([`Pipeline::encode`]).
pub(super) fn encode_alone(pipeline: &Pipeline, strategy: WeightStrategy, texts: &[&str], observer: &mut dyn Observer) -> Result<(Vec<Vec<f32>>, Timings), RunError> {
    let mut timings = Timings::default();
    let started = Instant::now();
    let encoder = load_prompt_encoder(pipeline, strategy, observer)?;
    timings.load += started.elapsed();
    let started = Instant::now();
    let values = encode_texts(pipeline, &encoder, texts, observer)?;
    timings.encode += started.elapsed();
    Ok((values, timings))
}

//! `flux-lite gen`: flags → a `Job` → the engine → PNG files.

mod again;
mod inputs;
mod outputs;
mod report;
mod watch;

use crate::progress::Bar;
use crate::recipe;
use argh::FromArgs;
use flux_lite_platform::model::lora::LoraSpec;
use flux_lite_platform::pipeline::init_image::Marks;
use flux_lite_platform::pipeline::{self, KvPrecision, Made};
use flux_lite_platform::{GpuOptions, Job, Limits, OutputType, Pipeline, RunError};
use std::path::PathBuf;
use std::time::Instant;

/// Generate an image from a text prompt.
#[derive(FromArgs, Debug, Clone)]
#[argh(subcommand, name = "gen")]
pub struct GenArgs {
    /// the diffusers model folder (model_index.json, text_encoder/, tokenizer/, transformer/, vae/, scheduler/); with --from, the one the image names unless given
    #[argh(option)]
    model: Option<PathBuf>,
    /// make again the image this PNG was made as: its prompt, seed, size, steps, guidance, model, LoRAs, input images and precision, as it carries them; each flag given instead wins (an image from another tool gives its prompts, seed, steps, guidance and size)
    #[argh(option)]
    from: Option<PathBuf>,
    /// the text prompt
    #[argh(option)]
    prompt: Option<String>,
    /// read the prompt from this UTF-8 text file (its final line break dropped)
    #[argh(option)]
    prompt_file: Option<PathBuf>,
    /// with guidance (a base model, --guidance above 1), what to steer away from, for every prompt (default: the empty prompt, as diffusers); a guidance-distilled model has no use for it and warns
    #[argh(option)]
    negative_prompt: Option<String>,
    /// where to write the image: a file (written whole or not at all; a symbolic link is written through), a named pipe or device (written into), or - for standard output; .png (the default), .jpg/.jpeg or .webp (lossless) by its extension, each carrying the settings it was made with
    #[argh(option)]
    output: Option<PathBuf>,
    /// JPEG quality, 1 to 100 (default 90); for --output FILE.jpg
    #[argh(option)]
    quality: Option<u8>,
    /// a reference image (PNG or JPEG) to edit or take elements from; repeat for up to 16. Each is scaled to about 1 megapixel when larger and centre-cropped to multiples of 16
    #[argh(option)]
    image: Vec<PathBuf>,
    /// image-to-image or inpainting: the picture to change (PNG or JPEG; it sets the output's size and is also the first reference image)
    #[argh(option)]
    init_image: Option<PathBuf>,
    /// with --init-image, what to repaint: a PNG or JPEG whose white (grey ≥ 128) parts are repainted and black parts kept; default: all of it
    #[argh(option)]
    mask: Option<PathBuf>,
    /// with --mask, what in it repaints: white (default: grey ≥ 128, as diffusers), black (inverted, as A1111's inpainting_mask_invert) or transparent (as OpenAI's image edits)
    #[argh(option, from_str_fn(parse_mask_marks))]
    mask_marks: Option<Marks>,
    /// with --init-image, how far from it to start, in (0, 1]: 1 repaints from pure noise (default 0.8, as diffusers; steps × strength of the steps run)
    #[argh(option)]
    strength: Option<f64>,
    /// with --mask, work on the region around the mask's white parts grown by PIXELS, at the output's size, and paste the result back over the init image (diffusers' padding_mask_crop; the PNG has the init image's size)
    #[argh(option)]
    mask_crop: Option<usize>,
    /// the references' keys and values: auto (default: cached after the first step when model_index.json names Flux2KleinKVPipeline), on (the KV pipeline's recipe for any klein model) or off (Flux2KleinPipeline's: the references in every pass)
    #[argh(option, default = "None", from_str_fn(parse_kv_cache))]
    kv_cache: Option<bool>,
    /// the transformer's keys and values under --memory-budget: auto (default: f32, or f16 where only that fits), f32 (the exact path: a budget only f16 would fit is refused) or f16 (always, by chunks of tokens)
    #[argh(option, from_str_fn(parse_kv_precision))]
    kv_precision: Option<KvPrecision>,
    /// image width in pixels, a multiple of 16 for the real VAE (default: the first reference image's, else 1024)
    #[argh(option)]
    width: Option<usize>,
    /// image height in pixels, a multiple of 16 for the real VAE (default: the first reference image's, else 1024)
    #[argh(option)]
    height: Option<usize>,
    /// denoising steps (default: 4 for distilled models, 50 otherwise)
    #[argh(option)]
    steps: Option<usize>,
    /// random seed (default: random; always printed)
    #[argh(option)]
    seed: Option<u64>,
    /// classifier-free guidance scale (default: 1.0 for distilled models, 4.0 otherwise; distilled models ignore it)
    #[argh(option)]
    guidance: Option<f32>,
    /// make this many images, seeds S, S+1, … (each the image a single run with that seed makes); outputs are numbered NAME-0001.png, … and never overwrite a file (default 1)
    #[argh(option, default = "1")]
    count: usize,
    /// one prompt per line (blank lines skipped): one image each (--count each), seeds S, S+1, … in order; equal prompts are encoded once; outputs numbered as with --count
    #[argh(option)]
    batch_file: Option<PathBuf>,
    /// use prompt embeddings from this safetensors file (`prompt_embeds` [512, joint], as `flux-lite encode` writes) instead of --prompt
    #[argh(option)]
    embeddings: Option<PathBuf>,
    /// a LoRA adapter for the transformer, FILE[:SCALE] (scale default 1.0); repeat to add several. diffusers/PEFT, BFL (ai-toolkit) and kohya layouts
    #[argh(option, from_str_fn(crate::lora::parse_lora))]
    lora: Vec<LoraSpec>,
    /// read the transformer from this folder instead of the model's transformer/, or from a GGUF file (BFL's tensor names, as ComfyUI-GGUF and stable-diffusion.cpp write them)
    #[argh(option)]
    transformer: Option<PathBuf>,
    /// read the text encoder from a GGUF file (llama.cpp's Qwen3 layout, e.g. Qwen3-4B-Q8_0.gguf) instead of the model's text_encoder/
    #[argh(option)]
    text_encoder: Option<PathBuf>,
    /// VAE device memory as for a square image of this many pixels; larger images (and reference images) run by bands (default: untiled while the image fits)
    #[argh(option)]
    vae_tile: Option<usize>,
    /// device memory the run may allocate, e.g. 2GiB or 512MiB (default: the adapter's memory less 10% where it is known: the Vulkan heap budget, or the host memory available on a CPU adapter; else no limit)
    #[argh(option, from_str_fn(crate::budget::parse_memory_budget))]
    memory_budget: Option<u64>,
    /// also write the final packed latents (safetensors, tensor `latents` [tokens, channels])
    #[argh(option)]
    output_latents: Option<PathBuf>,
    /// rewrite this PNG with a preview of the image after each step (the latents through the VAE's latent-to-RGB map; an image viewer that reloads shows the image forming)
    #[argh(option)]
    preview: Option<PathBuf>,
    /// with --preview, draw it every N steps and after the last (default 1)
    #[argh(option, default = "1")]
    preview_every: usize,
    /// with --preview, draw it with this tiny decoder instead (a safetensors file in diffusers' AutoencoderTiny layout or TAESD's, e.g. TAEF2): the image as a small VAE sees it, on the GPU, its memory counted in the plan
    #[argh(option)]
    preview_decoder: Option<PathBuf>,
    /// precision tier: auto (default: on a CPU adapter f32, the fastest there; elsewhere matrix units where the adapter has them and they pass a known-answer check, else f16, else f32), f32 (the reference), f16 (f16-staged GEMM tiles, f32 sums) or matrix (cooperative-matrix units, f16 operands, f32 sums); f16 and matrix apply a range rule (docs/kernels.md), and a tier the adapter lacks is an error
    #[argh(option, from_str_fn(crate::tier::parse_precision))]
    precision: Option<flux_lite_platform::Precision>,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
    /// print the adapter and memory use
    #[argh(switch)]
    verbose: bool,
}

pub fn run(args: &GenArgs) -> Result<(), String> {
    let started = Instant::now();
    let mut args = args.clone();
    let again = again::fill(&mut args)?;
    let args = &args;
    let model_dir = args.model.as_deref().ok_or("give --model DIR (or --from IMAGE.png, made by flux-lite)")?;
    let host_peak = args.verbose.then(flux_lite_platform::host_memory::AnonymousPeak::start).flatten();
    let format = outputs::check_flags(&args.output, &args.output_latents, &args.preview, args.preview_every, args.quality)?;
    let interrupt = crate::interrupt::flag();
    let mut model = pipeline::open_model(model_dir, args.transformer.as_deref(), args.text_encoder.as_deref()).map_err(|e| e.to_string())?;
    if let Some(file) = &args.preview_decoder {
        if args.preview.is_none() {
            return Err("--preview-decoder draws the previews of --preview: give --preview FILE.png too".into());
        }
        model = model.with_preview_decoder(file).map_err(|e| format!("--preview-decoder: {e}"))?;
    }
    let job = Job {
        images_per_prompt: args.count,
        references: crate::references::load(&args.image, &model)?,
        width: args.width,
        height: args.height,
        steps: args.steps,
        guidance: args.guidance,
        seed: args.seed,
        lora: crate::lora::open_lora(&args.lora, &model.transformer, args.verbose)?,
        vae_tile: args.vae_tile,
        memory_budget: args.memory_budget,
        output: if args.output.is_some() { OutputType::Image } else { OutputType::Latents },
        init: inputs::init_image(args, &model)?,
        kv_cache: args.kv_cache,
        kv_precision: args.kv_precision.unwrap_or_default(),
        ..Job::prompts(inputs::prompts(args, model.transformer.joint_attention_dim)?)
    };
    let job = job.resolve(&model, &Limits::default()).map_err(|e| crate::errors::request_line(&e))?;
    if job.guidance_ignored() {
        eprintln!("warning: {} is guidance-distilled; --guidance {} is ignored", model_dir.display(), job.request().guidance);
    }
    if job.negative_ignored() {
        match model.index.is_distilled {
            true => eprintln!("warning: {} is guidance-distilled; --negative-prompt is ignored", model_dir.display()),
            false => eprintln!("warning: --guidance {} runs no guidance (it takes more than 1); --negative-prompt is ignored", job.request().guidance),
        }
    }
    eprintln!("seed: {}", job.request().seed);
    let outputs = outputs::Outputs::new(&args.output, format, &args.output_latents, job.images())?;
    let in_channels = model.transformer.in_channels;
    let gpu_options = GpuOptions { interrupt: Some(interrupt), precision: args.precision.unwrap_or(flux_lite_platform::Precision::Auto), ..crate::env_gpu_options()? };
    let pipeline = Pipeline::with_model(model, &gpu_options).map_err(|e| e.to_string())?.scratch_dir(crate::scratch_dir());
    crate::tier::print_notice(pipeline.gpu());
    if !args.quiet {
        crate::tier::print_software_warning(pipeline.gpu());
    }
    // Without --memory-budget the run takes the adapter's default budget; its refusal says so.
    let offered = pipeline.gpu().memory_offered().filter(|_| args.memory_budget.is_none());
    let line = |e: &RunError| crate::errors::run_line_under(e, offered.as_ref());
    if args.verbose {
        eprintln!("adapter: {}", pipeline.gpu().describe());
        eprintln!("precision: {}", crate::tier::describe_taken(pipeline.gpu()));
        if let Some(m) = &offered {
            eprintln!("{}", crate::budget::default_line(m));
        }
        report::plan(&pipeline.plan(&job).map_err(|e| line(&e))?, job.references(), pipeline.model());
        if job.images() > 1 {
            eprintln!("batch: {} images from {} distinct prompts, each prompt encoded once", job.images(), job.batch().prompts.len());
        }
    }
    let mut bar = Bar::new(args.quiet);
    let preview = args.preview.as_deref().map(|p| (p, args.preview_every));
    let mut watch = watch::Watch::new(&mut bar, preview, host_peak.as_ref());
    let run = recipe_run(args, model_dir, &pipeline)?;
    if let (Some(image), Some(made)) = (&args.from, &again.recipe) {
        again::compare(image, made, &run);
    }
    let mut write = |made: Made| {
        let prompt = &job.batch().prompts[job.batch().items[made.index].prompt];
        let text = run.recipe(prompt, made.seed, job.request()).chunks();
        outputs.write(&made, in_channels, &text).map_err(RunError::Output)
    };
    let finished = pipeline.run(&job, &mut watch, &mut write);
    let phases = watch.finish();
    bar.finish();
    let finished = finished.map_err(|e| line(&e))?;
    if args.verbose {
        let budget = args.memory_budget.or(offered.map(|m| m.default_budget()));
        report::device_memory(pipeline.gpu().memory().high_water, budget, &finished.plan);
        report::host_memory(host_peak, &finished.plan);
        report::phases(&phases, &finished.plan);
        let compiled = pipeline.gpu().compile_report();
        eprintln!("shaders: {} pipelines compiled in {:.2}s; {}", compiled.pipelines, compiled.time.as_secs_f64(), compiled.cache);
    }
    report::times(&finished.timings, started.elapsed());
    Ok(())
}

/// What this run's images carry of where their inputs came from and what ran them.
fn recipe_run(args: &GenArgs, model_dir: &std::path::Path, pipeline: &Pipeline) -> Result<recipe::Run, String> {
    let shown = |p: &PathBuf| p.display().to_string();
    let file = |p: &PathBuf| recipe::Source::File(shown(p));
    Ok(recipe::Run {
        embeddings: args.embeddings.as_ref().map(shown),
        references: args.image.iter().map(file).collect(),
        init: args.init_image.as_ref().map(|i| recipe::InitSources { image: file(i), mask: args.mask.as_ref().map(file), marks: args.mask_marks.unwrap_or(Marks::White), mask_crop: args.mask_crop }),
        ..recipe::Run::of_pipeline(model_dir, pipeline, args.transformer.as_deref(), args.text_encoder.as_deref())?
    })
}

/// `--kv-precision auto|f32|f16`.
pub(crate) fn parse_kv_precision(value: &str) -> Result<KvPrecision, String> {
    match value {
        "auto" => Ok(KvPrecision::Auto),
        "f32" => Ok(KvPrecision::F32),
        "f16" => Ok(KvPrecision::F16),
        other => Err(format!("--kv-precision {other}: give auto, f32 or f16")),
    }
}

/// `--mask-marks white|black|transparent`.
fn parse_mask_marks(value: &str) -> Result<Marks, String> {
    Marks::from_name(value).ok_or_else(|| format!("--mask-marks {value}: give white, black or transparent"))
}

/// `--kv-cache auto|on|off`: `None` follows the model's pipeline.
fn parse_kv_cache(value: &str) -> Result<Option<bool>, String> {
    match value {
        "auto" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        other => Err(format!("--kv-cache {other}: give auto, on or off")),
    }
}

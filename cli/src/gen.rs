//! `flux-lite gen`: prompt → PNG.

use crate::progress::Bar;
use argh::FromArgs;
use flux_lite_core::plan::Plan;
use flux_lite_platform::pipeline::embeddings_file::{self, EmbeddingsFile};
use flux_lite_platform::pipeline::reference_image::ReferenceImage;
use flux_lite_platform::pipeline::{self, denoise, output, Batch, Made, Observer, Phase, Pipeline, Prompt, Request};
use flux_lite_platform::RunError;
use flux_lite_platform::GpuOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use flux_lite_platform::model::lora::{LoraSet, LoraSpec};
use std::time::Instant;

/// Generate an image from a text prompt.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "gen")]
pub struct GenArgs {
    /// the diffusers model folder (model_index.json, text_encoder/, tokenizer/, transformer/, vae/, scheduler/)
    #[argh(option)]
    model: PathBuf,
    /// the text prompt
    #[argh(option)]
    prompt: Option<String>,
    /// read the prompt from this UTF-8 text file (its final line break dropped)
    #[argh(option)]
    prompt_file: Option<PathBuf>,
    /// where to write the PNG: a file (written whole or not at all; a symbolic link is written through), a named pipe or device (written into), or - for standard output
    #[argh(option)]
    output: Option<PathBuf>,
    /// a reference image (PNG or JPEG) to edit or take elements from; repeat for up to 16. Each is scaled to about 1 megapixel when larger and centre-cropped to multiples of 16
    #[argh(option)]
    image: Vec<PathBuf>,
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
    #[argh(option, from_str_fn(parse_lora))]
    lora: Vec<LoraSpec>,
    /// read the transformer from this folder instead of the model's transformer/
    #[argh(option)]
    transformer: Option<PathBuf>,
    /// VAE device memory as for a square image of this many pixels; larger images (and reference images) run by bands (default: untiled while the image fits)
    #[argh(option)]
    vae_tile: Option<usize>,
    /// device memory the run may allocate, e.g. 2GiB or 512MiB (default: no limit, everything resident)
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
    /// precision tier: auto (default: on a CPU adapter f32, the fastest there; elsewhere matrix units where the adapter has them and they pass a known-answer check, else f16, else f32), f32 (the reference), f16 (f16-staged GEMM tiles, f32 sums) or matrix (cooperative-matrix units, f16 operands, f32 sums); f16 and matrix apply a range rule (docs/kernels.md), and a tier the adapter lacks is an error
    #[argh(option, default = "flux_lite_platform::Precision::Auto", from_str_fn(crate::tier::parse_precision))]
    precision: flux_lite_platform::Precision,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
    /// print the adapter and memory use
    #[argh(switch)]
    verbose: bool,
}

pub fn parse_lora(arg: &str) -> Result<LoraSpec, String> {
    LoraSpec::parse(arg)
}

/// Reads and checks the adapters before any work: one line each with
/// `verbose`, a warning for keys left unused (listed with `verbose`).
pub fn open_lora(specs: &[LoraSpec], config: &flux_lite_core::config::TransformerConfig, verbose: bool) -> Result<Arc<LoraSet>, String> {
    let set = LoraSet::open(specs, config).map_err(|e| e.to_string())?;
    for lora in &set.adapters {
        if verbose {
            eprintln!("lora: {}", lora.summary());
        }
        if lora.text_encoder_keys > 0 {
            eprintln!("warning: LoRA {}: {} text-encoder keys are not supported and were skipped", lora.spec.path.display(), lora.text_encoder_keys);
        }
        if !lora.unmatched.is_empty() {
            let listed = if verbose {
                let first: Vec<&str> = lora.unmatched.iter().take(UNMATCHED_LISTED).map(String::as_str).collect();
                format!(": {}", first.join(", "))
            } else {
                " (--verbose lists them)".to_string()
            };
            eprintln!(
                "warning: LoRA {}: adapted {} modules; {} keys matched no module of this transformer{listed}",
                lora.spec.path.display(),
                lora.modules(),
                lora.unmatched.len()
            );
        }
    }
    Ok(set)
}

/// Unmatched LoRA keys `--verbose` lists.
const UNMATCHED_LISTED: usize = 10;

/// Steps above this are refused as a typo rather than run for hours.
pub const MAX_STEPS: usize = 1000;

/// Images one `gen` makes at most (`--count` × prompts).
pub const MAX_IMAGES: usize = 10_000;


pub fn run(args: &GenArgs) -> Result<(), String> {
    let started = Instant::now();
    let host_peak = args.verbose.then(flux_lite_platform::host_memory::AnonymousPeak::start).flatten();
    if args.output.is_none() && args.output_latents.is_none() {
        return Err("give --output FILE.png (or --output-latents FILE)".into());
    }
    let to_stdout = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == output::STDOUT);
    if to_stdout(&args.output) && to_stdout(&args.output_latents) {
        return Err("--output - and --output-latents -: only one of them can go to standard output".into());
    }
    for (flag, path) in [("--output", &args.output), ("--output-latents", &args.output_latents), ("--preview", &args.preview)] {
        if let Some(path) = path {
            output::check_output_path(flag, path)?;
        }
    }
    if to_stdout(&args.preview) {
        return Err("--preview -: a preview is rewritten after each step, so it goes to a file".into());
    }
    if args.preview_every == 0 {
        return Err("--preview-every 0: give a number of steps, 1 or more".into());
    }
    let interrupt = crate::interrupt::flag();
    let prompt = crate::prompt::from_flags(args.prompt.as_deref(), args.prompt_file.as_deref())?;
    let lines = match &args.batch_file {
        Some(path) if prompt.is_some() || args.embeddings.is_some() => {
            return Err(format!("--batch-file {} gives the prompts: leave out --prompt, --prompt-file and --embeddings", path.display()))
        }
        Some(path) => Some(crate::prompt::lines(path)?),
        None => None,
    };
    let prompt_text = match (prompt, &args.embeddings, &lines) {
        (_, _, Some(_)) => String::new(),
        (Some(p), None, None) => p,
        (None, Some(_), None) => String::new(),
        (Some(_), Some(_), None) => return Err("give --prompt or --embeddings, not both".into()),
        (None, None, None) => return Err("give --prompt TEXT (or --prompt-file FILE, --batch-file FILE or --embeddings FILE)".into()),
    };
    let images = lines.as_ref().map_or(1, Vec::len).saturating_mul(args.count);
    if args.count == 0 || images > MAX_IMAGES {
        return Err(format!("--count {}: {images} images is outside 1..={MAX_IMAGES}", args.count));
    }
    let outputs = Outputs::new(args, images)?;
    let model = pipeline::open_model(&args.model, args.transformer.as_deref()).map_err(|e| e.to_string())?;
    let references = crate::references::load(&args.image, &model)?;
    let (width, height) = crate::references::image_size(args.width, args.height, &references);
    denoise::latent_grid(&model.vae, width, height).map_err(|e| crate::errors::size_line(&e))?;
    let distilled = model.index.is_distilled;
    let steps = args.steps.unwrap_or_else(|| pipeline::default_steps(&model));
    if steps == 0 || steps > MAX_STEPS {
        return Err(format!("--steps {steps} is outside 1..={MAX_STEPS}"));
    }
    let guidance = args.guidance.unwrap_or_else(|| pipeline::default_guidance(&model));
    if !guidance.is_finite() || guidance < 0.0 {
        return Err(format!("--guidance {guidance} must be a finite number ≥ 0"));
    }
    if distilled && guidance > 1.0 {
        eprintln!("warning: {} is guidance-distilled; --guidance {guidance} is ignored", args.model.display());
    }
    let joint = model.transformer.joint_attention_dim;
    let prompt = match &args.embeddings {
        Some(path) => {
            let file = EmbeddingsFile::open(path)?;
            let positive = file
                .get(embeddings_file::PROMPT, joint)?
                .ok_or_else(|| format!("{}: no tensor `{}`", path.display(), embeddings_file::PROMPT))?;
            Prompt::Embeddings { positive, negative: file.get(embeddings_file::NEGATIVE, joint)? }
        }
        None => Prompt::Text(prompt_text.clone()),
    };
    let seed = args.seed.unwrap_or_else(random_seed);
    eprintln!("seed: {seed}");
    let batch = match &lines {
        Some(lines) => {
            let repeated: Vec<&str> = lines.iter().flat_map(|l| std::iter::repeat_n(l.as_str(), args.count)).collect();
            Batch::texts(&repeated, seed)
        }
        None => Batch::seeds(prompt, seed, args.count),
    };

    let lora = open_lora(&args.lora, &model.transformer, args.verbose)?;
    let in_channels = model.transformer.in_channels;
    let gpu_options = GpuOptions { interrupt: Some(interrupt), precision: args.precision, ..crate::env_gpu_options()? };
    let pipeline = Pipeline::with_model(model, &gpu_options).map_err(|e| e.to_string())?;
    crate::tier::print_notice(pipeline.gpu());
    if !args.quiet {
        crate::tier::print_software_warning(pipeline.gpu());
    }
    let request = Request {
        width,
        height,
        steps,
        seed,
        guidance,
        vae_tile: args.vae_tile,
        memory_budget: args.memory_budget,
        references: references.iter().map(|r| (r.width, r.height)).collect(),
        lora,
    };
    if args.verbose {
        eprintln!("adapter: {}", pipeline.gpu().describe());
        eprintln!("precision: {}", crate::tier::describe_taken(pipeline.gpu()));
        print_plan(&pipeline.plan(&request).map_err(|e| crate::errors::run_line(&e))?, &references);
    }
    if args.verbose && images > 1 {
        eprintln!("batch: {images} images from {} distinct prompts, each prompt encoded once", batch.prompts.len());
    }
    let mut bar = Bar::new(args.quiet);
    let preview = args.preview.as_deref().map(|p| (p, args.preview_every));
    let mut watch = Watch { bar: &mut bar, preview, sampler: host_peak.as_ref(), phases: Vec::new(), current: None };
    let mut write = |made: Made| {
        let prompt = match &batch.prompts[batch.items[made.index].prompt] {
            Prompt::Text(t) => t.clone(),
            Prompt::Embeddings { .. } => prompt_text.clone(),
        };
        let mut text = png_text(prompt, made.seed, &request, args.model.display().to_string());
        if let Some(path) = &args.embeddings {
            text.push(("embeddings", path.display().to_string()));
        }
        for path in &args.image {
            text.push(("reference", path.display().to_string()));
        }
        outputs.write(made.index, &made, in_channels, &text).map_err(RunError::Input)
    };
    let finished = match args.output {
        Some(_) => pipeline.generate_batch(&batch, &request, &references, &mut watch, &mut write),
        None => pipeline.latents_batch(&batch, &request, &references, &mut watch, &mut write),
    };
    let phases = watch.finish();
    bar.finish();
    let finished = finished.map_err(|e| crate::errors::run_line(&e))?;
    let timings = &finished.timings;

    if args.verbose {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let peak = pipeline.gpu().memory().high_water;
        let plan = &finished.plan;
        let budget = match args.memory_budget {
            Some(budget) => format!("of budget {:.2} MiB", mib(budget)),
            None => "no budget".to_string(),
        };
        eprintln!(
            "peak device memory: {:.2} MiB, {budget} (planned {:.2} MiB; device and host together {:.2} MiB in the largest phase)",
            mib(peak),
            mib(plan.device_peak()),
            mib(plan.peak())
        );
        // Exact figures, for scripts and tests: a few KiB over a budget shows here, not in MiB.
        let budget = args.memory_budget.map_or("none".into(), |b| b.to_string());
        eprintln!("device bytes: peak {peak}, budget {budget}, planned {}", plan.device_peak());
        print_host_memory(host_peak, plan);
        print_phases(&phases, plan);
    }
    let per_step: Vec<String> = timings.steps.iter().map(|d| format!("{:.2}s", d.as_secs_f64())).collect();
    eprintln!(
        "time: load {:.2}s, encode {:.2}s, steps [{}], decode {:.2}s, total {:.2}s",
        timings.load.as_secs_f64(),
        timings.encode.as_secs_f64(),
        per_step.join(", "),
        timings.decode.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `peak host memory: …` beside the planned host bytes, and its exact form
/// `host bytes: …` (measured on Linux and macOS).
fn print_host_memory(sampler: Option<flux_lite_platform::host_memory::AnonymousPeak>, plan: &Plan) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let planned = plan.host_peak();
    let (Some(sampler), Some(now)) = (sampler, flux_lite_platform::host_memory::now()) else {
        eprintln!("peak host memory: not measured on this OS (planned {:.2} MiB)", mib(planned));
        eprintln!("host bytes: planned {planned}");
        return;
    };
    let anonymous = sampler.finish();
    eprintln!(
        "peak host memory: {:.2} MiB {own} (sampled every {} ms; it also holds the driver, its compiled kernels and, on unified memory, the device's buffers), {:.2} MiB {peak} (planned {:.2} MiB: what the engine allocates on the host)",
        mib(anonymous),
        flux_lite_platform::host_memory::AnonymousPeak::PERIOD.as_millis(),
        mib(now.resident_peak),
        mib(planned),
        own = flux_lite_platform::host_memory::FIGURES.0,
        peak = flux_lite_platform::host_memory::FIGURES.1
    );
    eprintln!("host bytes: anonymous peak {anonymous}, resident peak {}, planned {planned}, planned with the device {}", now.resident_peak, plan.peak());
}

/// The progress bar, and each phase's anonymous high-water where measured.
struct Watch<'a> {
    bar: &'a mut Bar,
    /// `--preview FILE` and every how many steps, when asked.
    preview: Option<(&'a Path, usize)>,
    sampler: Option<&'a flux_lite_platform::host_memory::AnonymousPeak>,
    /// Each phase that ran: its start's and its peak's readings.
    phases: Vec<(Phase, u64, u64)>,
    /// The running phase and its start's reading.
    current: Option<(Phase, u64)>,
}

impl Watch<'_> {
    /// Each phase that ran with its start's reading and its high-water.
    fn finish(mut self) -> Vec<(Phase, u64, u64)> {
        self.close_phase();
        self.phases
    }

    /// Ends the running phase; returns the reading the next one starts from.
    fn close_phase(&mut self) -> u64 {
        let Some(sampler) = self.sampler else { return 0 };
        let (peak, now) = sampler.next_phase();
        if let Some((phase, start)) = self.current.take() {
            self.phases.push((phase, start, peak));
        }
        now
    }
}

impl Observer for Watch<'_> {
    fn phase(&mut self, phase: Phase) {
        let start = self.close_phase();
        self.current = Some((phase, start));
    }

    fn progress(&mut self, p: flux_lite_platform::pipeline::Progress) {
        self.bar.progress(p);
    }

    fn warning(&mut self, message: &str) {
        self.bar.warning(message);
    }

    fn image(&mut self, index: usize, count: usize) {
        self.bar.image(index, count);
    }

    fn previews(&self) -> Option<usize> {
        self.preview.map(|(_, every)| every)
    }

    /// Rewrites the preview file atomically (a reader never sees half a PNG);
    /// a failed write is a warning, the run goes on.
    fn preview(&mut self, p: &flux_lite_platform::pipeline::Preview<'_>) {
        let Some((path, _)) = self.preview else { return };
        let text = [("Preview", format!("step {} of {}", p.step, p.steps))];
        let written = output::encode_png(p.width as u32, p.height as u32, p.rgb, &text).and_then(|png| output::write_atomically(path, &png));
        if let Err(e) = written {
            self.bar.warning(&format!("warning: --preview {}: {e}", path.display()));
        }
    }
}

/// Where each image of the run goes: the paths the flags give for one
/// image; `NAME-0001.png`, … for several, none of which may exist.
struct Outputs {
    png: Option<Vec<PathBuf>>,
    latents: Option<Vec<PathBuf>>,
}

impl Outputs {
    fn new(args: &GenArgs, images: usize) -> Result<Self, String> {
        let name = |flag: &str, path: &Option<PathBuf>| -> Result<Option<Vec<PathBuf>>, String> {
            let Some(path) = path else { return Ok(None) };
            if images == 1 {
                return Ok(Some(vec![path.clone()]));
            }
            if path.as_os_str() == output::STDOUT {
                return Err(format!("{flag} -: {images} images cannot all go to standard output; give a file name (they are numbered)"));
            }
            let paths: Vec<PathBuf> = (0..images).map(|i| numbered(path, i)).collect();
            if let Some(taken) = paths.iter().find(|p| p.symlink_metadata().is_ok()) {
                return Err(format!("{flag}: {} exists; a batch never overwrites a file (move it, or give another name)", taken.display()));
            }
            Ok(Some(paths))
        };
        Ok(Self { png: name("--output", &args.output)?, latents: name("--output-latents", &args.output_latents)? })
    }

    /// Writes image `index`'s latents and PNG; an error is one line naming the file.
    fn write(&self, index: usize, made: &Made, in_channels: usize, text: &[(&str, String)]) -> Result<(), String> {
        let several = self.png.as_ref().or(self.latents.as_ref()).is_some_and(|p| p.len() > 1);
        if let Some(path) = self.latents.as_ref().map(|p| &p[index]) {
            if several && path.symlink_metadata().is_ok() {
                return Err(format!("--output-latents: {} appeared during the run; a batch never overwrites a file", path.display()));
            }
            output::write_f32_tensors(path, &[("latents", &made.latents)], in_channels, text)?;
        }
        if let (Some(path), Some(image)) = (self.png.as_ref().map(|p| &p[index]), &made.image) {
            if several && path.symlink_metadata().is_ok() {
                return Err(format!("--output: {} appeared during the run; a batch never overwrites a file", path.display()));
            }
            let png = output::encode_png(image.width as u32, image.height as u32, &image.rgb, text)?;
            output::write_atomically(path, &png)?;
            eprintln!("wrote {}", output::shown(path));
        }
        Ok(())
    }
}

/// The text chunks every PNG carries (gen's and the server's alike).
pub fn png_text(prompt: String, seed: u64, request: &Request, model: String) -> Vec<(&'static str, String)> {
    let lora = request.lora.adapters.iter().map(|l| ("lora", format!("{}:{}", l.spec.path.display(), l.spec.scale)));
    let mut text = vec![
        ("prompt", prompt),
        ("seed", seed.to_string()),
        ("steps", request.steps.to_string()),
        ("size", format!("{}x{}", request.width, request.height)),
        ("guidance", request.guidance.to_string()),
        ("model", model),
        ("software", format!("flux-lite {}", env!("CARGO_PKG_VERSION"))),
    ];
    text.extend(lora);
    text
}

/// `dir/NAME-0001.ext` for image 0 of `dir/NAME.ext`.
fn numbered(path: &std::path::Path, index: usize) -> PathBuf {
    let stem = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{:04}.{}", index + 1, ext.to_string_lossy()),
        None => format!("{stem}-{:04}", index + 1),
    };
    path.with_file_name(name)
}

/// `host bytes by phase: …`: each phase's anonymous high-water beside the
/// plan's device and host bytes for it (on unified memory the measured
/// figure holds both; it also holds the driver and what the allocator kept
/// from the phases before).
fn print_phases(phases: &[(Phase, u64, u64)], plan: &Plan) {
    if phases.is_empty() {
        return;
    }
    let planned = |p: Phase| match p {
        Phase::Encode => plan.encode.peak(),
        Phase::References => plan.references.map_or(0, |r| r.peak()),
        Phase::Denoise => plan.denoise.peak(),
        Phase::Decode => plan.decode.peak(),
    };
    let parts: Vec<String> = phases.iter().map(|&(p, start, peak)| format!("{} from {start} to {peak} planned {}", p.name(), planned(p))).collect();
    eprintln!("host bytes by phase: {}", parts.join(", "));
}

/// The plan `--verbose` prints: each phase's layout, the VAE tile used.
fn print_plan(plan: &Plan, references: &[ReferenceImage]) {
    eprintln!("plan: text encoder {}; transformer {}", plan.encode.weights, plan.denoise);
    for r in references {
        eprintln!("reference {}: {}×{} → {}×{}", r.path.display(), r.original.0, r.original.1, r.width, r.height);
    }
    if let Some(r) = plan.references {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let layout = r.tile.map_or("untiled".to_string(), |t| format!("in bands, arena of a {t}-pixel square"));
        eprintln!("plan: VAE encoder {layout}, arena {:.2} MiB, peak {:.2} MiB", mib(r.arena_bytes), mib(r.peak()));
    }
    match plan.decode.tile {
        Some(tile) => eprintln!("plan: VAE in bands, arena of a {tile}-pixel square"),
        None => eprintln!("plan: VAE untiled"),
    }
}

pub fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // A 63-bit seed, as a torch user would pass.
    (nanos ^ (std::process::id() as u64).rotate_left(32)) & (u64::MAX >> 1)
}

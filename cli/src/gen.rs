//! `flux-lite gen`: prompt embeddings → denoised latents.

use argh::FromArgs;
use flux_lite_platform::denoise::{self, Conditioning, StepProgress};
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::transformer::Transformer;
use flux_lite_platform::{Gpu, GpuOptions};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Generate: run the denoiser from precomputed prompt embeddings and write the final latents.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "gen")]
pub struct GenArgs {
    /// the diffusers model folder
    #[argh(option)]
    model: PathBuf,
    /// safetensors file holding `prompt_embeds` [512, joint_attention_dim] (f32 or bf16), e.g. from diffusers' encode_prompt
    #[argh(option)]
    embeddings: PathBuf,
    /// where to write the final packed latents (safetensors, tensor `latents` [tokens, channels])
    #[argh(option)]
    output_latents: PathBuf,
    /// random seed (default: random, printed)
    #[argh(option)]
    seed: Option<u64>,
    /// denoising steps (default: 4 for distilled models, 50 otherwise)
    #[argh(option)]
    steps: Option<usize>,
    /// image width in pixels, a multiple of 2 × the VAE scale factor (default 1024)
    #[argh(option, default = "1024")]
    width: usize,
    /// image height in pixels, a multiple of 2 × the VAE scale factor (default 1024)
    #[argh(option, default = "1024")]
    height: usize,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
    /// print the adapter and memory use
    #[argh(switch)]
    verbose: bool,
}

/// Steps above this are refused as a typo rather than run for hours.
const MAX_STEPS: usize = 1000;

pub fn run(args: &GenArgs) -> Result<(), String> {
    let started = Instant::now();
    let model = ModelFolder::open(&args.model).map_err(|e| e.to_string())?;
    let (lat_h, lat_w) = denoise::latent_grid(&model.vae, args.width, args.height)?;
    let steps = args.steps.unwrap_or(if model.index.is_distilled { 4 } else { 50 });
    if steps == 0 || steps > MAX_STEPS {
        return Err(format!("--steps {steps} is outside 1..={MAX_STEPS}"));
    }
    let prompt = read_embeddings(&args.embeddings, model.transformer.joint_attention_dim)?;
    let text = prompt.len() / model.transformer.joint_attention_dim;
    let seed = args.seed.unwrap_or_else(random_seed);
    eprintln!("seed: {seed}");
    if !model.index.is_distilled {
        eprintln!("warning: {} is a base (non-distilled) model; classifier-free guidance is not applied yet", args.model.display());
    }

    let gpu = Gpu::new(&GpuOptions::default()).map_err(|e| e.to_string())?;
    if args.verbose {
        eprintln!("adapter: {}", gpu.describe());
    }
    let store = model.weights(Component::Transformer).map_err(|e| e.to_string())?;
    let transformer =
        Transformer::new(&gpu, &model.transformer, &store, text, lat_h, lat_w).map_err(|e| e.to_string())?;
    if args.verbose {
        eprintln!("transformer activations: {}", crate::human_bytes(transformer.arena_bytes));
    }
    let loaded = started.elapsed();

    let noise = denoise::packed_noise(seed, model.transformer.in_channels, lat_h, lat_w);
    let mut step_started = Instant::now();
    let mut step_times = Vec::with_capacity(steps);
    let quiet = args.quiet;
    let mut progress = |p: StepProgress| {
        if !quiet {
            eprint!("\rstep {}/{} block {}/{}   ", p.step + 1, p.steps, p.block.done, p.block.total);
        }
        if p.block.done == p.block.total {
            step_times.push(step_started.elapsed());
            step_started = Instant::now();
        }
    };
    let latents =
        denoise::denoise(&gpu, &transformer, &model.scheduler, steps, &noise, Conditioning::Prompt(&prompt), &mut progress).map_err(|e| e.to_string())?;
    if !quiet {
        eprintln!();
    }
    write_latents(&args.output_latents, &latents, lat_h * lat_w, model.transformer.in_channels, seed, steps, args)?;
    let per_step: Vec<String> = step_times.iter().map(|d| format!("{:.2}s", d.as_secs_f64())).collect();
    eprintln!(
        "time: load {:.2}s, steps [{}], total {:.2}s",
        loaded.as_secs_f64(),
        per_step.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `prompt_embeds` of an embeddings file as f32, `[text, joint]` (a leading batch of 1 is allowed).
fn read_embeddings(path: &Path, joint: usize) -> Result<Vec<f32>, String> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{name}: not a valid safetensors file: {e}"))?;
    let t = st.tensor("prompt_embeds").map_err(|_| format!("{name}: no tensor `prompt_embeds`"))?;
    let shape = t.shape();
    let rows = match shape {
        [rows, j] | [1, rows, j] if *j == joint && *rows > 0 => *rows,
        _ => return Err(format!("{name}: `prompt_embeds` has shape {shape:?}, expected [512, {joint}]")),
    };
    let values: Vec<f32> = match t.dtype() {
        Dtype::F32 => t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => t.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => return Err(format!("{name}: `prompt_embeds` is {other:?}; expected F32 or BF16")),
    };
    debug_assert_eq!(values.len(), rows * joint);
    Ok(values)
}

/// Writes the latents next to their final name and renames, so a failed run
/// never leaves a partial file.
fn write_latents(
    path: &Path,
    latents: &[f32],
    tokens: usize,
    channels: usize,
    seed: u64,
    steps: usize,
    args: &GenArgs,
) -> Result<(), String> {
    let bytes: Vec<u8> = latents.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![tokens, channels], &bytes).map_err(|e| e.to_string())?;
    let metadata: HashMap<String, String> = [
        ("seed", seed.to_string()),
        ("steps", steps.to_string()),
        ("width", args.width.to_string()),
        ("height", args.height.to_string()),
        ("model", args.model.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let data = safetensors::serialize([("latents", view)], Some(metadata)).map_err(|e| e.to_string())?;
    flux_lite_platform::output::write_atomically(path, &data)
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // A 63-bit seed, as a torch user would pass.
    (nanos ^ (std::process::id() as u64).rotate_left(32)) & (u64::MAX >> 1)
}

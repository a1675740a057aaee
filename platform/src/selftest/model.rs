//! The tiny test model end to end against diffusers: `tiny-a` (a FLUX.2
//! klein pipeline at toy width: 2 double and 2 single blocks, a 4-layer
//! Qwen3, a 2-level VAE; 2.3 MB) and the goldens diffusers wrote for its
//! one-step case (1.9 MB), both built into the binary. The model is
//! written to a temporary folder and opened as any model is.

use super::Check;
use crate::pipeline::{Job, Limits, Options, Pipeline, Prompt, Silent};
use crate::tolerance::{self, png_gap};
use flux_lite_kernels::{GpuOptions, Precision};
use safetensors::SafeTensors;
use std::path::Path;

/// The model folder's files, as `test_vectors/models/tiny-a` holds them.
const MODEL: [(&str, &[u8]); 12] = [
    ("model_index.json", include_bytes!("../../../test_vectors/models/tiny-a/model_index.json")),
    ("scheduler/scheduler_config.json", include_bytes!("../../../test_vectors/models/tiny-a/scheduler/scheduler_config.json")),
    ("text_encoder/config.json", include_bytes!("../../../test_vectors/models/tiny-a/text_encoder/config.json")),
    ("text_encoder/generation_config.json", include_bytes!("../../../test_vectors/models/tiny-a/text_encoder/generation_config.json")),
    ("text_encoder/model.safetensors", include_bytes!("../../../test_vectors/models/tiny-a/text_encoder/model.safetensors")),
    ("tokenizer/chat_template.jinja", include_bytes!("../../../test_vectors/models/tiny-a/tokenizer/chat_template.jinja")),
    ("tokenizer/tokenizer.json", include_bytes!("../../../test_vectors/models/tiny-a/tokenizer/tokenizer.json")),
    ("tokenizer/tokenizer_config.json", include_bytes!("../../../test_vectors/models/tiny-a/tokenizer/tokenizer_config.json")),
    ("transformer/config.json", include_bytes!("../../../test_vectors/models/tiny-a/transformer/config.json")),
    (
        "transformer/diffusion_pytorch_model.safetensors",
        include_bytes!("../../../test_vectors/models/tiny-a/transformer/diffusion_pytorch_model.safetensors"),
    ),
    ("vae/config.json", include_bytes!("../../../test_vectors/models/tiny-a/vae/config.json")),
    ("vae/diffusion_pytorch_model.safetensors", include_bytes!("../../../test_vectors/models/tiny-a/vae/diffusion_pytorch_model.safetensors")),
];

/// diffusers' tensors for the case, and its PNG.
const GOLDENS: &[u8] = include_bytes!("../../../test_vectors/goldens/tiny-a/one-step/goldens.safetensors");
const IMAGE: &[u8] = include_bytes!("../../../test_vectors/goldens/tiny-a/one-step/image.png");

/// The case (`test_vectors/goldens/tiny-a/one-step/case.json`).
const PROMPT: &str = "a red fox in the snow";
const SEED: u64 = 42;
const SIZE: usize = 32;

/// The bounds of `tier`: the f32 path's, or the other tiers' stated ones.
struct Bounds {
    text_encoder: f64,
    velocity: f64,
    max_levels: u8,
    mean_levels: f64,
}

fn bounds(tier: Precision) -> Bounds {
    use tolerance::{f32, other_tiers as half};
    match tier {
        Precision::F16 | Precision::Matrix => Bounds {
            text_encoder: half::TEXT_ENCODER,
            velocity: half::VELOCITY,
            max_levels: half::PNG_MAX_LEVELS,
            mean_levels: half::PNG_MEAN_LEVELS,
        },
        _ => Bounds { text_encoder: f32::TEXT_ENCODER, velocity: f32::STEP, max_levels: f32::PNG_MAX_LEVELS, mean_levels: f32::PNG_MEAN_LEVELS },
    }
}

/// The model's checks on `tier`: the prompt embedding, the step's velocity
/// (from the latents it moved) and the image.
pub fn checks(options: &GpuOptions, tier: Precision) -> Vec<Check> {
    let name = |what: &str| format!("{} tiny model: {what}", tier.name());
    let b = bounds(tier);
    match run(options, tier) {
        Ok(found) => vec![
            Check::measured(name("prompt embedding vs transformers"), "relative L2", found.embedding, b.text_encoder),
            Check::measured(name("one step's velocity vs diffusers"), "relative L2", found.velocity, b.velocity),
            Check::measured(name("image vs diffusers' PNG, largest difference"), "levels", found.max_levels as f64, b.max_levels as f64),
            Check::measured(name("image vs diffusers' PNG, mean difference"), "levels", found.mean_levels, b.mean_levels),
        ],
        Err(why) => vec![Check::failed(name("end to end"), "relative L2", b.velocity, why)],
    }
}

/// What one run of the case measured.
struct Found {
    embedding: f64,
    velocity: f64,
    max_levels: u8,
    mean_levels: f64,
}

fn run(options: &GpuOptions, tier: Precision) -> Result<Found, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder for the tiny model: {e}"))?;
    write_model(dir.path())?;
    let goldens = SafeTensors::deserialize(GOLDENS).map_err(|e| format!("the built-in goldens: {e}"))?;
    let golden = |name: &str| -> Result<Vec<f32>, String> {
        let t = goldens.tensor(name).map_err(|e| format!("golden {name}: {e}"))?;
        Ok(t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    };
    let pipeline = Pipeline::open(dir.path(), Options { gpu: GpuOptions { precision: tier, ..options.clone() }, transformer: None, text_encoder: None, scratch_dir: None, keep_loaded: false, preview_decoder: None }).map_err(|e| e.to_string())?;
    let (mut embeddings, _) = pipeline.encode(&[PROMPT], None, &mut Silent).map_err(|e| e.to_string())?;
    let embedding = embeddings.pop().ok_or("no prompt embedding")?;
    let prompt = Prompt::Embeddings { positive: embedding.clone(), negative: None };
    let job = Job { width: Some(SIZE), height: Some(SIZE), steps: Some(1), seed: Some(SEED), guidance: Some(1.0), ..Job::new(prompt) };
    let job = job.resolve(pipeline.model(), &Limits::default()).map_err(|e| e.to_string())?;
    let mut made = Vec::new();
    pipeline
        .run(&job, &mut Silent, &mut |m| {
            made.push(m);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let generated = made.pop().ok_or("no image made")?;
    // One Euler step: latents = noise + (σ₁ − σ₀)·velocity.
    let (noise, sigmas) = (golden("noise")?, golden("sigmas")?);
    let dt = sigmas.get(1).zip(sigmas.first()).map(|(a, b)| a - b).ok_or("golden sigmas: two expected")?;
    let velocity: Vec<f32> = generated.latents.iter().zip(&noise).map(|(l, n)| (l - n) / dt).collect();
    let image = generated.image.ok_or("no image")?;
    let want = image::load_from_memory(IMAGE).map_err(|e| format!("the built-in PNG: {e}"))?.to_rgb8();
    let (max_levels, mean_levels) = png_gap(&image.rgb, want.as_raw());
    Ok(Found {
        embedding: rel_l2(&embedding, &golden("prompt_embeds")?),
        velocity: rel_l2(&velocity, &golden("velocity.0")?),
        max_levels,
        mean_levels,
    })
}

fn write_model(dir: &Path) -> Result<(), String> {
    for (path, bytes) in MODEL {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let want: Vec<f64> = want.iter().map(|&w| w as f64).collect();
    flux_lite_kernels::selftest::rel_l2(got, &want)
}

//! `flux-lite encode`: prompt → prompt embeddings file.

use crate::progress::Bar;
use argh::FromArgs;
use flux_lite_platform::pipeline::embeddings_file;
use flux_lite_platform::pipeline::{Options, Pipeline};
use flux_lite_platform::pipeline::output;
use flux_lite_platform::GpuOptions;
use std::path::PathBuf;

/// Encode a prompt with the model's Qwen3 text encoder and write `prompt_embeds` [512, joint_attention_dim] (f32 safetensors).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "encode")]
pub struct EncodeArgs {
    /// the diffusers model folder
    #[argh(option)]
    model: PathBuf,
    /// read the text encoder from a GGUF file (llama.cpp's Qwen3 layout) instead of the model's text_encoder/
    #[argh(option)]
    text_encoder: Option<PathBuf>,
    /// the text prompt
    #[argh(option)]
    prompt: Option<String>,
    /// read the prompt from this UTF-8 text file (its final line break dropped)
    #[argh(option)]
    prompt_file: Option<PathBuf>,
    /// also encode this negative prompt and write it as `negative_prompt_embeds` (gen --embeddings then guides away from it)
    #[argh(option)]
    negative_prompt: Option<String>,
    /// where to write the embeddings (safetensors): a file (written whole or not at all; links written through), a named pipe or device, or - for standard output
    #[argh(option)]
    output: PathBuf,
    /// device memory the encode may allocate, e.g. 2GiB (default: the adapter's memory less 10% where it is known, else no limit)
    #[argh(option, from_str_fn(crate::budget::parse_memory_budget))]
    memory_budget: Option<u64>,
    /// precision tier: auto (default: on a CPU adapter f32, the fastest there; elsewhere matrix units where the adapter has them and they pass a known-answer check, else f16, else f32), f32 (the reference), f16 (f16-staged GEMM tiles, f32 sums) or matrix (cooperative-matrix units, f16 operands, f32 sums); f16 and matrix apply a range rule (docs/kernels.md), and a tier the adapter lacks is an error
    #[argh(option, default = "flux_lite_platform::Precision::Auto", from_str_fn(crate::tier::parse_precision))]
    precision: flux_lite_platform::Precision,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
}


pub fn run(args: &EncodeArgs) -> Result<(), String> {
    output::check_output_path("--output", &args.output)?;
    let interrupt = crate::interrupt::flag();
    let prompt = crate::prompt::from_flags(args.prompt.as_deref(), args.prompt_file.as_deref())?
        .ok_or("give --prompt TEXT or --prompt-file FILE")?;
    let options = Options { gpu: GpuOptions { interrupt: Some(interrupt), precision: args.precision, ..crate::env_gpu_options()? }, transformer: None, text_encoder: args.text_encoder.clone(), keep_loaded: false, preview_decoder: None, scratch_dir: None };
    let pipeline = Pipeline::open(&args.model, options).map_err(|e| e.to_string())?;
    crate::tier::print_notice(pipeline.gpu());
    let mut bar = Bar::new(args.quiet);
    let mut texts = vec![prompt.as_str()];
    texts.extend(args.negative_prompt.as_deref());
    let encoded = pipeline.encode(&texts, args.memory_budget, &mut bar);
    bar.finish();
    let (encoded, timings) = encoded.map_err(|e| crate::errors::run_line(&e))?;
    let values = &encoded[0];
    let model = pipeline.model();
    let joint = model.transformer.joint_attention_dim;
    let mut metadata = vec![("prompt", prompt.clone()), ("model", args.model.display().to_string())];
    let mut tensors = vec![(embeddings_file::PROMPT, values.as_slice())];
    if let (Some(negative), Some(values)) = (&args.negative_prompt, encoded.get(1)) {
        metadata.push(("negative_prompt", negative.clone()));
        tensors.push((embeddings_file::NEGATIVE, values.as_slice()));
    }
    output::write_f32_tensors(&args.output, &tensors, joint, &metadata)?;
    eprintln!(
        "wrote {} ({} × {joint}); load {:.2}s, encode {:.2}s",
        output::shown(&args.output),
        values.len() / joint,
        timings.load.as_secs_f64(),
        timings.encode.as_secs_f64()
    );
    Ok(())
}

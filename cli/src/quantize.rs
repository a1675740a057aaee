//! `flux-lite quantize`: a model's transformer → one GGUF file as
//! ComfyUI-GGUF and stable-diffusion.cpp read FLUX.2.

use crate::stdout::say;
use argh::FromArgs;
use flux_lite_core::ggml::GgmlType;
use flux_lite_core::plan::Bytes;
use flux_lite_platform::model::quantize::{self, WRITABLE};
use std::path::PathBuf;
use std::time::Instant;

/// Write a model's transformer as one GGUF file (BFL's tensor names; the block linears and modulations in the type asked for, inputs, timestep and final layers in BF16, norms in F32), readable by gguf-py, ComfyUI-GGUF, stable-diffusion.cpp and diffusers.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "quantize")]
pub struct QuantizeArgs {
    /// the diffusers model folder
    #[argh(option)]
    model: PathBuf,
    /// read the transformer from this folder instead of the model's transformer/ (e.g. a DF11 folder)
    #[argh(option)]
    transformer: Option<PathBuf>,
    /// the type of the block linears: q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, q3_k, q2_k, bf16 or f16
    #[argh(option, long = "type", from_str_fn(parse_type))]
    ggml: GgmlType,
    /// the GGUF file to write (written under a temporary name, then renamed)
    #[argh(option)]
    output: PathBuf,
}

fn parse_type(s: &str) -> Result<GgmlType, String> {
    let names: Vec<String> = WRITABLE.iter().map(|t| t.name().to_ascii_lowercase()).collect();
    match GgmlType::from_name(s) {
        Some(t) if WRITABLE.contains(&t) => Ok(t),
        Some(t) => Err(format!("{} is not a type quantize writes; one of {}", t.name(), names.join(", "))),
        None => Err(format!("unknown type {s:?}; one of {}", names.join(", "))),
    }
}

pub fn run(args: &QuantizeArgs) -> Result<(), String> {
    let started = Instant::now();
    let model = flux_lite_platform::pipeline::open_model(&args.model, args.transformer.as_deref(), None).map_err(|e| e.to_string())?;
    let s = quantize::quantize_transformer(&model, args.ggml, &args.output)?;
    say!(
        "transformer: {} → {} ({:.1}%): {} tensors, {} of them {}",
        Bytes(s.bytes_before),
        Bytes(s.bytes_after),
        100.0 * s.bytes_after as f64 / s.bytes_before.max(1) as f64,
        s.tensors,
        s.quantized,
        args.ggml.name()
    );
    if let Some(first) = s.not_whole_blocks.first() {
        eprintln!("note: {} tensors stay BF16: their rows are not whole {} blocks (`{first}`)", s.not_whole_blocks.len(), args.ggml.name());
    }
    eprintln!("wrote {} in {:.2}s", args.output.display(), started.elapsed().as_secs_f64());
    Ok(())
}

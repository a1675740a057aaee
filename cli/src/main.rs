//! `flux-lite`: the command-line front end. Thin: parses, calls platform, reports.

use argh::FromArgs;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::{Gpu, GpuOptions};
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod budget;
mod compress;
mod encode;
mod gen;
mod progress;

/// flux-lite: FLUX.2-klein text-to-image on any GPU, in WGSL through wgpu.
#[derive(FromArgs, Debug)]
struct Cli {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum Command {
    Gen(gen::GenArgs),
    Encode(encode::EncodeArgs),
    Compress(compress::CompressArgs),
    Info(InfoArgs),
    Gpu(GpuArgs),
    Bench(bench::BenchArgs),
}

/// Print a model folder's configuration and weight sizes without running it.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "info")]
struct InfoArgs {
    /// the diffusers model folder (model_index.json, transformer/, text_encoder/, vae/, …)
    #[argh(option)]
    model: PathBuf,
}

/// Print the GPU adapter flux-lite would use and its limits.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "gpu")]
struct GpuArgs {}

fn main() -> ExitCode {
    let cli: Cli = argh::from_env();
    let result = match cli.command {
        Command::Gen(args) => gen::run(&args),
        Command::Encode(args) => encode::run(&args),
        Command::Compress(args) => compress::run(&args),
        Command::Info(args) => info(&args),
        Command::Gpu(_) => gpu(),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn info(args: &InfoArgs) -> Result<(), String> {
    let m = ModelFolder::open(&args.model).map_err(|e| e.to_string())?;
    let t = &m.transformer;
    let q = &m.text_encoder;
    let v = &m.vae;
    println!("model: {}", m.root.display());
    println!("distilled: {}", m.index.is_distilled);
    println!(
        "transformer: {} double + {} single blocks, {} heads × {}, inner {}, mlp {}, joint {}, in {} channels, RoPE axes {:?} θ {}",
        t.num_layers,
        t.num_single_layers,
        t.num_attention_heads,
        t.attention_head_dim,
        t.inner_dim(),
        t.mlp_hidden_dim(),
        t.joint_attention_dim,
        t.in_channels,
        t.axes_dims_rope.as_slice(),
        t.rope_theta
    );
    println!(
        "text encoder: Qwen3 {} layers, hidden {}, {} / {} heads × {}, mlp {}, vocab {}, RoPE θ {}, prompt layers {:?}",
        q.num_hidden_layers,
        q.hidden_size,
        q.num_attention_heads,
        q.num_key_value_heads,
        q.head_dim,
        q.intermediate_size,
        q.vocab_size,
        q.rope_theta,
        q.output_layers()
    );
    println!(
        "vae: channels {:?}, {} latent channels, scale factor {}, {} groups",
        v.block_out_channels.as_slice(),
        v.latent_channels,
        v.scale_factor(),
        v.norm_num_groups
    );
    for c in Component::ALL {
        let params: u64 = m.expected_tensors(c).iter().map(|s| s.shape.iter().product::<usize>() as u64).sum();
        let store = m.weights(c).map_err(|e| e.to_string())?;
        println!(
            "{}: {} parameters, {} in files",
            c.dir(),
            params,
            human_bytes(store.data_bytes())
        );
    }
    Ok(())
}

fn gpu() -> Result<(), String> {
    let gpu = Gpu::new(&GpuOptions::default()).map_err(|e| e.to_string())?;
    println!("adapter: {}", gpu.describe());
    println!("driver: {} {}", gpu.info.driver, gpu.info.driver_info);
    println!("max storage binding: {}", human_bytes(gpu.max_binding()));
    println!("max buffer: {}", human_bytes(gpu.limits.max_buffer_size));
    println!("workgroup storage: {}", human_bytes(gpu.limits.max_compute_workgroup_storage_size as u64));
    Ok(())
}

pub(crate) fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

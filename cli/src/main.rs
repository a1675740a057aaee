//! `flux-lite`: the command-line front end. Thin: parses, calls platform, reports.

use argh::FromArgs;
use flux_lite_core::plan::Bytes;
use flux_lite_platform::pipeline_files::PipelineFiles;
use flux_lite_platform::{Gpu, GpuOptions, PipelineStore, Precision};
use std::path::PathBuf;
use std::sync::Arc;
use std::process::ExitCode;
use stdout::say;

mod bench;
mod budget;
mod compress;
mod quantize;
mod recipe;
mod encode;
mod errors;
mod flash_report;
mod gen;
mod info;
mod interrupt;
mod lora;
mod progress;
mod prompt;
mod references;
mod selftest;
mod serve;
mod stdout;
mod tier;

/// flux-lite: FLUX.2-klein text-to-image on any GPU, in WGSL through wgpu.
#[derive(FromArgs, Debug)]
struct Cli {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
// One command's flags, parsed once per process: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    Gen(gen::GenArgs),
    Encode(encode::EncodeArgs),
    Compress(compress::CompressArgs),
    Quantize(quantize::QuantizeArgs),
    Info(info::InfoArgs),
    Gpu(GpuArgs),
    Bench(bench::BenchArgs),
    Selftest(selftest::SelftestArgs),
    Serve(serve::ServeArgs),
}

/// Print the GPU adapter flux-lite would use and its limits.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "gpu")]
struct GpuArgs {
    /// write every kernel module's WGSL source into this folder, as
    /// FLUX_LITE_KERNEL_DIR reads it back (a kernel-development aid), and exit
    #[argh(option)]
    kernel_sources: Option<std::path::PathBuf>,
    /// run the matrix tier's flash attention on its start-up check and the
    /// check's variations, print what each gives, and write the outputs and
    /// exact answers into this folder (a kernel-development aid), then exit
    #[argh(option)]
    flash_report: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let cli = match parse_args() {
        Ok(cli) => cli,
        Err(exit) => return exit,
    };
    apply_environment();
    let result = match cli.command {
        Command::Gen(args) => gen::run(&args),
        Command::Encode(args) => encode::run(&args),
        Command::Compress(args) => compress::run(&args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Gpu(args) => match (args.kernel_sources, args.flash_report) {
            (Some(_), Some(_)) => Err("gpu takes --kernel-sources or --flash-report, not both".into()),
            (Some(dir), None) => write_kernel_sources(&dir),
            (None, Some(dir)) => flash_report::run(&dir),
            (None, None) => gpu(),
        },
        Command::Bench(args) => bench::run(&args),
        Command::Selftest(args) => selftest::run(&args),
        Command::Serve(args) => serve::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            if interrupt::requested() { ExitCode::from(interrupt::EXIT_STATUS) } else { ExitCode::FAILURE }
        }
    }
}

/// The command line, or how to exit: `--help` prints its text and
/// succeeds; a bad argument is one `error:` line and a failure.
fn parse_args() -> Result<Cli, ExitCode> {
    let mut words = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(word) => words.push(word),
            Err(raw) => {
                eprintln!("error: argument {raw:?} is not valid UTF-8");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    Cli::from_args(&["flux-lite"], &words).map_err(|early| match early.status {
        Ok(()) => {
            print!("{}", early.output);
            ExitCode::SUCCESS
        }
        Err(()) => {
            let first = early.output.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad arguments");
            eprintln!("error: {first} (see flux-lite --help)");
            ExitCode::FAILURE
        }
    })
}

/// Each fixed kernel module's source in `dir` under the name
/// `FLUX_LITE_KERNEL_DIR` looks for (`Module::file_name`).
fn write_kernel_sources(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for module in flux_lite_platform::Module::ALL {
        let path = dir.join(module.file_name());
        std::fs::write(&path, module.source().as_ref()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    say!("{} kernel sources written to {}", flux_lite_platform::Module::ALL.len(), dir.display());
    Ok(())
}

fn gpu() -> Result<(), String> {
    let gpu = Gpu::new(&GpuOptions { precision: Precision::F32, ..crate::env_gpu_options()? }).map_err(|e| e.to_string())?;
    say!("adapter: {}", gpu.describe());
    say!("driver: {} {}", gpu.info.driver, gpu.info.driver_info);
    say!("max storage binding: {}", Bytes(gpu.max_binding()));
    say!("max buffer: {}", Bytes(gpu.limits.max_buffer_size));
    say!("workgroup storage: {}", Bytes(gpu.limits.max_compute_workgroup_storage_size as u64));
    say!("subgroup size: {} to {}", gpu.info.subgroup_min_size, gpu.info.subgroup_max_size);
    if gpu.cpu_shaped_kernels() {
        let reads = match gpu.cpu_lanes() {
            Some(lanes) => format!("rows shared across subgroups of {lanes} (attention, linear and 3×3/1×1 conv read each shared row once a subgroup)"),
            None => "every row read in every lane (no fixed subgroup size to share rows across)".to_string(),
        };
        say!("CPU-shaped kernels: {reads}");
    }
    say!("cooperative matrices offered: {}", gpu.matrix_offered());
    // Each tier as it would run here, or why it cannot; then what auto takes.
    for tier in [Precision::F16, Precision::Matrix] {
        let line = match Gpu::new(&GpuOptions { precision: tier, ..crate::env_gpu_options()? }) {
            Ok(g) => match g.notice() {
                Some(notice) => format!("{} (notice: {notice})", crate::tier::describe(&g)),
                None => crate::tier::describe(&g),
            },
            Err(e) => format!("unavailable ({e})"),
        };
        say!("{} tier: {line}", tier.name());
    }
    let auto = Gpu::new(&GpuOptions { precision: Precision::Auto, ..crate::env_gpu_options()? }).map_err(|e| e.to_string())?;
    if let Some(notice) = auto.notice() {
        say!("notice: {notice}");
    }
    let why = crate::tier::why_auto_took(&auto).unwrap_or_else(|| "known-answer check passed".into());
    say!("tier auto takes: {} ({why})", crate::tier::describe(&auto));
    Ok(())
}

/// The device options the environment sets (`FLUX_LITE_BACKEND`,
/// `FLUX_LITE_ADAPTER`, the benchmarking switches, and in test builds the
/// tests': `GpuOptions::from_settings`); each command adds its flags.
pub fn env_gpu_options() -> Result<GpuOptions, String> {
    let options = GpuOptions::from_settings(&|name| std::env::var(name).ok()).map_err(|e| e.to_string())?;
    // A kernel folder's replacements, held to what their launchers bind
    // before any device is made from them.
    if let Some(dir) = &options.kernel_dir {
        flux_lite_platform::check_kernel_dir(dir).map_err(|e| e.to_string())?;
    }
    let store = cache_dir().map(|dir| Arc::new(PipelineFiles::new(dir.join("pipelines"))) as Arc<dyn PipelineStore>);
    Ok(GpuOptions { pipeline_store: store, ..options })
}

/// The variable naming the folder compiled pipelines are kept in (empty: none kept).
pub const CACHE_VARIABLE: &str = "FLUX_LITE_CACHE_DIR";

/// flux-lite's cache folder: `FLUX_LITE_CACHE_DIR`, else the platform's
/// (`$XDG_CACHE_HOME/flux-lite`, `~/.cache/flux-lite`,
/// `~/Library/Caches/flux-lite` on macOS, `%LOCALAPPDATA%\flux-lite`).
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_VARIABLE) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = if cfg!(windows) {
        var("LOCALAPPDATA")
    } else if cfg!(target_os = "macos") {
        var("HOME").map(|h| h.join("Library/Caches"))
    } else {
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))
    };
    base.map(|b| b.join("flux-lite"))
}

/// The variable naming the banded VAE's scratch folder.
pub const SCRATCH_VARIABLE: &str = "FLUX_LITE_SCRATCH_DIR";

/// The process-wide settings the environment gives the library: in test
/// builds only, the tests' switches
/// ([`flux_lite_platform::pipeline::output::test_switches`]). The device's
/// come through [`env_gpu_options`], the scratch folder through
/// [`scratch_dir`].
fn apply_environment() {
    flux_lite_platform::pipeline::output::test_switches(&|name| std::env::var(name).ok());
}

/// Where the VAE by bands on the host keeps its scratch file
/// (`FLUX_LITE_SCRATCH_DIR`; `None`: the OS's temporary folder), for
/// `pipeline::Options::scratch_dir`.
pub fn scratch_dir() -> Option<PathBuf> {
    std::env::var_os(SCRATCH_VARIABLE).filter(|d| !d.is_empty()).map(PathBuf::from)
}

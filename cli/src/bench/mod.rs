//! `flux-lite bench`: throughput figures printed beside their ceilings.

use crate::stdout::say;
use argh::FromArgs;
use flux_lite_core::config::{self, Qwen3Config, TransformerConfig, VaeConfig};
use flux_lite_platform::bench::{self, Ceilings, Figure, ShapeBench};
use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::{Gpu, GpuOptions, Module, Precision};
use std::path::Path;

mod pipelines;
mod traffic;

/// Measure throughput against the physical ceiling of the same run.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "bench")]
pub struct BenchArgs {
    #[argh(subcommand)]
    what: BenchWhat,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum BenchWhat {
    Kernels(KernelsArgs),
    Df11(Df11Args),
    Traffic(TrafficArgs),
}

/// Kernels and blocks at a model's shapes (random weights made in memory), each beside the ceilings the adapter shows in the same run.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "kernels")]
struct KernelsArgs {
    /// klein-4b, klein-9b, or a model folder whose config files give the shapes (default klein-4b)
    #[argh(option, default = "String::from(\"klein-4b\")")]
    model: String,
    /// token counts for the linear layers, attention and blocks, comma-separated (default 768,1536,4608; 64 on a software adapter)
    #[argh(option, from_str_fn(parse_list))]
    tokens: Option<Vec<u64>>,
    /// image side for the VAE up block in pixels, 0 to skip (default 1024; 64 on a software adapter)
    #[argh(option)]
    vae_size: Option<u64>,
    /// image sides for whole denoising steps, VAE decodes and end-to-end figures, comma-separated, 0 to skip (default 256,512,1024; none on a software adapter)
    #[argh(option, from_str_fn(parse_list))]
    step_sizes: Option<Vec<u64>>,
    /// bf16 weights in the DF11 expansion, 0 to skip (default 16777216; 1048576 on a software adapter)
    #[argh(option)]
    df11_elements: Option<usize>,
    /// run only these rows, comma-separated: linear, lora (a rank-16 LoRA side product on each linear shape), attention, blocks, vae, df11 (and the GGUF types' expansion), step, tiers (the linears on every tier side by side), ops (each op of the first double and single block timed alone, as the step records it, and their sums), vae-ops (the untiled VAE decode's ops each timed alone, summed by kind) (default all but ops and vae-ops)
    #[argh(option, from_str_fn(parse_rows))]
    only: Option<Vec<String>>,
    /// timed runs of each row after a warm-up; the median is reported (default 5)
    #[argh(option, default = "5")]
    repeats: usize,
    /// precision tier: auto (default: on a CPU adapter f32, the fastest there; elsewhere matrix units where the adapter has them and they pass a known-answer check, else f16, else f32), f32 (the reference), f16 (f16-staged GEMM tiles, f32 sums) or matrix (cooperative-matrix units, f16 operands, f32 sums); f16 and matrix apply a range rule (docs/kernels.md), and a tier the adapter lacks is an error
    #[argh(option, default = "flux_lite_platform::Precision::Auto", from_str_fn(crate::tier::parse_precision))]
    precision: flux_lite_platform::Precision,
    /// after the rows, what the driver made of every matrix pipeline the run built: registers, spills, workgroup memory and the rest of what it reports (Vulkan drivers with VK_KHR_pipeline_executable_properties)
    #[argh(switch)]
    pipeline_statistics: bool,
}

const ROWS: [&str; 10] = ["linear", "lora", "attention", "blocks", "ops", "vae", "vae-ops", "df11", "step", "tiers"];

/// The rows run only where `--only` names them.
const ASKED_ONLY: [&str; 2] = ["ops", "vae-ops"];

/// The rank of the LoRA side products `bench kernels` times.
const LORA_RANK: u64 = 16;

fn parse_rows(text: &str) -> Result<Vec<String>, String> {
    let rows: Vec<String> = text.split(',').map(|r| r.trim().to_string()).collect();
    match rows.iter().find(|r| !ROWS.contains(&r.as_str())) {
        Some(r) => Err(format!("--only {r:?}: expected some of {}", ROWS.join(", "))),
        None => Ok(rows),
    }
}

fn parse_list(text: &str) -> Result<Vec<u64>, String> {
    let values: Result<Vec<u64>, _> = text.split(',').map(|v| v.trim().parse::<u64>()).collect();
    match values {
        Ok(v) if !v.is_empty() => Ok(v.into_iter().filter(|&x| x > 0).collect()),
        _ => Err(format!("{text:?}: expected numbers separated by commas, e.g. 768,1536")),
    }
}

/// What the prompt's encode, a denoising step, the VAE decode and encode and a whole generation move and how many dispatches they take on a tier, computed from the programs and the config files alone (no GPU), with the roofline on an H200.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "traffic")]
struct TrafficArgs {
    /// klein-4b, klein-9b, or a model folder whose config files give the shapes (default klein-4b)
    #[argh(option, default = "String::from(\"klein-4b\")")]
    model: String,
    /// image width in pixels (default 1024)
    #[argh(option, default = "1024")]
    width: u64,
    /// image height in pixels (default 1024)
    #[argh(option, default = "1024")]
    height: u64,
    /// precision tier whose data path to count: f32, f16 or matrix (default matrix; auto counts as matrix, the tier auto takes on an H200)
    #[argh(option, default = "flux_lite_platform::Precision::Matrix", from_str_fn(crate::tier::parse_precision))]
    precision: flux_lite_platform::Precision,
}

/// DF11 expansion: host (one thread, all threads) and GPU, each beside a plain copy of the same bytes.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "df11")]
struct Df11Args {
    /// bf16 weights in the group (default 16777216, 32 MiB)
    #[argh(option, default = "16 << 20")]
    elements: usize,
    /// runs of each measurement; the fastest is reported (default 3)
    #[argh(option, default = "3")]
    repeats: usize,
    /// skip the GPU
    #[argh(switch)]
    no_gpu: bool,
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    match &args.what {
        BenchWhat::Df11(a) => df11(a),
        BenchWhat::Kernels(a) => kernels(a),
        BenchWhat::Traffic(a) => traffic::run(&a.model, [a.width, a.height], a.precision),
    }
}

/// The shapes to bench: a published model by name, or a folder's configs.
pub(crate) struct Shapes {
    pub name: String,
    pub transformer: TransformerConfig,
    pub text_encoder: Qwen3Config,
    pub vae: VaeConfig,
    pub distilled: bool,
}

pub(crate) fn shapes(model: &str) -> Result<Shapes, String> {
    let published = |name: &str, transformer, text_encoder, vae| Shapes { name: name.into(), transformer, text_encoder, vae, distilled: true };
    match model {
        "klein-4b" => Ok(published("FLUX.2-klein-4B", config::klein_4b::transformer(), config::klein_4b::text_encoder(), config::klein_4b::vae())),
        "klein-9b" => Ok(published("FLUX.2-klein-9B", config::klein_9b::transformer(), config::klein_9b::text_encoder(), config::klein_9b::vae())),
        dir => {
            let f = ModelFolder::open(Path::new(dir)).map_err(|e| e.to_string())?;
            Ok(Shapes { name: dir.into(), transformer: f.transformer, text_encoder: f.text_encoder, vae: f.vae, distilled: f.index.is_distilled })
        }
    }
}

fn kernels(args: &KernelsArgs) -> Result<(), String> {
    let Shapes { name, transformer, text_encoder, vae, distilled } = shapes(&args.model)?;
    let gpu = Gpu::new(&GpuOptions { precision: args.precision, ..crate::env_gpu_options()? }).map_err(|e| e.to_string())?;
    let software = gpu.is_software();
    let tokens = args.tokens.clone().unwrap_or(if software { vec![64] } else { vec![768, 1536, 4608] });
    let vae_size = args.vae_size.unwrap_or(if software { 64 } else { 1024 });
    let step_sizes = args.step_sizes.clone().unwrap_or(if software { vec![] } else { vec![256, 512, 1024] });
    let df11_elements = args.df11_elements.unwrap_or(if software { 1 << 20 } else { 16 << 20 });
    let scale = vae.scale_factor() as u64 * 2;
    if !vae_size.is_multiple_of(scale) {
        return Err(format!("--vae-size {vae_size} is not a multiple of {scale}"));
    }
    if let Some(s) = step_sizes.iter().find(|&&s| !s.is_multiple_of(scale)) {
        return Err(format!("--step-sizes: {s} is not a multiple of {scale}"));
    }
    let want = |row: &str| match &args.only {
        Some(only) => only.iter().any(|r| r == row),
        None => !ASKED_ONLY.contains(&row),
    };
    let bench = ShapeBench::new(&gpu, args.repeats);
    let err = |e: flux_lite_platform::RunError| e.to_string();
    let ceilings = bench.ceilings().map_err(|e| e.to_string())?;
    say!("adapter: {}", gpu.describe());
    say!("model shapes: {name}; random bf16 weights; f32 activations");
    say!("times: median of {} runs after a warm-up, {}", args.repeats.max(1), bench.timer().clock().describe());
    crate::tier::print_notice(&gpu);
    say!("precision: {}: linear and conv rows on this tier, the rest f32", crate::tier::describe(&gpu));
    let matrix_peak = ceilings.matrix_flops.map_or(String::new(), |m| format!(", matrix units {:.1} GFLOP/s", m / 1e9));
    say!(
        "ceilings measured in this run: FMA peak {:.1} GFLOP/s{matrix_peak}, copy {:.1} GB/s (bytes read + written)",
        ceilings.flops / 1e9,
        ceilings.bytes / 1e9
    );
    say!();
    say!("| what | shape | time | GFLOP/s | GB/s | bound | % of bound | dispatches |");
    say!("|---|---|---|---|---|---|---|---|");
    for &t in &tokens {
        if want("linear") {
            // On f16 operands each shape again over the operands the engine
            // keeps in memory there, beside its converted row.
            for f in bench.linears(&transformer, t).map_err(err)? {
                row(&f.converted, &ceilings);
                if let Some(in_memory) = &f.in_memory {
                    row(in_memory, &ceilings);
                }
            }
        }
        if want("lora") {
            for f in bench.lora_side_products(&transformer, t, LORA_RANK).map_err(err)? {
                row(&f, &ceilings);
            }
        }
        if want("attention") {
            for f in bench.attention(&transformer, t).map_err(err)? {
                row(&f, &ceilings);
            }
        }
        if want("blocks") {
            for f in bench.blocks(&transformer, t).map_err(err)? {
                row(&f, &ceilings);
            }
        }
        if want("ops") {
            for f in bench.block_ops(&transformer, t).map_err(err)? {
                row(&f, &ceilings);
            }
        }
    }
    // Untiled VAE rows the adapter cannot hold are skipped with the reason, after the table
    // (the `vae` rows' decode then runs by bands).
    let mut skipped = Vec::new();
    let mut vae_fits = |what: &str, size: u64| match bench.vae_unfit(&vae, size) {
        Some(why) => {
            skipped.push(format!("{what} at {size}×{size} skipped: {why} (gen decodes it in tiles)"));
            false
        }
        None => true,
    };
    let (mut tiny_line, mut encode_skipped) = (None, None);
    if vae_size > 0 && want("vae") {
        // The whole decode where the adapter holds it, else by bands as `gen` runs it.
        let decode = if vae_fits("VAE up block", vae_size) {
            row(&bench.vae_up_block(&vae, vae_size).map_err(err)?, &ceilings);
            bench.vae_decode(&vae, vae_size).map_err(err)?
        } else {
            bench.vae_decode_banded(&vae, vae_size).map_err(err)?
        };
        row(&decode, &ceilings);
        // The encoder (init images, references) where the adapter holds it whole.
        match bench.vae_encode_unfit(&vae, vae_size) {
            None => row(&bench.vae_encode(&vae, vae_size).map_err(err)?, &ceilings),
            Some(why) => encode_skipped = Some(format!("VAE encode at {vae_size}×{vae_size} skipped: {why} (gen encodes it by bands)")),
        }
        // The preview decoder beside the whole decode it stands in for, each laid out as `gen` lays it out.
        let tiny = bench.tiny_decode(&vae, vae_size).map_err(err)?;
        row(&tiny, &ceilings);
        tiny_line = Some(format!(
            "tiny decoder (TAEF2's shape, --preview-decoder) at {vae_size}×{vae_size}: {:.2} ms, {:.2}% of the VAE decode's time ({:.2}% of its operations)",
            tiny.seconds * 1e3,
            100.0 * tiny.seconds / decode.seconds,
            100.0 * tiny.flops as f64 / decode.flops as f64
        ));
    }
    if vae_size > 0 && want("vae-ops") && vae_fits("VAE decode op by op", vae_size) {
        for f in bench.vae_decode_ops(&vae, vae_size).map_err(err)? {
            row(&f, &ceilings);
        }
    }
    if df11_elements > 0 && want("df11") {
        row(&bench.df11(df11_elements).map_err(err)?, &ceilings);
        for ggml in flux_lite_core::ggml::GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
            row(&bench.ggml(ggml, df11_elements).map_err(err)?, &ceilings);
        }
    }
    if want("step") && !step_sizes.is_empty() {
        let encode = bench.text_encoder(&text_encoder).map_err(err)?;
        row(&encode, &ceilings);
        let steps = flux_lite_platform::pipeline::job::default_steps_for(distilled) as u64;
        let mut previews = Vec::new();
        for &size in &step_sizes {
            let step = bench.step(&transformer, size, vae.latent_cell() as u64).map_err(err)?;
            row(&step, &ceilings);
            let preview = bench.preview(&vae, size).map_err(err)?;
            previews.push(format!("latent preview after a step at {size}×{size} (the map on the GPU, its levels read back and enlarged on the host): {:.2} ms, {:.2}% of the step", preview * 1e3, 100.0 * preview / step.seconds));
            if vae_fits("VAE decode and end to end", size) {
                let decode = bench.vae_decode(&vae, size).map_err(err)?;
                row(&decode, &ceilings);
                row(&ShapeBench::end_to_end(&encode, &step, steps, !distilled, &decode, size), &ceilings);
            }
        }
        say!();
        for line in &previews {
            say!("{line}");
        }
    }
    if let Some(line) = &tiny_line {
        say!();
        say!("{line}");
    }
    if vae_size > 0 && (want("vae") || want("vae-ops")) && vae.mid_block_add_attention {
        // What the VAE's attention rows timed: not the flash kernel, whatever its check found.
        let width = vae.decoder_channels().last().copied().unwrap_or_default() as u64;
        match flux_lite_platform::runs_chunked_attention(&gpu) {
            true => say!("the VAE's mid-block attention (one head of {width}): Q·Kᵀ and P·V on the matrix linear over chunks of {} keys, the softmax carried between them ({})", flux_lite_core::ir::ATTENTION_KEY_CHUNK, Module::AttentionChunks.name()),
            false => say!("the VAE's mid-block attention (one head of {width}, carried across key chunks as the bands run it): {}", flux_lite_platform::carried_attention_module(&gpu, width).name()),
        }
    }
    if want("tiers") {
        tiers_side_by_side(&transformer, &tokens, args.repeats)?;
    }
    skipped.extend(encode_skipped);
    if !skipped.is_empty() {
        say!();
    }
    for line in &skipped {
        say!("{line}");
    }
    if step_sizes.is_empty() && args.step_sizes.is_none() && want("step") {
        say!();
        say!("whole denoising steps skipped on a software adapter (ask for them with --step-sizes)");
    }
    if args.pipeline_statistics {
        say!();
        pipelines::print_statistics(&gpu);
    }
    Ok(())
}

/// The transformer's linears on every tier the adapter runs (f32, f16,
/// matrix), each tier on its own device with its own ceilings measured in
/// this run: time, share of the tier's compute ceiling (the FMA peak for f32
/// and f16, whose sums are f32 FMAs; the matrix units' for matrix), and the
/// speed-up over f32.
fn tiers_side_by_side(transformer: &TransformerConfig, tokens: &[u64], repeats: usize) -> Result<(), String> {
    let mut gpus = Vec::new();
    let mut missing = Vec::new();
    for tier in [Precision::F32, Precision::F16, Precision::Matrix] {
        match Gpu::new(&GpuOptions { precision: tier, ..crate::env_gpu_options()? }) {
            Ok(g) => gpus.push(g),
            Err(e) => missing.push(format!("{} tier not shown: {e}", tier.name())),
        }
    }
    // Per tier: its name, its ceilings, its figures for every token count;
    // on f16 operands a second column over the operands kept in memory.
    let mut measured: Vec<(&str, Ceilings, Vec<Figure>)> = Vec::new();
    for gpu in &gpus {
        let bench = ShapeBench::new(gpu, repeats);
        let ceilings = bench.ceilings().map_err(|e| e.to_string())?;
        let mut linears = Vec::new();
        for &t in tokens {
            linears.extend(bench.linears(transformer, t).map_err(|e| e.to_string())?);
        }
        measured.push((gpu.precision().name(), ceilings, linears.iter().map(|f| f.converted.clone()).collect()));
        if let Some(in_memory) = linears.iter().map(|f| f.in_memory.clone()).collect::<Option<Vec<Figure>>>().filter(|f| !f.is_empty()) {
            measured.push(("matrix, f16 x and W in memory", ceilings, in_memory));
        }
    }
    say!();
    say!("linears by tier (each tier's ceilings measured in this run):");
    for (name, c, _) in &measured {
        let matrix = c.matrix_flops.map_or(String::new(), |m| format!(", matrix units {:.1} GFLOP/s", m / 1e9));
        say!("- {name}: FMA peak {:.1} GFLOP/s{matrix}, copy {:.1} GB/s", c.flops / 1e9, c.bytes / 1e9);
    }
    say!();
    let names: Vec<&str> = measured.iter().map(|(n, _, _)| *n).collect();
    let ratios: Vec<String> = names.iter().skip(1).map(|n| format!("{n} ÷ f32")).collect();
    say!("| linear | shape | FLOP/byte | {} | {} |", names.iter().map(|n| format!("{n}: time (% of ceiling)")).collect::<Vec<_>>().join(" | "), ratios.join(" | "));
    say!("|---|---|---|{}{}", "---|".repeat(names.len()), "---|".repeat(ratios.len()));
    let (_, _, reference) = &measured[0];
    for (i, f) in reference.iter().enumerate() {
        let cells: Vec<String> = measured.iter().map(|(_, c, fs)| format!("{} ({}%)", duration(fs[i].seconds), share(100.0 * fs[i].flops as f64 / fs[i].peak(c) / fs[i].seconds.max(1e-12)))).collect();
        let speedups: Vec<String> = measured.iter().skip(1).map(|(_, _, fs)| format!("{}×", figure(f.seconds / fs[i].seconds.max(1e-12), 2))).collect();
        let intensity = f.flops as f64 / f.bytes as f64;
        say!("| {} | {} | {intensity:.0} | {} | {} |", f.what, f.shape, cells.join(" | "), speedups.join(" | "));
    }
    for line in missing {
        say!("{line}");
    }
    Ok(())
}

/// One table row: time, achieved rates, which ceiling bounds it and how close it comes.
fn row(f: &Figure, c: &Ceilings) {
    let rate = |work: u64| if work == 0 { "–".to_string() } else { format!("{:.1}", work as f64 / f.seconds.max(1e-12) / 1e9) };
    say!(
        "| {} | {} | {} | {} | {} | {} | {}% | {} |",
        f.what,
        f.shape,
        duration(f.seconds),
        rate(f.flops),
        rate(f.bytes),
        match (f.compute_bound(c), f.matrix && c.matrix_flops.is_some()) {
            (true, true) => "matrix",
            (true, false) => "FMA",
            (false, _) => "copy",
        },
        share(100.0 * f.of_ceiling(c)),
        f.dispatches.map_or("–".to_string(), |d| d.to_string())
    );
}

/// A percentage in one decimal, or in two significant digits below 0.1
/// (a tiny row far from its ceiling must not read as 0).
fn share(percent: f64) -> String {
    figure(percent, 1)
}

/// `value` with `decimals` places, or in two significant digits where it is
/// below the last of those places (so a small figure never reads as 0).
fn figure(value: f64, decimals: usize) -> String {
    if value >= 10f64.powi(-(decimals as i32)) || value == 0.0 {
        format!("{value:.decimals$}")
    } else {
        let digits = (1 - value.log10().floor() as i32).max(0) as usize;
        format!("{value:.digits$}")
    }
}

fn duration(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else if seconds >= 1e-3 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{:.1} µs", seconds * 1e6)
    }
}

fn gbps(rate: f64) -> String {
    format!("{:.2} GB/s", rate / 1e9)
}

fn df11(args: &Df11Args) -> Result<(), String> {
    if args.elements == 0 {
        return Err("--elements must be at least 1".into());
    }
    let gpu = if args.no_gpu {
        None
    } else {
        match crate::env_gpu_options().and_then(|o| Gpu::new(&o).map_err(|e| e.to_string())) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("warning: no GPU ({e}); host figures only");
                None
            }
        }
    };
    let weights = bench::synthetic_weights(args.elements, 0);
    let r = bench::df11(&weights, gpu.as_ref(), args.repeats).map_err(|e| e.to_string())?;
    let bf16 = 2 * r.elements;
    say!(
        "df11: {} bf16 weights, normal σ 0.02 ({:.1} MiB), DF11 {:.1} MiB ({:.1}% of bf16); bf16 output bytes per second, fastest of {}",
        r.elements,
        bf16 as f64 / (1 << 20) as f64,
        r.compressed_bytes as f64 / (1 << 20) as f64,
        100.0 * r.compressed_bytes as f64 / bf16 as f64,
        args.repeats.max(1)
    );
    say!("encode, 1 thread:           {}", gbps(bf16 as f64 / r.encode.as_secs_f64().max(1e-9)));
    say!("host decode, 1 thread:      {}   (copy, 1 thread: {})", gbps(r.host_one_thread), gbps(r.host_copy));
    say!(
        "host decode, {} threads:     {}   ({:.2} per thread)",
        r.host_threads,
        gbps(r.host_all_threads),
        r.host_all_threads / 1e9 / r.host_threads as f64
    );
    if let (Some(gpu), Some((decode, copy, exact))) = (&gpu, r.device) {
        say!(
            "gpu decode ({}):  {}   (buffer copy: {}; {:.0}% of copy){}",
            gpu.describe(),
            gbps(decode),
            gbps(copy),
            100.0 * decode / copy,
            if exact { ", bit-exact" } else { ", MISMATCH" }
        );
        if !exact {
            return Err("the GPU expansion differs from the weights".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{figure, share};

    #[test]
    fn a_share_below_a_tenth_of_a_percent_keeps_two_significant_digits() {
        assert_eq!(share(12.34), "12.3");
        assert_eq!(share(0.1), "0.1");
        assert_eq!(share(0.0472), "0.047");
        assert_eq!(share(0.00153), "0.0015");
        assert_eq!(share(0.0), "0.0");
    }

    #[test]
    fn a_ratio_below_a_hundredth_keeps_two_significant_digits() {
        assert_eq!(figure(1.234, 2), "1.23");
        assert_eq!(figure(0.04, 2), "0.04");
        assert_eq!(figure(0.00472, 2), "0.0047");
    }
}

//! `flux-lite bench`: throughput figures printed beside their ceilings.

use argh::FromArgs;
use flux_lite_platform::bench;
use flux_lite_platform::{Gpu, GpuOptions};

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
    Df11(Df11Args),
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
        match Gpu::new(&GpuOptions::default()) {
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
    println!(
        "df11: {} bf16 weights, normal σ 0.02 ({:.1} MiB), DF11 {:.1} MiB ({:.1}% of bf16); bf16 output bytes per second, fastest of {}",
        r.elements,
        bf16 as f64 / (1 << 20) as f64,
        r.compressed_bytes as f64 / (1 << 20) as f64,
        100.0 * r.compressed_bytes as f64 / bf16 as f64,
        args.repeats.max(1)
    );
    println!("encode, 1 thread:           {}", gbps(bf16 as f64 / r.encode.as_secs_f64().max(1e-9)));
    println!("host decode, 1 thread:      {}   (copy, 1 thread: {})", gbps(r.host_one_thread), gbps(r.host_copy));
    println!(
        "host decode, {} threads:     {}   ({:.2} per thread)",
        r.host_threads,
        gbps(r.host_all_threads),
        r.host_all_threads / 1e9 / r.host_threads as f64
    );
    if let (Some(gpu), Some((decode, copy, exact))) = (&gpu, r.device) {
        println!(
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

//! What `gen --verbose` prints: the plan, device and host memory beside it,
//! each phase's host high-water; and the closing `time:` line.

use flux_lite_core::plan::Plan;
use flux_lite_platform::host_memory::{self, AnonymousPeak};
use flux_lite_platform::pipeline::Timings;
use flux_lite_platform::{Phase, ReferenceImage};
use std::time::Duration;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The plan `--verbose` prints: each phase's layout, the VAE tile used.
pub fn plan(plan: &Plan, references: &[ReferenceImage], model: &flux_lite_platform::model::ModelFolder) {
    eprintln!("plan: text encoder {}; transformer {}", plan.encode.weights, plan.denoise);
    if plan.denoise.kv_cache == flux_lite_core::models::transformer::KvMode::Keep {
        let cell = model.vae.latent_cell();
        let tokens: usize = references.iter().map(|r| (r.width / cell) * (r.height / cell)).sum();
        let bytes = flux_lite_core::models::transformer::kv_cache_bytes(&model.transformer, tokens as u64);
        eprintln!("plan: the references' keys and values ({tokens} tokens, {:.2} MiB in f32) extracted on the first step, read from the cache by every later step", mib(bytes));
    }
    for r in references {
        eprintln!("reference {}: {}×{} → {}×{}", r.path.display(), r.original.0, r.original.1, r.width, r.height);
    }
    if let Some(r) = plan.references {
        let layout = r.tile.map_or("untiled".to_string(), |t| format!("in bands, arena of a {t}-pixel square"));
        eprintln!("plan: VAE encoder {layout}, arena {:.2} MiB, peak {:.2} MiB", mib(r.arena_bytes), mib(r.peak()));
    }
    if plan.denoise.kv_cache == flux_lite_core::models::transformer::KvMode::Recompute {
        eprintln!("plan: the references' keys and values do not fit the budget beside the transformer: recomputed every step (the same image, slower steps)");
    }
    match (plan.decode.tile, plan.decode.on_device) {
        (Some(_), true) => eprintln!("plan: VAE in bands of one binding, the image's activations on the device"),
        (Some(tile), false) => eprintln!("plan: VAE in bands, arena of a {tile}-pixel square"),
        (None, _) => eprintln!("plan: VAE untiled"),
    }
}

/// Device memory beside the budget and the plan, in MiB and in exact bytes.
pub fn device_memory(peak: u64, budget: Option<u64>, plan: &Plan) {
    let budget_mib = match budget {
        Some(budget) => format!("of budget {:.2} MiB", mib(budget)),
        None => "no budget".to_string(),
    };
    eprintln!(
        "peak device memory: {:.2} MiB, {budget_mib} (planned {:.2} MiB; device and host together {:.2} MiB in the largest phase)",
        mib(peak),
        mib(plan.device_peak()),
        mib(plan.peak())
    );
    // Exact figures, for scripts and tests: a few KiB over a budget shows here, not in MiB.
    let budget = budget.map_or("none".into(), |b| b.to_string());
    eprintln!("device bytes: peak {peak}, budget {budget}, planned {}", plan.device_peak());
}

/// `peak host memory: …` beside the planned host bytes, and its exact form
/// `host bytes: …` (measured on Linux and macOS).
pub fn host_memory(sampler: Option<AnonymousPeak>, plan: &Plan) {
    let planned = plan.host_peak();
    let (Some(sampler), Some(now)) = (sampler, host_memory::now()) else {
        eprintln!("peak host memory: not measured on this OS (planned {:.2} MiB)", mib(planned));
        eprintln!("host bytes: planned {planned}");
        return;
    };
    let anonymous = sampler.finish();
    eprintln!(
        "peak host memory: {:.2} MiB {own} (sampled every {} ms; it also holds the driver, its compiled kernels and, on unified memory, the device's buffers), {:.2} MiB {peak} (planned {:.2} MiB: what the engine allocates on the host)",
        mib(anonymous),
        AnonymousPeak::PERIOD.as_millis(),
        mib(now.resident_peak),
        mib(planned),
        own = host_memory::FIGURES.0,
        peak = host_memory::FIGURES.1
    );
    eprintln!("host bytes: anonymous peak {anonymous}, resident peak {}, planned {planned}, planned with the device {}", now.resident_peak, plan.peak());
}

/// `host bytes by phase: …`: each phase's anonymous high-water beside the
/// plan's device and host bytes for it (on unified memory the measured
/// figure holds both; it also holds the driver and what the allocator kept
/// from the phases before).
pub fn phases(phases: &[(Phase, u64, u64)], plan: &Plan) {
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

/// `time: load …, encode …, steps […], decode …, total …`.
pub fn times(timings: &Timings, total: Duration) {
    let per_step: Vec<String> = timings.steps.iter().map(|d| format!("{:.2}s", d.as_secs_f64())).collect();
    eprintln!(
        "time: load {:.2}s, encode {:.2}s, steps [{}], decode {:.2}s, total {:.2}s",
        timings.load.as_secs_f64(),
        timings.encode.as_secs_f64(),
        per_step.join(", "),
        timings.decode.as_secs_f64(),
        total.as_secs_f64()
    );
}

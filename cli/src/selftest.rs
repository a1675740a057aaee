//! `flux-lite selftest`: the engine checked on this machine's adapter, one
//! line per check; the first thing to run when an image looks wrong.

use crate::stdout::say;
use argh::FromArgs;
use flux_lite_platform::selftest::{self, Check, Event, Report};

/// Check this machine's GPU: every product kernel on each precision tier it
/// offers against the reference, DF11 expansion against the official
/// package, and a built-in tiny model end to end against diffusers.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "selftest")]
pub struct SelftestArgs {
    /// print the report as JSON on standard output instead of lines
    #[argh(switch)]
    json: bool,
}

pub fn run(args: &SelftestArgs) -> Result<(), String> {
    let json = args.json;
    let report = selftest::run(&crate::env_gpu_options()?, &mut |event| {
        if !json {
            print_event(event);
        }
    })
    .map_err(|e| e.to_string())?;
    if json {
        say!("{}", to_json(&report));
    } else {
        let passed = report.checks.iter().filter(|c| c.passed()).count();
        say!("selftest: {passed} of {} checks passed", report.checks.len());
    }
    let failed = report.checks.iter().filter(|c| !c.passed()).count();
    match failed {
        0 => Ok(()),
        n => Err(format!("selftest: {n} of {} checks failed on {}", report.checks.len(), report.adapter)),
    }
}

/// `pass  NAME: worst MEASURE W (tolerance T)`.
fn line(c: &Check) -> String {
    let verdict = if c.passed() { "pass" } else { "FAIL" };
    match &c.failure {
        Some(why) => format!("{verdict}  {}: {why}", c.name),
        None => format!("{verdict}  {}: {} {} (tolerance {})", c.name, c.measure, figure(c.worst), figure(c.tolerance)),
    }
}

/// A figure as the report words it: whole numbers plain, others in
/// scientific notation with three digits.
fn figure(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e6 {
        format!("{v}")
    } else {
        format!("{v:.2e}")
    }
}

fn print_event(event: Event<'_>) {
    match event {
        Event::Adapter { adapter, driver } => {
            say!("adapter: {adapter}");
            say!("driver: {driver}");
        }
        Event::Tier(tier, Ok(())) => say!("tier {}:", tier.name()),
        Event::Tier(tier, Err(why)) => say!("tier {}: not offered here ({why})", tier.name()),
        Event::Check(c) => say!("{}", line(c)),
    }
}

fn to_json(r: &Report) -> serde_json::Value {
    let tiers: Vec<serde_json::Value> = r
        .tiers
        .iter()
        .map(|(tier, offered)| serde_json::json!({ "tier": tier.name(), "offered": offered.is_ok(), "why_not": offered.as_ref().err() }))
        .collect();
    let checks: Vec<serde_json::Value> = r
        .checks
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "measure": c.measure,
                "worst": c.worst.is_finite().then_some(c.worst),
                "tolerance": c.tolerance,
                "passed": c.passed(),
                "failure": c.failure,
            })
        })
        .collect();
    serde_json::json!({ "adapter": r.adapter, "driver": r.driver, "tiers": tiers, "checks": checks, "passed": r.passed() })
}

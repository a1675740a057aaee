//! `flux-lite selftest`: the engine checked on the adapter it would use,
//! without the repository or Python, the way the test suite checks it:
//!
//! - the product kernels (linear, convolution, attention) on every
//!   precision tier the adapter offers, and the norms and RoPE that every
//!   tier shares, against core's f64 reference
//!   ([`flux_lite_kernels::selftest`]);
//! - DF11 expansion on the device, bit for bit against the official
//!   dfloat11 package's groups ([`df11`]);
//! - the tiny test model (`test_vectors/models/tiny-a`, built into the
//!   binary with its diffusers goldens) end to end on every tier: the
//!   prompt embedding, one step's velocity and the image ([`model`]).
//!
//! Each check gives its worst error beside its tolerance; the tolerances
//! are the test suite's ([`crate::tolerance`], [`flux_lite_kernels::selftest`]).

pub mod df11;
pub mod model;

pub use flux_lite_kernels::selftest::Check;
use flux_lite_kernels::{Gpu, GpuError, GpuOptions, Precision};

/// Everything one selftest found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The adapter, its backend and driver.
    pub adapter: String,
    pub driver: String,
    /// Each tier with whether the adapter offers it (and why not).
    pub tiers: Vec<(Precision, Result<(), String>)>,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(Check::passed)
    }
}

/// What a selftest reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// First: the adapter and its driver.
    Adapter { adapter: &'a str, driver: &'a str },
    /// A tier before its checks: offered, or not and why.
    Tier(Precision, Result<(), &'a str>),
    /// A check as it ends.
    Check(&'a Check),
}

/// The tiers a selftest tries, the reference first.
pub const TIERS: [Precision; 3] = [Precision::F32, Precision::F16, Precision::Matrix];

/// Runs every check on each tier `options`' adapter offers; `progress` hears
/// of each step as it ends. Fails only when no device can be opened at all.
pub fn run(options: &GpuOptions, progress: &mut dyn FnMut(Event<'_>)) -> Result<Report, GpuError> {
    let reference = Gpu::new(&GpuOptions { precision: Precision::F32, ..options.clone() })?;
    let mut report = Report {
        adapter: reference.describe(),
        driver: format!("{} {}", reference.info.driver, reference.info.driver_info).trim().to_string(),
        tiers: Vec::new(),
        checks: Vec::new(),
    };
    progress(Event::Adapter { adapter: &report.adapter, driver: &report.driver });
    let keep = |report: &mut Report, check: Check, progress: &mut dyn FnMut(Event<'_>)| {
        progress(Event::Check(&check));
        report.checks.push(check);
    };
    for check in df11::checks(&reference).into_iter().chain(flux_lite_kernels::selftest::shared_checks(&reference)) {
        keep(&mut report, check, progress);
    }
    drop(reference);
    for tier in TIERS {
        let gpu = match Gpu::new(&GpuOptions { precision: tier, ..options.clone() }) {
            Ok(gpu) => gpu,
            Err(e) => {
                let why = e.to_string();
                progress(Event::Tier(tier, Err(&why)));
                report.tiers.push((tier, Err(why)));
                continue;
            }
        };
        progress(Event::Tier(tier, Ok(())));
        report.tiers.push((tier, Ok(())));
        for check in flux_lite_kernels::selftest::product_checks(&gpu) {
            keep(&mut report, check, progress);
        }
        drop(gpu);
        for check in model::checks(options, tier) {
            keep(&mut report, check, progress);
        }
    }
    Ok(report)
}

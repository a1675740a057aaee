//! `--precision auto|f32|f16|matrix`: the precision tier a run asks for.

use flux_lite_platform::{Gpu, Precision};

/// Parses a tier's name; the default, `auto`, lets the adapter decide.
pub fn parse_precision(text: &str) -> Result<Precision, String> {
    Precision::from_name(text.trim()).ok_or_else(|| format!("--precision {:?}: expected auto, f32, f16 or matrix", text.trim()))
}

/// Prints, on standard error, why `auto` stepped down a tier (one
/// `notice:` line), when it did.
pub fn print_notice(gpu: &Gpu) {
    if let Some(notice) = gpu.notice() {
        eprintln!("notice: {notice}");
    }
}

/// The tier a device runs, in words: `matrix (8×8 f16 tiles into f32, subgroup 8)`.
pub fn describe(gpu: &Gpu) -> String {
    match (gpu.precision(), gpu.matrix()) {
        (Precision::Matrix, Some(c)) => format!("matrix ({})", c.describe()),
        (Precision::F16, _) => "f16 (f16-staged tiles, f32 sums)".into(),
        (tier, _) => tier.name().into(),
    }
}

/// Where `auto` took the tier over one the adapter offers, why and how to
/// run the other: `llvmpipe … is a CPU adapter, …; --precision f16 or matrix runs them`.
pub fn why_auto_took(gpu: &Gpu) -> Option<String> {
    gpu.auto_reason().map(|reason| format!("{reason}; --precision f16 or matrix runs them"))
}

/// The tier as [`describe`] says it, with [`why_auto_took`] where there is
/// a why: `f32 (auto: llvmpipe … is a CPU adapter, …)`.
pub fn describe_taken(gpu: &Gpu) -> String {
    match why_auto_took(gpu) {
        Some(why) => format!("{} (auto: {why})", describe(gpu)),
        None => describe(gpu),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_by_name() {
        assert_eq!(parse_precision("auto"), Ok(Precision::Auto));
        assert_eq!(parse_precision("f32"), Ok(Precision::F32));
        assert_eq!(parse_precision(" f16"), Ok(Precision::F16));
        assert_eq!(parse_precision("matrix"), Ok(Precision::Matrix));
        assert!(parse_precision("bf16").unwrap_err().starts_with("--precision \"bf16\": expected auto"));
    }
}

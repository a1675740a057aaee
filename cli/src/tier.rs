//! `--precision f32|matrix`: the precision tier a run asks for.

use flux_lite_platform::Precision;

/// Parses `f32` or `matrix`; the default, f32, is the reference tier.
pub fn parse_precision(text: &str) -> Result<Precision, String> {
    match text.trim() {
        "f32" => Ok(Precision::F32),
        "matrix" => Ok(Precision::Matrix),
        other => Err(format!("--precision {other:?}: expected f32 or matrix")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_by_name() {
        assert_eq!(parse_precision("f32"), Ok(Precision::F32));
        assert_eq!(parse_precision("matrix"), Ok(Precision::Matrix));
        assert!(parse_precision("f16").unwrap_err().starts_with("--precision"));
    }
}

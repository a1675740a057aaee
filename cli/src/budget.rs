//! Sizes on the command line: `--memory-budget SIZE`, and `info --limits`.

use flux_lite_core::plan::DeviceLimits;

/// Parses `512MiB`, `3GiB`, `1.5 GiB`, `4096B` or `64KiB` (units B, KiB, MiB, GiB, TiB).
pub fn parse_memory_budget(text: &str) -> Result<u64, String> {
    parse_size("--memory-budget", text)
}

/// `default budget: …`: the budget a run takes without `--memory-budget`,
/// with where its figure came from.
pub fn default_line(m: &flux_lite_platform::AdapterMemory) -> String {
    format!(
        "default budget: {} ({} B): {} of {} less {}% (give --memory-budget to choose another)",
        flux_lite_core::plan::Bytes(m.default_budget()),
        m.default_budget(),
        m.source.describe(),
        flux_lite_core::plan::Bytes(m.bytes),
        flux_lite_platform::DEFAULT_MARGIN_PERCENT
    )
}

/// The device limits `info` plans under: `adapter` (`None`: this machine's
/// adapter, the default), `webgpu` (WebGPU's defaults, which every adapter
/// grants), or `BUFFER/BINDING`, e.g. `4GiB/4GiB` (a given GPU's).
pub fn parse_limits(text: &str) -> Result<Option<DeviceLimits>, String> {
    match text.trim() {
        "adapter" => Ok(None),
        "webgpu" => Ok(Some(DeviceLimits::WEBGPU_DEFAULT)),
        pair => {
            let (buffer, binding) = pair
                .split_once('/')
                .ok_or_else(|| format!("--limits {text:?}: expected adapter, webgpu, or BUFFER/BINDING such as 4GiB/2GiB"))?;
            Ok(Some(DeviceLimits { max_buffer: parse_size("--limits", buffer)?, max_binding: parse_size("--limits", binding)?, half_operands: false, attention_products: flux_lite_core::ir::AttentionProducts::NONE }))
        }
    }
}

/// A byte count with a binary unit, or an error naming `flag`.
fn parse_size(flag: &str, text: &str) -> Result<u64, String> {
    let bad = || format!("{flag} {text:?}: expected a size such as 512MiB or 3GiB (units B, KiB, MiB, GiB, TiB)");
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
    let (number, unit) = (&t[..split], t[split..].trim());
    let shift = match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 || (shift == 0 && number.contains('.')) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_memory_budget("512MiB"), Ok(512 << 20));
        assert_eq!(parse_memory_budget("3GiB"), Ok(3 << 30));
        assert_eq!(parse_memory_budget("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_memory_budget("4096B"), Ok(4096));
        assert_eq!(parse_memory_budget("1KiB"), Ok(1024));
    }

    #[test]
    fn limits_by_name_or_as_two_sizes() {
        assert_eq!(parse_limits("adapter"), Ok(None));
        assert_eq!(parse_limits("webgpu"), Ok(Some(DeviceLimits::WEBGPU_DEFAULT)));
        assert_eq!(parse_limits("4GiB/2GiB"), Ok(Some(DeviceLimits { max_buffer: 4 << 30, max_binding: 2 << 30, half_operands: false, attention_products: flux_lite_core::ir::AttentionProducts::NONE })));
        for bad in ["", "4GiB", "4GiB/", "gpu", "4GB/2GB"] {
            assert!(parse_limits(bad).unwrap_err().starts_with("--limits"), "{bad}");
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        for bad in ["", "12", "GiB", "3GB", "3 gib", "-1GiB", "0B", "1.5B", "1e3MiB", "3GiBs", "99999999999TiB"] {
            let err = parse_memory_budget(bad).unwrap_err();
            assert!(err.starts_with("--memory-budget"), "{bad}: {err}");
        }
    }
}

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

/// The warning for a software adapter (llvmpipe, SwiftShader, WARP): on one a
/// 1024² step takes minutes, and a machine whose GPU driver is missing from
/// a container otherwise just looks hung.
pub fn software_warning(adapter: &str, device_type: wgpu::DeviceType) -> Option<String> {
    (device_type == wgpu::DeviceType::Cpu)
        .then(|| format!("warning: software driver ({adapter}, no GPU in use): expect minutes per step at 1024²; FLUX_LITE_BACKEND or the GPU's Vulkan/Metal driver chooses another"))
}

/// Prints [`software_warning`] for the device, when it applies.
pub fn print_software_warning(gpu: &Gpu) {
    if let Some(line) = software_warning(&gpu.info.name, gpu.info.device_type) {
        eprintln!("{line}");
    }
}

/// The tier a device runs, in words: `matrix (8×8 f16 tiles into f32,
/// subgroup 8; flash attention)`, the last where both of the flash
/// attention's paths passed their start-up checks, or `flash attention over
/// f16 pieces` (or `over f32 rows`) where only that one did (where one
/// failed, the device's notice says why), and `the transformer's attention
/// as products on the GEMM core` where that runs it.
pub fn describe(gpu: &Gpu) -> String {
    let flash = gpu.flash_attention();
    let paths = match (flash.rows, flash.pieces) {
        (true, true) => "; flash attention",
        (false, true) => "; flash attention over f16 pieces",
        (true, false) => "; flash attention over f32 rows",
        (false, false) => "",
    };
    let products = if gpu.attention_on_products(true) || gpu.attention_on_products(false) { "; the transformer's and the text encoder's attention as products on the GEMM core" } else { "" };
    match (gpu.precision(), gpu.matrix()) {
        (Precision::Matrix, Some(c)) => format!("matrix ({}{paths}{products})", c.describe()),
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
    #[test]
    fn a_software_adapter_is_said_and_a_gpu_is_not() {
        let line = super::software_warning("llvmpipe (LLVM 15.0.6, 256 bits)", wgpu::DeviceType::Cpu).unwrap();
        assert!(line.starts_with("warning: software driver (llvmpipe") && line.contains("minutes per step"), "{line}");
        assert_eq!(super::software_warning("NVIDIA H200", wgpu::DeviceType::DiscreteGpu), None);
    }

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

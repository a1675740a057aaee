//! The precision tier a device is made for: which one `auto` or a named
//! tier resolves to on an adapter (`proof.rs` proves `auto`'s, stepping
//! down where its known-answer check fails).

use crate::error::GpuError;
use crate::precision::{pick_matrix_config, MatrixConfig, MatrixOperands, Precision};

/// The tier a device is made for, with the features it needs.
pub(super) struct TierChoice {
    pub(super) tier: Precision,
    pub(super) matrix: Option<MatrixConfig>,
    pub(super) features: wgpu::Features,
    /// Under `auto`, why it took this tier over one the adapter offers.
    pub(super) reason: Option<String>,
}

/// Why `auto` takes f32 on a CPU adapter (a software driver such as
/// lavapipe), where the half tiers only add work: staging f16 and the range
/// rule cost more than the narrower operands save, and their results are
/// less exact (the figures: docs/kernels.md, "Precision tiers"). Named, the
/// half tiers still run.
fn cpu_reason(info: &wgpu::AdapterInfo) -> String {
    format!("{} is a CPU adapter, where the f16 and matrix tiers run slower than f32 and less exactly", info.name)
}

/// The tier `asked` resolves to on this adapter (`auto`: f32 on a CPU
/// adapter, else the best offered, to be proven by the probe), or why a
/// named tier cannot run here.
pub(super) fn choose_tier(
    adapter: &wgpu::Adapter,
    limits: &wgpu::Limits,
    info: &wgpu::AdapterInfo,
    offered: &[wgpu::CooperativeMatrixProperties],
    options: &super::GpuOptions,
) -> Result<TierChoice, GpuError> {
    let (asked, staging, as_on_a_gpu) = (options.precision, options.gemm_staging, options.gpu_shaped_kernels);
    let has = |f: wgpu::Features| adapter.features().contains(f);
    let unavailable = |tier: Precision, why: String| GpuError::TierUnavailable { tier: tier.name(), adapter: info.name.clone(), why };
    let half = || {
        if has(wgpu::Features::SHADER_F16) {
            Ok(TierChoice { tier: Precision::F16, matrix: None, features: wgpu::Features::SHADER_F16, reason: None })
        } else {
            Err(unavailable(Precision::F16, "the adapter lacks f16 in shaders".into()))
        }
    };
    let matrix = || {
        #[cfg(any(test, feature = "test-support"))]
        if let Some(emulated) = options.emulated_matrix {
            let memory = emulated.planned_memory(adapter.limits().max_compute_workgroup_storage_size, options.max_workgroup_memory);
            return emulated_tier(emulated, has(wgpu::Features::SHADER_F16), memory, staging).map_err(|why| unavailable(Precision::Matrix, why));
        }
        if !has(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            return Err(unavailable(Precision::Matrix, "the adapter lacks cooperative matrices".into()));
        }
        // The linear's workgroups hold several subgroups, each finding its
        // share by its subgroup id.
        if !has(wgpu::Features::SUBGROUP) {
            return Err(unavailable(Precision::Matrix, "the adapter lacks subgroup operations".into()));
        }
        let subgroup = subgroup_sizes(info.backend, info.subgroup_min_size, info.subgroup_max_size);
        let config = pick_matrix_config(offered, subgroup, limits.max_compute_workgroup_storage_size, staging).map_err(|why| unavailable(Precision::Matrix, why))?;
        let mut features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SUBGROUP;
        // f16 operands need f16 in shaders; f32 ones (8×8, as on Apple GPUs) do not.
        if config.operands == MatrixOperands::F16 {
            if !has(wgpu::Features::SHADER_F16) {
                return Err(unavailable(Precision::Matrix, "the adapter lacks f16 in shaders for its f16 cooperative matrices".into()));
            }
            features |= wgpu::Features::SHADER_F16;
        }
        Ok(TierChoice { tier: Precision::Matrix, matrix: Some(config), features, reason: None })
    };
    let reference = TierChoice { tier: Precision::F32, matrix: None, features: wgpu::Features::empty(), reason: None };
    match asked {
        Precision::F32 => Ok(reference),
        Precision::F16 => half(),
        Precision::Matrix => matrix(),
        Precision::Auto if info.device_type == wgpu::DeviceType::Cpu && !as_on_a_gpu => Ok(TierChoice { reason: Some(cpu_reason(info)), ..reference }),
        Precision::Auto => Ok(matrix().or_else(|_| half()).unwrap_or(reference)),
    }
}

/// The matrix tier with its cooperative matrices emulated
/// ([`crate::emulated_matrix`]): the configuration an adapter listing
/// `emulated`'s tiles and subgroups and `memory` of workgroup memory would
/// get, with f16 in shaders where its operands are f16.
#[cfg(any(test, feature = "test-support"))]
fn emulated_tier(emulated: crate::emulated_matrix::EmulatedMatrix, f16: bool, memory: u32, staging: Option<crate::GemmStaging>) -> Result<TierChoice, String> {
    let subgroup = (emulated.subgroup, emulated.subgroup);
    let config = pick_matrix_config(&emulated.offered(), subgroup, memory, staging)?;
    if config.operands == MatrixOperands::F32 {
        return Ok(TierChoice { tier: Precision::Matrix, matrix: Some(config), features: wgpu::Features::empty(), reason: None });
    }
    if !f16 {
        return Err("the adapter lacks f16 in shaders, which the emulated cooperative matrices' f16 operands need".into());
    }
    Ok(TierChoice { tier: Precision::Matrix, matrix: Some(config), features: wgpu::Features::SHADER_F16, reason: None })
}

/// The adapter's subgroup sizes as the matrix tier may rely on them. Metal
/// reports a range (wgpu: 4 to 64), but Apple GPUs run compute in
/// simdgroups of 32, which their simdgroup matrices are defined over: on
/// Metal a range holding 32 is taken as 32.
fn subgroup_sizes(backend: wgpu::Backend, min: u32, max: u32) -> (u32, u32) {
    if backend == wgpu::Backend::Metal && (min..=max).contains(&32) {
        return (32, 32);
    }
    (min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metal_runs_the_matrix_tier_in_simdgroups_of_32() {
        use wgpu::Backend::{Metal, Vulkan};
        // wgpu reports 4 to 64 on Apple GPUs; other backends' ranges are taken as reported.
        assert_eq!(subgroup_sizes(Metal, 4, 64), (32, 32));
        assert_eq!(subgroup_sizes(Metal, 32, 32), (32, 32));
        assert_eq!(subgroup_sizes(Vulkan, 32, 64), (32, 64));
        assert_eq!(subgroup_sizes(Vulkan, 8, 8), (8, 8));
        let offered = [wgpu::CooperativeMatrixProperties {
            m_size: 8,
            n_size: 8,
            k_size: 8,
            ab_type: wgpu::CooperativeScalarType::F32,
            cr_type: wgpu::CooperativeScalarType::F32,
            saturating_accumulation: false,
        }];
        let config = crate::precision::pick_matrix_config(&offered, subgroup_sizes(Metal, 4, 64), 32 << 10, None).unwrap();
        assert_eq!((config.size, config.subgroup), (8, 32));
        assert!(crate::precision::pick_matrix_config(&offered, subgroup_sizes(Vulkan, 4, 64), 32 << 10, None).is_err());
    }
}

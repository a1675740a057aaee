use super::*;
use crate::interface::storage_bindings_used;

fn parse(module: Module) -> naga::Module {
    naga::front::wgsl::parse_str(&module.source())
        .unwrap_or_else(|e| panic!("{}.wgsl: {}", module.name(), e.emit_to_string(&module.source())))
}

fn validate(module: Module) -> (naga::Module, naga::valid::ModuleInfo) {
    let m = parse(module);
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), module.naga_capabilities())
        .validate(&m)
        .unwrap_or_else(|e| panic!("{}: {}", module.name(), e.emit_to_string(&module.source())));
    (m, info)
}

#[test]
fn every_module_parses_and_validates() {
    for module in Module::ALL {
        validate(module);
    }
}

/// `module` validated, with its overrides resolved as a launch sets them
/// (`wg`: the subgroup size the matrix tier's workgroups take).
fn resolved(module: Module, wg: f64) -> (naga::Module, naga::valid::ModuleInfo) {
    resolved_with(module, &[("WG", wg)])
}

/// `module` validated with `constants` (where it declares them) and bf16
/// weights with a bias.
fn resolved_with(module: Module, constants: &[(&str, f64)]) -> (naga::Module, naga::valid::ModuleInfo) {
    let (m, info) = validate(module);
    let declared = |name: &str| m.overrides.iter().any(|(_, o)| o.name.as_deref() == Some(name));
    let constants: naga::back::PipelineConstants = [("WEIGHT_BF16", 1.0), ("HAS_BIAS", 1.0)]
        .into_iter()
        .chain(constants.iter().copied())
        .filter(|(name, _)| declared(name))
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    naga::back::pipeline_constants::process_overrides(&m, &info, None, &constants)
        .map(|(m, info)| (m.into_owned(), info.into_owned()))
        .unwrap_or_else(|e| panic!("{}: overrides: {e}", module.name()))
}

#[test]
fn every_module_translates_to_spirv_and_msl() {
    // Subgroup sizes of lavapipe and of Apple/NVIDIA GPUs.
    for module in Module::ALL {
        for wg in [8.0, 32.0] {
            let (m, info) = resolved(module, wg);
            let spv = naga::back::spv::write_vec(&m, &info, &naga::back::spv::Options::default(), None)
                .unwrap_or_else(|e| panic!("{}: SPIR-V: {e}", module.name()));
            assert!(!spv.is_empty());
            let options = naga::back::msl::Options { lang_version: (3, 0), ..Default::default() };
            let pipeline = naga::back::msl::PipelineOptions::default();
            let (msl, _) = naga::back::msl::write_string(&m, &info, &options, &pipeline)
                .unwrap_or_else(|e| panic!("{}: MSL: {e}", module.name()));
            if module.is_matrix() {
                assert!(msl.contains("simdgroup"), "{}: no simdgroup matrix in the MSL", module.name());
            }
        }
    }
}

/// The modules' SPIR-V, as naga writes it (SPIR-V 1.3) at lavapipe's and
/// GPUs' subgroup sizes, through the Khronos validator (`spirv-val`, from
/// Debian's spirv-tools, which `ci/setup-vulkan.sh` installs) for Vulkan 1.1:
/// the modules `which` picks, each with the validator's first complaint.
/// `None` after a `skipped:` line where no validator is installed (Mesa 26's
/// root, whose run repeats the host's).
fn spirv_val_refusals(tag: &str, which: impl Fn(&Module) -> bool) -> Option<Vec<String>> {
    if std::process::Command::new("spirv-val").arg("--version").output().is_err() {
        crate::skip::skipped("no spirv-val here (ci/setup-vulkan.sh installs Debian's spirv-tools on the host)");
        return None;
    }
    // A folder per test: the two run side by side.
    let dir = std::env::temp_dir().join(format!("flux-lite-spirv-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut refused = Vec::new();
    for module in Module::ALL.into_iter().filter(|m| which(m)) {
        for wg in [8.0, 32.0] {
            let (m, info) = resolved(module, wg);
            let options = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
            let words = naga::back::spv::write_vec(&m, &info, &options, None).unwrap_or_else(|e| panic!("{}: SPIR-V: {e}", module.name()));
            let path = dir.join(format!("{module:?}-{wg}.spv").replace([' ', '{', '}', ':', ','], "_"));
            std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&words)).unwrap();
            let out = std::process::Command::new("spirv-val").args(["--target-env", "vulkan1.1"]).arg(&path).output().unwrap();
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("").to_string();
                refused.push(format!("{} (subgroup {wg}): {why}", module.name()));
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    Some(refused)
}

#[test]
fn every_module_without_matrices_passes_spirv_val() {
    if let Some(refused) = spirv_val_refusals("plain", |m| !m.is_matrix()) {
        assert!(refused.is_empty(), "spirv-val refuses:\n{}", refused.join("\n"));
    }
}

/// Debian bookworm's validator (2023.1) predates SPV_KHR_cooperative_matrix
/// and names its capability (6022) invalid: where it does, the matrix modules
/// cannot be validated here, which the test says. Any other complaint fails it.
#[test]
fn every_matrix_module_passes_spirv_val_where_the_validator_knows_cooperative_matrices() {
    let Some(refused) = spirv_val_refusals("matrix", |m| m.is_matrix()) else { return };
    let unknown = |r: &String| r.contains("Invalid capability operand: 6022");
    if !refused.is_empty() && refused.iter().all(unknown) {
        crate::skip::skipped(format_args!("this spirv-val does not know cooperative matrices (capability 6022): {} matrix modules not validated", refused.len() / 2));
        return;
    }
    assert!(refused.is_empty(), "spirv-val refuses:\n{}", refused.join("\n"));
}

/// DX12 takes HLSL (shader model 6.2, for f16), wgpu's GL backend GLSL ES
/// 3.1. Cooperative matrices exist in wgpu on Vulkan and Metal only, so the
/// matrix modules are not translated to either; GL has no f16, so only the
/// f32 modules go to GLSL.
#[test]
fn every_module_translates_to_hlsl_and_the_f32_ones_to_glsl() {
    for module in Module::ALL.into_iter().filter(|m| !m.is_matrix()) {
        let (m, info) = resolved(module, 32.0);
        let options = naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_2, ..Default::default() };
        let mut hlsl = String::new();
        naga::back::hlsl::Writer::new(&mut hlsl, &options, &naga::back::hlsl::PipelineOptions { entry_point: None })
            .write(&m, &info, None)
            .unwrap_or_else(|e| panic!("{}: HLSL: {e}", module.name()));
        assert!(hlsl.contains("[numthreads("), "{}: no compute entry point in the HLSL", module.name());
        if !module.features().is_empty() {
            continue;
        }
        for ep in &m.entry_points {
            let pipeline = naga::back::glsl::PipelineOptions { shader_stage: ep.stage, entry_point: ep.name.clone(), multiview: None };
            let mut glsl = String::new();
            naga::back::glsl::Writer::new(&mut glsl, &m, &info, &naga::back::glsl::Options::default(), &pipeline, naga::proc::BoundsCheckPolicies::default())
                .and_then(|mut w| w.write())
                .unwrap_or_else(|e| panic!("{}::{}: GLSL: {e}", module.name(), ep.name));
            assert!(glsl.contains("void main()"), "{}::{}: no main in the GLSL", module.name(), ep.name);
        }
    }
}

#[test]
fn catalog_matches_the_shaders() {
    for k in ALL_KERNELS {
        let m = parse(k.module);
        let ep = m
            .entry_points
            .iter()
            .find(|e| e.name == k.entry)
            .unwrap_or_else(|| panic!("{}: no entry point {}", k.module.name(), k.entry));
        if ep.workgroup_size_overrides.is_some() {
            // Sized by an override (the matrix tier's subgroup): listed as 0.
            assert_eq!(k.workgroup_size[0], 0, "{}: workgroup size is an override", k.entry);
        } else {
            assert_eq!(ep.workgroup_size, k.workgroup_size, "{}", k.entry);
        }

        let mut layouter = naga::proc::Layouter::default();
        layouter.update(m.to_ctx()).unwrap();
        for (_, var) in m.global_variables.iter() {
            let Some(binding) = &var.binding else { continue };
            match var.space {
                naga::AddressSpace::Uniform => {
                    assert_eq!(binding.binding, 0, "{}: params at binding 0", k.entry);
                    assert_eq!(layouter[var.ty].size as usize, k.params_size, "{}: Params size", k.entry);
                }
                naga::AddressSpace::Storage { access } => {
                    if let Some((_, acc)) = k.storage.iter().find(|(slot, _)| *slot == binding.binding) {
                        let writable = access.contains(naga::StorageAccess::STORE);
                        assert_eq!(writable, *acc == Access::ReadWrite, "{} binding {}", k.entry, binding.binding);
                    }
                }
                _ => {}
            }
        }
        // The listed bindings are exactly those the entry point uses (wgpu
        // derives the layout from use): what a kernel folder's replacement is
        // held to as well.
        let listed: std::collections::BTreeSet<u32> = k.storage.iter().map(|(slot, _)| *slot).collect();
        assert_eq!(storage_bindings_used(&m, k.entry), Some(listed), "{}: the storage bindings it uses, beside the catalog's", k.entry);
        if let Some(name) = k.weight_dtype_override {
            assert!(
                m.overrides.iter().any(|(_, o)| o.name.as_deref() == Some(name)),
                "{}: no override {name}",
                k.entry
            );
        }
    }
}

#[test]
fn wrapped_grid_covers_every_workgroup() {
    assert_eq!(wrapped_grid(0), [1, 1, 1]);
    assert_eq!(wrapped_grid(10), [10, 1, 1]);
    let g = wrapped_grid(200_000);
    assert!(g[0] <= MAX_GRID_DIM && (g[0] as u64 * g[1] as u64) >= 200_000);
}

/// The workgroup memory `m` declares.
fn workgroup_bytes(m: &naga::Module) -> u32 {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(m.to_ctx()).unwrap();
    m.global_variables.iter().filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup).map(|(_, v)| layouter[v.ty].size).sum()
}

/// The GEMM core's modules on `c`, its staging's overrides set as the
/// launchers set them.
fn staged(module: Module, c: MatrixConfig) -> naga::Module {
    staged_with(module, c, &[])
}

/// [`staged`] with `more` overrides.
fn staged_with(module: Module, c: MatrixConfig, more: &[(&'static str, u32)]) -> naga::Module {
    let constants: Vec<(&str, f64)> = c.staging.constants(c.size).into_iter().chain(more.iter().copied()).map(|(name, value)| (name, value as f64)).chain([("WG", 4.0 * c.subgroup as f64)]).collect();
    resolved_with(module, &constants).0
}

use crate::precision::{GemmStaging, MatrixConfig, MatrixOperands};

/// The GEMM core's modules at each tile configuration: (module, tile size, operands).
const GEMM_MODULES: [(Module, u32, MatrixOperands); 24] = [
    (Module::LinearMatrix8, 8, MatrixOperands::F16),
    (Module::LinearMatrix16, 16, MatrixOperands::F16),
    (Module::LinearMatrix8F32, 8, MatrixOperands::F32),
    (Module::ConvMatrix8, 8, MatrixOperands::F16),
    (Module::ConvMatrix16, 16, MatrixOperands::F16),
    (Module::ConvMatrix8F32, 8, MatrixOperands::F32),
    (Module::LinearMatrix8Vec4, 8, MatrixOperands::F16),
    (Module::LinearMatrix16Vec4, 16, MatrixOperands::F16),
    (Module::LinearMatrix8F32Vec4, 8, MatrixOperands::F32),
    (Module::ConvMatrixNhwc8, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16, 16, MatrixOperands::F16),
    (Module::ConvMatrixNhwc8Vec4, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16Vec4, 16, MatrixOperands::F16),
    (Module::ConvMatrix8Narrow, 8, MatrixOperands::F16),
    (Module::ConvMatrix16Narrow, 16, MatrixOperands::F16),
    (Module::ConvMatrix8F32Narrow, 8, MatrixOperands::F32),
    (Module::ConvMatrixNhwc8Narrow, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16Narrow, 16, MatrixOperands::F16),
    (Module::ConvMatrixNhwc8Vec4Narrow, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16Vec4Narrow, 16, MatrixOperands::F16),
    (Module::ConvMatrixNhwc8Thin, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16Thin, 16, MatrixOperands::F16),
    (Module::ConvMatrixNhwc8Vec4Thin, 8, MatrixOperands::F16),
    (Module::ConvMatrixNhwc16Vec4Thin, 16, MatrixOperands::F16),
];

/// The matrix linear's workgroup memory as the tier's choice counts it
/// (`MatrixConfig::linear_workgroup_bytes`, which picks the staging by the
/// adapter's limit) is what its shader declares under each staging (with
/// two out-slots a subgroup and with one), and the
/// convolutions' on the same core too (the narrow and thin blocks' less).
#[test]
fn the_matrix_linears_workgroup_memory_is_what_the_tier_checks() {
    for (module, size, operands) in GEMM_MODULES {
        for staging in GemmStaging::ALL.into_iter().flat_map(|s| [s, s.one_out_slot()]) {
            let config = MatrixConfig { size, subgroup: 32, operands, staging };
            let declared = workgroup_bytes(&staged(module, config));
            if module.has_narrow_blocks() {
                assert!(declared < config.linear_workgroup_bytes(), "{} {staging:?}", module.name());
            } else {
                assert_eq!(declared, config.linear_workgroup_bytes(), "{} {staging:?}", module.name());
            }
        }
    }
}

/// Every matrix module's workgroup memory as an adapter offering 48 KiB a
/// workgroup (NVIDIA's Vulkan driver) runs it leaves room for two
/// workgroups: the GEMM core's modules staged for it, the wide attention's
/// 512-wide head in halves of its dims a workgroup.
#[test]
fn every_matrix_kernel_leaves_room_for_two_workgroups_in_48_kib() {
    use crate::kernels::attention::matrix_attention_output_dims;
    const MEMORY: u32 = 48 << 10;
    for module in Module::ALL.into_iter().filter(|m| m.is_matrix()) {
        let tag = format!("{module:?}");
        let (size, operands) = (if tag.contains("16") { 16 } else { 8 }, if tag.contains("F32") { MatrixOperands::F32 } else { MatrixOperands::F16 });
        let config = MatrixConfig { size, subgroup: 32, operands, staging: GemmStaging::DEEP }.staged_for(MEMORY).unwrap();
        let wide = tag.starts_with("AttentionMatrixWide").then(|| matrix_attention_output_dims(config, 512, MEMORY, None));
        let more: Vec<(&'static str, u32)> = wide.map(|o| ("O_DIMS", o)).into_iter().collect();
        let bytes = workgroup_bytes(&staged_with(module, config, &more));
        let staging = GEMM_MODULES.iter().any(|(m, ..)| *m == module).then(|| format!(" (k staged in {})", config.staging.describe(size)));
        let dims = wide.map(|o| format!(" ({o} output dims a workgroup)"));
        println!("{tag}: {bytes} bytes of workgroup memory{}{}", staging.unwrap_or_default(), dims.unwrap_or_default());
        assert!(2 * bytes <= MEMORY, "{tag}: {bytes} bytes, more than half of 48 KiB");
    }
}

/// The matrix attention's workgroup memory, whole heads and split over
/// their output dims, is what `matrix_attention_workgroup_bytes` counts.
#[test]
fn the_matrix_attentions_workgroup_memory_is_what_its_split_counts() {
    use crate::kernels::attention::matrix_attention_workgroup_bytes;
    for (module, size, operands, max_dim) in [
        (Module::AttentionMatrix8, 8, MatrixOperands::F16, 128),
        (Module::AttentionMatrix16, 16, MatrixOperands::F16, 128),
        (Module::AttentionMatrix8F32, 8, MatrixOperands::F32, 128),
        (Module::AttentionMatrixWide8, 8, MatrixOperands::F16, 512),
        (Module::AttentionMatrixWide16, 16, MatrixOperands::F16, 512),
    ] {
        let config = MatrixConfig { size, subgroup: 32, operands, staging: GemmStaging::DEEP };
        for o_dims in [max_dim, max_dim / 2, max_dim / 4] {
            let declared = workgroup_bytes(&staged_with(module, config, &[("O_DIMS", o_dims)]));
            assert_eq!(declared, matrix_attention_workgroup_bytes(config, o_dims), "{module:?} at {o_dims} dims a workgroup");
        }
    }
}

/// The flash attention's workgroup memory is what the start-up check
/// counts against the adapter's limit, and fits the 48 KiB NVIDIA's
/// Vulkan driver offers (`maxComputeSharedMemorySize`, 49,152 bytes), at
/// both tile sizes.
#[test]
fn the_flash_attentions_workgroup_memory_fits_48_kib() {
    for (module, size) in [(Module::AttentionFlash8, 8), (Module::AttentionFlash16, 16)] {
        let declared = workgroup_bytes(&parse(module));
        println!("{}: {declared} bytes of workgroup memory", module.name());
        assert!(declared <= 48 * 1024, "{}: {declared} bytes", module.name());
        let config = MatrixConfig { size, subgroup: 32, operands: MatrixOperands::F16, staging: GemmStaging::DEEP };
        assert_eq!(crate::kernels::attention::flash_workgroup_bytes(config), declared, "{}", module.name());
    }
}


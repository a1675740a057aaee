//! Which storage bindings a module's entry points use, read from its WGSL
//! with naga: what the catalogue's lists must equal (wgpu derives each
//! pipeline's layout from use, and the launchers bind the listed slots), and
//! what a replacement from the kernel folder (`FLUX_LITE_KERNEL_DIR`) is
//! held to before anything is built from it.

use crate::catalogue::ALL_KERNELS;
use crate::error::GpuError;
use crate::kernel::Module;
use std::collections::BTreeSet;

/// Whether `function` or any function it calls (however deeply) reads or
/// writes the global variable `name`: bindings used only inside helpers
/// (`load_a`/`load_b` of the GEMM tiling) count as used by the entry point.
fn uses_global(m: &naga::Module, function: &naga::Function, name: Option<&str>) -> bool {
    let direct = function
        .expressions
        .iter()
        .any(|(_, e)| matches!(e, naga::Expression::GlobalVariable(g) if m.global_variables[*g].name.as_deref() == name));
    let mut callees = Vec::new();
    calls_in(&function.body, &mut callees);
    direct || callees.into_iter().any(|f| uses_global(m, &m.functions[f], name))
}

/// Every function a block calls, nested blocks included.
fn calls_in(block: &naga::Block, out: &mut Vec<naga::Handle<naga::Function>>) {
    for statement in block.iter() {
        match statement {
            naga::Statement::Call { function, .. } => out.push(*function),
            naga::Statement::Block(b) => calls_in(b, out),
            naga::Statement::If { accept, reject, .. } => {
                calls_in(accept, out);
                calls_in(reject, out);
            }
            naga::Statement::Loop { body, continuing, .. } => {
                calls_in(body, out);
                calls_in(continuing, out);
            }
            naga::Statement::Switch { cases, .. } => cases.iter().for_each(|c| calls_in(&c.body, out)),
            _ => {}
        }
    }
}

/// The storage bindings (group 0) entry point `entry` of `m` uses, or
/// `None` where `m` has no such entry point.
pub(crate) fn storage_bindings_used(m: &naga::Module, entry: &str) -> Option<BTreeSet<u32>> {
    let ep = m.entry_points.iter().find(|e| e.name == entry)?;
    let used = m
        .global_variables
        .iter()
        .filter(|(_, var)| matches!(var.space, naga::AddressSpace::Storage { .. }))
        .filter_map(|(_, var)| var.binding.as_ref().map(|b| (b.binding, var.name.as_deref())))
        .filter(|(_, name)| uses_global(m, &ep.function, *name))
        .map(|(slot, _)| slot)
        .collect();
    Some(used)
}

/// Checks a replacement `source` for `module` against what its launchers
/// bind: it parses, and each of the module's entry points in the catalogue
/// is there and uses exactly the storage bindings listed for it. A variant
/// that drops a binding with the code that read it would otherwise build
/// and then fail at its first dispatch, far from the cause.
pub(crate) fn check_replacement(module: Module, source: &str) -> Result<(), String> {
    let m = naga::front::wgsl::parse_str(source).map_err(|e| crate::error::one_line(&e.emit_to_string(source)))?;
    for k in ALL_KERNELS.iter().filter(|k| k.module == module) {
        let used = storage_bindings_used(&m, k.entry).ok_or_else(|| format!("no entry point {}", k.entry))?;
        let bound: BTreeSet<u32> = k.storage.iter().map(|(slot, _)| *slot).collect();
        if used != bound {
            return Err(format!("entry point {} uses storage bindings {used:?}, but its launchers bind {bound:?}", k.entry));
        }
    }
    Ok(())
}

/// Every replacement in kernel folder `dir` (`FLUX_LITE_KERNEL_DIR`, see
/// [`crate::GpuOptions::kernel_dir`]) held to what its launchers bind
/// ([`check_replacement`]): for the caller to run before it makes a device
/// with that folder, so a variant that cannot run is refused with its
/// reason, not at its first dispatch. (Here, above the catalogue, not in
/// the device, which the catalogue's launchers depend on.)
pub fn check_kernel_dir(dir: &std::path::Path) -> Result<(), GpuError> {
    for module in Module::ALL {
        let path = dir.join(module.file_name());
        let Ok(source) = std::fs::read_to_string(&path) else { continue };
        check_replacement(module, &source).map_err(|why| GpuError::KernelSource { path: path.display().to_string(), why })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_check_follows_calls_into_helpers() {
        // `helper` alone touches `hidden`: the entry point uses it through the call.
        let source = "@group(0) @binding(1) var<storage, read_write> hidden: array<f32>;
            fn helper() { hidden[0] = 1.0; }
            @compute @workgroup_size(1) fn main() { helper(); }";
        let m = naga::front::wgsl::parse_str(source).unwrap();
        let ep = &m.entry_points[0];
        assert!(uses_global(&m, &ep.function, Some("hidden")));
        assert!(!uses_global(&m, &ep.function, Some("absent")));
        assert_eq!(storage_bindings_used(&m, "main"), Some(BTreeSet::from([1])));
        assert_eq!(storage_bindings_used(&m, "other"), None);
    }

    #[test]
    fn every_built_in_module_passes_the_replacement_check() {
        for module in Module::ALL {
            check_replacement(module, &module.source()).unwrap_or_else(|why| panic!("{}: {why}", module.name()));
        }
    }

    #[test]
    fn a_replacement_that_drops_a_binding_or_an_entry_point_is_refused() {
        let source = Module::RangeScales.source();
        // range_scales reads its rows at binding 1: a variant measuring a constant drops it.
        let read = "src[weight_word(e, SOURCE_BF16)]";
        assert!(source.contains(read));
        let dropped = source.replace(read, "0u");
        assert_eq!(check_replacement(Module::RangeScales, &dropped), Err("entry point range_scales uses storage bindings {2}, but its launchers bind {1, 2}".to_string()));
        let renamed = source.replace("fn range_scales(", "fn measured(");
        assert_eq!(check_replacement(Module::RangeScales, &renamed), Err("no entry point range_scales".to_string()));
        let unparsable = format!("{source}\nfn broken( {{");
        assert!(check_replacement(Module::RangeScales, &unparsable).is_err_and(|why| !why.contains('\n')));
    }

    #[test]
    fn a_kernel_folder_is_refused_where_a_replacement_cannot_be_bound() {
        let dir = std::env::temp_dir().join(format!("flux-lite-kernel-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("RangeScales.wgsl"), Module::RangeScales.source().as_ref()).unwrap();
        assert!(check_kernel_dir(&dir).is_ok());
        std::fs::write(dir.join("RangeScales.wgsl"), Module::RangeScales.source().replace("fn range_scales(", "fn measured(")).unwrap();
        let refused = check_kernel_dir(&dir).unwrap_err().to_string();
        assert_eq!(refused, format!("{}: no entry point range_scales (a kernel folder's replacement must keep each entry point and the storage bindings its launchers bind)", dir.join("RangeScales.wgsl").display()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

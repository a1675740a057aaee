use super::*;

fn parse(module: Module) -> naga::Module {
    naga::front::wgsl::parse_str(module.source())
        .unwrap_or_else(|e| panic!("{}.wgsl: {}", module.name(), e.emit_to_string(module.source())))
}

#[test]
fn every_module_parses_and_validates() {
    for module in Module::ALL {
        let m = parse(module);
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
            .validate(&m)
            .unwrap_or_else(|e| panic!("{}.wgsl: {}", module.name(), e.emit_to_string(module.source())));
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
        assert_eq!(ep.workgroup_size, k.workgroup_size, "{}", k.entry);

        let mut layouter = naga::proc::Layouter::default();
        layouter.update(m.to_ctx()).unwrap();
        let mut storage_seen = Vec::new();
        for (_, var) in m.global_variables.iter() {
            let Some(binding) = &var.binding else { continue };
            match var.space {
                naga::AddressSpace::Uniform => {
                    assert_eq!(binding.binding, 0, "{}: params at binding 0", k.entry);
                    assert_eq!(layouter[var.ty].size as usize, k.params_size, "{}: Params size", k.entry);
                }
                naga::AddressSpace::Storage { access } => {
                    let listed = k.storage.iter().find(|(slot, _)| *slot == binding.binding);
                    if let Some((_, acc)) = listed {
                        let writable = access.contains(naga::StorageAccess::STORE);
                        assert_eq!(writable, *acc == Access::ReadWrite, "{} binding {}", k.entry, binding.binding);
                        storage_seen.push(binding.binding);
                    } else {
                        assert!(
                            !ep_uses_directly(&m, ep, var.name.as_deref()),
                            "{} uses binding {} that the catalog omits",
                            k.entry,
                            binding.binding
                        );
                    }
                }
                _ => {}
            }
        }
        for (slot, _) in k.storage {
            assert!(storage_seen.contains(slot), "{}: catalog lists binding {slot} the module lacks", k.entry);
        }
        if let Some(name) = k.weight_dtype_override {
            assert!(
                m.overrides.iter().any(|(_, o)| o.name.as_deref() == Some(name)),
                "{}: no override {name}",
                k.entry
            );
        }
    }
}

fn ep_uses_directly(m: &naga::Module, ep: &naga::EntryPoint, name: Option<&str>) -> bool {
    ep.function
        .expressions
        .iter()
        .any(|(_, e)| matches!(e, naga::Expression::GlobalVariable(g) if m.global_variables[*g].name.as_deref() == name))
}

#[test]
fn wrapped_grid_covers_every_workgroup() {
    assert_eq!(wrapped_grid(0), [1, 1, 1]);
    assert_eq!(wrapped_grid(10), [10, 1, 1]);
    let g = wrapped_grid(200_000);
    assert!(g[0] <= MAX_GRID_DIM && (g[0] as u64 * g[1] as u64) >= 200_000);
}

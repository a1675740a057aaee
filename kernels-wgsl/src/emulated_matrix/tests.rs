//! The rewriting held to naga and to hand-written modules.

use super::*;
use crate::Module;

/// Every matrix module, emulated, is WGSL that naga accepts without
/// cooperative matrices or subgroups: none of them is left.
/// Each named adapter's tier is configured as that adapter's would be,
/// from what it lists: NVIDIA's 16×16 f16 tiles staged lean in 48 KiB,
/// Apple's 8×8 f32 tiles (taken over its f16 ones) staged single in 32 KiB,
/// lavapipe's 8×8 f16 tiles in subgroups of 8.
#[test]
fn each_emulated_adapter_gets_the_configuration_its_listing_gives() {
    use crate::precision::{pick_matrix_config, MatrixOperands};
    use crate::GemmStaging;
    let config = |e: EmulatedMatrix| pick_matrix_config(&e.offered(), (e.subgroup, e.subgroup), e.planned_memory(32 << 10, None), None).unwrap();
    let nvidia = config(EmulatedMatrix::NVIDIA);
    assert_eq!((nvidia.size, nvidia.subgroup, nvidia.operands, nvidia.staging), (16, 32, MatrixOperands::F16, GemmStaging::LEAN));
    let apple = config(EmulatedMatrix::APPLE);
    assert_eq!((apple.size, apple.subgroup, apple.operands, apple.staging), (8, 32, MatrixOperands::F32, GemmStaging::SINGLE));
    let lavapipe = config(EmulatedMatrix::LAVAPIPE);
    assert_eq!((lavapipe.size, lavapipe.subgroup, lavapipe.operands), (8, 8, MatrixOperands::F16));
    // A test's cap lowers the emulated adapter's memory; lavapipe plans for what the driver lists.
    assert_eq!(EmulatedMatrix::NVIDIA.planned_memory(32 << 10, Some(24 << 10)), 24 << 10);
    assert_eq!(EmulatedMatrix::LAVAPIPE.planned_memory(32 << 10, None), 32 << 10);
    for (name, e) in [("nvidia", EmulatedMatrix::NVIDIA), ("apple", EmulatedMatrix::APPLE), ("lavapipe", EmulatedMatrix::LAVAPIPE)] {
        assert_eq!(EmulatedMatrix::from_setting(name), Ok(e));
    }
    assert!(EmulatedMatrix::from_setting("16").unwrap_err().contains("give nvidia"));
}

#[test]
fn every_matrix_module_emulated_validates_without_cooperative_matrices() {
    let mut emulated = 0;
    for module in Module::ALL.into_iter().filter(|m| m.is_matrix()) {
        let source = emulate(&module.source(), 32).unwrap_or_else(|e| panic!("{}: {e}", module.name())).source;
        let parsed = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{}: {}", module.name(), e.emit_to_string(&source)));
        use naga::valid::Capabilities as C;
        let caps = module.naga_capabilities() - C::COOPERATIVE_MATRIX - C::SUBGROUP;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&parsed)
            .unwrap_or_else(|e| panic!("{}: {}", module.name(), e.emit_to_string(&source)));
        assert!(!source.contains("subgroup_id") && !source.contains("coop"), "{}: {source}", module.name());
        emulated += 1;
    }
    assert!(emulated >= 20, "only {emulated} matrix modules");
}

#[test]
fn a_pointer_let_and_a_nested_load_are_rewritten_to_the_array() {
    let source = "enable f16;\nenable wgpu_cooperative_matrix;\nconst T: u32 = 8u;\nalias MatA = coop_mat8x8<f16, A>;\nalias MatC = coop_mat8x8<f32, C>;\n\
        var<workgroup> a: array<f16, 64>;\nvar<workgroup> c: array<f32, 64>;\n\
        @compute @workgroup_size(16)\nfn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {\n\
        let z = &c[sg * 0u];\n    let m = coopMultiplyAdd(coopLoadT<MatA>(&a[0], T), coopLoad<MatA>(&a[0], T), coopLoadT<MatC>(z, T));\n    coopStoreT(m, &c[(li / 64u) * 8u], T);\n}\n";
    let out = emulate(source, 8).unwrap().source;
    assert!(out.contains("let sg = li / EMULATED_SUBGROUP;"), "{out}");
    assert!(out.contains("let z = sg * 0u;"), "{out}");
    assert!(out.contains("let m: EmulatedSlot = 0u; emulated_load_c(m, z, T, true); emulated_load_a((EMULATED_TEMPS_AT + 0u), 0, T, true); emulated_load_a((EMULATED_TEMPS_AT + 1u), 0, T, false); emulated_multiply_add((EMULATED_TEMPS_AT + 0u), (EMULATED_TEMPS_AT + 1u), m);"), "{out}");
    assert!(out.contains("emulated_store_c(m, (li / 64u) * 8u, T, true);"), "{out}");
    assert!(out.contains("= f32(emulated_tiles[base + row * T + col]);"), "{out}");
    assert!(out.contains("const EMULATED_SLOTS: u32 = 3u;"), "{out}");
    let parsed = naga::front::wgsl::parse_str(&out).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&out)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::SHADER_FLOAT16).validate(&parsed).unwrap();
}

#[test]
fn a_number_set_from_a_number_stays_as_it_is_and_a_pointer_name_into_two_arrays_is_refused() {
    let head = "enable f16;\nenable wgpu_cooperative_matrix;\nconst T: u32 = 8u;\nalias MatC = coop_mat8x8<f32, C>;\n\
        var<workgroup> c: array<f32, 64>;\nvar<workgroup> d: array<f32, 64>;\n";
    let numbers = format!("{head}fn f() -> u32 {{\n    let x = 0u;\n    var y = x;\n    return y;\n}}\n\
        @compute @workgroup_size(8)\nfn main(@builtin(local_invocation_index) li: u32) {{\n    let t = coopLoadT<MatC>(&c[0], T);\n    var u = t;\n    coopStoreT(u, &c[f()], T);\n}}\n");
    let out = emulate(&numbers, 8).unwrap().source;
    assert!(out.contains("var y = x;"), "{out}");
    assert!(out.contains("let u: EmulatedSlot = 1u; emulated_copy(t, u)"), "{out}");
    let two = format!("{head}fn g() {{\n    let p = &d[0];\n    let t = coopLoadT<MatC>(p, T);\n}}\n\
        @compute @workgroup_size(8)\nfn main(@builtin(local_invocation_index) li: u32) {{\n    let p = &c[0];\n    let t = coopLoadT<MatC>(p, T);\n}}\n");
    let refused = emulate(&two, 8).unwrap_err();
    assert!(refused.contains("`p` points into `d` in one place and `c` in another"), "{refused}");
}

/// A load from an array of vec4s counts its pointer and stride in vec4s and
/// reads the components as consecutive operands, as SPIR-V's cooperative
/// loads do: (row, col) of a row-major tile at vec4 `at` with a stride of
/// `stride` vec4s is operand 4·at + 4·stride·row + col.
#[test]
fn a_load_from_vec4s_reads_their_components_as_consecutive_operands() {
    assert_eq!(Element::parse("vec4<f16>, A_VEC4S>"), Element { scalar: "f16".into(), width: 4 });
    assert_eq!(Element::parse("f32, 64>"), Element { scalar: "f32".into(), width: 1 });
    let source = "enable f16;\nenable wgpu_cooperative_matrix;\nconst T: u32 = 8u;\nalias MatA = coop_mat8x8<f16, A>;\nalias MatC = coop_mat8x8<f32, C>;\n\
        var<workgroup> a: array<vec4<f16>, 32>;\nvar<workgroup> c: array<f32, 64>;\n\
        @compute @workgroup_size(8)\nfn main(@builtin(local_invocation_index) li: u32) {\n\
        let m = coopMultiplyAdd(coopLoadT<MatA>(&a[2], 4u), coopLoad<MatA>(&a[0], 4u), coopLoadT<MatC>(&c[0], T));\n    coopStoreT(m, &c[0], T);\n}\n";
    let out = emulate(source, 8).unwrap().source;
    assert!(out.contains("let emulated_e = emulated_operand(at, stride, row, col, row_major, 4u); emulated_tiles[base + row * T + col] = f32(a[emulated_e / 4u][emulated_e % 4u]);"), "{out}");
    assert!(out.contains("return at * width + select(col * stride * width + row, row * stride * width + col, row_major);"), "{out}");
    let parsed = naga::front::wgsl::parse_str(&out).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&out)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::SHADER_FLOAT16).validate(&parsed).unwrap();
}

#!/usr/bin/env python3
"""Variants of the matrix tier's flash attention, one folder each, for
FLUX_LITE_KERNEL_DIR: which change makes the start-up check pass where the
kernel as built fails it (an NVIDIA H200, 16×16 tiles in subgroups of 32:
NaN, then -inf in a few outputs), and what the kernel holds on the way.

    python3 ci/flash_variants.py SOURCES OUT

SOURCES: what `flux-lite gpu --kernel-sources SOURCES` wrote. OUT/<variant>/
gets AttentionFlash8.wgsl and AttentionFlash16.wgsl, each changed in one
way; printed one a line as `name<TAB>kind<TAB>what it tells`. Two kinds:
- `fix`: computes the kernel's answer another way (each passes the
  start-up check on Mesa 26's lavapipe); `all` is every fix at once;
- `probe`: writes one of the kernel's intermediates in place of each f32
  output (so it fails the check by design); `flux-lite gpu --flash-report
  DIR` with it, then `python3 ci/flash_analyse.py DIR` reads what it held.
The engine refuses a folder whose sources its launchers could not bind.
"""
import pathlib
import sys

ZERO_FILL = """    for (var i = li; i < KB * LDK / 4u; i += WG) { kv_sh[i] = vec4<Operand>(); }
    for (var i = li; i < QB * KB; i += WG) { s_sh[i] = 0.0; p_sh[i] = Operand(0.0); }
    for (var i = li; i < KB; i += WG) { k_scale[i] = 1.0; v_row[i] = 0.0; }
    for (var r = li; r < QB; r += WG) { q_scale[r] = 1.0; row_rescale[r] = 1.0; }
    for (var i = li; i < QB * MAX_SEGS; i += WG) { seg_max[i] = 0.0; seg_sum[i] = 0.0; }
    workgroupBarrier();
"""
ZERO_ANCHOR = "    for (var i = li; i < T * T; i += WG) {\n        zero_sh[i] = 0.0;"
OUTPUT = "= s_sh[mine + i] * row_factor(row, unit);"
P_STAGED = "p_sh[r * KB + j] = Operand(pr * P_SHIFT);"

# The queries in workgroup memory for the whole run (16 KiB more with 16×16
# tiles: 40 KiB a workgroup), each score's fragment loaded from there on
# every key tile, where the kernel holds them in registers across the loop.
Q_SHARED = [
    ("var<workgroup> moved: u32;", "var<workgroup> moved: u32;\nvar<workgroup> q_sh: array<vec4<Operand>, QB * MAX_DIM / 4u>;"),
    ("    var k_end = p.kv_len;", """    for (var i = li; i < QB * MAX_DIM / 4u; i += WG) {
        let r = i / (MAX_DIM / 4u);
        let d = 4u * (i % (MAX_DIM / 4u));
        if (quads_at(p.q_offset, p.q_stride)) {
            q_sh[i] = tensor_quad(QUERIES, h, q0 + r, d, q_scale[r]);
        } else {
            q_sh[i] = vec4<Operand>(divided_by_power(tensor_run(QUERIES, h, q0 + r, d), q_scale[r]));
        }
    }
    var k_end = p.kv_len;"""),
] + [(f"coopMultiplyAdd(qf{n}, ", f"coopMultiplyAdd(coopLoadT<MatA>(&q_sh[((sg * T) * MAX_DIM + {n}u * T) / 4u], MAX_DIM / 4u), ")
     for n in range(16) for _ in range(2)]
# Each P·V product in two statements, where the kernel nests one in the other.
PV_SPLIT = [(f"o{n} = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + {n}u * T) / 4u], LDV / 4u), "
             f"coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[({n}u * T) / 4u], LDV / 4u), o{n}));",
             f"o{n} = coopMultiplyAdd(pa0, coopLoadT<MatB>(&kv_sh[({n}u * T) / 4u], LDV / 4u), o{n});\n"
             f"        o{n} = coopMultiplyAdd(pa1, coopLoadT<MatB>(&kv_sh[(T * LDV + {n}u * T) / 4u], LDV / 4u), o{n});")
            for n in range(8)]

# The accumulators staged through a workgroup array of their own (as the
# GEMM's are), for their rescale and the f32 output, where the kernel stages
# them over its scores (4 KiB more with 16×16 tiles).
RESCALED = "coopStoreT(o{n}, &s_sh[mine], T); workgroupBarrier(); rescale_tile(mine, sg, lane, lanes); workgroupBarrier(); o{n} = coopLoadT<MatC>(&s_sh[mine], T);"
WRITTEN = "coopStoreT(o{n}, &s_sh[mine], T); workgroupBarrier(); write_tile(mine, sg, lane, lanes, h, q0, d0 + {n}u * T, unit);"
O_STAGE = [
    ("var<workgroup> moved: u32;", "var<workgroup> moved: u32;\nvar<workgroup> o_stage: array<f32, SG * T * T>;"),
    ("        s_sh[mine + i] *= row_rescale[sg * T + i / T];", "        o_stage[sg * T * T + i] *= row_rescale[sg * T + i / T];"),
    (OUTPUT, "= o_stage[sg * T * T + i] * row_factor(row, unit);"),
] + [(RESCALED.format(n=n), RESCALED.format(n=n).replace("&s_sh[mine]", "&o_stage[sg * T * T]")) for n in range(8)] \
  + [(WRITTEN.format(n=n), WRITTEN.format(n=n).replace("&s_sh[mine]", "&o_stage[sg * T * T]")) for n in range(8)]
# Each f32 output tile's staging filled with 7777 before the accumulator is
# stored over it, and written out as staged: an output of 7777 is an
# element the store did not write.
UNWRITTEN = [(OUTPUT, "= s_sh[mine + i];")] + [
    (WRITTEN.format(n=n), "for (var i = lane; i < T * T; i += lanes) { s_sh[mine + i] = 7777.0; } workgroupBarrier(); " + WRITTEN.format(n=n))
    for n in range(8)]

# The values staged dim by dim (a tile's column of KB keys for each dim) and
# loaded column-major, as the GEMM loads its B, where the kernel stages them
# key by key and loads them row-major (the one load of that kind among the
# matrix kernels).
V_COLUMNS = [
    ("            if (quads_at(p.v_offset, p.v_stride)) {", "            var quad: vec4<Operand>;\n            if (quads_at(p.v_offset, p.v_stride)) {"),
    ("kv_sh[(j * LDV + c) / 4u] = tensor_quad(VALUES", "quad = tensor_quad(VALUES"),
    ("kv_sh[(j * LDV + c) / 4u] = vec4<Operand>(", "quad = vec4<Operand>("),
    ("            }\n        }\n        workgroupBarrier();\n        // Then each (row, segment)'s probabilities",
     "            }\n            for (var e = 0u; e < 4u; e++) { let at = (c + e) * KB + j; kv_sh[at / 4u][at % 4u] = quad[e]; }"
     "\n        }\n        workgroupBarrier();\n        // Then each (row, segment)'s probabilities"),
] + [(f"coopLoadT<MatB>(&kv_sh[(T * LDV + {n}u * T) / 4u], LDV / 4u)", f"coopLoad<MatB>(&kv_sh[({n}u * T * KB + T) / 4u], KB / 4u)")
     for n in range(8)] \
  + [(f"coopLoadT<MatB>(&kv_sh[({n}u * T) / 4u], LDV / 4u)", f"coopLoad<MatB>(&kv_sh[({n}u * T * KB) / 4u], KB / 4u)")
     for n in range(8)]

# Each variant: (name, kind, what it tells, [(text, replacement)]).
VARIANTS = [
    ("zero", "fix", "a read of workgroup memory never written (pipelines skip its zeroing)",
     [(ZERO_ANCHOR, ZERO_FILL + ZERO_ANCHOR)]),
    ("always", "fix", "the accumulators reassigned under a branch (rescaled on every key tile)",
     [("if (workgroupUniformLoad(&moved) != 0u) {", "workgroupBarrier();\n        if (true) {")]),
    ("sgli", "fix", "the subgroup_id builtin (subgroup taken as local index / subgroup size)",
     [("@builtin(subgroup_id) sg: u32,", "@builtin(subgroup_id) sg_unused: u32,"),
      ("    let h = wid.y;", "    let sg = li / lanes;\n    let h = wid.y;")]),
    ("oneseg", "fix", "a row's softmax split over two invocations (one each: MAX_SEGS 1)",
     [("const MAX_SEGS: u32 = 2u;", "const MAX_SEGS: u32 = 1u;")]),
    ("lazy0", "fix", "the lazy maximum (raised on every key tile that passes it: LAZY 0)",
     [("const LAZY: f32 = 8.0;", "const LAZY: f32 = 0.0;")]),
    ("pshift1", "fix", "the probabilities' ×16 shift into f16 (P_SHIFT 1)",
     [("const P_SHIFT: f32 = 16.0;", "const P_SHIFT: f32 = 1.0;")]),
    ("clamp", "fix", "an f16 overflow where values and probabilities are staged (each clamped to ±65504 first)",
     [("vec4<Operand>(divided_by_power(tensor_run(VALUES, kvh, k0 + j, d0 + c), v_div))",
       "vec4<Operand>(clamp(divided_by_power(tensor_run(VALUES, kvh, k0 + j, d0 + c), v_div), vec4<f32>(-65504.0), vec4<f32>(65504.0)))"),
      (P_STAGED, "p_sh[r * KB + j] = Operand(min(pr * P_SHIFT, 65504.0));")]),
    ("qshared", "fix", "the query fragments held in registers across the key loop (loaded from workgroup memory for each key tile)",
     Q_SHARED),
    ("pvsplit", "fix", "a P·V product nested in another (two statements)", PV_SPLIT),
    ("ostage", "fix", "the accumulators staged over the scores for their rescale and the output (an array of their own)", O_STAGE),
    ("vcolumns", "fix", "the values loaded row-major as the right operand (staged by dims and loaded column-major, as the GEMM's)", V_COLUMNS),
    ("unwritten", "probe", "each f32 output tile's staging as the accumulator's store left it over 7777s (7777: not written)", UNWRITTEN),
    ("unnormalised", "probe", "each output before its row's sum divides it (the accumulator times the values' scale over P_SHIFT)",
     [(OUTPUT, "= s_sh[mine + i] * unit;")]),
    ("rowsums", "probe", "each row's softmax sum, in every dim of the row",
     [(OUTPUT, "= row_sum[row];")]),
    ("rowmax", "probe", "each row's running maximum at the end, in every dim of the row",
     [(OUTPUT, "= row_max[row];")]),
]


def changed(source, edits, name):
    for old, new in edits:
        if old not in source:
            sys.exit(f"error: flash_variants: variant {name}: the kernel no longer has {old.strip()[:60]!r}")
        source = source.replace(old, new, 1)
    return source


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sources, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    fixes = [edit for _, kind, _, edits in VARIANTS if kind == "fix" for edit in edits]
    listed = VARIANTS + [("all", "fix", "every fix above at once", fixes)]
    for module in ("AttentionFlash8", "AttentionFlash16"):
        base = (sources / f"{module}.wgsl").read_text()
        for name, _, _, edits in listed:
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{module}.wgsl").write_text(changed(base, edits, name))
    for name, kind, tells, _ in listed:
        print(f"{name}\t{kind}\t{tells}")


if __name__ == "__main__":
    main()

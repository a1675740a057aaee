#!/usr/bin/env python3
"""Variants of the matrix tier's flash attention, one folder each, for
FLUX_LITE_KERNEL_DIR: which change makes `selftest` pass where the kernel as
built returns NaN (an NVIDIA H200, 16×16 tiles in subgroups of 32).

    python3 ci/flash_variants.py SOURCES OUT

SOURCES: what `flux-lite gpu --kernel-sources SOURCES` wrote. OUT/<variant>/
gets AttentionFlash8.wgsl and AttentionFlash16.wgsl, each changed in one way
(and `all`, every change at once); the names are printed one a line. Every
variant computes the kernel's answer (each passes the start-up check on
Mesa 26's lavapipe), and the engine refuses a folder whose sources its
launchers could not bind.
"""
import pathlib
import sys

# Each variant: (name, what it rules out, [(text, replacement)]).
ZERO_FILL = """    for (var i = li; i < KB * LDK / 4u; i += WG) { kv_sh[i] = vec4<Operand>(); }
    for (var i = li; i < QB * KB; i += WG) { s_sh[i] = 0.0; p_sh[i] = Operand(0.0); }
    for (var i = li; i < KB; i += WG) { k_scale[i] = 1.0; v_row[i] = 0.0; }
    for (var r = li; r < QB; r += WG) { q_scale[r] = 1.0; row_rescale[r] = 1.0; }
    for (var i = li; i < QB * MAX_SEGS; i += WG) { seg_max[i] = 0.0; seg_sum[i] = 0.0; }
    workgroupBarrier();
"""
ZERO_ANCHOR = "    for (var i = li; i < T * T; i += WG) {\n        zero_sh[i] = 0.0;"
VARIANTS = [
    ("zero", "a read of workgroup memory never written (pipelines skip its zeroing)",
     [(ZERO_ANCHOR, ZERO_FILL + ZERO_ANCHOR)]),
    ("always", "the accumulators reassigned under a branch (rescaled on every key tile)",
     [("if (workgroupUniformLoad(&moved) != 0u) {", "workgroupBarrier();\n        if (true) {")]),
    ("sgli", "the subgroup_id builtin (subgroup taken as local index / subgroup size)",
     [("@builtin(subgroup_id) sg: u32,", "@builtin(subgroup_id) sg_unused: u32,"),
      ("    let h = wid.y;", "    let sg = li / lanes;\n    let h = wid.y;")]),
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
    every = [edit for _, _, edits in VARIANTS for edit in edits]
    for module in ("AttentionFlash8", "AttentionFlash16"):
        base = (sources / f"{module}.wgsl").read_text()
        for name, _, edits in VARIANTS + [("all", "", every)]:
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{module}.wgsl").write_text(changed(base, edits, name))
    for name, rules_out, _ in VARIANTS:
        print(f"{name}\t{rules_out}")
    print("all\tevery change above at once")


if __name__ == "__main__":
    main()

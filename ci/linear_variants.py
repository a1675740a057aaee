#!/usr/bin/env python3
"""Timing variants of the matrix tier's linear (vec4 fetching, f16
operands), one folder each, for FLUX_LITE_KERNEL_DIR: where a k step's time
goes on a GPU. Each variant takes one part of the step away, so its results
are wrong by design: they are for `bench kernels --only linear`, never for
an image. That bench times each shape twice on f16 operands: over f32 x and
bf16 W, converted as staged, and over the f16 operands the engine keeps in
memory, staged as stored; no_rounding changes only the first.

    python3 ci/linear_variants.py SOURCES OUT

SOURCES: what `flux-lite gpu --kernel-sources SOURCES` wrote. OUT/<variant>/
gets LinearMatrix8Vec4.wgsl and LinearMatrix16Vec4.wgsl, each changed as the
variant says; `name<TAB>what it leaves out` is printed one a line.
"""
import pathlib
import re
import sys

MODULES = ("LinearMatrix8Vec4", "LinearMatrix16Vec4")

# put() replaced by a sum of what was fetched into one element: the global
# loads stay (their values are used), the rounding and the stores go (W's
# too: put() no longer calls put_w()). Both operand forms are summed: f32 x
# and bf16 W, converted as staged, and the f16 operands kept in memory,
# staged as stored.
NO_PUT = """fn put(li: u32, half: u32, f: ptr<function, Fetched>) {
    var s = 0.0;
    for (var j = 0u; j < FETCH_A; j++) {
        s += dot((*f).a[j], vec4<f32>(1.0)) + dot(vec4<f32>((*f).a_stored[j]), vec4<f32>(1.0));
    }
    for (var j = 0u; j < FETCH_B; j++) {
        s += f32((*f).w.pairs[j].x ^ (*f).w.pairs[j].w);
        s += dot(vec4<f32>((*f).w.stored[j][0]) + vec4<f32>((*f).w.stored[j][1]), vec4<f32>(1.0));
    }
    put_a(half * BM * LD + li, s);
}
"""


def function(source, name):
    """The text of WGSL function `name`, from `fn name(` to its closing brace."""
    start = source.find(f"fn {name}(")
    if start < 0:
        return None
    end = source.find("\n}\n", start)
    return source[start:end + 3] if end >= 0 else None


def no_mma(source):
    out, n = re.subn(r"\n\s*acc(\d)(\d) = coopMultiplyAdd\(a\1, b\2, acc\1\2\);", "", source)
    return out if n == 16 else None


def no_put(source):
    old = function(source, "put")
    return source.replace(old, NO_PUT, 1) if old else None


def no_fetch(source):
    """x's loads in fetch() and W's in fetch_w() (matrix_fetch_vec4.wgsl),
    over f32 x and bf16 W and over the f16 operands kept in memory alike."""
    fetch, fetch_w = function(source, "fetch"), function(source, "fetch_w")
    if not fetch or not fetch_w or "a_vec4(" not in fetch or "a_quad(" not in fetch or "b_vec8(" not in fetch_w or "b_octet(" not in fetch_w:
        return None
    # One load from each operand's binding a call, outside the loops, so
    # that every binding stays in the module's interface (the pipeline's
    # layout): x's f32 vec4s and f16 quads, W's bf16 octets and f16 ones.
    new_fetch = re.sub(r"a_vec4\([^;]*\);", "vec4<f32>(f32(i)) + keep_a * 0.0;", fetch)
    new_fetch = re.sub(r"a_quad\([^;]*\);", "vec4<Operand>(vec4<f32>(f32(i))) + keep_q * Operand(0.0);", new_fetch)
    new_fetch = new_fetch.replace(
        "    var f: Fetched;\n",
        "    var f: Fetched;\n    let keep_a = x_vec4[p.x_offset / 4u];\n    let keep_q = x_half_quad(p.x_offset / 4u);\n",
        1,
    )
    new_fetch_w = re.sub(r"b_vec8\([^;]*\);", "vec4<u32>(i) | (keep_b & vec4<u32>(0u));", fetch_w)
    new_fetch_w = re.sub(
        r"b_octet\([^;]*\);",
        "array<vec4<Operand>, 2>(vec4<Operand>(vec4<f32>(f32(i))) + keep_o[0] * Operand(0.0), keep_o[1] * Operand(0.0));",
        new_fetch_w,
    )
    new_fetch_w = new_fetch_w.replace(
        "    var f: FetchedW;\n",
        "    var f: FetchedW;\n    let keep_b = w_vec4[p.w_offset / 8u];\n    let keep_o = w_half_octet(p.w_offset / 8u);\n",
        1,
    )
    if "keep_q = " not in new_fetch or "keep_o = " not in new_fetch_w or "a_quad(" in new_fetch or "b_octet(" in new_fetch_w:
        return None
    return source.replace(fetch, new_fetch, 1).replace(fetch_w, new_fetch_w, 1)


def no_rounding(source):
    """A rows not scaled; W's u32s taken as f16 pairs with no scale, as a W
    packed at load (`W_HALF`) is read: what staging costs without rounding."""
    put, put_w = function(source, "put"), function(source, "put_w")
    if not put or not put_w or "(*f).a[j] * row_inverse(r)" not in put or "b_word_operands(q.x, c)" not in put_w:
        return None
    new_put_w = re.sub(r"b_word_operands\(q\.([xyzw]), c\)", r"unpack2x16float(q.\1)", put_w)
    return source.replace(put, put.replace("(*f).a[j] * row_inverse(r)", "(*f).a[j]"), 1).replace(put_w, new_put_w, 1)


VARIANTS = [
    ("base", "nothing (the kernel as built, timed in the same run)", lambda s: s),
    ("no_mma", "the multiply-adds (what is left: fetching, rounding, staging, barriers, the epilogue)", no_mma),
    ("no_put", "rounding and storing each step into workgroup memory (the global loads stay)", no_put),
    ("no_fetch", "the global loads of either operand form (each step stages values made from the invocation index)", no_fetch),
    ("no_rounding", "the range scales' multiplies and the bf16 unpacking of the rows over f32 x and bf16 W (W's words read as f16 pairs, as a W packed at load is; the rows over f16 operands in memory have no conversion to leave out)", no_rounding),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sources, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    for module in MODULES:
        base = (sources / f"{module}.wgsl").read_text()
        for name, _, change in VARIANTS:
            changed = change(base)
            if changed is None:
                sys.exit(f"error: linear_variants: variant {name}: {module} no longer has the code it changes")
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{module}.wgsl").write_text(changed)
    for name, leaves_out, _ in VARIANTS:
        print(f"{name}\t{leaves_out}")


if __name__ == "__main__":
    main()

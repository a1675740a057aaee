#!/usr/bin/env python3
"""What `flux-lite gpu --flash-report DIR` wrote, looked at closely: for
each case, where its outputs are not finite or far from the exact answer,
with each output's place in the kernel's tiles (query row and dim modulo
the tile size, the query's subgroup), so that a fault that follows a tile
position, a row, a dim or the data shows as such.

    python3 ci/flash_analyse.py DIR [--tile 16] [--probe NAME] [--answers DIR2]

--answers DIR2 reads the exact answers from DIR2 (the same cases: the
kernel as built's folder, where ci/gpu-flash.sh keeps them once).

--probe NAME reads DIR as written with ci/flash_variants.py's probe NAME
(its outputs are an intermediate, not the attention): `unnormalised`
(each row's outputs over their answers, where the answers are not near
zero, should be one number: the row's sum), `rowsums` or `rowmax` (one number a row), `unwritten` (outputs of
exactly 7777 are elements an accumulator's store left unwritten).
"""
import argparse
import collections
import math
import pathlib
import struct


def floats(path, fmt, size):
    data = path.read_bytes()
    return list(struct.unpack(f"<{len(data) // size}{fmt}", data))


def cases(folder):
    lines = (folder / "cases.tsv").read_text().splitlines()
    head = lines[0].split("\t")
    for line in lines[1:]:
        row = dict(zip(head, line.split("\t")))
        for key in ("q_len", "kv_len", "q_heads", "kv_heads", "head_dim", "causal", "pieces", "non_finite", "repeats"):
            row[key] = int(row[key])
        yield row


def place(case, i, tile):
    width = case["q_heads"] * case["head_dim"]
    row, head, dim = i // width, i % width // case["head_dim"], i % case["head_dim"]
    return row, head, dim, row % tile, dim % tile


def tally(title, values):
    counts = collections.Counter(values)
    return f"{title}: " + ", ".join(f"{k}×{n}" for k, n in sorted(counts.items()))


def attention(case, got, want, tile):
    bad = [i for i, g in enumerate(got) if not math.isfinite(g)]
    print(f"  not finite: {len(bad)} of {len(got)}")
    if bad:
        places = [place(case, i, tile) for i in bad]
        print("  " + tally("by query row", [p[0] for p in places]))
        print("  " + tally("by head", [p[1] for p in places]))
        print("  " + tally("by dim", [p[2] for p in places]))
        print("  " + tally(f"by (row mod {tile}, dim mod {tile})", [(p[3], p[4]) for p in places]))
        print("  " + tally("by sign of the answer", ["-" if want[i] < 0 else "+" for i in bad]))
        print("  " + tally("by value", [str(got[i]) for i in bad]))
        for i in bad[:12]:
            row, head, dim, _, _ = place(case, i, tile)
            print(f"    output {i}: row {row} head {head} dim {dim}: {got[i]} (want {want[i]:.6g})")
    scale = max((abs(w) for w in want), default=1.0) or 1.0
    far = sorted((abs(g - w) / scale, i) for i, (g, w) in enumerate(zip(got, want)) if math.isfinite(g))[::-1]
    wrong = [i for e, i in far if e > 1e-2]
    print(f"  finite outputs more than 1% of the largest answer away: {len(wrong)}")
    if wrong:
        places = [place(case, i, tile) for i in wrong]
        print("  " + tally("by query row", [p[0] for p in places][:200]))
        for e, i in far[:8]:
            row, head, dim, _, _ = place(case, i, tile)
            print(f"    output {i}: row {row} head {head} dim {dim}: {got[i]:.6g} (want {want[i]:.6g})")


def inputs(case):
    """The case's queries, keys and values as kernels-wgsl/src/probe_flash/cases.rs makes them."""
    def values(count, mul, scale):
        f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
        return [f32(f32(f32(((i * mul + i // 5) % 97) / 48.5) - 1.0) * scale) for i in range(count)]
    kv = case["kv_len"] * case["kv_heads"] * case["head_dim"]
    return values(case["q_len"] * case["q_heads"] * case["head_dim"], 7, 2.0), values(kv, 11, 2.0)


def kernel_softmax_state(case, tile):
    """Each (row, head)'s running maximum and sum at the end as the flash
    kernel keeps them over f32 rows: queries and keys rounded to f16 under
    their rows' range scales, keys in tiles of 2T, a workgroup's keys up to
    its last query (causal), the maximum raised only past 8 (LAZY)."""
    q, k = inputs(case)
    d, qh, kh = case["head_dim"], case["q_heads"], case["kv_heads"]
    half = lambda x: struct.unpack("<e", struct.pack("<e", x))[0]
    scaled = lambda row: (lambda s: ([half(x / s) for x in row], s))(2.0 ** (math.frexp(max(map(abs, row)) or 1.0)[1] - 14))
    qb, kb = (4 if tile == 16 else 2) * tile, 2 * tile
    keys = {(j, h): scaled(k[(j * kh + h) * d:(j * kh + h + 1) * d]) for j in range(case["kv_len"]) for h in range(kh)}
    state = {}
    for r in range(case["q_len"]):
        for h in range(qh):
            qr, qs = scaled(q[(r * qh + h) * d:(r * qh + h + 1) * d])
            end = min(case["kv_len"], r // qb * qb + qb) if case["causal"] else case["kv_len"]
            m, l = None, 0.0
            for k0 in range(0, end, kb):
                scores = []
                for j in range(k0, min(k0 + kb, case["kv_len"])):
                    if case["causal"] and j > r:
                        continue
                    kr, ks = keys[(j, h // (qh // kh))]
                    scores.append(sum(a * b for a, b in zip(qr, kr)) * qs * ks / math.sqrt(d))
                if not scores:
                    continue
                top = max(scores)
                new = top if m is None or top > m + 8.0 else m
                l = (l * math.exp(m - new) if m is not None else 0.0) + sum(math.exp(x - new) for x in scores)
                m = new
            state[(r, h)] = (m, l)
    return state


def per_row(case, got, want, probe, tile):
    width = case["q_heads"] * case["head_dim"]
    modelled = kernel_softmax_state(case, tile) if not case["pieces"] else None
    if modelled:
        def held(r, h):
            at = r * width + h * case["head_dim"]
            if probe != "unnormalised":
                return got[at]
            # The output before its sum divides it, over the answer: the row's sum.
            dims = range(at, at + case["head_dim"])
            largest = max(abs(want[i]) for i in dims)
            ratios = sorted(got[i] / want[i] for i in dims if want[i] != 0.0 and abs(want[i]) >= 0.1 * largest)
            return ratios[len(ratios) // 2] if ratios else float("nan")
        pick = 0 if probe == "rowmax" else 1
        off = [(abs(held(r, h) - m[pick]) / max(abs(m[pick]), 1e-30), r, h) for (r, h), m in modelled.items()]
        worst = max(off, key=lambda e: (not e[0] <= 1e-2, e[0] if e[0] == e[0] else math.inf))
        print(f"  {probe} against the kernel's arithmetic modelled here: {sum(1 for e in off if not e[0] <= 1e-2)} of {len(off)} "
              f"(row, head) more than 1% off (not finite counted off); the farthest {worst[0]:.2e} at row {worst[1]} head {worst[2]}")
    print(f"  {probe}: one number a row and head expected")
    for row in range(case["q_len"]):
        for head in range(case["q_heads"]):
            dims = range(row * width + head * case["head_dim"], row * width + (head + 1) * case["head_dim"])
            if probe == "unnormalised":
                # Over the row's larger answers: near zero, rounding swamps the ratio.
                largest = max(abs(want[i]) for i in dims)
                ratios = [got[i] / want[i] for i in dims if abs(want[i]) >= 0.1 * largest and want[i] != 0.0]
                finite = [r for r in ratios if math.isfinite(r)]
                spread = (max(finite) - min(finite)) / abs(min(finite)) if finite and min(finite) != 0 else float("nan")
                note = "" if len(finite) == len(ratios) and spread < 2e-2 else "  <-"
                if note or row % 16 == 15:
                    print(f"    row {row} head {head}: output over answer {min(finite, default=float('nan')):.6g} … {max(finite, default=float('nan')):.6g} ({len(ratios) - len(finite)} not finite){note}")
            else:
                seen = sorted({got[i] for i in dims}, key=lambda v: (math.isnan(v), v))
                note = "" if len(seen) == 1 and math.isfinite(seen[0]) else "  <-"
                if note or row % 16 == 15:
                    print(f"    row {row} head {head}: {seen[:4]}{note}")


def unwritten(case, got, tile):
    missed = [i for i, g in enumerate(got) if g == 7777.0]
    print(f"  unwritten: {len(missed)} of {len(got)} outputs are the 7777 the store should have covered")
    if missed:
        places = [place(case, i, tile) for i in missed]
        print("  " + tally(f"by (row mod {tile}, dim mod {tile})", [(p[3], p[4]) for p in places]))
        print("  " + tally("by query row", [p[0] for p in places]))
    bad = [i for i, g in enumerate(got) if not math.isfinite(g)]
    print(f"  not finite: {len(bad)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--tile", type=int, default=16)
    parser.add_argument("--answers", type=pathlib.Path)
    parser.add_argument("--probe", choices=["unnormalised", "rowsums", "rowmax", "unwritten"])
    args = parser.parse_args()
    for case in cases(args.folder):
        got = floats(args.folder / f"{case['name']}.got.f32", "f", 4)
        want = floats((args.answers or args.folder) / f"{case['name']}.want.f64", "d", 8)
        print(f"{case['name']}: {case['q_len']} queries, {case['kv_len']} keys, {case['q_heads']}/{case['kv_heads']} heads of {case['head_dim']}, "
              f"{'causal' if case['causal'] else 'no mask'}, values to {case['v_scale']}, {'f16 pieces' if case['pieces'] else 'f32 rows'}; "
              f"finite rel L2 {case['finite_rel_l2']}; repeats bit for bit: {'yes' if case['repeats'] else 'no'}")
        if args.probe == "unwritten" and not case["pieces"]:
            unwritten(case, got, args.tile)
        elif args.probe and not case["pieces"]:
            per_row(case, got, want, args.probe, args.tile)
        else:
            attention(case, got, want, args.tile)


if __name__ == "__main__":
    main()

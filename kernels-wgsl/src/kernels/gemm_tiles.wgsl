// The register-tiled core shared by `linear` and `conv2d`: a workgroup of
// 256 invocations computes a TM×TN tile of out[m, n] = Σ_k a[m, k]·b[n, k]
// (TM·TN = 128·128; the prelude sets the shape: 128×128, or 64×256 where m
// is at most 64, a convolution's few output channels, so the tile's rows
// are not spent on zeros). The invocations stand in a TY×TX grid (TY =
// TM/8); each computes 8×8 outputs (rows ty·4 + {0..3} and TM/2 + ty·4 +
// {0..3}, the same for columns with tx and TN/2), so every four vec4 reads
// of workgroup memory feed 64 FMAs. The a and b tiles (TM and TN rows × 8
// of k, stored k-major as vec4s of four rows) are double-buffered: the next
// tile's global loads are issued before the current tile's arithmetic and
// stored after it, with one barrier per step of k. Each load brings 4
// consecutive k of one row of a or of b through the module's `load_a(row,
// k)` and `load_b(col, k)`, which return zeros past the matrix. The sum runs
// over k in order, one FMA per term, whatever the shape.
//
// Two tiers share this file, told apart by the prelude ahead of it: the f32
// tier (`HALF` false, `Stage` = f32) and the f16 tier (`HALF` true, `Stage`
// = f16), which stages the tiles as f16 under range_rule.wgsl's rule (each
// row of a and of b scaled by its power of two, measured over all k before
// the first step) and widens them back to f32 for the FMAs, so the sum is
// f32 either way. The f32 tier skips the rule entirely: its arithmetic is
// the same instruction for instruction.

const TK: u32 = 8u;
// The invocation grid (TY·TX = 256) and the vec4s per k row of each tile.
const TY: u32 = TM / 8u;
const TX: u32 = TN / 8u;
const VA: u32 = TM / 4u;
const VB: u32 = TN / 4u;
// Loads of 4 k per step: 2·TM for a, 2·TN for b, shared by 256 invocations.
const LOADS_A: u32 = (2u * TM + 255u) / 256u;
const LOADS_B: u32 = (2u * TN + 255u) / 256u;

// [buffer][kk · VA + rows / 4]
var<workgroup> a_tile: array<array<vec4<Stage>, 2u * TM>, 2>;
var<workgroup> b_tile: array<array<vec4<Stage>, 2u * TN>, 2>;
// The f16 tier's power-of-two scales of the tile's rows of a and of b.
var<workgroup> a_scale: array<f32, TM>;
var<workgroup> b_scale: array<f32, TN>;

// A run of 4 values on its way into a tile: as it is on the f32 tier,
// divided by its row's scale and rounded to f16 on the f16 tier.
fn staged(v: vec4<f32>, scale: f32) -> vec4<Stage> {
    if (HALF) {
        return vec4<Stage>(v / scale);
    }
    return vec4<Stage>(v);
}

// The f16 tier's scales: rows e = tid, tid + 256, … of the TM rows of a
// then the TN rows of b, each measured over all k.
fn measure_ranges(tid: u32, row0: u32, col0: u32, k: u32) {
    for (var e = tid; e < TM + TN; e += 256u) {
        var largest = 0.0;
        for (var gk = 0u; gk < k; gk += 4u) {
            var v: vec4<f32>;
            if (e < TM) {
                v = abs(load_a(row0 + e, gk));
            } else {
                v = abs(load_b(col0 + e - TM, gk));
            }
            largest = max(largest, max(max(v.x, v.y), max(v.z, v.w)));
        }
        if (e < TM) {
            a_scale[e] = range_scale(largest);
        } else {
            b_scale[e - TM] = range_scale(largest);
        }
    }
}

// Writes a loaded run of 4 k values of tile row `r` into buffer `buf`, k-major.
fn store_a(buf: u32, r: u32, kq: u32, v: vec4<f32>) {
    let s = staged(v, a_scale[r]);
    for (var i = 0u; i < 4u; i++) {
        a_tile[buf][(kq * 4u + i) * VA + r / 4u][r % 4u] = s[i];
    }
}

fn store_b(buf: u32, r: u32, kq: u32, v: vec4<f32>) {
    let s = staged(v, b_scale[r]);
    for (var i = 0u; i < 4u; i++) {
        b_tile[buf][(kq * 4u + i) * VB + r / 4u][r % 4u] = s[i];
    }
}

// This invocation's place in the TY×TX grid: (row group, column group).
fn tile_place(lid: vec3<u32>) -> vec2<u32> {
    let tid = lid.y * 16u + lid.x;
    return vec2<u32>(tid / TX, tid % TX);
}

// The tile at (row0, col0) over k terms: acc[i·2 + h] holds row
// (i / 4)·TM/2 + ty·4 + i % 4, columns h·TN/2 + tx·4 + {0..3}.
fn gemm_tile(lid: vec3<u32>, row0: u32, col0: u32, k: u32) -> array<vec4<f32>, 16> {
    let tid = lid.y * 16u + lid.x;
    let place = tile_place(lid);
    let ty = place.x;
    let tx = place.y;
    // This invocation's shares of each step's loads: load e = tid + 256·l
    // brings tile row e / 2, k run e % 2 (a's while e < 2·TM, b's while e < 2·TN).
    var acc: array<vec4<f32>, 16>;
    if (HALF) {
        measure_ranges(tid, row0, col0, k);
        workgroupBarrier();
    }
    let steps = (k + TK - 1u) / TK;
    for (var l = 0u; l < LOADS_A; l++) {
        let e = tid + 256u * l;
        if (e < 2u * TM) {
            store_a(0u, e / 2u, e % 2u, load_a(row0 + e / 2u, (e % 2u) * 4u));
        }
    }
    for (var l = 0u; l < LOADS_B; l++) {
        let e = tid + 256u * l;
        if (e < 2u * TN) {
            store_b(0u, e / 2u, e % 2u, load_b(col0 + e / 2u, (e % 2u) * 4u));
        }
    }
    workgroupBarrier();
    for (var s = 0u; s < steps; s++) {
        let cur = s % 2u;
        let more = s + 1u < steps;
        var next_a: array<vec4<f32>, LOADS_A>;
        var next_b: array<vec4<f32>, LOADS_B>;
        if (more) {
            for (var l = 0u; l < LOADS_A; l++) {
                let e = tid + 256u * l;
                if (e < 2u * TM) {
                    next_a[l] = load_a(row0 + e / 2u, (s + 1u) * TK + (e % 2u) * 4u);
                }
            }
            for (var l = 0u; l < LOADS_B; l++) {
                let e = tid + 256u * l;
                if (e < 2u * TN) {
                    next_b[l] = load_b(col0 + e / 2u, (s + 1u) * TK + (e % 2u) * 4u);
                }
            }
        }
        for (var kk = 0u; kk < TK; kk++) {
            let a0 = vec4<f32>(a_tile[cur][kk * VA + ty]);
            let a1 = vec4<f32>(a_tile[cur][kk * VA + TY + ty]);
            let b0 = vec4<f32>(b_tile[cur][kk * VB + tx]);
            let b1 = vec4<f32>(b_tile[cur][kk * VB + TX + tx]);
            for (var i = 0u; i < 4u; i++) {
                acc[i * 2u] = fma(vec4<f32>(a0[i]), b0, acc[i * 2u]);
                acc[i * 2u + 1u] = fma(vec4<f32>(a0[i]), b1, acc[i * 2u + 1u]);
                acc[8u + i * 2u] = fma(vec4<f32>(a1[i]), b0, acc[8u + i * 2u]);
                acc[8u + i * 2u + 1u] = fma(vec4<f32>(a1[i]), b1, acc[8u + i * 2u + 1u]);
            }
        }
        if (more) {
            for (var l = 0u; l < LOADS_A; l++) {
                let e = tid + 256u * l;
                if (e < 2u * TM) {
                    store_a(1u - cur, e / 2u, e % 2u, next_a[l]);
                }
            }
            for (var l = 0u; l < LOADS_B; l++) {
                let e = tid + 256u * l;
                if (e < 2u * TN) {
                    store_b(1u - cur, e / 2u, e % 2u, next_b[l]);
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

// Output `acc[i·2 + h][j]` of invocation `lid`, scaled back on the f16 tier.
fn tile_value(acc: array<vec4<f32>, 16>, lid: vec3<u32>, i: u32, h: u32, j: u32) -> f32 {
    let value = acc[i * 2u + h][j];
    if (HALF) {
        return value * a_scale[tile_row(lid, 0u, i)] * b_scale[tile_col(lid, 0u, h, j)];
    }
    return value;
}

// Row and column of output `acc[i·2 + h][j]` of invocation `lid` in the tile at (row0, col0).
fn tile_row(lid: vec3<u32>, row0: u32, i: u32) -> u32 {
    return row0 + (i / 4u) * (TM / 2u) + tile_place(lid).x * 4u + i % 4u;
}

fn tile_col(lid: vec3<u32>, col0: u32, h: u32, j: u32) -> u32 {
    return col0 + h * (TN / 2u) + tile_place(lid).y * 4u + j;
}

// Four bf16 (two whole u32 words, `paired`) or f32 weights from element
// `base` on; the first `count` (≤ 4) are real, the rest zero.
fn weight_run(base: u32, count: u32, paired: bool) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (WEIGHT_BF16 && paired && count == 4u) {
        let lo = w[base >> 1u];
        let hi = w[(base >> 1u) + 1u];
        v = vec4<f32>(bf16_at(lo, 0u), bf16_at(lo, 1u), bf16_at(hi, 0u), bf16_at(hi, 1u));
    } else {
        for (var i = 0u; i < count; i++) {
            v[i] = weight_value(w[weight_word(base + i, WEIGHT_BF16)], base + i, WEIGHT_BF16);
        }
    }
    return v;
}

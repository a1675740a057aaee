// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]); W and b bf16 (two per u32) or f32.
// Offsets and strides let one call read or write a window of a larger tensor.
//
// Register-tiled: a 16×16 workgroup computes a 128×128 output tile, each
// invocation 8×8 outputs (rows ty·4 + {0..3} and 64 + ty·4 + {0..3}, the
// same for columns with tx), so every four vec4 reads of workgroup memory
// feed 64 FMAs. The x and W tiles (128 rows × 8 of k each, stored k-major
// as vec4s of four rows) are double-buffered: the next tile's global loads
// are issued before the current tile's arithmetic and stored after it, with
// one barrier per step of k. Each invocation loads 4 consecutive k of one row
// of x and of W; bf16 weights come as two u32 words when the host says the
// window's rows start on even elements (W_PAIRED).

override WEIGHT_BF16: bool = true;
override HAS_BIAS: bool = false;
// Set when w_offset and k are both even: every 4-element run starting at an
// even k is two whole u32 words.
override W_PAIRED: bool = false;

struct Params {
    m: u32, n: u32, k: u32,
    x_offset: u32, x_stride: u32,
    w_offset: u32, b_offset: u32,
    y_offset: u32, y_stride: u32,
    _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const TM: u32 = 128u;
const TN: u32 = 128u;
const TK: u32 = 8u;
// vec4s per k row of a tile.
const V: u32 = 32u;

// [buffer][kk][rows / 4]
var<workgroup> x_tile: array<array<vec4<f32>, 256>, 2>;
var<workgroup> w_tile: array<array<vec4<f32>, 256>, 2>;

fn weight(i: u32) -> f32 {
    return weight_value(w[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

// x[row, gk .. gk + 4), zero past the matrix.
fn load_x(row: u32, gk: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (row < p.m) {
        let base = p.x_offset + row * p.x_stride + gk;
        for (var i = 0u; i < 4u; i++) {
            if (gk + i < p.k) {
                v[i] = x[base + i];
            }
        }
    }
    return v;
}

// W[col, gk .. gk + 4), zero past the matrix.
fn load_w(col: u32, gk: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (col < p.n) {
        let base = p.w_offset + col * p.k + gk;
        if (WEIGHT_BF16 && W_PAIRED && gk + 4u <= p.k) {
            let lo = w[base >> 1u];
            let hi = w[(base >> 1u) + 1u];
            v = vec4<f32>(bf16_at(lo, 0u), bf16_at(lo, 1u), bf16_at(hi, 0u), bf16_at(hi, 1u));
        } else {
            for (var i = 0u; i < 4u; i++) {
                if (gk + i < p.k) {
                    v[i] = weight(base + i);
                }
            }
        }
    }
    return v;
}

// Writes a loaded run of 4 k values of tile row `r` into buffer `buf`, k-major.
fn store_x(buf: u32, r: u32, kq: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        x_tile[buf][(kq * 4u + i) * V + r / 4u][r % 4u] = v[i];
    }
}

fn store_w(buf: u32, r: u32, kq: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        w_tile[buf][(kq * 4u + i) * V + r / 4u][r % 4u] = v[i];
    }
}

@compute @workgroup_size(16, 16)
fn linear(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let tid = lid.y * 16u + lid.x;
    // This invocation's share of each tile load: tile row lr, k run kq.
    let lr = tid / 2u;
    let kq = tid % 2u;
    var acc: array<vec4<f32>, 16>; // [row 0..8][column half 0..2]
    let steps = (p.k + TK - 1u) / TK;

    store_x(0u, lr, kq, load_x(row0 + lr, kq * 4u));
    store_w(0u, lr, kq, load_w(col0 + lr, kq * 4u));
    workgroupBarrier();
    for (var s = 0u; s < steps; s++) {
        let cur = s % 2u;
        let more = s + 1u < steps;
        var next_x = vec4<f32>(0.0);
        var next_w = vec4<f32>(0.0);
        if (more) {
            let gk = (s + 1u) * TK + kq * 4u;
            next_x = load_x(row0 + lr, gk);
            next_w = load_w(col0 + lr, gk);
        }
        for (var kk = 0u; kk < TK; kk++) {
            let a0 = x_tile[cur][kk * V + lid.y];
            let a1 = x_tile[cur][kk * V + 16u + lid.y];
            let b0 = w_tile[cur][kk * V + lid.x];
            let b1 = w_tile[cur][kk * V + 16u + lid.x];
            for (var i = 0u; i < 4u; i++) {
                acc[i * 2u] = fma(vec4<f32>(a0[i]), b0, acc[i * 2u]);
                acc[i * 2u + 1u] = fma(vec4<f32>(a0[i]), b1, acc[i * 2u + 1u]);
                acc[8u + i * 2u] = fma(vec4<f32>(a1[i]), b0, acc[8u + i * 2u]);
                acc[8u + i * 2u + 1u] = fma(vec4<f32>(a1[i]), b1, acc[8u + i * 2u + 1u]);
            }
        }
        if (more) {
            store_x(1u - cur, lr, kq, next_x);
            store_w(1u - cur, lr, kq, next_w);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 8u; i++) {
        let r = row0 + (i / 4u) * 64u + lid.y * 4u + i % 4u;
        if (r >= p.m) {
            continue;
        }
        for (var h = 0u; h < 2u; h++) {
            let v = acc[i * 2u + h];
            for (var j = 0u; j < 4u; j++) {
                let c = col0 + h * 64u + lid.x * 4u + j;
                if (c < p.n) {
                    var out = v[j];
                    if (HAS_BIAS) {
                        out += bias(p.b_offset + c);
                    }
                    y[p.y_offset + r * p.y_stride + c] = out;
                }
            }
        }
    }
}

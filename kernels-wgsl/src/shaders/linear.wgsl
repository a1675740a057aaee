// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]); W and b bf16 (two per u32) or f32.
// Register-tiled: a 16×16 workgroup computes a 64×64 output tile, each
// invocation 4×4 outputs, with x and W tiles staged in workgroup memory.
// Offsets and strides let one call read or write a window of a larger tensor.

override WEIGHT_BF16: bool = true;
override HAS_BIAS: bool = false;

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

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> x_tile: array<f32, 1024>; // [TK][TM]
var<workgroup> w_tile: array<f32, 1024>; // [TK][TN]

fn weight(i: u32) -> f32 {
    return weight_value(w[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

@compute @workgroup_size(16, 16)
fn linear(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let tid = lid.y * 16u + lid.x;
    var acc: array<array<f32, 4>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        for (var i = 0u; i < 4u; i++) {
            let e = tid + i * 256u;
            let r = e / TK;
            let kk = e % TK;
            let gk = k0 + kk;
            var xv = 0.0;
            if (row0 + r < p.m && gk < p.k) {
                xv = x[p.x_offset + (row0 + r) * p.x_stride + gk];
            }
            x_tile[kk * TM + r] = xv;
            var wv = 0.0;
            if (col0 + r < p.n && gk < p.k) {
                wv = weight(p.w_offset + (col0 + r) * p.k + gk);
            }
            w_tile[kk * TN + r] = wv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var a: array<f32, 4>;
            var bb: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = x_tile[kk * TM + lid.y + 16u * i];
                bb[i] = w_tile[kk * TN + lid.x + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(a[i], bb[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + lid.x + 16u * j;
            if (r < p.m && c < p.n) {
                var v = acc[i][j];
                if (HAS_BIAS) {
                    v += bias(p.b_offset + c);
                }
                y[p.y_offset + r * p.y_stride + c] = v;
            }
        }
    }
}

// y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n]) on cooperative-matrix units: the
// matrix tier's linear. One workgroup is one subgroup (WG invocations) and
// owns one T×T output tile; T is the adapter's tile size, defined with the
// MatA/MatB/MatC aliases ahead of this file. Each step of k stages a T×T
// tile of x (row-major, rows m) and of Wᵀ (row-major, rows k) in workgroup
// memory as f16, zero past the matrix, and multiplies them into an f32
// accumulator. Operands are rounded to f16 as they are staged.
//
// Range rule: f16 holds magnitudes up to 65504 and normal values down to
// 6.1e-5; FLUX activations and bf16 weights can fall outside both. Each of
// the tile's rows of x and columns of Wᵀ is scaled by a power of two that
// brings its largest magnitude (over all k) into [2¹³, 2¹⁴) before the
// rounding, and the product is scaled back in f32: powers of two change no
// significant bit, values never overflow f16, and small rows keep f16's
// full precision instead of going subnormal. Only values below 2⁻³⁸ of
// their row's largest flush to zero.

override WEIGHT_BF16: bool = true;
override HAS_BIAS: bool = false;
// The subgroup size: one subgroup owns a tile, so a workgroup is one subgroup.
override WG: u32 = 8u;

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

var<workgroup> a_tile: array<f16, T * T>;
var<workgroup> b_tile: array<f16, T * T>;
var<workgroup> c_tile: array<f32, T * T>;
// The power-of-two scales of the tile's rows of x and columns of Wᵀ.
var<workgroup> row_scale: array<f32, T>;
var<workgroup> col_scale: array<f32, T>;

fn bias(i: u32) -> f32 {
    return weight_value(b[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

// x[m0 + r, k0 + c] and W[n0 + c, k0 + r], zero past the matrix.
fn x_at(r: u32, c: u32, m0: u32, k0: u32) -> f32 {
    if (m0 + r < p.m && k0 + c < p.k) {
        return x[p.x_offset + (m0 + r) * p.x_stride + k0 + c];
    }
    return 0.0;
}

fn wt_at(r: u32, c: u32, n0: u32, k0: u32) -> f32 {
    if (k0 + r < p.k && n0 + c < p.n) {
        let e = p.w_offset + (n0 + c) * p.k + k0 + r;
        return weight_value(w[weight_word(e, WEIGHT_BF16)], e, WEIGHT_BF16);
    }
    return 0.0;
}

// The power of two that brings `largest` into [2¹³, 2¹⁴) (1 for zero).
fn range_scale(largest: f32) -> f32 {
    if (largest == 0.0) {
        return 1.0;
    }
    return ldexp(1.0, frexp(largest).exp - 14);
}

@compute @workgroup_size(WG)
fn linear_matrix(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let tiles_n = (p.n + T - 1u) / T;
    let tile = flat_workgroup(wid, nwg);
    let m0 = (tile / tiles_n) * T;
    let n0 = (tile % tiles_n) * T;
    // Workgroups past the last tile (a wrapped grid's excess) run on zeros
    // and store nothing: cooperative operations need uniform control flow,
    // which an early return would break.
    for (var i = li; i < T * T; i += WG) {
        c_tile[i] = 0.0;
    }
    // Each invocation measures whole rows of x and columns of Wᵀ over k.
    for (var r = li; r < T; r += WG) {
        var xs = 0.0;
        var ws = 0.0;
        for (var k0 = 0u; k0 < p.k; k0++) {
            xs = max(xs, abs(x_at(r, 0u, m0, k0)));
            ws = max(ws, abs(wt_at(0u, r, n0, k0)));
        }
        row_scale[r] = range_scale(xs);
        col_scale[r] = range_scale(ws);
    }
    workgroupBarrier();
    var acc = coopLoadT<MatC>(&c_tile[0], T);
    for (var k0 = 0u; k0 < p.k; k0 += T) {
        for (var i = li; i < T * T; i += WG) {
            let r = i / T;
            let c = i % T;
            a_tile[i] = f16(x_at(r, c, m0, k0) / row_scale[r]);
            b_tile[i] = f16(wt_at(r, c, n0, k0) / col_scale[c]);
        }
        workgroupBarrier();
        let a = coopLoadT<MatA>(&a_tile[0], T);
        let bm = coopLoadT<MatB>(&b_tile[0], T);
        acc = coopMultiplyAdd(a, bm, acc);
        workgroupBarrier();
    }
    coopStoreT(acc, &c_tile[0], T);
    workgroupBarrier();
    for (var i = li; i < T * T; i += WG) {
        let r = i / T;
        let c = i % T;
        if (m0 + r < p.m && n0 + c < p.n) {
            var out = c_tile[i] * row_scale[r] * col_scale[c];
            if (HAS_BIAS) {
                out += bias(p.b_offset + n0 + c);
            }
            y[p.y_offset + (m0 + r) * p.y_stride + n0 + c] = out;
        }
    }
}

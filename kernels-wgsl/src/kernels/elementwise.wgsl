// Elementwise ops over [rows, cols] views: each operand has its own offset
// and row stride, so column slices of wider tensors (the fused projections,
// concatenation and split along features) need no copies.

struct Params {
    rows: u32, cols: u32,
    a_offset: u32, a_stride: u32,
    b_offset: u32, b_stride: u32,
    dst_offset: u32, dst_stride: u32,
    scalar: f32, gate_offset: u32,
    shift: f32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

struct Cell {
    ok: bool,
    a: u32,
    b: u32,
    dst: u32,
    col: u32,
}

fn cell(gid: vec3<u32>, nwg: vec3<u32>) -> Cell {
    let flat = gid.x + gid.y * nwg.x * 64u;
    let r = flat / max(p.cols, 1u);
    let c = flat % max(p.cols, 1u);
    return Cell(flat < p.rows * p.cols,
                p.a_offset + r * p.a_stride + c,
                p.b_offset + r * p.b_stride + c,
                p.dst_offset + r * p.dst_stride + c,
                c);
}

@compute @workgroup_size(64)
fn silu_op(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = silu(a[e.a]); }
}

// silu(a)·b: the SwiGLU gate (a = gate half, b = up half).
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = silu(a[e.a]) * b[e.b]; }
}

// dst += gate ⊙ a, the gate a cols-wide vector in b at gate_offset (broadcast over rows).
@compute @workgroup_size(64)
fn gated_residual(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = fma(b[p.gate_offset + e.col], a[e.a], dst[e.dst]); }
}

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = a[e.a] + b[e.b]; }
}

// add, then relu's max: the same values as the two passes.
@compute @workgroup_size(64)
fn add_relu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = max(a[e.a] + b[e.b], 0.0); }
}

@compute @workgroup_size(64)
fn add_inplace(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] += a[e.a]; }
}

@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = a[e.a] * p.scalar; }
}

@compute @workgroup_size(64)
fn relu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = max(a[e.a], 0.0); }
}

// dst = tanh(a/s)·s: a soft clamp to (−s, s). The argument is held within
// ±15 first, where f32's tanh is already ±1, because some drivers compute
// tanh from exponentials that overflow to inf/inf for large arguments.
@compute @workgroup_size(64)
fn tanh_clamp(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = tanh(clamp(a[e.a] / p.scalar, -15.0, 15.0)) * p.scalar; }
}

// dst = a·s + shift, rounded as torch's `a.mul(s).add(shift)`: the product first.
@compute @workgroup_size(64)
fn scale_shift(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) {
        let scaled = a[e.a] * p.scalar;
        dst[e.dst] = scaled + p.shift;
    }
}

// dst += s·a (the Euler step, with s = σ_next − σ). Rounded like torch's
// `dst + s * a`: the product first, then the sum.
@compute @workgroup_size(64)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) {
        let step = a[e.a] * p.scalar;
        dst[e.dst] = dst[e.dst] + step;
    }
}

// Copy a column window: concatenation and split along features.
@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = cell(gid, nwg);
    if (e.ok) { dst[e.dst] = a[e.a]; }
}

// dst[c, r] = a[r, c]: between [channels, pixels] and [tokens, features].
@compute @workgroup_size(64)
fn transpose(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    if (flat >= p.rows * p.cols) { return; }
    let r = flat / p.cols;
    let c = flat % p.cols;
    dst[p.dst_offset + c * p.dst_stride + r] = a[p.a_offset + r * p.a_stride + c];
}

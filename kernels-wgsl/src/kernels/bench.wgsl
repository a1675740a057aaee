// The adapter's own ceilings, measured beside the kernels they bound.
//
// `fma_peak`: every invocation runs eight independent chains of vec4 FMAs
// (enough to hide the FMA latency of any current GPU), seeded from its index
// so no compiler can fold them, and writes one sum so none is dead code.
// FLOPs = invocations · iterations · 4 repeats · 8 chains · 4 lanes · 2.
//
// `copy_peak`: a vec4 copy between two storage buffers, the most bytes per
// second a kernel of ours can read and write.

@group(0) @binding(2) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn fma_peak(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 256u + li;
    let s = f32(i & 1023u) * 1e-3;
    var a0 = vec4<f32>(s, s + 0.01, s + 0.02, s + 0.03);
    var a1 = a0 + 0.1;
    var a2 = a0 + 0.2;
    var a3 = a0 + 0.3;
    var a4 = a0 + 0.4;
    var a5 = a0 + 0.5;
    var a6 = a0 + 0.6;
    var a7 = a0 + 0.7;
    // |m| < 1 and c small: the chains settle near c/(1 − m), never overflow.
    let m = vec4<f32>(0.999, 0.998, 0.997, 0.996);
    let c = vec4<f32>(1e-3);
    // Unrolled by hand: wgpu may bound every loop with a counter (runtime
    // checks), a cost paid per iteration, so each iteration carries 32 FMAs.
    for (var it = 0u; it < p.iterations; it++) {
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    }
    let t = (a0 + a1) + (a2 + a3) + (a4 + a5) + (a6 + a7);
    if (i < p.count) {
        sink[i] = t.x + t.y + t.z + t.w;
    }
}

@compute @workgroup_size(256)
fn copy_peak(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_workgroup(wid, nwg) * 256u + li;
    if (i < p.count) {
        dst[i] = src[i];
    }
}

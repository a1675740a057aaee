// The matrix units' ceiling, beside `fma_peak`: every workgroup (one
// subgroup, WG invocations) multiplies one T×T operand tile (f16, or f32 where offered) by another into
// four independent f32 accumulators, `iterations` times each (so the units'
// latency is hidden), then stores the four sums so none is dead code.
// FLOPs = workgroups · iterations · 4 chains · 2·T³. A holds (i mod 7)/8 at
// row-major index i, and B is the same array read as B: every product is
// exact in f32, so the result is known (see the test).

override WG: u32 = 8u;

var<workgroup> ab_tile: array<Operand, T * T>;
var<workgroup> c_tile: array<f32, T * T>;

@compute @workgroup_size(WG)
fn matrix_peak(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = li; i < T * T; i += WG) {
        ab_tile[i] = Operand(f32(i % 7u) * 0.125);
        c_tile[i] = 0.0;
    }
    workgroupBarrier();
    let a = coopLoadT<MatA>(&ab_tile[0], T);
    let b = coopLoadT<MatB>(&ab_tile[0], T);
    var c0 = coopLoadT<MatC>(&c_tile[0], T);
    var c1 = c0;
    var c2 = c0;
    var c3 = c0;
    for (var it = 0u; it < p.iterations; it++) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    // Element li of each accumulator, summed: all four chains stay live.
    var total = 0.0;
    coopStoreT(c0, &c_tile[0], T);
    workgroupBarrier();
    total += c_tile[li % (T * T)];
    workgroupBarrier();
    coopStoreT(c1, &c_tile[0], T);
    workgroupBarrier();
    total += c_tile[li % (T * T)];
    workgroupBarrier();
    coopStoreT(c2, &c_tile[0], T);
    workgroupBarrier();
    total += c_tile[li % (T * T)];
    workgroupBarrier();
    coopStoreT(c3, &c_tile[0], T);
    workgroupBarrier();
    total += c_tile[li % (T * T)];
    let slot = flat_workgroup(wid, nwg) * WG + li;
    if (slot < p.count) {
        sink[slot] = total;
    }
}

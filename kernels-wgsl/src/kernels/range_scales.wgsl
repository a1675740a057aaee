// The range rule's scales of a product's operand, measured once per product
// before its tiles run (matrix_gemm.wgsl reads them): for each of `rows`
// rows of k values, the power of two range_rule.wgsl's `range_scale` gives
// its largest magnitude. The source is f32 (activations) or bf16 (weights,
// two per u32), as SOURCE_BF16 says. One workgroup measures one row.

override SOURCE_BF16: bool = false;

// Value t of row r is src[src_offset + r·src_stride + t·t_stride]: rows of a
// matrix (t_stride 1), or its columns (src_stride 1, t_stride its row stride).
struct Params {
    rows: u32, k: u32,
    src_offset: u32, src_stride: u32,
    dst_offset: u32, t_stride: u32,
    _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

const SCALES_WG: u32 = 64u;
var<workgroup> largest: array<f32, SCALES_WG>;

@compute @workgroup_size(SCALES_WG)
fn range_scales(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    var m = 0.0;
    if (row < p.rows) {
        let start = p.src_offset + row * p.src_stride;
        for (var t = li; t < p.k; t += SCALES_WG) {
            let e = start + t * p.t_stride;
            m = max(m, abs(weight_value(src[weight_word(e, SOURCE_BF16)], e, SOURCE_BF16)));
        }
    }
    largest[li] = m;
    workgroupBarrier();
    for (var half = SCALES_WG / 2u; half > 0u; half /= 2u) {
        if (li < half) {
            largest[li] = max(largest[li], largest[li + half]);
        }
        workgroupBarrier();
    }
    if (li == 0u && row < p.rows) {
        dst[p.dst_offset + row] = range_scale(largest[0]);
    }
}

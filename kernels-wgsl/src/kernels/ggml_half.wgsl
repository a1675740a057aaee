// GGML rows expanded straight into the matrix tier's f16 operand (after
// ggml.wgsl): each row of p.row_elements values divided by its range scale
// (range_rule.wgsl's, of the row's largest magnitude, as range_scales.wgsl
// measures a row of the f32 expansion) and rounded to f16, two a word, the
// scale beside it: what a product's staging makes of the f32 expansion
// every tile, written once. One workgroup a row: its invocations expand
// the row's runs once for the largest magnitude, then again for the words
// (the blocks are read twice, the row never stored as f32).

@group(0) @binding(3) var<storage, read_write> words: array<u32>;
@group(0) @binding(4) var<storage, read_write> scales: array<f32>;

const HALF_WG: u32 = 64u;
var<workgroup> row_largest: array<f32, HALF_WG>;

@compute @workgroup_size(HALF_WG)
fn ggml_expand_half(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_workgroup(wid, nwg);
    let runs_a_row = p.row_elements / 32u;
    let rows = p.runs / runs_a_row;
    var largest = 0.0;
    if (row < rows) {
        for (var r = li; r < runs_a_row; r += HALF_WG) {
            let v = run_values(row * runs_a_row + r);
            for (var l = 0u; l < 32u; l++) {
                largest = max(largest, abs(v[l]));
            }
        }
    }
    row_largest[li] = largest;
    workgroupBarrier();
    if (row >= rows) {
        return;
    }
    var m = 0.0;
    for (var i = 0u; i < HALF_WG; i++) {
        m = max(m, row_largest[i]);
    }
    let scale = range_scale(m);
    let inverse = 1.0 / scale;
    for (var r = li; r < runs_a_row; r += HALF_WG) {
        let v = run_values(row * runs_a_row + r);
        let w0 = p.out_shift + (row * p.row_elements + r * 32u) / 2u;
        for (var l = 0u; l < 16u; l++) {
            words[w0 + l] = pack2x16float(vec2<f32>(v[2u * l] * inverse, v[2u * l + 1u] * inverse));
        }
    }
    if (li == 0u) {
        scales[p.scales_shift + row] = scale;
    }
}

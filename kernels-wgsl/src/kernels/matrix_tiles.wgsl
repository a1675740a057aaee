// The cooperative-matrix core shared by the matrix tier's linear and conv2d
// (as gemm_tiles.wgsl is for the f32 tier): one workgroup, which is one
// subgroup of WG invocations, computes one T×T tile of
// C[row, col] = Σ_t A[row, t]·B[t, col] into `c_tile` (f32, row-major).
// T and the MatA/MatB/MatC aliases come ahead of this file; the module
// provides `a_at(r, t, row0, t0)` = A[row0 + r, t0 + t] and
// `b_at(t, c, col0, t0)` = B[t0 + t, col0 + c], zero past the matrix.
//
// Each step of k stages a T×T tile of A and of B in workgroup memory as
// `Operand` (f16, or f32 where the adapter offers f32 tiles, as Apple GPUs
// do) and multiplies them into an f32 accumulator.
//
// f16 operands are rounded under range_rule.wgsl's rule, per row of A and
// column of B over all of k; f32 operands need no rule, and skip the
// measuring (their scales stay 1).

var<workgroup> a_tile: array<Operand, T * T>;
var<workgroup> b_tile: array<Operand, T * T>;
var<workgroup> c_tile: array<f32, T * T>;
// The power-of-two scales of the tile's rows of A and columns of B.
var<workgroup> row_scale: array<f32, T>;
var<workgroup> col_scale: array<f32, T>;

// C's tile at (row0, col0) over k terms into c_tile. Tiles past the matrix
// run on zeros: cooperative operations need uniform control flow, which an
// early return would break.
fn matrix_tile(li: u32, row0: u32, col0: u32, k: u32) {
    for (var i = li; i < T * T; i += WG) {
        c_tile[i] = 0.0;
    }
    // Each invocation measures whole rows of A and columns of B over k.
    for (var r = li; r < T; r += WG) {
        var a_largest = 0.0;
        var b_largest = 0.0;
        for (var t = 0u; OPERAND_HALF && t < k; t++) {
            a_largest = max(a_largest, abs(a_at(r, 0u, row0, t)));
            b_largest = max(b_largest, abs(b_at(0u, r, col0, t)));
        }
        row_scale[r] = range_scale(a_largest);
        col_scale[r] = range_scale(b_largest);
    }
    workgroupBarrier();
    var acc = coopLoadT<MatC>(&c_tile[0], T);
    for (var t0 = 0u; t0 < k; t0 += T) {
        for (var i = li; i < T * T; i += WG) {
            let r = i / T;
            let c = i % T;
            a_tile[i] = Operand(a_at(r, c, row0, t0) / row_scale[r]);
            b_tile[i] = Operand(b_at(r, c, col0, t0) / col_scale[c]);
        }
        workgroupBarrier();
        let a = coopLoadT<MatA>(&a_tile[0], T);
        let b = coopLoadT<MatB>(&b_tile[0], T);
        acc = coopMultiplyAdd(a, b, acc);
        workgroupBarrier();
    }
    coopStoreT(acc, &c_tile[0], T);
    workgroupBarrier();
    for (var i = li; i < T * T; i += WG) {
        c_tile[i] *= row_scale[i / T] * col_scale[i % T];
    }
    workgroupBarrier();
}

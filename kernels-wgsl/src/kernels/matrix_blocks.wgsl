// The throughput core of the matrix tier's linear: one workgroup, one
// subgroup of WG invocations, computes a block of R·T × R·T outputs of
// C[row, col] = Σ_t A[row, t]·B[t, col] as R×R cooperative-matrix tiles of
// T×T held in R² accumulators for the whole of k, so each T×T fragment of A
// read from workgroup memory serves R products, and each element of A and B
// staged from global memory serves R·T·2 FLOPs per T of k (the one-tile core,
// matrix_tiles.wgsl, staged both operands for every single tile).
//
// k advances KT = 2T at a time: the invocations stage the block's KT
// columns of A (R·T rows, row-major) and of Bᵀ (R·T columns, each a run of
// KT, read by `coopLoad` as column-major B), with consecutive invocations on
// consecutive k, so global reads are coalesced along the rows of x and W.
//
// f16 operands are rounded under range_rule.wgsl's rule, per row of A and
// column of B over all of k, measured before the first step; the sum is f32
// and is scaled back tile by tile on its way out. f32 operands (8×8, Apple
// GPUs) skip the measuring (their scales stay 1).
//
// The module provides `a_at(r, t, row0, t0)` = A[row0 + r, t0 + t],
// `b_at(t, c, col0, t0)` = B[t0 + t, col0 + c] (zero past the matrix), and
// `block_value_out(r, c, value)`, which writes C[r, c] (r, c absolute) if
// inside the matrix. Accumulators are declared once, outside every loop: a
// cooperative-matrix `var` declared inside a loop is zeroed only once.

const R: u32 = 4u;
const KT: u32 = 2u * T;
const BLOCK: u32 = R * T;

var<workgroup> a_tile: array<Operand, BLOCK * KT>;
var<workgroup> b_tile: array<Operand, BLOCK * KT>;
var<workgroup> c_tile: array<f32, T * T>;
// The power-of-two scales of the block's rows of A and columns of B, and
// their inverses (multiplying by the inverse of a power of two is exact).
var<workgroup> row_scale: array<f32, BLOCK>;
var<workgroup> col_scale: array<f32, BLOCK>;
var<workgroup> row_inverse: array<f32, BLOCK>;
var<workgroup> col_inverse: array<f32, BLOCK>;

// The range rule's scales: each invocation measures whole rows of A and
// columns of B over all of k (each walks its own row, so its reads stay in
// the lines it just fetched).
fn measure_block(li: u32, row0: u32, col0: u32, k: u32) {
    for (var r = li; r < BLOCK; r += WG) {
        var a_largest = 0.0;
        var b_largest = 0.0;
        for (var t = 0u; OPERAND_HALF && t < k; t++) {
            a_largest = max(a_largest, abs(a_at(r, 0u, row0, t)));
            b_largest = max(b_largest, abs(b_at(0u, r, col0, t)));
        }
        row_scale[r] = range_scale(a_largest);
        col_scale[r] = range_scale(b_largest);
        row_inverse[r] = 1.0 / row_scale[r];
        col_inverse[r] = 1.0 / col_scale[r];
    }
}

// Stages KT terms from t0 on: A's block rows and B's block columns, each a
// contiguous run of KT in workgroup memory.
fn stage_block(li: u32, row0: u32, col0: u32, t0: u32) {
    for (var i = li; i < BLOCK * KT; i += WG) {
        let r = i / KT;
        let t = i % KT;
        a_tile[i] = Operand(a_at(r, t, row0, t0) * row_inverse[r]);
        b_tile[i] = Operand(b_at(t, r, col0, t0) * col_inverse[r]);
    }
}

// Tile (ti, tj) of the block, as c_tile holds it, scaled back and written out.
fn block_out(li: u32, ti: u32, tj: u32, row0: u32, col0: u32) {
    for (var i = li; i < T * T; i += WG) {
        let r = ti * T + i / T;
        let c = tj * T + i % T;
        block_value_out(row0 + r, col0 + c, c_tile[i] * row_scale[r] * col_scale[c]);
    }
}

// The block at (row0, col0) over k terms, written out through `block_value_out`.
// Blocks past the matrix run on zeros: cooperative operations need uniform
// control flow, which an early return would break.
fn matrix_block(li: u32, row0: u32, col0: u32, k: u32) {
    for (var i = li; i < T * T; i += WG) {
        c_tile[i] = 0.0;
    }
    measure_block(li, row0, col0, k);
    workgroupBarrier();
    var acc00 = coopLoadT<MatC>(&c_tile[0], T);
    var acc01 = coopLoadT<MatC>(&c_tile[0], T);
    var acc02 = coopLoadT<MatC>(&c_tile[0], T);
    var acc03 = coopLoadT<MatC>(&c_tile[0], T);
    var acc10 = coopLoadT<MatC>(&c_tile[0], T);
    var acc11 = coopLoadT<MatC>(&c_tile[0], T);
    var acc12 = coopLoadT<MatC>(&c_tile[0], T);
    var acc13 = coopLoadT<MatC>(&c_tile[0], T);
    var acc20 = coopLoadT<MatC>(&c_tile[0], T);
    var acc21 = coopLoadT<MatC>(&c_tile[0], T);
    var acc22 = coopLoadT<MatC>(&c_tile[0], T);
    var acc23 = coopLoadT<MatC>(&c_tile[0], T);
    var acc30 = coopLoadT<MatC>(&c_tile[0], T);
    var acc31 = coopLoadT<MatC>(&c_tile[0], T);
    var acc32 = coopLoadT<MatC>(&c_tile[0], T);
    var acc33 = coopLoadT<MatC>(&c_tile[0], T);
    for (var t0 = 0u; t0 < k; t0 += KT) {
        stage_block(li, row0, col0, t0);
        workgroupBarrier();
        for (var kk = 0u; kk < KT; kk += T) {
            let a0 = coopLoadT<MatA>(&a_tile[(0u * T) * KT + kk], KT);
            let a1 = coopLoadT<MatA>(&a_tile[(1u * T) * KT + kk], KT);
            let a2 = coopLoadT<MatA>(&a_tile[(2u * T) * KT + kk], KT);
            let a3 = coopLoadT<MatA>(&a_tile[(3u * T) * KT + kk], KT);
            let b0 = coopLoad<MatB>(&b_tile[(0u * T) * KT + kk], KT);
            let b1 = coopLoad<MatB>(&b_tile[(1u * T) * KT + kk], KT);
            let b2 = coopLoad<MatB>(&b_tile[(2u * T) * KT + kk], KT);
            let b3 = coopLoad<MatB>(&b_tile[(3u * T) * KT + kk], KT);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc02 = coopMultiplyAdd(a0, b2, acc02);
            acc03 = coopMultiplyAdd(a0, b3, acc03);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
            acc12 = coopMultiplyAdd(a1, b2, acc12);
            acc13 = coopMultiplyAdd(a1, b3, acc13);
            acc20 = coopMultiplyAdd(a2, b0, acc20);
            acc21 = coopMultiplyAdd(a2, b1, acc21);
            acc22 = coopMultiplyAdd(a2, b2, acc22);
            acc23 = coopMultiplyAdd(a2, b3, acc23);
            acc30 = coopMultiplyAdd(a3, b0, acc30);
            acc31 = coopMultiplyAdd(a3, b1, acc31);
            acc32 = coopMultiplyAdd(a3, b2, acc32);
            acc33 = coopMultiplyAdd(a3, b3, acc33);
        }
        workgroupBarrier();
    }
    coopStoreT(acc00, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 0u, 0u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc01, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 0u, 1u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc02, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 0u, 2u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc03, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 0u, 3u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc10, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 1u, 0u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc11, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 1u, 1u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc12, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 1u, 2u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc13, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 1u, 3u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc20, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 2u, 0u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc21, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 2u, 1u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc22, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 2u, 2u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc23, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 2u, 3u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc30, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 3u, 0u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc31, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 3u, 1u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc32, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 3u, 2u, row0, col0);
    workgroupBarrier();
    coopStoreT(acc33, &c_tile[0], T);
    workgroupBarrier();
    block_out(li, 3u, 3u, row0, col0);
    workgroupBarrier();
}

//! The source of the CPU adapters' linear (`linear_lanes`): `y = x·Wᵀ (+ b)`
//! with each row of x read once a subgroup and broadcast to its lanes.
//!
//! Each invocation owns [`COLS`] output columns (rows of W, which it reads
//! itself: no other lane needs them) over the workgroup's [`ROWS`] rows of
//! x (which every lane needs: the subgroup reads each 32-term run of a row
//! together, lane `l` its terms `4l .. 4l + 3`, and `subgroupBroadcast`
//! hands each vec4 to every lane). A CPU driver (lavapipe) fetches a
//! storage load lane by lane, whatever the address, so a run of 32 terms of
//! a row of x costs one load a lane instead of eight, and each term of W
//! feeds [`ROWS`] products, each term of x [`COLS`]. There is no workgroup
//! memory and no barrier (the tiled kernel's staging costs a CPU lane by
//! lane too).
//!
//! Each vec4 of W is loaded just before its products rather than a whole
//! run at the top of the step, so fewer values live across the step.
//!
//! `subgroupBroadcast` takes a constant lane, so the products of a run are
//! written out here for each subgroup size. Each output's sum runs over k
//! from 0 up, one `fma` a term, the bias and (with ACCUMULATE) y's old value
//! added after it (`linear_out`), as the tiled kernel sums: the same bits.

/// Rows of x a workgroup (and each invocation) takes.
pub const ROWS: u32 = 8;
/// Output columns an invocation owns (64 invocations a workgroup).
pub const COLS: u32 = 4;
/// Columns a workgroup covers.
pub const COLS_PER_GROUP: u32 = 64 * COLS;

use super::lanes::{emit, weight_vec4, LANE_COUNTS, PRODUCT_PRELUDE};

/// The entry's source after the shared parts (`product_io.wgsl`,
/// `linear_io.wgsl`), for subgroups of `lanes` invocations.
pub fn source(lanes: u32) -> String {
    assert!(LANE_COUNTS.contains(&lanes), "no linear_lanes for subgroups of {lanes}");
    let run = 4 * lanes; // terms of k a step
    let mut s = String::new();
    s.push_str(PRODUCT_PRELUDE);
    let ind = "    ";
    emit!(s, "@compute @workgroup_size(64)");
    emit!(s, "fn linear_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {{");
    emit!(s, "{ind}let row0 = wid.x * {ROWS}u;");
    emit!(s, "{ind}let col0 = wid.y * {COLS_PER_GROUP}u + lid.x;");
    // Where each row of x and each owned row of W starts, in vec4s
    // (clamped into the matrix: rows and columns past it compute on the
    // last one and store nothing).
    for r in 0..ROWS {
        emit!(s, "{ind}let xb{r} = (p.x_offset + min(row0 + {r}u, p.m - 1u) * p.x_stride) / 4u;");
    }
    // With SWIGLU W's rows run on to the last output's up row.
    emit!(s, "{ind}let last = (p.w_offset + select(p.n, p.up_row + p.n, SWIGLU) * p.k) / select(4u, 8u, WEIGHT_BF16) - 1u;");
    for c in 0..COLS {
        emit!(s, "{ind}let wb{c} = (p.w_offset + paired_w_row_clamped(col0 + {}u, {COLS_PER_GROUP}u) * p.k) / select(4u, 8u, WEIGHT_BF16);", c * 64);
        for r in 0..ROWS {
            emit!(s, "{ind}var acc{r}_{c} = 0.0;");
        }
    }
    emit!(s, "{ind}let k4 = p.k / 4u;");
    emit!(s, "{ind}for (var k0 = 0u; k0 < p.k; k0 += {run}u) {{");
    let ind = "        ";
    // This lane's vec4 of each row's run (zero past k).
    emit!(s, "{ind}let xi = k0 / 4u + lane;");
    for r in 0..ROWS {
        emit!(s, "{ind}let xl{r} = select(vec4<f32>(0.0), x4[xb{r} + min(xi, k4 - 1u)], xi < k4);");
    }
    // The products, term by term in k's order; each owned column's terms
    // 4t .. 4t + 3 loaded just before they are used (`weight_vec4`).
    for t in 0..lanes {
        for c in 0..COLS {
            weight_vec4(&mut s, ind, c, "k0", t);
        }
        for r in 0..ROWS {
            emit!(s, "{ind}let x{r}_{t} = subgroupBroadcast(xl{r}, {t}u);");
        }
        for r in 0..ROWS {
            for c in 0..COLS {
                let (x, w, a) = (format!("x{r}_{t}"), format!("w{c}_{t}"), format!("acc{r}_{c}"));
                emit!(s, "{ind}{a} = fma({x}.w, {w}.w, fma({x}.z, {w}.z, fma({x}.y, {w}.y, fma({x}.x, {w}.x, {a}))));");
            }
        }
    }
    emit!(s, "    }}");
    let ind = "    ";
    // With SWIGLU the first half of the owned columns are gate rows, the
    // second half the up rows of the same outputs.
    emit!(s, "{ind}if (SWIGLU) {{");
    for r in 0..ROWS {
        for c in 0..COLS / 2 {
            let out = format!("paired_out(col0 + {}u, {COLS_PER_GROUP}u)", c * 64);
            emit!(s, "{ind}    if (row0 + {r}u < p.m && {out} < p.n) {{ swiglu_out(row0 + {r}u, {out}, acc{r}_{c}, acc{r}_{}); }}", c + COLS / 2);
        }
    }
    emit!(s, "{ind}    return;");
    emit!(s, "{ind}}}");
    for r in 0..ROWS {
        for c in 0..COLS {
            emit!(s, "{ind}if (row0 + {r}u < p.m && col0 + {}u < p.n) {{ linear_out(row0 + {r}u, col0 + {}u, acc{r}_{c}); }}", c * 64, c * 64);
        }
    }
    emit!(s, "}}");
    s
}

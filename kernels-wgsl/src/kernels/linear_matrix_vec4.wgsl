// The linear's fetching of matrix_gemm.wgsl's k steps as vec4s (in place of
// matrix_fetch.wgsl): x's rows four f32 at a time and W's rows eight bf16 at
// a time (a vec4 of u32 pairs), the same values as the element path and so
// the same sums; f16 operands already under their range scales (W packed,
// `W_HALF`; x's f16 rows, `stages_x_half()`) are copied into the tiles as
// they are stored, four a load and a store (linear_half_quads.wgsl), x's
// pieces each shifted by a power of two in f16. The launcher takes it where x's window, its row
// stride and k are whole vec4s, W is bf16 on whole vec4s, and each
// invocation's share of a step is whole vec4s
// (`MatrixConfig::fetches_vec4_steps`): a step's loads are a quarter (x)
// and an eighth (W) as many instructions, each invocation's rows and
// columns fixed over k.

// read_write as every product's x: it may share its buffer with y.
@group(0) @binding(6) var<storage, read_write> x_vec4: array<vec4<f32>>;

// At most FETCH_A vec4s of x an invocation and step: as f32 values, or
// (`a_stored`) as the tiles take them; and W's (matrix_fetch_vec4.wgsl).
const FETCH_A: u32 = 8u;
struct Fetched {
    a: array<vec4<f32>, FETCH_A>,
    a_stored: array<vec4<Operand>, FETCH_A>,
    w: FetchedW,
}

// x's f16 rows: staged from their f16 values with no conversion
// (`a_quad`). The launcher takes f16 rows only onto f16 tiles; the f32
// operands' module widens the same words (linear_half_quads_widened.wgsl).
fn stages_x_half() -> bool {
    return X_HALF;
}

// The vec4 of x holding x[m0 + r, k0 + 4·c4 …] (x's first past the matrix),
// and whether it is inside: k is whole vec4s, so a vec4 is inside or past
// it whole; the index is selected, not branched around.
fn x_vec4_at(r: u32, c4: u32, m0: u32, k0: u32) -> vec2<u32> {
    let inside = m0 + r < p.m && k0 + 4u * c4 < p.k;
    let at = (p.x_offset + (m0 + r) * p.x_stride + k0) / 4u + c4;
    return vec2<u32>(select(p.x_offset / 4u, at, inside), u32(inside));
}

// x[m0 + r, k0 + 4·c4 …] of x's f32 rows (zero past the matrix).
fn a_vec4(r: u32, c4: u32, m0: u32, k0: u32) -> vec4<f32> {
    let at = x_vec4_at(r, c4, m0, k0);
    return select(vec4<f32>(0.0), x_vec4[at.x], at.y == 1u);
}

// The same four values of x's f16 rows as the tiles take them
// (`stages_x_half()`), under the row's range scale: as stored under one
// scale a row (the scale times its inverse is 1); in pieces, times the
// power of two from the piece's scale to the row's, in f16 where that is a
// normal f16 (the product exact, or rounded once as the f32 path rounds
// it), else in f32 as the f32 path does.
fn a_quad(r: u32, c4: u32, m0: u32, k0: u32) -> vec4<Operand> {
    let at = x_vec4_at(r, c4, m0, k0);
    let stored = select(vec4<Operand>(), x_half_quad(at.x), at.y == 1u);
    if (X_PIECE == 0u) {
        return stored;
    }
    let shift = x_half_scale(m0 + r, k0 + 4u * c4) * row_inverse(r);
    if (shift >= F16_SMALLEST_NORMAL) {
        return stored * Operand(shift);
    }
    return vec4<Operand>(vec4<f32>(stored) * shift);
}

// 2⁻¹⁴.
const F16_SMALLEST_NORMAL: f32 = 6.103515625e-5;

// The octet of W's words holding W[n0 + c, k0 + 8·q …] (W's first past
// it), and whether it is inside (matrix_fetch_vec4.wgsl's).
fn w_octet_at(c: u32, q: u32, n0: u32, k0: u32) -> vec2<u32> {
    let inside = column_inside(n0 + c, BN) && k0 + 8u * q < p.k;
    let at = (p.w_offset + w_row(n0 + c) * p.k + k0) / 8u + q;
    return vec2<u32>(select(p.w_offset / 8u, at, inside), u32(inside));
}

// Issues the global loads of KT terms from t0 on.
fn fetch(li: u32, row0: u32, col0: u32, t0: u32) -> Fetched {
    var f: Fetched;
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        if (stages_x_half()) {
            f.a_stored[j] = a_quad(i / (KT / 4u), i % (KT / 4u), row0, t0);
        } else {
            f.a[j] = a_vec4(i / (KT / 4u), i % (KT / 4u), row0, t0);
        }
    }
    f.w = fetch_w(li, col0, t0);
    return f;
}

// Puts fetched values into buffer `half`, four terms a store: x as the
// tiles take it, or rounded under each row's range scale; W as
// matrix_fetch_vec4.wgsl puts it.
fn put(li: u32, half: u32, f: ptr<function, Fetched>) {
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        let r = i / (KT / 4u);
        let at = half * BM * LD + r * LD + 4u * (i % (KT / 4u));
        if (stages_x_half()) {
            put_a_quad(at, (*f).a_stored[j]);
        } else {
            put_a4(at, (*f).a[j] * row_inverse(r));
        }
    }
    put_w(li, half, (*f).w);
}

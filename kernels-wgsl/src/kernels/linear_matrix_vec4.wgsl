// The linear's fetching of matrix_gemm.wgsl's k steps as vec4s (in place of
// matrix_fetch.wgsl): x's rows four f32 at a time and W's rows eight bf16
// (or packed f16, `W_HALF`) at a time (a vec4 of u32 pairs), the same
// values as the element path and so the same sums. The launcher takes it where x's window, its row stride
// and k are whole vec4s, W is bf16 on whole vec4s, and each invocation's
// share of a step is whole vec4s (`MatrixConfig::fetches_vec4_steps`): a
// step's loads are a quarter (x) and an eighth (W) as many instructions,
// each invocation's rows and columns fixed over k.

// read_write as every product's x: it may share its buffer with y.
@group(0) @binding(6) var<storage, read_write> x_vec4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> w_vec4: array<vec4<u32>>;

fn prefetching() -> bool {
    return true;
}

// At most FETCH_A vec4s of x and FETCH_B of W an invocation and step.
const FETCH_A: u32 = 8u;
const FETCH_B: u32 = 4u;
struct Fetched {
    a: array<vec4<f32>, FETCH_A>,
    b: array<vec4<u32>, FETCH_B>,
}

// x[m0 + r, k0 + 4·c4 …] (zero past the matrix: k is whole vec4s, so a vec4
// is inside or past it whole); the index is selected, not branched around.
// On the half-precision path (`X_HALF`), the four f16 values in two words of
// x_half, times their row's scale (or their piece's, a piece being whole
// vec4s): the values the f32 path would have read.
fn a_vec4(r: u32, c4: u32, m0: u32, k0: u32) -> vec4<f32> {
    let inside = m0 + r < p.m && k0 + 4u * c4 < p.k;
    let at = (p.x_offset + (m0 + r) * p.x_stride + k0) / 4u + c4;
    let vec4_at = select(p.x_offset / 4u, at, inside);
    if (X_HALF) {
        let values = vec4<f32>(unpack2x16float(x_half[2u * vec4_at]), unpack2x16float(x_half[2u * vec4_at + 1u]));
        return select(vec4<f32>(0.0), values * x_half_scale(m0 + r, k0 + 4u * c4), inside);
    }
    return select(vec4<f32>(0.0), x_vec4[vec4_at], inside);
}

// W[n0 + c, k0 + 8·q …] as four bf16 pairs (zero past W).
fn b_vec8(c: u32, q: u32, n0: u32, k0: u32) -> vec4<u32> {
    let inside = column_inside(n0 + c, BN) && k0 + 8u * q < p.k;
    let at = (p.w_offset + paired_w_row(n0 + c, BN) * p.k + k0) / 8u + q;
    return select(vec4<u32>(0u), w_vec4[select(p.w_offset / 8u, at, inside)], inside);
}

// Issues the global loads of KT terms from t0 on.
fn fetch(li: u32, row0: u32, col0: u32, t0: u32) -> Fetched {
    var f: Fetched;
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        f.a[j] = a_vec4(i / (KT / 4u), i % (KT / 4u), row0, t0);
    }
    for (var j = 0u; j < BN * KT / 8u / WG; j++) {
        let i = li + j * WG;
        f.b[j] = b_vec8(i / (KT / 8u), i % (KT / 8u), col0, t0);
    }
    return f;
}

// Rounds fetched values into buffer `half`, each row of A and column of B
// under its range scale, four terms a store; W's words packed into f16
// (`W_HALF`) go in as they are, eight terms in two stores.
fn put(li: u32, half: u32, f: ptr<function, Fetched>) {
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        let r = i / (KT / 4u);
        put_a4(half * BM * LD + r * LD + 4u * (i % (KT / 4u)), (*f).a[j] * row_inverse(r));
    }
    for (var j = 0u; j < BN * KT / 8u / WG; j++) {
        let i = li + j * WG;
        let c = i / (KT / 8u);
        let at = half * BN * LD + c * LD + 8u * (i % (KT / 8u));
        let q = (*f).b[j];
        if (W_HALF) {
            put_b_words(at, q);
        } else {
            put_b4(at, vec4<f32>(b_word_operands(q.x, c), b_word_operands(q.y, c)));
            put_b4(at + 4u, vec4<f32>(b_word_operands(q.z, c), b_word_operands(q.w, c)));
        }
    }
}

// The first step, fetched and rounded before the products.
fn stage(li: u32, half: u32, row0: u32, col0: u32, t0: u32) {
    var f = fetch(li, row0, col0, t0);
    put(li, half, &f);
}

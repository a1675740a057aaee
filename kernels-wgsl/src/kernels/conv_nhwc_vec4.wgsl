// The channels-last convolution's fetching of matrix_gemm.wgsl's k steps
// four taps at a time (in place of matrix_fetch.wgsl): a run of four taps
// is four channels of one neighbour, so one neighbour's place, one range
// scale and two words give four values of A, and W's rows (taps last) come
// eight terms a load, packed f16 words (`W_HALF`) copied into the tiles as
// they are stored. The same values as the element path (a_at, b_pair), so
// the same sums. The launcher takes it where the input's channels, its
// pieces and a norm group's channels are whole runs of 4, W's taps are
// last with its window and the taps whole runs of 8, and each invocation's
// share of a step is whole vec4s (`MatrixConfig::fetches_vec4_steps`).

// At most FETCH_A vec4s of A an invocation and step (8 on a square
// block's four subgroups, 16 on a narrow one's two: the same 8T rows of A
// over half the invocations); and W's (matrix_fetch_vec4.wgsl).
const FETCH_A: u32 = 32u / SUBGROUPS;
struct Fetched {
    a: array<vec4<f32>, FETCH_A>,
    w: FetchedW,
}

// A's taps k0 + 4·c4 … of output pixel m0 + r: channels ci … ci + 3 of one
// neighbour, normalised where NORM_IN, as a_at gives them one at a time
// (zero in the padding and past the call's pixels or the taps).
fn a_quad(r: u32, c4: u32, m0: u32, k0: u32) -> vec4<f32> {
    let row = m0 + r;
    let tap = k0 + 4u * c4;
    let at = neighbour(p.px_first + row, tap / IN_CHANNELS);
    let ci = tap % IN_CHANNELS;
    let inside = row < p.px_count && tap < taps() && at.y == 1u;
    let word = select(p.x_offset, p.x_offset + (at.x - p.x_first) * X_WORDS + ci / 2u, inside);
    let scale = input_scale(select(p.x_first, at.x, inside), select(0u, ci, inside));
    let v = vec4<f32>(unpack2x16float(x_half[word]), unpack2x16float(x_half[word + 1u])) * scale;
    let normed = vec4<f32>(normed_input(v.x, ci), normed_input(v.y, ci + 1u), normed_input(v.z, ci + 2u), normed_input(v.w, ci + 3u));
    return select(vec4<f32>(0.0), normed, inside);
}

// The octet of W's words holding W[n0 + c, tap k0 + 8·q …] (W's first past
// it), and whether it is inside.
fn w_octet_at(c: u32, q: u32, n0: u32, k0: u32) -> vec2<u32> {
    let inside = n0 + c < p.out_channels && k0 + 8u * q < taps();
    let at = (p.w_offset + (n0 + c) * taps() + k0) / 8u + q;
    return vec2<u32>(select(p.w_offset / 8u, at, inside), u32(inside));
}

// Issues the global loads of KT terms from t0 on.
fn fetch(li: u32, row0: u32, col0: u32, t0: u32) -> Fetched {
    var f: Fetched;
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        f.a[j] = a_quad(i / (KT / 4u), i % (KT / 4u), row0, t0);
    }
    f.w = fetch_w(li, col0, t0);
    return f;
}

// Puts fetched values into buffer `half`, four terms a store: A rounded
// under its rows' range scales, W as matrix_fetch_vec4.wgsl puts it.
fn put(li: u32, half: u32, f: ptr<function, Fetched>) {
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        let r = i / (KT / 4u);
        put_a4(half * BM * LD + r * LD + 4u * (i % (KT / 4u)), (*f).a[j] * row_inverse(r));
    }
    put_w(li, half, (*f).w);
}

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

// W's window again (binding 2's buffer): as vec4s of f16, and as bf16 pairs.
@group(0) @binding(21) var<storage, read> w_octets: array<array<vec4<f16>, 2>>;
@group(0) @binding(22) var<storage, read> w_vec4: array<vec4<u32>>;

fn prefetching() -> bool {
    return true;
}

// At most FETCH_A vec4s of A and FETCH_B octets of W an invocation and
// step: W as bf16 pairs or (`b_stored`) as stored. A module specialised by
// its constants keeps only the fields its paths read.
const FETCH_A: u32 = 8u;
const FETCH_B: u32 = 4u;
struct Fetched {
    a: array<vec4<f32>, FETCH_A>,
    b: array<vec4<u32>, FETCH_B>,
    b_stored: array<array<vec4<Operand>, 2>, FETCH_B>,
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

// Those eight terms as bf16 pairs (zero past W).
fn b_vec8(c: u32, q: u32, n0: u32, k0: u32) -> vec4<u32> {
    let at = w_octet_at(c, q, n0, k0);
    return select(vec4<u32>(0u), w_vec4[at.x], at.y == 1u);
}

// Those eight terms packed as f16 (`W_HALF`), as stored.
fn b_octet(c: u32, q: u32, n0: u32, k0: u32) -> array<vec4<Operand>, 2> {
    let at = w_octet_at(c, q, n0, k0);
    let octet = w_octets[at.x];
    let inside = at.y == 1u;
    return array<vec4<Operand>, 2>(select(vec4<Operand>(), octet[0], inside), select(vec4<Operand>(), octet[1], inside));
}

// Issues the global loads of KT terms from t0 on.
fn fetch(li: u32, row0: u32, col0: u32, t0: u32) -> Fetched {
    var f: Fetched;
    for (var j = 0u; j < BM * KT / 4u / WG; j++) {
        let i = li + j * WG;
        f.a[j] = a_quad(i / (KT / 4u), i % (KT / 4u), row0, t0);
    }
    for (var j = 0u; j < BN * KT / 8u / WG; j++) {
        let i = li + j * WG;
        if (W_HALF) {
            f.b_stored[j] = b_octet(i / (KT / 8u), i % (KT / 8u), col0, t0);
        } else {
            f.b[j] = b_vec8(i / (KT / 8u), i % (KT / 8u), col0, t0);
        }
    }
    return f;
}

// Puts fetched values into buffer `half`, four terms a store: A rounded
// under its rows' range scales, W as stored or rounded under its columns'.
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
        if (W_HALF) {
            put_b_quad(at, (*f).b_stored[j][0]);
            put_b_quad(at + 4u, (*f).b_stored[j][1]);
        } else {
            let q = (*f).b[j];
            put_b4(at, vec4<f32>(b_word_operands(q.x, c), b_word_operands(q.y, c)));
            put_b4(at + 4u, vec4<f32>(b_word_operands(q.z, c), b_word_operands(q.w, c)));
        }
    }
}

// The first step, fetched and put before the products.
fn stage(li: u32, half: u32, row0: u32, col0: u32, t0: u32) {
    var f = fetch(li, row0, col0, t0);
    put(li, half, &f);
}

// What the vec4 fetching of matrix_gemm.wgsl's k steps shares between the
// linear (linear_matrix_vec4.wgsl) and the channels-last convolution
// (conv_nhwc_vec4.wgsl): W's rows eight terms a load, as bf16 pairs
// rounded under their column's range scale, or packed f16 words (`W_HALF`)
// copied into the tiles as they are stored (half_octets.wgsl's
// `w_half_octet`); the module gives `w_octet_at`, where an octet of W lies,
// and `fetch` and `put`, which fetch and put A and call these for W.

@group(0) @binding(7) var<storage, read> w_vec4: array<vec4<u32>>;

fn prefetching() -> bool {
    return true;
}

// At most FETCH_B octets of W an invocation and step: as bf16 pairs, or
// (`stored`) as stored. A module specialised by its constants keeps only
// the fields its paths read.
const FETCH_B: u32 = 4u;
struct FetchedW {
    pairs: array<vec4<u32>, FETCH_B>,
    stored: array<array<vec4<Operand>, 2>, FETCH_B>,
}

// The octet at W[n0 + c, k0 + 8·q …] as four bf16 pairs (zero past W).
fn b_vec8(c: u32, q: u32, n0: u32, k0: u32) -> vec4<u32> {
    let at = w_octet_at(c, q, n0, k0);
    return select(vec4<u32>(0u), w_vec4[at.x], at.y == 1u);
}

// The same eight terms packed as f16 (`W_HALF`), as stored.
fn b_octet(c: u32, q: u32, n0: u32, k0: u32) -> array<vec4<Operand>, 2> {
    let at = w_octet_at(c, q, n0, k0);
    let octet = w_half_octet(at.x);
    let inside = at.y == 1u;
    return array<vec4<Operand>, 2>(select(vec4<Operand>(), octet[0], inside), select(vec4<Operand>(), octet[1], inside));
}

// W's octets a k step, and the rounds of WG invocations taking them: a
// thin block's may be fewer than WG (then some invocations take none; the
// check folds away where they divide).
override W_OCTETS: u32 = BN * KT / 8u;
override W_ROUNDS: u32 = (W_OCTETS + WG - 1u) / WG;

fn takes_octet(i: u32) -> bool {
    return W_OCTETS % WG == 0u || i < W_OCTETS;
}

// Issues the global loads of W's KT terms from t0 on.
fn fetch_w(li: u32, col0: u32, t0: u32) -> FetchedW {
    var f: FetchedW;
    for (var j = 0u; j < W_ROUNDS; j++) {
        let i = li + j * WG;
        if (!takes_octet(i)) {
            continue;
        }
        if (W_HALF) {
            f.stored[j] = b_octet(i / (KT / 8u), i % (KT / 8u), col0, t0);
        } else {
            f.pairs[j] = b_vec8(i / (KT / 8u), i % (KT / 8u), col0, t0);
        }
    }
    return f;
}

// Puts fetched W into buffer `half`, four terms a store: as stored, or
// rounded under each column's range scale.
fn put_w(li: u32, half: u32, w: FetchedW) {
    for (var j = 0u; j < W_ROUNDS; j++) {
        let i = li + j * WG;
        if (!takes_octet(i)) {
            continue;
        }
        let c = i / (KT / 8u);
        let at = half * BN * LD + c * LD + 8u * (i % (KT / 8u));
        if (W_HALF) {
            put_b_quad(at, w.stored[j][0]);
            put_b_quad(at + 4u, w.stored[j][1]);
        } else {
            let q = w.pairs[j];
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

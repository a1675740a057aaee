// The element-by-element fetching of matrix_gemm.wgsl's k steps: A and B
// read through the module's `a_at`, `b_at` and `b_pair` (see matrix_gemm.wgsl),
// element i of a step's A being the module's `a_element(i)` (row, term):
// terms fastest where A's rows are contiguous (the linear's x), rows fastest
// where neighbouring rows are (the conv's pixels), so that consecutive
// invocations read neighbouring addresses.

// Whether the next k step is fetched into registers during the products
// (B's columns as bf16 pairs), or staged element by element before them.
fn prefetching() -> bool {
    return B_PAIRED;
}

// What one invocation fetches of one k step: BM·KT / WG values of A, at
// most FETCH_A of them (32 with 2×2 subgroups, 64 with 2×1), and
// BN·KT / 2 / WG pairs of B, at most FETCH (the launcher takes the fetching
// path only where 4 subgroups' invocations × 32 ≥ BM·KT, which bounds both
// shapes alike: 16×16 tiles in subgroups of 32 or more, 8×8 tiles in
// subgroups of 8 or more). The loads are unconditional (the module's
// accessors clamp and select instead of branching), so the compiler can
// issue them all before the first one returns.
const FETCH: u32 = 32u;
const FETCH_A: u32 = FETCH * 4u / SUBGROUPS;
struct Fetched {
    a: array<f32, FETCH_A>,
    b: array<u32, FETCH>,
}

// B's pairs a k step, and the rounds of WG invocations taking them: a thin
// block's may not divide (then the last round's later invocations take
// none; the check folds away where they divide).
override B_PAIRS: u32 = BN * KT / 2u;
override B_ROUNDS: u32 = (B_PAIRS + WG - 1u) / WG;

fn takes_pair(i: u32) -> bool {
    return B_PAIRS % WG == 0u || i < B_PAIRS;
}

// Issues the global loads of KT terms from t0 on.
fn fetch(li: u32, row0: u32, col0: u32, t0: u32) -> Fetched {
    var f: Fetched;
    for (var j = 0u; j < BM * KT / WG; j++) {
        let i = li + j * WG;
        let rt = a_element(i);
        f.a[j] = a_at(rt.x, rt.y, row0, t0);
    }
    for (var j = 0u; j < B_ROUNDS; j++) {
        let i = li + j * WG;
        if (takes_pair(i)) {
            f.b[j] = b_pair(i / (KT / 2u), 2u * (i % (KT / 2u)), col0, t0);
        }
    }
    return f;
}

// Rounds fetched values into buffer `half`, each row of A and column of B
// under its range scale.
fn put(li: u32, half: u32, f: ptr<function, Fetched>) {
    for (var j = 0u; j < BM * KT / WG; j++) {
        let rt = a_element(li + j * WG);
        put_a(half * BM * LD + rt.x * LD + rt.y, (*f).a[j] * row_inverse(rt.x));
    }
    for (var j = 0u; j < B_ROUNDS; j++) {
        let i = li + j * WG;
        if (!takes_pair(i)) {
            continue;
        }
        let c = i / (KT / 2u);
        let at = half * BN * LD + c * LD + 2u * (i % (KT / 2u));
        let pair = b_word_operands((*f).b[j], c);
        put_b(at, pair.x);
        put_b(at + 1u, pair.y);
    }
}

// Stages KT terms from t0 on into buffer `half` (0 or 1), element by element.
fn stage(li: u32, half: u32, row0: u32, col0: u32, t0: u32) {
    for (var i = li; i < BM * KT; i += WG) {
        let rt = a_element(i);
        put_a(half * BM * LD + rt.x * LD + rt.y, a_at(rt.x, rt.y, row0, t0) * row_inverse(rt.x));
    }
    for (var i = li; i < BN * KT; i += WG) {
        let c = i / KT;
        let t = i % KT;
        put_b(half * BN * LD + c * LD + t, b_at(t, c, col0, t0) * col_inverse(c));
    }
}

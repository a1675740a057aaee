// The attention family's interface, shared by `attention.wgsl` (f32, every
// tier) and `attention_matrix.wgsl` (matrix tier): the parameter block
// (AttentionParams on the host), the bindings, and which scores a query sees.
// The keys and values are declared by `attention_kv_f32.wgsl` (f32) or
// `attention_kv_half.wgsl` (f16 pairs with a range scale per head row).

struct Params {
    q_len: u32, kv_len: u32, q_heads: u32, kv_heads: u32, head_dim: u32,
    q_offset: u32, q_stride: u32,
    k_offset: u32, k_stride: u32,
    v_offset: u32, v_stride: u32,
    o_offset: u32, o_stride: u32,
    scale: f32, causal: u32, use_mask: u32, mask_offset: u32,
    q_position: u32,
    // attention.wgsl's online softmax carried between calls over chunks of
    // the keys: its state at state_offset, what `carry` says (CARRY_FROM, CARRY_KEEP).
    state_offset: u32, carry: u32,
    k_scale_offset: u32, v_scale_offset: u32,
    // The matrix kernel's f16 output in pieces: where its scales start, and
    // from one query to the next.
    o_scale_offset: u32, o_scale_stride: u32,
    // Its f16 queries, keys and values in pieces of qkv_piece values: where
    // the queries' scales start, and each one's scales from row to row (the
    // keys' and values' start at k_scale_offset and v_scale_offset).
    q_scale_offset: u32, q_scale_stride: u32, k_scale_stride: u32, v_scale_stride: u32,
    qkv_piece: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read> key_keep: array<u32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
@group(0) @binding(6) var<storage, read_write> state: array<f32>;

// Marks a masked score; every real score is larger.
const MASKED: f32 = -3.0e38;

// Whether local query qi sees key kj: inside both lengths, not after the
// query's position when causal, and not masked out. Written without
// short-circuits (on a CPU adapter each `&&` is a branch per SIMD lane); the
// mask word is read at a key clamped into the keys, so it is always in bounds.
fn visible(qi: u32, kj: u32) -> bool {
    let in_range = (qi < p.q_len) & (kj < p.kv_len);
    let causal_ok = (p.causal == 0u) | (kj <= qi + p.q_position);
    var kept = true;
    if (p.use_mask != 0u) {
        kept = key_keep[p.mask_offset + min(kj, p.kv_len - 1u)] != 0u;
    }
    return in_range & causal_ok & kept;
}

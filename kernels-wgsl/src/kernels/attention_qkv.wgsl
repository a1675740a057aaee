// The matrix tier's attention inputs, shared by attention_matrix.wgsl and
// attention_flash.wgsl: each query, key and value read as f32, from the f32
// rows (attention_kv_f32.wgsl's bindings) or from f16 rows in pieces.

// Queries, keys and values as f16 rows in pieces (`QKV_HALF`), as their
// projections and the RMSNorm + RoPE wrote them: f16 pairs at bindings 14–16
// (offsets and strides counting f16 values), a scale every p.qkv_piece
// values at bindings 17–19. Each value is widened and scaled back: the
// values the f32 path reads, up to their rounding to f16 in pieces.
override QKV_HALF: bool = false;
@group(0) @binding(14) var<storage, read_write> q_half: array<u32>;
@group(0) @binding(15) var<storage, read_write> k_half: array<u32>;
@group(0) @binding(16) var<storage, read_write> v_half: array<u32>;
@group(0) @binding(17) var<storage, read_write> q_scales: array<f32>;
@group(0) @binding(18) var<storage, read_write> k_scales: array<f32>;
@group(0) @binding(19) var<storage, read_write> v_scales: array<f32>;

// The f16 value at element e of a tensor's words, widened (exactly).
fn half_at(word: u32, e: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

// Query q0 + r, key or value k0 + j of head h (kv head kvh) at dim d; zero past the tensors.
fn q_at(h: u32, q0: u32, r: u32, d: u32) -> f32 {
    if (q0 + r < p.q_len && d < p.head_dim) {
        let e = p.q_offset + (q0 + r) * p.q_stride + h * p.head_dim + d;
        if (QKV_HALF) {
            return half_at(q_half[e / 2u], e) * q_scales[p.q_scale_offset + (q0 + r) * p.q_scale_stride + (h * p.head_dim + d) / p.qkv_piece];
        }
        return q[e];
    }
    return 0.0;
}

fn k_at(kvh: u32, k0: u32, j: u32, d: u32) -> f32 {
    if (k0 + j < p.kv_len && d < p.head_dim) {
        let e = p.k_offset + (k0 + j) * p.k_stride + kvh * p.head_dim + d;
        if (QKV_HALF) {
            return half_at(k_half[e / 2u], e) * k_scales[p.k_scale_offset + (k0 + j) * p.k_scale_stride + (kvh * p.head_dim + d) / p.qkv_piece];
        }
        return k[e];
    }
    return 0.0;
}

fn v_at(kvh: u32, k0: u32, j: u32, d: u32) -> f32 {
    if (k0 + j < p.kv_len && d < p.head_dim) {
        let e = p.v_offset + (k0 + j) * p.v_stride + kvh * p.head_dim + d;
        if (QKV_HALF) {
            return half_at(v_half[e / 2u], e) * v_scales[p.v_scale_offset + (k0 + j) * p.v_scale_stride + (kvh * p.head_dim + d) / p.qkv_piece];
        }
        return v[e];
    }
    return 0.0;
}


// The power of two a row of queries, keys or values (dims [first, past) of
// head h) is staged under, so that its largest magnitude stays below 2¹⁴:
// in f16 pieces, the largest of its pieces' scales (each piece then shifted
// by a power of two, exactly); in f32, the range rule's scale of its largest
// magnitude; 1 past the tensors or for f32 operands.
fn q_row_scale(h: u32, qi: u32) -> f32 {
    if (!OPERAND_HALF || qi >= p.q_len) {
        return 1.0;
    }
    var largest = 0.0;
    if (QKV_HALF) {
        for (var d = 0u; d < p.head_dim; d += p.qkv_piece) {
            largest = max(largest, q_scales[p.q_scale_offset + qi * p.q_scale_stride + (h * p.head_dim + d) / p.qkv_piece]);
        }
        return largest;
    }
    for (var d = 0u; d < p.head_dim; d++) {
        largest = max(largest, abs(q[p.q_offset + qi * p.q_stride + h * p.head_dim + d]));
    }
    return range_scale(largest);
}

fn k_row_scale(kvh: u32, kj: u32) -> f32 {
    if (!OPERAND_HALF || kj >= p.kv_len) {
        return 1.0;
    }
    var largest = 0.0;
    if (QKV_HALF) {
        for (var d = 0u; d < p.head_dim; d += p.qkv_piece) {
            largest = max(largest, k_scales[p.k_scale_offset + kj * p.k_scale_stride + (kvh * p.head_dim + d) / p.qkv_piece]);
        }
        return largest;
    }
    for (var d = 0u; d < p.head_dim; d++) {
        largest = max(largest, abs(k[p.k_offset + kj * p.k_stride + kvh * p.head_dim + d]));
    }
    return range_scale(largest);
}

// Values: over dims [first, past) of the head only (a workgroup's share of them).
// Past the keys 0: a tile's padding must not raise the scale its values share.
fn v_row_scale(kvh: u32, kj: u32, first: u32, past: u32) -> f32 {
    if (!OPERAND_HALF) {
        return 1.0;
    }
    if (kj >= p.kv_len) {
        return 0.0;
    }
    let end = min(past, p.head_dim);
    var largest = 0.0;
    if (QKV_HALF) {
        for (var d = first / p.qkv_piece * p.qkv_piece; d < end; d += p.qkv_piece) {
            largest = max(largest, v_scales[p.v_scale_offset + kj * p.v_scale_stride + (kvh * p.head_dim + d) / p.qkv_piece]);
        }
        return largest;
    }
    for (var d = first; d < end; d++) {
        largest = max(largest, abs(v[p.v_offset + kj * p.v_stride + kvh * p.head_dim + d]));
    }
    return range_scale(largest);
}

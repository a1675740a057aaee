// The matrix tier's attention inputs and outputs, shared by
// attention_matrix.wgsl and attention_flash.wgsl: each query, key and value
// read as f32, from the f32 rows (attention_kv_f32.wgsl's bindings) or from
// f16 rows in pieces; the output's f16 pieces.

// The output as the next product's operand (`O_HALF`): f16 pairs at binding
// 12 (o's offset and stride counting f16 values), each query's row in
// pieces of O_PIECE values (a head's dims whole pieces) under their own
// range scales, at binding 13 from p.o_scale_offset, p.o_scale_stride
// from one query to the next: the range rule's rounding of the f32 output
// (kept ≥ 2⁻¹²⁶ as half_pack.wgsl keeps it), without its write and read.
override O_HALF: bool = false;
override O_PIECE: u32 = 64u;
@group(0) @binding(12) var<storage, read_write> o_half: array<u32>;
@group(0) @binding(13) var<storage, read_write> o_scales: array<f32>;

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

// Which of the three a read is of; a constant at each call, so the
// switches below fold away.
const QUERIES: u32 = 0u;
const KEYS: u32 = 1u;
const VALUES: u32 = 2u;

// A tensor's rows: how many, where the first starts and from one to the
// next (in values), and its f16 pieces' scales likewise.
struct TensorRows {
    len: u32,
    offset: u32,
    stride: u32,
    scale_offset: u32,
    scale_stride: u32,
}

fn rows_of(tensor: u32) -> TensorRows {
    switch tensor {
        case QUERIES: {
            return TensorRows(p.q_len, p.q_offset, p.q_stride, p.q_scale_offset, p.q_scale_stride);
        }
        case KEYS: {
            return TensorRows(p.kv_len, p.k_offset, p.k_stride, p.k_scale_offset, p.k_scale_stride);
        }
        default: {
            return TensorRows(p.kv_len, p.v_offset, p.v_stride, p.v_scale_offset, p.v_scale_stride);
        }
    }
}

// Element e of a tensor's f32 rows, word w of its f16 rows, scale s of its pieces.
fn f32_of(tensor: u32, e: u32) -> f32 {
    switch tensor {
        case QUERIES: {
            return q[e];
        }
        case KEYS: {
            return k[e];
        }
        default: {
            return v[e];
        }
    }
}

fn half_word_of(tensor: u32, w: u32) -> u32 {
    switch tensor {
        case QUERIES: {
            return q_half[w];
        }
        case KEYS: {
            return k_half[w];
        }
        default: {
            return v_half[w];
        }
    }
}

fn piece_scale_of(tensor: u32, s: u32) -> f32 {
    switch tensor {
        case QUERIES: {
            return q_scales[s];
        }
        case KEYS: {
            return k_scales[s];
        }
        default: {
            return v_scales[s];
        }
    }
}

// Where dim d of row `row` of head `head` lies in a tensor's values, and
// where its piece's scale lies.
fn element_of(t: TensorRows, head: u32, row: u32, d: u32) -> u32 {
    return t.offset + row * t.stride + head * p.head_dim + d;
}

fn piece_of(t: TensorRows, head: u32, row: u32, d: u32) -> u32 {
    return t.scale_offset + row * t.scale_stride + (head * p.head_dim + d) / p.qkv_piece;
}

// Dim d of row `row` (a query; or a key or value) of head `head` (a kv head
// for keys and values) of `tensor`, as f32; zero past the tensor.
fn tensor_at(tensor: u32, head: u32, row: u32, d: u32) -> f32 {
    let t = rows_of(tensor);
    if (row < t.len && d < p.head_dim) {
        let e = element_of(t, head, row, d);
        if (QKV_HALF) {
            return half_at(half_word_of(tensor, e / 2u), e) * piece_scale_of(tensor, piece_of(t, head, row, d));
        }
        return f32_of(tensor, e);
    }
    return 0.0;
}

// Four neighbouring dims d … d + 3 (d a multiple of 4) as tensor_at gives
// them. Where the f16 rows come in whole runs (`half_runs`: the head's
// dims, the pieces and each row's start whole runs of 4 values), the run's
// two words and its piece's one scale are read once; else value by value.
fn half_runs(offset: u32, stride: u32) -> bool {
    return p.head_dim % 4u == 0u && p.qkv_piece % 4u == 0u && offset % 4u == 0u && stride % 4u == 0u;
}

fn run_of(words: vec2<u32>, scale: f32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(words.x), unpack2x16float(words.y)) * scale;
}

fn tensor_run(tensor: u32, head: u32, row: u32, d: u32) -> vec4<f32> {
    let t = rows_of(tensor);
    if (QKV_HALF && half_runs(t.offset, t.stride)) {
        if (row >= t.len || d >= p.head_dim) {
            return vec4<f32>(0.0);
        }
        let w = element_of(t, head, row, d) / 2u;
        return run_of(vec2<u32>(half_word_of(tensor, w), half_word_of(tensor, w + 1u)), piece_scale_of(tensor, piece_of(t, head, row, d)));
    }
    return vec4<f32>(tensor_at(tensor, head, row, d), tensor_at(tensor, head, row, d + 1u), tensor_at(tensor, head, row, d + 2u), tensor_at(tensor, head, row, d + 3u));
}

// The power of two a query's (`of_keys` false) or a key's row over the whole
// head is staged under, so that its largest magnitude stays below 2¹⁴: in f16
// pieces, the largest of its pieces' scales (each piece then shifted by a
// power of two, exactly); in f32, the range rule's scale of its largest
// magnitude; 1 past the tensors or for f32 operands.
fn qk_row_scale(of_keys: bool, head: u32, index: u32) -> f32 {
    if (!OPERAND_HALF || index >= select(p.q_len, p.kv_len, of_keys)) {
        return 1.0;
    }
    var largest = 0.0;
    if (QKV_HALF) {
        for (var d = 0u; d < p.head_dim; d += p.qkv_piece) {
            let piece = (head * p.head_dim + d) / p.qkv_piece;
            if (of_keys) {
                largest = max(largest, k_scales[p.k_scale_offset + index * p.k_scale_stride + piece]);
            } else {
                largest = max(largest, q_scales[p.q_scale_offset + index * p.q_scale_stride + piece]);
            }
        }
        return largest;
    }
    for (var d = 0u; d < p.head_dim; d++) {
        if (of_keys) {
            largest = max(largest, abs(k[p.k_offset + index * p.k_stride + head * p.head_dim + d]));
        } else {
            largest = max(largest, abs(q[p.q_offset + index * p.q_stride + head * p.head_dim + d]));
        }
    }
    return range_scale(largest);
}

// The same for a value's row, over dims [first, past) of the head only (a
// workgroup's share of them); 0 past the keys: a tile's padding must not
// raise the scale its values share.
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

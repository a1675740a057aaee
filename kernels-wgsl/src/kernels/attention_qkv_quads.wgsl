// The flash attention's f16 queries, keys and values (`QKV_HALF`) as it
// copies them into workgroup memory: their buffers (bindings 14–16) bound
// again at 20–22 as vec4s of f16 (naga has no bitcast from u32 words to
// f16s), so a run of four dims moves as stored, shifted from its piece's
// range scale to the one its row (or the tile's values) is staged under by
// one f16 multiply by a power of two, where it was widened, scaled and
// rounded again.
@group(0) @binding(20) var<storage, read_write> q_quads: array<vec4<f16>>;
@group(0) @binding(21) var<storage, read_write> k_quads: array<vec4<f16>>;
@group(0) @binding(22) var<storage, read_write> v_quads: array<vec4<f16>>;

// 2⁻¹⁴.
const QUAD_SMALLEST_SHIFT: f32 = 6.103515625e-5;

// Four f16 values under a piece's scale `piece`, brought under `staged`
// (a power of two no smaller: the largest of the pieces it covers):
// times their ratio in f16 where that ratio is a normal f16 (the product
// exact, or rounded once as the f32 path rounds it), else in f32 as the f32
// path does. The values run_of and divided_by_power give, rounded to f16.
fn shifted_quad(stored: vec4<f16>, piece: f32, staged: f32) -> vec4<f16> {
    let shift = piece * exact_inverse(staged);
    if (shift >= QUAD_SMALLEST_SHIFT) {
        return stored * f16(shift);
    }
    return vec4<f16>(vec4<f32>(stored) * shift);
}

// Whether runs of four dims of rows at `offset`, `stride` are copied as
// stored: f16 rows in whole runs (`half_runs`).
fn quads_at(offset: u32, stride: u32) -> bool {
    return QKV_HALF && half_runs(offset, stride);
}

// Which of the three a run is of.
const QUERIES: u32 = 0u;
const KEYS: u32 = 1u;
const VALUES: u32 = 2u;

// Dims d … d + 3 of row `row` (a query, or a key or value) of head `head`
// (a kv head for keys and values) of tensor `tensor`, under `staged` as
// the tiles take them (zero past the tensor); rows where `quads_at` holds.
// `tensor` is a constant at each call.
fn quad_of(tensor: u32, head: u32, row: u32, d: u32, staged: f32) -> vec4<f16> {
    let len = select(p.kv_len, p.q_len, tensor == QUERIES);
    if (row >= len || d >= p.head_dim) {
        return vec4<f16>();
    }
    let dim = head * p.head_dim + d;
    var stored: vec4<f16>;
    var piece: f32;
    switch tensor {
        case QUERIES: {
            stored = q_quads[(p.q_offset + row * p.q_stride + dim) / 4u];
            piece = q_scales[p.q_scale_offset + row * p.q_scale_stride + dim / p.qkv_piece];
        }
        case KEYS: {
            stored = k_quads[(p.k_offset + row * p.k_stride + dim) / 4u];
            piece = k_scales[p.k_scale_offset + row * p.k_scale_stride + dim / p.qkv_piece];
        }
        default: {
            stored = v_quads[(p.v_offset + row * p.v_stride + dim) / 4u];
            piece = v_scales[p.v_scale_offset + row * p.v_scale_stride + dim / p.qkv_piece];
        }
    }
    return shifted_quad(stored, piece, staged);
}

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

// Dims d … d + 3 of row `row` of head `head` of `tensor` (as
// attention_qkv.wgsl's tensor_run), under `staged` as the tiles take them
// (zero past the tensor); rows where `quads_at` holds.
fn tensor_quad(tensor: u32, head: u32, row: u32, d: u32, staged: f32) -> vec4<f16> {
    let t = rows_of(tensor);
    if (row >= t.len || d >= p.head_dim) {
        return vec4<f16>();
    }
    let at = element_of(t, head, row, d) / 4u;
    var stored: vec4<f16>;
    switch tensor {
        case QUERIES: {
            stored = q_quads[at];
        }
        case KEYS: {
            stored = k_quads[at];
        }
        default: {
            stored = v_quads[at];
        }
    }
    return shifted_quad(stored, piece_scale_of(tensor, piece_of(t, head, row, d)), staged);
}

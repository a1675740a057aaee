// matrix_gemm.wgsl's k steps in workgroup memory where the operands are
// f32 (8×8 tiles, Apple GPUs): one operand an element, as Metal's
// simdgroup loads read them (a pointer at an element, the stride in
// elements). The same interface as matrix_tiles_vec4.wgsl.
const TILE_VEC: u32 = 1u;
var<workgroup> a_tiles: array<Operand, A_STAGED>;
var<workgroup> b_tiles: array<Operand, B_STAGED>;

fn put_a(at: u32, v: f32) {
    a_tiles[at] = Operand(v);
}

fn put_b(at: u32, v: f32) {
    b_tiles[at] = Operand(v);
}

fn put_a4(at: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        a_tiles[at + i] = Operand(v[i]);
    }
}

fn put_b4(at: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        b_tiles[at + i] = Operand(v[i]);
    }
}

// W's words are packed into f16 only where the operands are f16; the words
// widened, for the same interface.
fn put_b_words(at: u32, words: vec4<u32>) {
    put_b4(at, vec4<f32>(unpack2x16float(words.x), unpack2x16float(words.y)));
    put_b4(at + 4u, vec4<f32>(unpack2x16float(words.z), unpack2x16float(words.w)));
}

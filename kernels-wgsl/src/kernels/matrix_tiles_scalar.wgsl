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

fn put_a_quad(at: u32, q: vec4<Operand>) {
    for (var i = 0u; i < 4u; i++) {
        a_tiles[at + i] = q[i];
    }
}

fn put_b_quad(at: u32, q: vec4<Operand>) {
    for (var i = 0u; i < 4u; i++) {
        b_tiles[at + i] = q[i];
    }
}

// matrix_gemm.wgsl's k steps in workgroup memory where the operands are
// f16: vec4s of four consecutive terms of a row of A (of a column of B), so
// that a step's values go in four at a store (f16 ones as they are), and
// the cooperative loads read the vec4s (a load's pointer at a vec4, its
// stride in vec4s: LD and each tile's first term are whole vec4s, T being 8
// or 16).
const TILE_VEC: u32 = 4u;
override A_VEC4S: u32 = A_STAGED / 4u;
override B_VEC4S: u32 = B_STAGED / 4u;
var<workgroup> a_tiles: array<vec4<Operand>, A_VEC4S>;
var<workgroup> b_tiles: array<vec4<Operand>, B_VEC4S>;

// One term of A (of B) at element `at` of its tiles, rounded to f16.
fn put_a(at: u32, v: f32) {
    a_tiles[at / 4u][at % 4u] = Operand(v);
}

fn put_b(at: u32, v: f32) {
    b_tiles[at / 4u][at % 4u] = Operand(v);
}

// Four consecutive terms from element `at` (a multiple of 4), rounded to f16.
fn put_a4(at: u32, v: vec4<f32>) {
    a_tiles[at / 4u] = vec4<Operand>(v);
}

fn put_b4(at: u32, v: vec4<f32>) {
    b_tiles[at / 4u] = vec4<Operand>(v);
}

// Four consecutive terms from element `at` (a multiple of 4) as they are
// stored: f16 values already under their row's (column's) range scale.
fn put_a_quad(at: u32, q: vec4<Operand>) {
    a_tiles[at / 4u] = q;
}

fn put_b_quad(at: u32, q: vec4<Operand>) {
    b_tiles[at / 4u] = q;
}

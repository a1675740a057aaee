// linear_half_quads.wgsl's and half_octets.wgsl's interface where the
// operands are f32 (a module without f16): the same buffers at bindings 20
// and 21 read as words of f16 pairs, each value widened exactly.
@group(0) @binding(20) var<storage, read_write> x_quads: array<vec2<u32>>;
@group(0) @binding(21) var<storage, read> w_octets: array<vec4<u32>>;

fn widened(words: vec2<u32>) -> vec4<Operand> {
    return vec4<Operand>(unpack2x16float(words.x), unpack2x16float(words.y));
}

fn x_half_quad(at: u32) -> vec4<Operand> {
    return widened(x_quads[at]);
}

fn w_half_octet(at: u32) -> array<vec4<Operand>, 2> {
    let words = w_octets[at];
    return array<vec4<Operand>, 2>(widened(words.xy), widened(words.zw));
}

// The f16 values a vec4 linear copies into its tiles as they are stored
// (f16 operands): x's f16 rows (x_half, binding 9) and W's packed words
// (w_vec4, binding 7), the same buffers bound again as vec4s of f16, so a
// k step moves them from memory to workgroup memory with no conversion
// (naga has no bitcast from u32 words to f16s).
@group(0) @binding(20) var<storage, read_write> x_quads: array<vec4<f16>>;
@group(0) @binding(21) var<storage, read> w_octets: array<array<vec4<f16>, 2>>;

// Four f16 values of x from vec4 `at` (values 4·at …).
fn x_half_quad(at: u32) -> vec4<Operand> {
    return x_quads[at];
}

// Eight f16 values of W from octet `at` (values 8·at …), in one load.
fn w_half_octet(at: u32) -> array<vec4<Operand>, 2> {
    return w_octets[at];
}

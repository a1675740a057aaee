// x's f16 rows as the vec4 linear copies them into its tiles (f16
// operands): x_half's buffer (binding 9) bound again at binding 20 as vec4s
// of f16, so a k step moves them from memory to workgroup memory with no
// conversion (naga has no bitcast from u32 words to f16s).
@group(0) @binding(20) var<storage, read_write> x_quads: array<vec4<f16>>;

// Four f16 values of x from vec4 `at` (values 4·at …).
fn x_half_quad(at: u32) -> vec4<Operand> {
    return x_quads[at];
}

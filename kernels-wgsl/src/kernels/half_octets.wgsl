// W's packed f16 words (`W_HALF`) as the vec4 fetching copies them into its
// tiles (f16 operands): W's buffer bound again at binding 21 as vec4s of
// f16, so a k step moves them from memory to workgroup memory with no
// conversion (naga has no bitcast from u32 words to f16s).
@group(0) @binding(21) var<storage, read> w_octets: array<array<vec4<f16>, 2>>;

// Eight f16 values of W from octet `at` (values 8·at …), in one load.
fn w_half_octet(at: u32) -> array<vec4<Operand>, 2> {
    return w_octets[at];
}

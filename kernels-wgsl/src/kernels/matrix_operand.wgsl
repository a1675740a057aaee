// What every matrix-tier module shares about its operand type (`Operand`:
// f16 under the range rule, or f32).

// Two values as one word of f16 pairs (the first in the low half), rounded
// by the conversion to f16 the products' tiles use (`Operand(…)` where the
// module's operands are f16), so packing the f16 values widened back is
// exact whatever rounding `pack2x16float` has on an adapter: what a kernel
// writes for the next product is what that product would have staged.
fn operand_pair(v: vec2<f32>) -> u32 {
    return pack2x16float(vec2<f32>(f32(Operand(v.x)), f32(Operand(v.y))));
}

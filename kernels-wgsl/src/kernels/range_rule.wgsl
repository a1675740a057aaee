// The range rule of the half tiers (f16 and matrix), which round operands
// to f16 on their way into workgroup memory or matrix units.
//
// f16 holds magnitudes up to 65504 and normal values down to 6.1e-5; FLUX
// activations and bf16 weights can fall outside both. Each row of a
// product's left operand and each column of its right one is scaled by a
// power of two that brings its largest magnitude (over all k) into
// [2¹³, 2¹⁴) before the rounding, and the sum is scaled back in f32:
// powers of two change no significant bit, values never overflow f16, and
// small rows keep f16's full precision instead of going subnormal. Only
// values below 2⁻³⁸ of their row's largest flush to zero.

// The exponent of the power of two that brings `largest` into [2¹³, 2¹⁴) (0 for zero).
fn range_exponent(largest: f32) -> i32 {
    if (largest == 0.0) {
        return 0;
    }
    return frexp(largest).exp - 14;
}

// That power of two (1 for zero).
fn range_scale(largest: f32) -> f32 {
    return ldexp(1.0, range_exponent(largest));
}

// 1 / power for a power of two 2^e, e in [−126, 126] (every range scale a
// kernel keeps): exact, from the exponent's bits, where a division may be
// approximate (SPIR-V allows 2.5 ulp) and costs more than a multiply.
fn exact_inverse(power: f32) -> f32 {
    return bitcast<f32>(0x7f000000u - bitcast<u32>(power));
}

// v / power for a power of two: times its exact inverse where both are
// normal f32s (every range scale of f16 pieces, kept ≥ 2⁻¹²⁶), divided
// otherwise (a scale measured over f32 values so small that its inverse
// would overflow). The same values either way.
fn divided_by_power(v: vec4<f32>, power: f32) -> vec4<f32> {
    if (power >= 0x1p-126f && power <= 0x1p126f) {
        return v * exact_inverse(power);
    }
    return v / power;
}


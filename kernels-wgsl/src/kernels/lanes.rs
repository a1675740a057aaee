//! What the CPU kernels written out by the host share (`attention_lanes`,
//! `linear_lanes`, `conv_lanes`): the subgroup sizes they are written for,
//! the line emitter, and the products' vec4 views of x and W with the
//! load of a vec4 of a weight row.

/// Subgroup sizes the kernels are written for (a CPU driver's SIMD width in
/// f32 lanes: SSE, AVX2, AVX-512).
pub const LANE_COUNTS: [u32; 3] = [4, 8, 16];

/// One line of WGSL onto `s`.
macro_rules! emit {
    ($s:expr, $($arg:tt)*) => {{
        $s.push_str(&format!($($arg)*));
        $s.push('\n');
    }};
}
pub(crate) use emit;

/// x and W again as vec4s (the hosts take these kernels only where the
/// rows they read start on whole vec4s: of f32 for x, of bf16 pairs or f32
/// for W), and the bf16 pair a u32 holds.
pub const PRODUCT_PRELUDE: &str = r#"
@group(0) @binding(6) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> w4: array<vec4<u32>>;

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

"#;

/// `let w{c}_{t}`: terms `4t .. 4t + 3` of a run of the lane's weight row
/// `c` from term `first` (an expression, a multiple of 8) of the row
/// starting at vec4 `wb{c}` of `w4`, the load clamped to vec4 `last`; bf16
/// pairs or f32 as WEIGHT_BF16 says. Emitted just before the products that
/// use it, so few such values live at once (with bf16, runs `t` and `t + 1`
/// come from the same vec4, emitted as two identical loads: loading it once
/// for both measured the same time on lavapipe, docs/history/performance-2026-11.md).
pub fn weight_vec4(s: &mut String, ind: &str, c: u32, first: &str, t: u32) {
    emit!(s, "{ind}let q{c}_{t} = w4[min(wb{c} + select(({first}) / 4u + {t}u, ({first}) / 8u + {}u, WEIGHT_BF16), last)];", t / 2);
    let (a, b) = if t.is_multiple_of(2) { ("x", "y") } else { ("z", "w") };
    emit!(s, "{ind}let w{c}_{t} = select(bitcast<vec4<f32>>(q{c}_{t}), vec4<f32>(bf16_pair(q{c}_{t}.{a}), bf16_pair(q{c}_{t}.{b})), WEIGHT_BF16);");
}

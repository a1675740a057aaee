//! What the CPU kernels written out by the host share (`attention_lanes`,
//! `linear_lanes`, `conv_lanes`): the subgroup sizes they are written for,
//! the line emitter, and the products' vec4 views of x and W with the
//! loads of a run of a weight row.

use super::weight_texels::{TEXEL_BINDING, TEXEL_ROW};

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

/// x as vec4s (the hosts take these kernels only where the rows they read
/// start on whole vec4s), W's rows from the device's weight texels
/// (`weight_texels.rs`: the launcher copies them there first, texel t
/// holding vec4 t of the rows), and the bf16 pair a u32 holds.
pub fn product_prelude() -> String {
    format!(
        r#"
@group(0) @binding(6) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding({TEXEL_BINDING}) var weight_texels: texture_2d<u32>;

fn weight_texel(t: u32) -> vec4<u32> {{
    return textureLoad(weight_texels, vec2<u32>(t % {TEXEL_ROW}u, t / {TEXEL_ROW}u), 0);
}}

fn bf16_pair(word: u32) -> vec2<f32> {{
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}}

"#
    )
}

/// `var w{c}_{t}` for `t < vec4s`: terms `4t .. 4t + 3` of a run of the
/// lane's weight row `c`, from term `first` (an expression, a multiple of
/// 8) of the row starting at texel `wb{c}`, each load clamped to texel
/// `last`; bf16 pairs or f32 as WEIGHT_BF16 says.
pub fn weight_run(s: &mut String, ind: &str, c: u32, first: &str, vec4s: u32) {
    let load = |i: String| format!("weight_texel({i})");
    for t in 0..vec4s {
        emit!(s, "{ind}var w{c}_{t}: vec4<f32>;");
    }
    emit!(s, "{ind}if (WEIGHT_BF16) {{");
    for j in 0..vec4s / 2 {
        emit!(s, "{ind}    let q{j} = {};", load(format!("min(wb{c} + ({first}) / 8u + {j}u, last)")));
        emit!(s, "{ind}    w{c}_{} = vec4<f32>(bf16_pair(q{j}.x), bf16_pair(q{j}.y));", 2 * j);
        emit!(s, "{ind}    w{c}_{} = vec4<f32>(bf16_pair(q{j}.z), bf16_pair(q{j}.w));", 2 * j + 1);
    }
    emit!(s, "{ind}}} else {{");
    for t in 0..vec4s {
        emit!(s, "{ind}    w{c}_{t} = bitcast<vec4<f32>>({});", load(format!("min(wb{c} + ({first}) / 4u + {t}u, last)")));
    }
    emit!(s, "{ind}}}");
}

//! RoPE cos/sin tables, built on the host because WGSL's `sin`/`cos` are only
//! accurate near zero. Shaders read them as `[tokens, head_dim]` f32 rows.

/// Position ids of FLUX.2 text tokens: `(T, H, W, L) = (0, 0, 0, l)`.
pub fn text_position(l: usize) -> [f64; 4] {
    [0.0, 0.0, 0.0, l as f64]
}

/// Position ids of FLUX.2 image tokens: `(t, y, x, 0)`; `t` is 0 for the noise
/// and 10, 20, … for reference images.
pub fn image_position(t: usize, y: usize, x: usize) -> [f64; 4] {
    [t as f64, y as f64, x as f64, 0.0]
}

/// FLUX.2's 4-axis RoPE row for one token, as `Flux2PosEmbed` computes it in
/// float64: for axis `a` of width `d_a`, `ω_j = θ^(-2j/d_a)`, angle `pos_a·ω_j`,
/// each value repeated for the interleaved pair (c0, c0, c1, c1, …), axes
/// concatenated. `cos_row` and `sin_row` have `sum(axes)` entries.
pub fn flux_row(pos: [f64; 4], axes: &[usize], theta: f64, cos_row: &mut [f32], sin_row: &mut [f32]) {
    let mut col = 0;
    for (a, &dim) in axes.iter().enumerate() {
        for j in 0..dim / 2 {
            let omega = 1.0 / libm_pow(theta, (2 * j) as f64 / dim as f64);
            let angle = pos[a] * omega;
            let (s, c) = (sin(angle), cos(angle));
            for k in 0..2 {
                cos_row[col + 2 * j + k] = c as f32;
                sin_row[col + 2 * j + k] = s as f32;
            }
        }
        col += dim;
    }
}

/// Qwen3's rotate-half RoPE row for position `pos`. transformers computes the
/// inverse frequencies, the angle and its cos/sin in float32; the angle is
/// rounded to f32 here too (that rounding is the table's main error, so
/// matching it matches transformers), the cos/sin themselves in f64.
/// Layout `cat(freqs, freqs)`: entry `i` and `i + head_dim/2` share an angle.
pub fn qwen_row(pos: usize, head_dim: usize, theta: f64, cos_row: &mut [f32], sin_row: &mut [f32]) {
    let half = head_dim / 2;
    for i in 0..half {
        let exponent = ((2 * i) as f32) / head_dim as f32;
        // Two float32 roundings, as torch does them: the power, then its reciprocal.
        let power = libm_pow(theta, exponent as f64) as f32;
        let inv_freq = 1.0f32 / power;
        let angle = (pos as f32 * inv_freq) as f64;
        let (s, c) = (sin(angle) as f32, cos(angle) as f32);
        cos_row[i] = c;
        cos_row[i + half] = c;
        sin_row[i] = s;
        sin_row[i + half] = s;
    }
}

// libm rather than std: the same bits with and without std, and no_std works.
use libm::{cos, pow as libm_pow, sin};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flux_row_repeats_pairs_and_orders_axes() {
        let axes = [4, 4, 4, 4];
        let (mut c, mut s) = ([0f32; 16], [0f32; 16]);
        flux_row(image_position(0, 3, 5), &axes, 2000.0, &mut c, &mut s);
        // T axis at position 0: identity rotation.
        assert_eq!(&c[0..4], &[1.0; 4]);
        assert_eq!(&s[0..4], &[0.0; 4]);
        // H axis, j = 1: ω = 2000^(-1/2).
        let angle = 3.0 / 2000f64.sqrt();
        assert_eq!(c[6], angle.cos() as f32);
        assert_eq!(c[7], c[6]);
        assert_eq!(s[4], 3f64.sin() as f32);
        // W axis j = 0 holds x = 5.
        assert_eq!(s[8], 5f64.sin() as f32);
    }

    #[test]
    fn qwen_row_halves_share_angles() {
        let (mut c, mut s) = ([0f32; 8], [0f32; 8]);
        qwen_row(7, 8, 1e6, &mut c, &mut s);
        assert_eq!(c[0], 7f64.cos() as f32);
        assert_eq!(s[4], s[0]);
        assert_eq!(c[5], c[1]);
    }
}

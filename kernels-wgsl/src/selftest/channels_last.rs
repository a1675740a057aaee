//! The matrix tier's VAE path on the adapter's own tiles: 3×3
//! convolutions over channels-last f16 rows in pieces of 32 channels (the
//! stream as the decoder writes it), with more output channels than one
//! GEMM block holds, against core's f64 reference over the values the f16
//! inputs stand for: one reading its input through the ×2 upsampling into
//! f16 pieces onto an f16 residual (an up block's first convolution and a
//! resnet's last), one normalising its input by GroupNorm + SiLU as it
//! reads it (every resnet's convolutions). The inputs are exact in f16;
//! what remains is the f32 sums and one rounding to f16 (of each output,
//! or of each normalised operand): each pixel's relative L2 within
//! [`HALF_PRODUCT`] (pixels lie orders of magnitude apart in range).

use super::half_path::written_in_pieces;
use super::{poisoned, run_and_read, worst_rel_l2, Check, Rng, HALF_PRODUCT, WORST_ROW};
use crate::kernels::conv_nhwc::{conv2d_matrix_nhwc, NhwcInput, NhwcNorm, NhwcOutput, NhwcSource, NhwcWeights, NormActivation, TapOrder};
use crate::kernels::linear::{product_writes_pieces, MATRIX_BLOCK_TILES};
use crate::range_rule::{pack_rows, unpack_rows};
use crate::view::{HalfMat, Mat, Weight};
use crate::{Gpu, GpuError};
use flux_lite_core::oracle::{self as r, ConvShape, Weights};

/// The stream's pieces of channels in the decoder.
const PIECE: usize = 32;
/// The decoder's GroupNorm groups.
const GROUPS: usize = 32;

/// The checks `gpu` takes: none off the matrix tier's f16 tiles.
pub fn channels_last_checks(gpu: &Gpu) -> Vec<Check> {
    let Some(block) = gpu.matrix().map(|c| c.size as usize * MATRIX_BLOCK_TILES as usize) else { return Vec::new() };
    if !product_writes_pieces(gpu, PIECE as u64, false) {
        return Vec::new();
    }
    let tier = gpu.precision().name();
    let outcome = |name: String, got: Result<f64, GpuError>| match got {
        Ok(worst) => Check::measured(name, WORST_ROW, worst, HALF_PRODUCT),
        Err(e) => Check::failed(name, WORST_ROW, HALF_PRODUCT, e.to_string()),
    };
    let (cin, cout) = (block, block + PIECE);
    vec![
        outcome(
            format!("{tier} conv2d 3×3 channels-last, upsampled 7×6 → 14×12, {cin}→{cout} channels, f16 pieces of {PIECE} in and out onto an f16 residual"),
            check_upsampled_onto_residual(gpu, ConvShape::same(cin, cout, 14, 12, 3)),
        ),
        outcome(
            format!("{tier} conv2d 3×3 channels-last reading GroupNorm ({GROUPS} groups) + SiLU of its f16 input, 11×9, {cin}→{cout} channels"),
            check_normalised_input(gpu, ConvShape::same(cin, cout, 11, 9, 3)),
        ),
    ]
}

/// Channels-last values as f16 pieces of [`PIECE`] channels: the words,
/// the scales, and the values they stand for.
fn pack(x: &[f32]) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let (words, scales) = pack_rows(x, x.len() / PIECE, PIECE);
    let values = unpack_rows(&words, &scales, PIECE);
    (words, scales, values)
}

fn pieces<'a>(words: &'a wgpu::Buffer, scales: &'a wgpu::Buffer, channels: usize) -> HalfMat<'a> {
    HalfMat::pieces(Mat::new(words, (channels / 2) as u64), Mat::new(scales, (channels / PIECE) as u64), PIECE as u64)
}

/// `[rows, cols]` values as `[cols, rows]`: channels-last `[pixels, channels]`
/// as PyTorch's `[channels, pixels]`, and PyTorch's back.
fn transposed<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect()
}

/// W `[co, ci, ky, kx]` (as the model's files hold it) with its taps in
/// `[co, ky, kx, ci]` order, the order the decoder's weights reach the device in.
fn taps_channels_last(w: &[u16], ci: usize, taps: usize) -> Vec<u16> {
    (0..w.len()).map(|i| (i / (taps * ci), i % (taps * ci))).map(|(co, rest)| w[co * ci * taps + (rest % ci) * taps + rest / ci]).collect()
}

/// Seeded W and bias, uploaded in the decoder's tap order.
struct ConvWeights {
    w: Vec<u16>,
    b: Vec<u16>,
    wb: crate::DeviceBuffer,
    bb: crate::DeviceBuffer,
}

impl ConvWeights {
    fn new(gpu: &Gpu, rng: &mut Rng, s: ConvShape) -> Self {
        let taps = s.kernel * s.kernel;
        let (w, b) = (rng.bf16s(s.out_channels * s.in_channels * taps, 0.1), rng.bf16s(s.out_channels, 1.0));
        let (wb, bb) = (gpu.upload_bf16("w", &taps_channels_last(&w, s.in_channels, taps)), gpu.upload_bf16("b", &b));
        Self { w, b, wb, bb }
    }

    fn nhwc(&self) -> NhwcWeights<'_> {
        NhwcWeights { w: Weight::bf16(&self.wb), bias: Weight::bf16(&self.bb), order: TapOrder::ChannelsLast }
    }

    /// The reference convolution of channels-last `x` (of `s`'s input size), channels-last out.
    fn reference(&self, x: &[f32], s: ConvShape) -> Vec<f64> {
        let (pixels, out_pixels) = (s.height * s.width, s.out_height * s.out_width);
        let mut y = vec![0.0; s.out_channels * out_pixels];
        r::conv2d(&transposed(x, pixels, s.in_channels), Weights::Bf16(&self.w), Weights::Bf16(&self.b), s, &mut y);
        transposed(&y, s.out_channels, out_pixels)
    }
}

/// `s` is the output's shape: the stored input is half its height and width.
fn check_upsampled_onto_residual(gpu: &Gpu, s: ConvShape) -> Result<f64, GpuError> {
    let (cin, cout) = (s.in_channels, s.out_channels);
    let (stored, out_pixels) = ((s.height / 2) * (s.width / 2), s.out_height * s.out_width);
    let mut rng = Rng::new(80);
    let mut x = rng.normals(stored * cin, 1.0);
    // A pixel far larger than the rest, and one far smaller.
    x[3 * cin..4 * cin].iter_mut().for_each(|v| *v *= 300.0);
    x[5 * cin..6 * cin].iter_mut().for_each(|v| *v *= 1e-3);
    let (x_words, x_scales, x_values) = pack(&x);
    let (r_words, r_scales, r_values) = pack(&rng.normals(out_pixels * cout, 2.0));
    let weights = ConvWeights::new(gpu, &mut rng, s);
    // What the kernel reads: each stored pixel twice in each direction.
    let upsampled: Vec<f32> = (0..s.height * s.width).flat_map(|p| {
        let source = (p / s.width / 2) * (s.width / 2) + (p % s.width) / 2;
        x_values[source * cin..(source + 1) * cin].to_vec()
    }).collect();
    let want: Vec<f64> = weights.reference(&upsampled, s).iter().zip(&r_values).map(|(y, r)| y + f64::from(*r)).collect();
    let (xw, xs) = (gpu.upload_u32("x", &x_words), gpu.upload_f32("x scales", &x_scales));
    let (rw, rs) = (gpu.upload_u32("residual", &r_words), gpu.upload_f32("residual scales", &r_scales));
    let stored_shape = ConvShape { height: s.height / 2, width: s.width / 2, ..s };
    let got = written_in_pieces(gpu, [out_pixels, cout], PIECE, |enc, y| {
        let output = NhwcOutput::Half { y, residual: Some(pieces(&rw, &rs, cout)), relu: false };
        conv2d_matrix_nhwc(gpu, enc, pieces(&xw, &xs, cin).into(), weights.nhwc(), output, stored_shape, NhwcInput::Upsampled)
    })?;
    Ok(worst_rel_l2(&got, &want, cout))
}

fn check_normalised_input(gpu: &Gpu, s: ConvShape) -> Result<f64, GpuError> {
    let (cin, cout, pixels) = (s.in_channels, s.out_channels, s.height * s.width);
    let mut rng = Rng::new(81);
    let mut x = rng.normals(pixels * cin, 2.0);
    // Groups off zero, and a pixel far larger than the rest.
    x.iter_mut().enumerate().for_each(|(i, v)| *v += (i % cin / (cin / GROUPS)) as f32 * 0.5);
    x[4 * cin..5 * cin].iter_mut().for_each(|v| *v *= 50.0);
    let (x_words, x_scales, x_values) = pack(&x);
    let (gamma, beta) = (rng.bf16s(cin, 1.0), rng.bf16s(cin, 0.5));
    let weights = ConvWeights::new(gpu, &mut rng, s);
    // Each group's mean and 1/√(var + ε) over the values the rows stand for.
    let per_group = cin / GROUPS;
    let eps = 1e-6;
    let stats: Vec<f32> = (0..GROUPS).flat_map(|g| {
        let members: Vec<f64> = (0..pixels).flat_map(|p| (0..per_group).map(move |c| (p, g * per_group + c))).map(|(p, c)| f64::from(x_values[p * cin + c])).collect();
        let mean = members.iter().sum::<f64>() / members.len() as f64;
        let var = members.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / members.len() as f64;
        [mean as f32, (1.0 / (var + eps).sqrt()) as f32]
    }).collect();
    let bf = |v: u16| f64::from(flux_lite_core::numerics::bf16::to_f32(v));
    let normalised: Vec<f32> = x_values.iter().enumerate().map(|(i, v)| {
        let (c, g) = (i % cin, i % cin / per_group);
        let n = (f64::from(*v) - f64::from(stats[2 * g])) * f64::from(stats[2 * g + 1]) * bf(gamma[c]) + bf(beta[c]);
        r::silu(n) as f32
    }).collect();
    let want = weights.reference(&normalised, s);
    let (xw, xs) = (gpu.upload_u32("x", &x_words), gpu.upload_f32("x scales", &x_scales));
    let (sb, gb, bb) = (gpu.upload_f32("group stats", &stats), gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
    let norm = NhwcNorm { stats: Mat { buf: &sb, offset: 0, stride: 0 }, gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), groups: GROUPS as u64, activation: NormActivation::Silu };
    let yb = poisoned(gpu, pixels * cout);
    let got = run_and_read(gpu, &yb, pixels * cout, |enc| {
        let source = NhwcSource { rows: pieces(&xw, &xs, cin), norm: Some(norm) };
        conv2d_matrix_nhwc(gpu, enc, source, weights.nhwc(), NhwcOutput::F32 { y: Mat::new(&yb, cout as u64), residual: false, relu: false }, s, NhwcInput::Plain)
    })?;
    Ok(worst_rel_l2(&got, &want, cout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::f16_matrix_gpu;

    #[test]
    fn the_channels_last_checks_pass_on_matrix_units_at_the_adapters_block() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        super::super::assert_checks_pass(&channels_last_checks(&gpu), 2);
    }

    #[test]
    fn taps_go_channels_last() {
        // co 1, ci 2, a 2-tap kernel: [c0t0, c0t1, c1t0, c1t1] → [t0c0, t0c1, t1c0, t1c1].
        assert_eq!(taps_channels_last(&[1, 2, 3, 4], 2, 2), vec![1, 3, 2, 4]);
    }
}

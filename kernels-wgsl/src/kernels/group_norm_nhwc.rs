//! The last step of a GroupNorm (+ SiLU) over channels-last f32 rows, written as the next
//! convolution's f16 input under a range scale a pixel
//! (`group_norm_nhwc.wgsl`, in the f16-output norms' module): the VAE's
//! data path on the matrix tier.

use crate::device::Gpu;
use crate::dispatch::{dispatch, row_chunks, to_u32, window, Launch, Rows, Sink};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::view::{HalfMat, Mat};
use super::group_norm::{affine_windows, GroupAffine, GroupShape};
use super::linear::Input;
use super::norm::NormParams;

/// The normalised rows as f16 under a range scale each, one workgroup a pixel.
pub const GROUP_NORM_NHWC_HALF: Kernel =
    kernel(Module::NormHalf, "group_norm_nhwc_half", [128, 1, 1], &[(1, RW), (3, R), (4, R), (5, RW), (6, RW), (7, RW), (10, RW), (11, RW)], size_of::<NormParams>(), true);

/// The last step of a GroupNorm of `src`, channels-last `[pixels, channels]`
/// rows (f32, or f16 in pieces; whole pixels a row): normalised with `stats` `[groups,
/// 2]` (each group's `(mean, 1/√(var + eps))`, from
/// [`group_merge`](super::group_norm::group_merge)), times gamma plus beta,
/// SiLU after where `affine.silu`, into `dst`: f16 rows under one range
/// scale a pixel ([`HalfMat::rows`], a pixel's words `channels / 2` apart),
/// in pieces of pixels.
pub fn group_norm_nhwc_half(gpu: &Gpu, sink: &mut dyn Sink, src: Input<'_>, stats: Mat<'_>, affine: GroupAffine<'_>, dst: HalfMat<'_>, shape: GroupShape) -> Result<(), GpuError> {
    let GroupShape { channels, pixels, groups, .. } = shape;
    if !shape.channels_last || groups == 0 || !channels.is_multiple_of(groups) || !channels.is_multiple_of(2) || dst.piece.is_some() {
        return Err(GpuError::UnsupportedShape(format!("a channels-last group norm of {channels} channels in {groups} groups into f16 rows (even channels, one scale a pixel)")));
    }
    // The source's rows: f32 values, or f16 words and their pieces' scales.
    let (src_rows, src_scale_rows, piece) = match src {
        Input::F32(m) => (Rows::mat(m, channels, "group norm input"), None, 0),
        Input::Half(h) => {
            let piece = h.piece.unwrap_or(channels);
            if piece == 0 || !channels.is_multiple_of(piece) || h.data.stride != channels / 2 || h.scales.stride.max(1) != channels / piece {
                return Err(GpuError::UnsupportedShape(format!("a group norm over f16 rows of {channels} channels in pieces of {piece}")));
            }
            (Rows::mat(h.data, channels / 2, "group norm f16 input"), Some(Rows::mat(h.scales, channels / piece, "group norm input scales")), piece)
        }
    };
    let f32_stride_wrong = matches!(src, Input::F32(m) if m.stride != channels);
    if f32_stride_wrong || dst.data.stride != channels / 2 {
        return Err(GpuError::UnsupportedShape("channels-last rows are whole pixels".into()));
    }
    if pixels == 0 {
        return Ok(());
    }
    let tw = window(gpu, stats.buf, 4, stats.offset..stats.offset + 2 * groups, "group norm statistics")?;
    let (gw, bw) = affine_windows(gpu, [affine.gamma, affine.beta], channels)?;
    let shape = NormParams {
        d: to_u32(channels, "group norm channels")?,
        heads: 1,
        src_stride: to_u32(channels, "group norm channels")?,
        groups: to_u32(groups, "groups")?,
        silu: affine.silu as u32,
        w_offset: gw.local,
        shift_offset: tw.local,
        ..Default::default()
    };
    let dst_rows = Rows::mat(dst.data, channels / 2, "group norm output");
    let scale_rows = Rows::mat(dst.scales, 1, "group norm output scales");
    let constants = [("WEIGHT_BF16", affine.gamma.dtype.constant()), ("SRC_PIECE", to_u32(piece, "group norm input piece")?)];
    let mut all = vec![src_rows, dst_rows, scale_rows];
    all.extend(src_scale_rows);
    for rows in row_chunks(gpu, pixels, &all, 1)? {
        let (sw, dw, cw) = (src_rows.window(gpu, &rows)?, dst_rows.window(gpu, &rows)?, scale_rows.window(gpu, &rows)?);
        let ssw = match src_scale_rows {
            Some(r) => r.window(gpu, &rows)?,
            None => sw.clone(),
        };
        let params = NormParams {
            rows: to_u32(rows.end - rows.start, "group norm pixels")?,
            src_offset: sw.local,
            src_scales: ssw.local,
            dst_offset: dw.local,
            dst_stride: to_u32(dst.data.stride, "group norm output stride")?,
            scales_offset: cw.local,
            ..shape
        };
        let launch = Launch { kernel: &GROUP_NORM_NHWC_HALF, constants: &constants, params, grid: wrapped_grid(rows.end - rows.start) };
        dispatch(gpu, sink, launch, &[(1, &sw), (3, &gw), (4, &bw), (5, &tw), (6, &dw), (7, &cw), (10, &sw), (11, &ssw)]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::group_norm::{group_merge, group_moments, GroupStats};
    use crate::range_rule::{pack_rows, unpack_rows};
    use crate::testing::*;
    use crate::view::Weight;
    use flux_lite_core::oracle::{self as r, Weights};

    /// GroupNorm (+ SiLU) of seeded channels-last rows against the f64
    /// oracle: each value within its f16 rounding under its pixel's scale
    /// (half an f16 step, 2⁻¹¹ of the value, or 2⁻²⁵ of the scale below
    /// f16's normals) plus the f32 arithmetic's 1e-5 of the row's largest
    /// magnitude (2¹⁴ scales at most: a value near 0 is a difference of
    /// terms as large as the row's).
    /// With `src_piece`, the source is f16 rows in pieces of that many
    /// channels (the VAE's stream), and the oracle takes the values they stand for.
    fn check_group_norm_nhwc(gpu: &Gpu, [channels, width, rows, groups]: [usize; 4], silu: bool, seed: u64, src_piece: Option<usize>) {
        let pixels = width * rows;
        let mut rng = Rng::new(seed);
        let mut x = rng.normals(channels * pixels, 2.0);
        // A group far off zero (a large mean), and one pixel far larger than the rest.
        x[..channels / groups * pixels].iter_mut().for_each(|v| *v += 50.0);
        x.iter_mut().skip(pixels / 2).step_by(pixels).for_each(|v| *v *= 30.0);
        let (gamma, beta) = (rng.bf16s(channels, 1.0), rng.bf16s(channels, 0.5));
        let widen = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| flux_lite_core::numerics::bf16::to_f32(h)).collect() };
        let mut nhwc: Vec<f32> = (0..pixels * channels).map(|i| x[(i % channels) * pixels + i / channels]).collect();
        // An f16 source: its words and scales, and the values they stand for.
        let packed = src_piece.map(|piece| {
            let (words, scales) = pack_rows(&nhwc, pixels * channels / piece, piece);
            nhwc = unpack_rows(&words, &scales, piece);
            (gpu.upload_u32("x words", &words), gpu.upload_f32("x scales", &scales), piece)
        });
        let x: Vec<f32> = (0..pixels * channels).map(|i| nhwc[(i % pixels) * channels + i / pixels]).collect();
        let mut want = vec![0.0; channels * pixels];
        r::group_norm(&x, Weights::F32(&widen(&gamma)), Weights::F32(&widen(&beta)), [channels, pixels, groups], 1e-6, silu, &mut want);
        let xb = gpu.upload_f32("x", &nhwc);
        let (gb, bb) = (gpu.upload_bf16("gamma", &gamma), gpu.upload_bf16("beta", &beta));
        let (words_len, len) = (pixels * channels / 2, pixels * channels / 2 + pixels + 2 * groups + 2 * groups * rows);
        let out = poisoned(gpu, len);
        let dst = HalfMat::rows(Mat::new(&out, (channels / 2) as u64), Mat { buf: &out, offset: words_len as u64, stride: 1 });
        let stats = Mat { buf: &out, offset: (words_len + pixels) as u64, stride: 0 };
        let affine = GroupAffine { gamma: Weight::bf16(&gb), beta: Weight::bf16(&bb), silu };
        let moments = Mat { buf: &out, offset: (words_len + pixels + 2 * groups) as u64, stride: 0 };
        let shape = GroupShape { channels: channels as u64, pixels: pixels as u64, width: width as u64, groups: groups as u64, channels_last: true };
        let src = match &packed {
            None => Input::F32(Mat::new(&xb, channels as u64)),
            Some((words, scales, piece)) => Input::Half(HalfMat::pieces(Mat::new(words, (channels / 2) as u64), Mat::new(scales, (channels / piece) as u64), *piece as u64)),
        };
        let all = run_and_read(gpu, &out, len, |enc| {
            group_moments(gpu, enc, src, moments, shape)?;
            group_merge(gpu, enc, GroupStats { moments, stats, eps: 1e-6 }, shape.moments())?;
            group_norm_nhwc_half(gpu, enc, src, stats, affine, dst, shape)
        });
        let words: Vec<u32> = all[..words_len].iter().map(|v| v.to_bits()).collect();
        let scales = &all[words_len..words_len + pixels];
        let got = unpack_rows(&words, scales, channels);
        for (i, got) in got.iter().enumerate() {
            let (pixel, c) = (i / channels, i % channels);
            let w = want[c * pixels + pixel];
            let scale = f64::from(scales[pixel]);
            let bound = w.abs() * 2f64.powi(-11) + scale * 2f64.powi(-25) + 1e-5 * scale * 2f64.powi(14);
            assert!((f64::from(*got) - w).abs() <= bound, "pixel {pixel}, channel {c}: {got} vs {w} (bound {bound:.2e}), silu {silu}, source pieces {src_piece:?}");
        }
    }

    #[test]
    fn the_channels_last_group_norm_writes_f16_rows_within_their_rounding_of_the_oracle() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        check_group_norm_nhwc(&gpu, [64, 37, 1, 8], true, 70, None);
        check_group_norm_nhwc(&gpu, [96, 15, 10, 32], false, 71, None);
        // More channels than the workgroup's invocations (the VAE's 512).
        check_group_norm_nhwc(&gpu, [512, 3, 3, 32], true, 72, None);
    }

    #[test]
    fn the_channels_last_group_norm_reads_the_stream_as_f16_pieces() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        // Pieces of 32 and 16 channels (a group within a piece, and a piece within a group).
        check_group_norm_nhwc(&gpu, [128, 19, 3, 32], true, 73, Some(32));
        check_group_norm_nhwc(&gpu, [64, 11, 5, 2], false, 74, Some(16));
    }
}

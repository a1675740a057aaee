//! GroupNorm in three dispatches over a [`GroupShape`]: each image row's
//! moments (`group_moments`), their merge in one fixed order
//! (`group_merge`), the normalisation (`group_norm_apply`, channel-major
//! f32; `group_norm_nhwc` writes channels-last f16 rows). A band of whole
//! rows computes the very moments the whole image's run does, so a banded
//! GroupNorm equals the whole one bit for bit; and every (group, row) is one
//! workgroup's work, where one workgroup a group left a GPU with as many
//! busy workgroups as groups. Shaders: `norm.wgsl`'s GroupNorm section.

use crate::device::Gpu;
use crate::dispatch::{dispatch, to_u32, window, Launch, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, wrapped_grid, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::view::{Mat, Weight};
use super::linear::Input;
use super::norm::NormParams;

pub use flux_lite_core::ir::{GroupShape, RowMoments};

/// One workgroup a (group, row): the row's moments.
pub const GROUP_MOMENTS: Kernel = kernel(Module::Norm, "group_moments", [128, 1, 1], &[(1, RW), (5, RW), (10, RW), (11, RW)], size_of::<NormParams>(), false);
/// One workgroup a group: the rows' moments merged into the statistics.
pub const GROUP_MERGE: Kernel = kernel(Module::Norm, "group_merge", [128, 1, 1], &[(2, RW), (5, RW)], size_of::<NormParams>(), false);
/// One workgroup a group's share of 256 pixels: normalised, channel-major f32.
pub const GROUP_NORM_APPLY: Kernel =
    kernel(Module::Norm, "group_norm_apply", [128, 1, 1], &[(1, RW), (2, RW), (3, R), (4, R), (5, RW)], size_of::<NormParams>(), true);

/// A GroupNorm's affine weight and bias, and whether SiLU follows.
#[derive(Debug, Clone, Copy)]
pub struct GroupAffine<'a> {
    pub gamma: Weight<'a>,
    pub beta: Weight<'a>,
    pub silu: bool,
}

/// Where a GroupNorm's statistics go: the rows' moments `[rows, groups, 2]`,
/// then each group's `(mean, 1/√(var + eps))` `[groups, 2]`.
#[derive(Debug, Clone, Copy)]
pub struct GroupStats<'a> {
    pub moments: Mat<'a>,
    pub stats: Mat<'a>,
    pub eps: f32,
}

/// `shape`'s channels, groups and rows, or why no kernel takes it; `rows`
/// whether the kernel reads its pixels by image rows.
fn checked(shape: GroupShape, rows: bool) -> Result<NormParams, GpuError> {
    let GroupShape { channels, pixels, width, groups, .. } = shape;
    if groups == 0 || !channels.is_multiple_of(groups) || width == 0 || (rows && !pixels.is_multiple_of(width)) {
        return Err(GpuError::UnsupportedShape(format!("a group norm of {channels} channels in {groups} groups over {pixels} pixels in rows of {width}")));
    }
    Ok(NormParams {
        rows: to_u32(channels, "group norm channels")?,
        d: to_u32(pixels, "group norm pixels")?,
        heads: 1,
        groups: to_u32(groups, "groups")?,
        width: to_u32(width, "group norm row")?,
        ..Default::default()
    })
}

fn tensor<'a>(gpu: &Gpu, m: Mat<'a>, shape: GroupShape, what: &'static str) -> Result<Window<'a>, GpuError> {
    window(gpu, m.buf, 4, m.offset..m.offset + shape.channels * shape.pixels, what)
}

fn moments_window<'a>(gpu: &Gpu, m: Mat<'a>, rows: u64, groups: u64) -> Result<Window<'a>, GpuError> {
    window(gpu, m.buf, 4, m.offset..m.offset + 2 * groups * rows, "group norm moments")
}

/// The rows' grid: groups across, rows down.
fn grid(p: &NormParams, shape: GroupShape) -> Result<[u32; 3], GpuError> {
    Ok([p.groups, to_u32(shape.rows(), "group norm rows")?, 1])
}

/// A GroupNorm's source: f32 values, or channels-last f16 rows in pieces
/// (the VAE's stream on the matrix tier): its words' and scales' windows,
/// and the piece (0 for f32).
pub(crate) struct Source<'a> {
    pub values: Window<'a>,
    pub scales: Window<'a>,
    pub piece: u64,
}

impl<'a> Source<'a> {
    /// `src`'s windows over `shape`'s pixels: f32 in either layout, f16
    /// channels-last in pieces that divide the channels, whole pixels a row.
    pub(crate) fn of(gpu: &Gpu, src: Input<'a>, shape: GroupShape) -> Result<Self, GpuError> {
        match src {
            Input::F32(m) => {
                let values = tensor(gpu, m, shape, "group norm input")?;
                Ok(Self { scales: values.clone(), values, piece: 0 })
            }
            Input::Half(h) => {
                let (c, pixels) = (shape.channels, shape.pixels);
                let piece = h.piece.unwrap_or(c);
                if !shape.channels_last || piece == 0 || !c.is_multiple_of(piece) || h.data.stride != c / 2 || h.scales.stride.max(1) != c / piece {
                    return Err(GpuError::UnsupportedShape(format!("a group norm over f16 rows of {c} channels in pieces of {piece} (channels-last, whole pixels a row)")));
                }
                let values = window(gpu, h.data.buf, 4, h.data.offset..h.data.offset + pixels * c / 2, "group norm f16 input")?;
                let scales = window(gpu, h.scales.buf, 4, h.scales.offset..h.scales.offset + pixels * (c / piece), "group norm input scales")?;
                Ok(Self { values, scales, piece })
            }
        }
    }

    /// The kernels' override constant for it.
    pub(crate) fn constant(&self) -> Result<(&'static str, u32), GpuError> {
        Ok(("SRC_PIECE", to_u32(self.piece, "group norm input piece")?))
    }
}

/// Each group's `(mean, Σ(x − mean)²)` over each image row of `src` into
/// `moments` `[rows, groups, 2]`.
pub fn group_moments(gpu: &Gpu, sink: &mut dyn Sink, src: Input<'_>, moments: Mat<'_>, shape: GroupShape) -> Result<(), GpuError> {
    let p = checked(shape, true)?;
    if shape.pixels == 0 {
        return Ok(());
    }
    let (source, mw) = (Source::of(gpu, src, shape)?, moments_window(gpu, moments, shape.rows(), shape.groups)?);
    let params = NormParams { src_offset: source.values.local, src_scales: source.scales.local, shift_offset: mw.local, ..p };
    let constants = [("CHANNELS_LAST", shape.channels_last as u32), source.constant()?];
    let launch = Launch { kernel: &GROUP_MOMENTS, constants: &constants, params, grid: grid(&p, shape)? };
    dispatch(gpu, sink, launch, &[(1, &source.values), (5, &mw), (10, &source.values), (11, &source.scales)]);
    Ok(())
}

/// The rows' moments `of` merged in one fixed order into `stats`.
pub fn group_merge(gpu: &Gpu, sink: &mut dyn Sink, stats: GroupStats<'_>, of: RowMoments) -> Result<(), GpuError> {
    let RowMoments { rows, groups, per_row } = of;
    if groups == 0 || per_row == 0 {
        return Err(GpuError::UnsupportedShape(format!("a group norm's merge of {groups} groups' moments over {per_row} values a row")));
    }
    if rows == 0 {
        return Ok(());
    }
    let mw = moments_window(gpu, stats.moments, rows, groups)?;
    let tw = window(gpu, stats.stats.buf, 4, stats.stats.offset..stats.stats.offset + 2 * groups, "group norm statistics")?;
    let params = NormParams {
        rows: to_u32(rows, "group norm rows")?,
        groups: to_u32(groups, "groups")?,
        width: to_u32(per_row, "group norm values a row")?,
        shift_offset: mw.local,
        dst_offset: tw.local,
        eps: stats.eps,
        ..Default::default()
    };
    dispatch(gpu, sink, Launch { kernel: &GROUP_MERGE, constants: &[], params, grid: [params.groups, 1, 1] }, &[(2, &tw), (5, &mw)]);
    Ok(())
}

/// Windows of a norm's affine weight and bias over `channels`, which the
/// kernels index with one offset.
pub(crate) fn affine_windows<'a>(gpu: &Gpu, [gamma, beta]: [Weight<'a>; 2], channels: u64) -> Result<(Window<'a>, Window<'a>), GpuError> {
    if gamma.dtype != beta.dtype {
        return Err(GpuError::UnsupportedShape("group norm weight and bias must share a dtype".into()));
    }
    let gw = window(gpu, gamma.buf, gamma.dtype.bytes(), gamma.offset..gamma.offset + channels, "group norm weight")?;
    let bw = window(gpu, beta.buf, beta.dtype.bytes(), beta.offset..beta.offset + channels, "group norm bias")?;
    if gw.local != bw.local {
        return Err(GpuError::UnsupportedShape("group norm weight and bias must be equally aligned".into()));
    }
    Ok((gw, bw))
}

/// Pixels one workgroup of `group_norm_apply` takes (`APPLY_PIXELS` in norm.wgsl).
const APPLY_PIXELS: u64 = 256;

/// Channel-major `src` normalised with `stats` `[groups, 2]` (each group's
/// `(mean, 1/√(var + eps))`), times gamma plus beta, SiLU after where
/// `affine.silu`, into `dst`: each value alone, so `shape`'s pixels may be
/// any run of the image's (a band need not be whole rows).
pub fn group_norm_apply(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, stats: Mat<'_>, affine: GroupAffine<'_>, dst: Mat<'_>, shape: GroupShape) -> Result<(), GpuError> {
    let p = checked(shape, false)?;
    if shape.channels_last {
        return Err(GpuError::UnsupportedShape("a channels-last group norm writes f16 rows (group_norm_nhwc)".into()));
    }
    if shape.pixels == 0 {
        return Ok(());
    }
    let (sw, dw) = (tensor(gpu, src, shape, "group norm input")?, tensor(gpu, dst, shape, "group norm output")?);
    let tw = window(gpu, stats.buf, 4, stats.offset..stats.offset + 2 * shape.groups, "group norm statistics")?;
    let (gw, bw) = affine_windows(gpu, [affine.gamma, affine.beta], shape.channels)?;
    let params = NormParams { src_offset: sw.local, dst_offset: dw.local, shift_offset: tw.local, w_offset: gw.local, silu: affine.silu as u32, ..p };
    let constants = [("WEIGHT_BF16", affine.gamma.dtype.constant())];
    let launch = Launch { kernel: &GROUP_NORM_APPLY, constants: &constants, params, grid: wrapped_grid(shape.groups * shape.pixels.div_ceil(APPLY_PIXELS)) };
    dispatch(gpu, sink, launch, &[(1, &sw), (2, &dw), (3, &gw), (4, &bw), (5, &tw)]);
    Ok(())
}

/// The whole channel-major GroupNorm: the three dispatches.
pub fn group_norm(gpu: &Gpu, sink: &mut dyn Sink, src: Mat<'_>, stats: GroupStats<'_>, affine: GroupAffine<'_>, dst: Mat<'_>, shape: GroupShape) -> Result<(), GpuError> {
    group_moments(gpu, sink, Input::F32(src), stats.moments, shape)?;
    group_merge(gpu, sink, stats, shape.moments())?;
    group_norm_apply(gpu, sink, src, stats.stats, affine, dst, shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    fn check_group_norm(silu: bool) {
        held(&format!("group_norm silu={silu}"), crate::selftest::check_group_norm(gpu(), silu, 9 + silu as u64));
    }

    #[test]
    fn group_norm_affine() {
        check_group_norm(false);
    }

    #[test]
    fn group_norm_then_silu() {
        check_group_norm(true);
    }

    /// GroupNorm by bands of rows, as the banded VAE runs it: each band's
    /// moments against f64, the merged statistics, every band normalised
    /// against the reference GroupNorm of the whole tensor.
    #[test]
    fn group_norm_over_row_bands_matches_the_reference() {
        held("group_norm over row bands", crate::selftest::check_group_norm_by_bands(gpu()));
    }

    /// Moments by bands of rows, each band's tensor alone, land in the whole
    /// moments where the whole image's run puts them, bit for bit; so do the
    /// statistics and the normalised values, in both layouts.
    #[test]
    fn a_group_norm_by_bands_of_rows_equals_the_whole_one_bit_for_bit() {
        let gpu = gpu();
        let (channels, groups, width, rows) = (12usize, 3usize, 7usize, 9usize);
        let pixels = width * rows;
        let mut rng = Rng::new(41);
        let x: Vec<f32> = rng.normals(channels * pixels, 3.0).into_iter().map(|v| v + 5.0).collect();
        for channels_last in [false, true] {
            let shape = GroupShape { channels: channels as u64, pixels: pixels as u64, width: width as u64, groups: groups as u64, channels_last };
            let whole = {
                let (xb, mb) = (gpu.upload_f32("x", &x), poisoned(gpu, 2 * groups * rows));
                run_and_read(gpu, &mb, 2 * groups * rows, |enc| group_moments(gpu, enc, Input::F32(Mat::new(&xb, 0)), Mat::new(&mb, 0), shape))
            };
            let mb = poisoned(gpu, 2 * groups * rows);
            for (r0, r1) in [(0usize, 2usize), (2, 6), (6, 9)] {
                let band: Vec<f32> = match channels_last {
                    true => x[r0 * width * channels..r1 * width * channels].to_vec(),
                    false => (0..channels).flat_map(|c| x[c * pixels + r0 * width..c * pixels + r1 * width].to_vec()).collect(),
                };
                let xb = gpu.upload_f32("band", &band);
                let at = Mat { buf: &mb, offset: (2 * groups * r0) as u64, stride: 0 };
                gpu.submit(|enc| group_moments(gpu, enc, Input::F32(Mat::new(&xb, 0)), at, shape.band((r1 - r0) as u64))).unwrap();
            }
            let banded = gpu.read_f32(&mb, 0, 2 * groups * rows).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&banded), bits(&whole), "channels_last {channels_last}");
        }
    }
}

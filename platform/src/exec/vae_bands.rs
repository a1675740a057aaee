//! The VAE decode or encode (or the preview decoder's decode) of an image
//! too large for the device memory it may take: core's program run op by
//! op over bands of rows (elementwise ops by runs of values),
//! with every activation of the whole image kept in a scratch file mapped
//! into memory ([`HostTensors`]: the OS can write out what the process is
//! not using, and the process's own memory stays a band's worth) or, where
//! the budget holds them but no binding does, on the device
//! ([`DeviceTensors`]: a band moves by copies on the device).
//!
//! Each op sees what it would see untiled: a 3×3 convolution gets a row of
//! halo from the neighbouring bands, a GroupNorm takes its statistics over
//! the whole image (each band's rows' moments, merged as the whole run merges them), and the
//! mid-block attention sees every token (chunks of keys carrying its online
//! softmax). Every op computes each of its values as the whole image's run
//! does, so the banded decode is the untiled one bit for bit, while the
//! device holds one band's operands: a fixed number of elements whatever
//! the image size.

use crate::error::RunError;
use flux_lite_kernels::kernels::Gemm;
use flux_lite_kernels::Gpu;
use crate::exec::device_weights::DeviceWeights;
use crate::exec::runner::Runner;
use flux_lite_core::ir::{level_words, GroupShape, InputNorm, Op, Operand, RowMoments, Span};
use flux_lite_core::oracle::ConvShape;
use flux_lite_core::models::tensors::TensorName;
use flux_lite_core::models::vae_nhwc::half_rows;
use flux_lite_core::BumpArena;
use crate::exec::activations::{Activations, Window};
#[cfg(doc)]
use crate::exec::activations::{DeviceTensors, HostTensors};

use flux_lite_core::models::vae::{band_arena_bytes, nhwc_band_elements, BAND_ALIGN as ALIGN};

mod attention;
use attention::Attending;

/// `[lo, hi)` steps of `band` over `0..n`.
fn bands(n: u64, band: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..n).step_by(band.max(1) as usize).map(move |lo| (lo, (lo + band).min(n)))
}

/// Runs ops of a VAE program over bands in a device arena of `capacity` elements.
#[derive(Debug)]
pub struct BandRunner<'a> {
    pub gpu: &'a Gpu,
    pub runner: &'a Runner,
    pub weights: &'a DeviceWeights,
    /// f32 elements one band's operands may take.
    pub capacity: u64,
}

/// Hands out aligned operand spans in the band arena, from its start, for one band op.
struct Operands(BumpArena);

impl Operands {
    fn take(&mut self, elements: u64) -> Result<Span, RunError> {
        let s = self.0.alloc(4 * elements.max(1), ALIGN).map_err(|e| RunError::layout("banded VAE")(&e))?;
        Ok(Span::new(s.offset / 4, 0))
    }
}

impl BandRunner<'_> {
    /// Runs one op of core's decode or encode program on the whole image's activations.
    pub fn run(&self, store: &mut dyn Activations, op: &Op) -> Result<(), RunError> {
        match op {
            Op::DenormUnpatchify { packed, latent, mean, var, channels, height, width, eps } => {
                let stats = LatentStats { mean, var, eps: *eps };
                self.denorm_unpatchify(store, *packed, *latent, stats, [*channels, *height, *width])
            }
            &Op::Conv2d { x, ref w, ref bias, y, shape, residual, relu } => self.conv(store, [x, y], [w, bias], shape, [residual, relu]),
            &Op::GroupMoments { src, moments, shape } => self.group_moments(store, src, moments, shape),
            &Op::GroupMerge { moments, stats, of, eps } => self.group_merge(store, [moments, stats], of, eps),
            Op::GroupNormApply { src, stats, dst, gamma, beta, shape, silu } => {
                let g = Norm { gamma, beta, shape: *shape, silu: *silu };
                self.group_norm_apply(store, [*src, (*stats).into()], *dst, g)
            }
            Op::ConvNhwc { x, w, bias, y, shape, upsample, residual, norm, relu } => self.conv_nhwc(store, [*x, *y], *residual, [w, bias], (*shape, norm.as_ref()), (*upsample, *relu)),
            &Op::HalfPack { src, dst, scales, tokens, heads, head_dim } => self.half_pack(store, [src, dst, scales], tokens, heads * head_dim),
            &Op::Residual { dst, y, rows, cols } => self.residual(store, [dst, y], rows, cols),
            Op::Linear { x, w, w_row: 0, bias, y, rows, cols, inner, gate: None } if x.is_half() => {
                self.linear_over_half_rows(store, *x, w, bias.as_ref(), *y, Gemm { m: *rows, n: *cols, k: *inner })
            }
            Op::Add { a, b, dst, rows, cols, relu } => self.add(store, *a, *b, *dst, [*rows, *cols], *relu),
            Op::UpsampleNearest2x { x, y, channels, height, width } => self.upsample(store, *x, *y, *channels, *height, *width),
            Op::Transpose { src, dst, rows, cols } => self.transpose(store, *src, *dst, *rows, *cols),
            Op::Linear { x, w, w_row: 0, bias, y, rows, cols, inner, gate: None } if !x.is_half() => self.linear(store, x.data, w, bias.as_ref(), *y, Gemm { m: *rows, n: *cols, k: *inner }),
            &Op::CarriedAttention { q, k, v, o, q_len, kv_len, heads, head_dim, carry: None } => self.attention(store, [q, k, v, o], [q_len, kv_len], head_dim, Attending::Carried { heads }),
            &Op::ChunkedAttention { q, k, v, o, q_len, kv_len, head_dim, carry: None, .. } => self.attention(store, [q, k, v, o], [q_len, kv_len], head_dim, Attending::Chunked),
            &Op::Copy { src, dst, rows, cols } => self.copy(store, src, dst, rows, cols),
            &Op::TanhClamp { src, dst, count, limit } => self.elementwise(store, src, dst, count, |src, dst, count| Op::TanhClamp { src, dst, count, limit }),
            &Op::Relu { src, dst, count } => self.elementwise(store, src, dst, count, |src, dst, count| Op::Relu { src, dst, count }),
            &Op::ScaleShift { src, dst, count, scale, shift } => {
                self.elementwise(store, src, dst, count, |src, dst, count| Op::ScaleShift { src, dst, count, scale, shift })
            }
            &Op::PixelLevels { src, dst, count } => self.pixel_levels(store, src, dst, count),
            other => Err(cannot_band(format!("{other:?}"))),
        }
    }

    /// The 8-bit levels of `count` values by runs of whole words (four
    /// values each; the last run may end inside one).
    fn pixel_levels(&self, store: &mut dyn Activations, src: Span, dst: Span, count: u64) -> Result<(), RunError> {
        // Each value's operands take two elements, as `elementwise`'s do.
        let band = 4 * self.band(0, 8, "word of levels")?;
        for (v0, v1) in bands(count, band) {
            let mut arena = self.operands();
            let words = level_words(v1 - v0);
            let (xs, ys) = (arena.take(v1 - v0)?, arena.take(words)?);
            self.fetch(store, src, Window::run(v0, v1), xs)?;
            self.exec(Op::PixelLevels { src: xs, dst: ys, count: v1 - v0 })?;
            self.put(store, ys, dst, Window::run(v0 / 4, v0 / 4 + words))?;
        }
        Ok(())
    }

    fn operands(&self) -> Operands {
        Operands(BumpArena::new(band_arena_bytes(self.capacity)))
    }

    /// The most units (rows, pixels, tokens) a band can hold when its
    /// operands take `fixed + units · per_unit` elements.
    fn band(&self, fixed: u64, per_unit: u64, what: &str) -> Result<u64, RunError> {
        let units = self.capacity.saturating_sub(fixed) / per_unit.max(1);
        if units == 0 {
            let detail = format!("a band holds {} values, too few for one {what} of this image ({} needed); give it a larger tile", self.capacity, fixed + per_unit);
            return Err(RunError::Layout { component: "banded VAE", detail });
        }
        Ok(units)
    }

    fn exec(&self, op: Op) -> Result<(), RunError> {
        self.gpu.submit(|enc| self.runner.record(self.gpu, enc, self.weights, &op))?;
        Ok(())
    }

    /// `window` of the tensor at `src` into the band arena at `to`.
    fn fetch(&self, store: &mut dyn Activations, src: Span, window: Window, to: Span) -> Result<(), RunError> {
        store.fetch(self.gpu, self.runner, src, window, to)
    }

    /// The band at `from` into `window` of the tensor at `dst`.
    fn put(&self, store: &mut dyn Activations, from: Span, dst: Span, window: Window) -> Result<(), RunError> {
        store.put(self.gpu, self.runner, from, dst, window)
    }

    /// An op on each of `count` values alone (`make` builds it over a
    /// band's operands), by runs of values.
    fn elementwise(&self, store: &mut dyn Activations, src: Span, dst: Span, count: u64, make: impl Fn(Span, Span, u64) -> Op) -> Result<(), RunError> {
        let band = self.band(0, 2, "value")?;
        for (v0, v1) in bands(count, band) {
            let mut arena = self.operands();
            let (xs, ys) = (arena.take(v1 - v0)?, arena.take(v1 - v0)?);
            self.fetch(store, src, Window::run(v0, v1), xs)?;
            self.exec(make(xs, ys, v1 - v0))?;
            self.put(store, ys, dst, Window::run(v0, v1))?;
        }
        Ok(())
    }

    /// Packed tokens `[height·width, 4c]` to the latent `[c, 2·height, 2·width]`, by rows of tokens.
    fn denorm_unpatchify(&self, store: &mut dyn Activations, packed: Span, latent: Span, stats: LatentStats<'_>, [c, h, w]: [u64; 3]) -> Result<(), RunError> {
        let row = w * 4 * c;
        let band = self.band(0, 2 * row, "row of latent tokens")?;
        for (t0, t1) in bands(h, band) {
            let n = (t1 - t0) * row;
            let mut arena = self.operands();
            let (xs, ys) = (arena.take(n)?, arena.take(n)?);
            self.fetch(store, packed, Window::run(t0 * row, t1 * row), xs)?;
            let (mean, var, eps) = (stats.mean.clone(), stats.var.clone(), stats.eps);
            self.exec(Op::DenormUnpatchify { packed: xs, latent: ys, mean, var, channels: c, height: t1 - t0, width: w, eps })?;
            self.put(store, ys, latent, Window::columns(c, 4 * h * w, t0 * 4 * w, t1 * 4 * w))?;
        }
        Ok(())
    }

    /// A convolution by bands of output rows, each reading the input rows
    /// its kernel covers (a halo from the neighbouring bands; zeros only at
    /// the image border): stride 1 "same" and the encoder's stride-2
    /// downsampling alike. A residual one adds onto its output band's values.
    fn conv(&self, store: &mut dyn Activations, [x, y]: [Span; 2], [w, bias]: [&TensorName; 2], s: ConvShape, [residual, relu]: [bool; 2]) -> Result<(), RunError> {
        if x.offset == y.offset {
            return Err(cannot_band(format!("{s:?} in place (only out-of-place convolutions)")));
        }
        let (cin, cout, h, wd) = (s.in_channels as u64, s.out_channels as u64, s.height as u64, s.width as u64);
        let (out_h, out_w) = (s.out_height as u64, s.out_width as u64);
        let (fixed, per_row) = s.band_elements();
        let band = self.band(fixed, per_row, "convolution row")?;
        for (y0, y1) in bands(out_h, band) {
            let (g0, g1, pad_top) = s.input_rows(y0 as usize, y1 as usize);
            let (g0, g1) = (g0 as u64, g1 as u64);
            let input = Window::columns(cin, h * wd, g0 * wd, g1 * wd);
            let mut arena = self.operands();
            let (xs, ys) = (arena.take(input.values())?, arena.take(cout * (y1 - y0) * out_w)?);
            let output = Window::columns(cout, out_h * out_w, y0 * out_w, y1 * out_w);
            self.fetch(store, x, input, xs)?;
            if residual {
                self.fetch(store, y, output, ys)?;
            }
            let shape = ConvShape { height: (g1 - g0) as usize, pad_top, out_height: (y1 - y0) as usize, ..s };
            self.exec(Op::Conv2d { x: xs, w: w.clone(), bias: bias.clone(), y: ys, shape, residual, relu })?;
            self.put(store, ys, y, output)?;
        }
        Ok(())
    }

    /// `dst = src` over `[rows, cols]` views with their strides.
    fn copy(&self, store: &mut dyn Activations, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
        if rows == 0 {
            return Ok(());
        }
        if let Some(host) = store.on_host() {
            // A move inside the scratch file, not through the device.
            return host.copy_rows(src, dst, rows, cols);
        }
        let (src_stride, dst_stride) = (src.stride.max(cols), dst.stride.max(cols));
        for (r0, r1) in bands(rows, self.band(0, cols, "copied row")?) {
            let mut arena = self.operands();
            let xs = arena.take((r1 - r0) * cols)?;
            self.fetch(store, src.rows_from(r0), Window::columns(r1 - r0, src_stride, 0, cols), xs)?;
            self.put(store, xs, dst.rows_from(r0), Window::columns(r1 - r0, dst_stride, 0, cols))?;
        }
        Ok(())
    }

    /// A GroupNorm's rows' moments by bands of whole rows, each band's into
    /// its rows of `moments`: the values the whole image's run computes.
    fn group_moments(&self, store: &mut dyn Activations, src: Operand, moments: Span, shape: GroupShape) -> Result<(), RunError> {
        let (per_moments, w) = (2 * shape.groups, shape.width);
        let band = self.band(0, w * src.elements(shape.channels) + per_moments, "GroupNorm row")?;
        for (r0, r1) in bands(shape.rows(), band) {
            let mut arena = self.operands();
            let xs = self.fetch_pixels(store, &mut arena, src, shape, [r0 * w, r1 * w])?;
            let ms = arena.take(per_moments * (r1 - r0))?;
            self.exec(Op::GroupMoments { src: xs, moments: ms, shape: shape.band(r1 - r0) })?;
            self.put(store, ms, moments, Window::run(per_moments * r0, per_moments * r1))?;
        }
        Ok(())
    }

    /// The rows' moments merged into the statistics, whole (a few values a row).
    fn group_merge(&self, store: &mut dyn Activations, [moments, stats]: [Span; 2], of: RowMoments, eps: f32) -> Result<(), RunError> {
        let (n, out) = (2 * of.groups * of.rows, 2 * of.groups);
        self.band(n + out, 1, "GroupNorm's moments")?;
        let mut arena = self.operands();
        let (ms, ss) = (arena.take(n)?, arena.take(out)?);
        self.fetch(store, moments, Window::run(0, n), ms)?;
        self.exec(Op::GroupMerge { moments: ms, stats: ss, of, eps })?;
        self.put(store, ss, stats, Window::run(0, out))
    }

    /// A GroupNorm's normalisation by bands of pixels, each with the whole
    /// image's statistics: channel-major f32, or channels-last into f16 rows
    /// under a scale a pixel.
    fn group_norm_apply(&self, store: &mut dyn Activations, [src, stats]: [Operand; 2], dst: Operand, g: Norm<'_>) -> Result<(), RunError> {
        let shape = g.shape;
        let (c, fixed) = (shape.channels, 2 * shape.groups);
        if shape.channels_last != dst.is_half() || stats.is_half() {
            return Err(cannot_band(format!("a group norm of {shape:?} into {dst:?}")));
        }
        for (p0, p1) in bands(shape.pixels, self.band(fixed, src.elements(c) + c, "GroupNorm pixel")?) {
            let n = p1 - p0;
            let mut arena = self.operands();
            let xs = self.fetch_pixels(store, &mut arena, src, shape, [p0, p1])?;
            let (ss, ys) = (arena.take(fixed)?, arena.take(n * c)?);
            self.fetch(store, stats.data, Window::run(0, fixed), ss)?;
            let (gamma, beta) = (g.gamma.clone(), g.beta.clone());
            let band = GroupShape { pixels: n, ..shape };
            let out = match dst.is_half() {
                true => half_like(ys, n, c, dst),
                false => ys.into(),
            };
            self.exec(Op::GroupNormApply { src: xs, stats: ss, dst: out, gamma, beta, shape: band, silu: g.silu })?;
            match dst.is_half() {
                true => self.put_half_rows(store, out, dst, [p0, p1], c)?,
                false => self.put(store, ys, dst.data, pixels_window(shape, p0, p1))?,
            }
        }
        Ok(())
    }

    /// Pixels `[p0, p1)` of a GroupNorm's source `src` into the band: f32
    /// (channel-major or channels-last rows), or f16 rows as they are laid out.
    fn fetch_pixels(&self, store: &mut dyn Activations, arena: &mut Operands, src: Operand, shape: GroupShape, [p0, p1]: [u64; 2]) -> Result<Operand, RunError> {
        let (n, c) = (p1 - p0, shape.channels);
        if src.is_half() {
            let xs = half_like(arena.take(n * src.elements(c))?, n, c, src);
            self.fetch_half_rows(store, src, [p0, p1], c, xs)?;
            return Ok(xs);
        }
        let xs = arena.take(n * c)?;
        self.fetch(store, src.data, pixels_window(shape, p0, p1), xs)?;
        // Channels-last rows are whole pixels.
        Ok(Span::new(xs.offset, if shape.channels_last { c } else { 0 }).into())
    }

    /// Rows `[r0, r1)` of channels-last f16 rows `half` of `width` values
    /// (words, then a row's scales: one, or one a piece) into the band at `to`.
    fn fetch_half_rows(&self, store: &mut dyn Activations, half: Operand, [r0, r1]: [u64; 2], width: u64, to: Operand) -> Result<(), RunError> {
        let scales = half.scales.ok_or_else(|| cannot_band("f16 rows without their scales".into()))?;
        let per_row = scales_per_row(half, width);
        let words = width.div_ceil(2);
        self.fetch(store, half.data, Window::run(r0 * words, r1 * words), to.data)?;
        self.fetch(store, scales, Window::run(r0 * per_row, r1 * per_row), to.scales.unwrap_or(to.data))
    }

    /// The band's f16 rows `from` into rows `[r0, r1)` of `half`.
    fn put_half_rows(&self, store: &mut dyn Activations, from: Operand, half: Operand, [r0, r1]: [u64; 2], width: u64) -> Result<(), RunError> {
        let scales = half.scales.ok_or_else(|| cannot_band("f16 rows without their scales".into()))?;
        let per_row = scales_per_row(half, width);
        let words = width.div_ceil(2);
        self.put(store, from.data, half.data, Window::run(r0 * words, r1 * words))?;
        self.put(store, from.scales.unwrap_or(from.data), scales, Window::run(r0 * per_row, r1 * per_row))
    }

    /// A channels-last convolution by bands of output rows, each reading the
    /// input rows its taps reach (a halo from the neighbouring bands; zeros
    /// only at the image's border), through the ×2 upsampling where
    /// `upsample`: there every band but the first starts on an odd output
    /// row, whose taps begin on an input row's second upsampled copy, so
    /// that a band's input is whole input rows with no zeros above. Into f32
    /// rows (onto their own values where there is a residual) or f16 rows
    /// in pieces (onto the residual's); its input normalised as read with
    /// the whole image's statistics where `norm` says so; ReLU'd where `relu`.
    fn conv_nhwc(&self, store: &mut dyn Activations, [x, y]: [Operand; 2], residual: Option<Operand>, [w, bias]: [&TensorName; 2], (s, norm): (ConvShape, Option<&InputNorm>), (upsample, relu): (bool, bool)) -> Result<(), RunError> {
        let (cin, cout, h, wd) = (s.in_channels as u64, s.out_channels as u64, s.height as u64, s.width as u64);
        let (out_h, out_w) = (s.out_height as u64, s.out_width as u64);
        let in_place = residual.is_some_and(|r| r == y);
        if s.kernel > 3 || (upsample && s.kernel != 3) || !x.is_half() || (residual.is_some() && y.is_half() == in_place) {
            return Err(cannot_band(format!("a channels-last convolution {s:?} from {x:?} into {y:?} onto {residual:?}")));
        }
        // An input row's words and scales; the rows the taps reach beyond a
        // band's own, and the statistics (core's `nhwc_band_elements`).
        let input_row = wd * x.elements(cin);
        let stats = norm.map_or(0, |n| 2 * n.groups);
        let (fixed, per_row) = nhwc_band_elements(s, [x, y], residual, stats);
        let band = self.band(fixed, per_row, "convolution row")?;
        for (y0, y1) in conv_bands(out_h, band, upsample)? {
            let (g0, g1, pad_top) = match upsample {
                // Output row y reads upsampled rows y − 1 ..= y + 1, input rows (y − 1)/2 ..= (y + 1)/2.
                true => (y0.saturating_sub(1) / 2, (y1 / 2 + 1).min(h), (y0 == 0) as usize),
                false => {
                    let (g0, g1, pad) = s.input_rows(y0 as usize, y1 as usize);
                    (g0 as u64, g1 as u64, pad)
                }
            };
            let (rows_in, px_out) = (g1 - g0, (y1 - y0) * out_w);
            let mut arena = self.operands();
            let xs = half_like(arena.take(rows_in * input_row)?, rows_in * wd, cin, x);
            self.fetch_half_rows(store, x, [g0 * wd, g1 * wd], cin, xs)?;
            let norm = match norm {
                Some(n) => {
                    let ns = arena.take(stats)?;
                    self.fetch(store, n.stats, Window::run(0, stats), ns)?;
                    Some(InputNorm { stats: ns, ..n.clone() })
                }
                None => None,
            };
            let out = [y0 * out_w, y1 * out_w];
            let shape = ConvShape { height: rows_in as usize, pad_top, out_height: (y1 - y0) as usize, ..s };
            let op = |y: Operand, residual: Option<Operand>| Op::ConvNhwc { x: xs, w: w.clone(), bias: bias.clone(), y, shape, upsample, residual, norm: norm.clone(), relu };
            if y.is_half() {
                let ys = half_like(arena.take(px_out * y.elements(cout))?, px_out, cout, y);
                let rs = match residual {
                    Some(r) => {
                        let rs = half_like(arena.take(px_out * r.elements(cout))?, px_out, cout, r);
                        self.fetch_half_rows(store, r, out, cout, rs)?;
                        Some(rs)
                    }
                    None => None,
                };
                self.exec(op(ys, rs))?;
                self.put_half_rows(store, ys, y, out, cout)?;
            } else {
                let ys = Span::new(arena.take(px_out * cout)?.offset, cout);
                let output = Window::run(out[0] * cout, out[1] * cout);
                if in_place {
                    self.fetch(store, y.data, output, ys)?;
                }
                self.exec(op(ys.into(), in_place.then_some(ys.into())))?;
                self.put(store, ys, y.data, output)?;
            }
        }
        Ok(())
    }

    /// f32 rows of `width` packed as f16 rows (a scale a row of each head) by bands of rows.
    fn half_pack(&self, store: &mut dyn Activations, [src, dst, scales]: [Span; 3], rows: u64, width: u64) -> Result<(), RunError> {
        if src.stride.max(width) != width || dst.stride.max(width / 2) != width / 2 || scales.stride > 1 {
            return Err(cannot_band("a pack of rows that are not contiguous".into()));
        }
        for (r0, r1) in bands(rows, self.band(0, width + width / 2 + 1, "packed row")?) {
            let n = r1 - r0;
            let mut arena = self.operands();
            let (xs, ws, ss) = (arena.take(n * width)?, arena.take(n * width / 2)?, arena.take(n)?);
            self.fetch(store, src, Window::run(r0 * width, r1 * width), xs)?;
            self.exec(Op::HalfPack { src: Span::new(xs.offset, width), dst: Span::new(ws.offset, width / 2), scales: Span::new(ss.offset, 1), tokens: n, heads: 1, head_dim: width })?;
            self.put(store, ws, dst, Window::run(r0 * width / 2, r1 * width / 2))?;
            self.put(store, ss, scales, Window::run(r0, r1))?;
        }
        Ok(())
    }

    /// `dst += y` over contiguous rows, by bands of rows.
    fn residual(&self, store: &mut dyn Activations, [dst, y]: [Span; 2], rows: u64, cols: u64) -> Result<(), RunError> {
        if dst.stride.max(cols) != cols || y.stride.max(cols) != cols {
            return Err(cannot_band("a residual over rows that are not contiguous".into()));
        }
        for (r0, r1) in bands(rows, self.band(0, 2 * cols, "residual row")?) {
            let window = Window::run(r0 * cols, r1 * cols);
            let mut arena = self.operands();
            let (ds, ys) = (arena.take(window.values())?, arena.take(window.values())?);
            self.fetch(store, dst, window, ds)?;
            self.fetch(store, y, window, ys)?;
            self.exec(Op::Residual { dst: Span::new(ds.offset, cols), y: Span::new(ys.offset, cols), rows: r1 - r0, cols })?;
            self.put(store, ds, dst, window)?;
        }
        Ok(())
    }

    /// `y = x·Wᵀ + b` over f16 rows `x` (one scale a row), by bands of rows.
    fn linear_over_half_rows(&self, store: &mut dyn Activations, x: Operand, w: &TensorName, bias: Option<&TensorName>, y: Span, s: Gemm) -> Result<(), RunError> {
        let Gemm { m: rows, n: cols, k: inner } = s;
        if x.piece.is_some() || x.data.stride != inner / 2 || y.stride != cols {
            return Err(cannot_band("a linear over f16 rows in pieces or not contiguous".into()));
        }
        for (r0, r1) in bands(rows, self.band(0, inner / 2 + 1 + cols, "linear row")?) {
            let n = r1 - r0;
            let mut arena = self.operands();
            let (xs, ys) = (half_rows(arena.take(n * (inner / 2 + 1))?, n, inner), arena.take(n * cols)?);
            self.fetch_half_rows(store, x, [r0, r1], inner, xs)?;
            let y_band = Span::new(ys.offset, cols);
            self.exec(Op::Linear { x: xs, w: w.clone(), w_row: 0, bias: bias.cloned(), y: y_band, rows: n, cols, inner, gate: None })?;
            self.put(store, ys, y, Window::run(r0 * cols, r1 * cols))?;
        }
        Ok(())
    }

    /// `dst = a + b` (ReLU after where `relu`) over `[rows, cols]`, by bands of columns.
    fn add(&self, store: &mut dyn Activations, a: Span, b: Span, dst: Span, [rows, cols]: [u64; 2], relu: bool) -> Result<(), RunError> {
        for (c0, c1) in bands(cols, self.band(0, 3 * rows, "sum column")?) {
            let window = Window::columns(rows, cols, c0, c1);
            let mut arena = self.operands();
            let (w, n) = (c1 - c0, window.values());
            let (sa, sb, sd) = (arena.take(n)?, arena.take(n)?, arena.take(n)?);
            self.fetch(store, a, window, sa)?;
            self.fetch(store, b, window, sb)?;
            let view = |s: Span| Span::new(s.offset, w);
            self.exec(Op::Add { a: view(sa), b: view(sb), dst: view(sd), rows, cols: w, relu })?;
            self.put(store, sd, dst, window)?;
        }
        Ok(())
    }

    /// Nearest ×2 of `[c, h, w]`, by bands of input rows.
    fn upsample(&self, store: &mut dyn Activations, x: Span, y: Span, c: u64, h: u64, w: u64) -> Result<(), RunError> {
        for (y0, y1) in bands(h, self.band(0, 5 * c * w, "upsampled row")?) {
            let input = Window::columns(c, h * w, y0 * w, y1 * w);
            let mut arena = self.operands();
            let n = input.values();
            let (xs, ys) = (arena.take(n)?, arena.take(4 * n)?);
            self.fetch(store, x, input, xs)?;
            self.exec(Op::UpsampleNearest2x { x: xs, y: ys, channels: c, height: y1 - y0, width: w })?;
            self.put(store, ys, y, Window::columns(c, 4 * h * w, 4 * y0 * w, 4 * y1 * w))?;
        }
        Ok(())
    }

    /// `dst[c, r] = src[r, c]` by bands along the longer side (the pixels).
    fn transpose(&self, store: &mut dyn Activations, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
        if cols >= rows {
            // Columns [c0, c1) of src become rows [c0, c1) of dst: contiguous.
            for (c0, c1) in bands(cols, self.band(0, 2 * rows, "transposed column")?) {
                let input = Window::columns(rows, cols, c0, c1);
                let mut arena = self.operands();
                let (xs, ys) = (arena.take(input.values())?, arena.take(input.values())?);
                self.fetch(store, src, input, xs)?;
                self.exec(Op::Transpose { src: Span::new(xs.offset, c1 - c0), dst: Span::new(ys.offset, rows), rows, cols: c1 - c0 })?;
                self.put(store, ys, dst, Window::run(c0 * rows, c1 * rows))?;
            }
        } else {
            // Rows [r0, r1) of src become columns [r0, r1) of dst.
            for (r0, r1) in bands(rows, self.band(0, 2 * cols, "transposed row")?) {
                let n = (r1 - r0) * cols;
                let mut arena = self.operands();
                let (xs, ys) = (arena.take(n)?, arena.take(n)?);
                self.fetch(store, src, Window::run(r0 * cols, r1 * cols), xs)?;
                self.exec(Op::Transpose { src: Span::new(xs.offset, cols), dst: Span::new(ys.offset, r1 - r0), rows: r1 - r0, cols })?;
                self.put(store, ys, dst, Window::columns(cols, rows, r0, r1))?;
            }
        }
        Ok(())
    }

    /// `y = x·Wᵀ + b` over contiguous rows, by bands of rows.
    #[allow(clippy::too_many_arguments)] // the linear's operands and its shape
    fn linear(&self, store: &mut dyn Activations, x: Span, w: &TensorName, bias: Option<&TensorName>, y: Span, s: Gemm) -> Result<(), RunError> {
        let Gemm { m: rows, n: cols, k: inner } = s;
        if x.stride != inner || y.stride != cols {
            return Err(cannot_band("a linear over rows that are not contiguous".into()));
        }
        for (r0, r1) in bands(rows, self.band(0, inner + cols, "linear row")?) {
            let mut arena = self.operands();
            let n = r1 - r0;
            let (xs, ys) = (arena.take(n * inner)?, arena.take(n * cols)?);
            self.fetch(store, x, Window::run(r0 * inner, r1 * inner), xs)?;
            let op = Op::Linear {
                x: Span::new(xs.offset, inner).into(),
                w: w.clone(),
                w_row: 0,
                bias: bias.cloned(),
                y: Span::new(ys.offset, cols),
                rows: n,
                cols,
                inner,
                gate: None,
            };
            self.exec(op)?;
            self.put(store, ys, y, Window::run(r0 * cols, r1 * cols))?;
        }
        Ok(())
    }
}

/// The latent BatchNorm statistics a de-normalisation reads.
#[derive(Debug, Clone, Copy)]
struct LatentStats<'a> {
    mean: &'a TensorName,
    var: &'a TensorName,
    eps: f32,
}

/// A GroupNorm's weights and shape.
#[derive(Debug, Clone, Copy)]
struct Norm<'a> {
    gamma: &'a TensorName,
    beta: &'a TensorName,
    shape: GroupShape,
    silu: bool,
}

/// Bands of a convolution's `rows` output rows, at most `band` each; where
/// the input is read through the ×2 upsampling, every band after the first
/// starts on an odd row (the first is odd-long, the rest even-long).
fn conv_bands(rows: u64, band: u64, upsample: bool) -> Result<Vec<(u64, u64)>, RunError> {
    if !upsample {
        return Ok(bands(rows, band).collect());
    }
    if band < 2 {
        return Err(RunError::Layout { component: "banded VAE", detail: "a band holds too few rows of an upsampled convolution; give it a larger tile".into() });
    }
    let mut out = Vec::new();
    let mut y0 = 0;
    while y0 < rows {
        let take = if y0 == 0 { band - (1 - band % 2) } else { band - band % 2 };
        out.push((y0, (y0 + take).min(rows)));
        y0 += take;
    }
    Ok(out)
}

/// Scales a row of `width` f16 values of `half` holds: one, or one a piece.
fn scales_per_row(half: Operand, width: u64) -> u64 {
    half.piece.map_or(1, |piece| width / piece)
}

/// `rows` f16 rows of `width` at `at`, laid out as `like` is: words, then
/// a scale a row or a piece.
fn half_like(at: Span, rows: u64, width: u64, like: Operand) -> Operand {
    let words = Span::new(at.offset, width.div_ceil(2));
    match like.piece {
        None => half_rows(at, rows, width),
        Some(piece) => Operand::half_pieces(words, Span::new(at.offset + rows * words.stride, width / piece), piece),
    }
}

/// Pixels `[p0, p1)` of a GroupNorm's tensor.
fn pixels_window(shape: GroupShape, p0: u64, p1: u64) -> Window {
    match shape.channels_last {
        true => Window::run(p0 * shape.channels, p1 * shape.channels),
        false => Window::columns(shape.channels, shape.pixels, p0, p1),
    }
}

/// An op of the VAE's own program the banded run does not take: a bug in
/// the program or here, never the request's doing.
fn cannot_band(op: String) -> RunError {
    RunError::Internal(format!("the banded VAE cannot run {op}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_step_over_the_range() {
        assert_eq!(bands(7, 3).collect::<Vec<_>>(), [(0, 3), (3, 6), (6, 7)]);
    }
}

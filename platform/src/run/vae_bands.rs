//! The VAE decode or encode (or the preview decoder's decode) of an image
//! too large for the device memory it may take: core's program run op by
//! op over bands of rows (elementwise ops by runs of values),
//! with every activation of the whole image kept in a scratch file mapped
//! into memory ([`HostTensors`]), so the OS can write out what the process
//! is not using and the process's own memory stays a band's worth.
//!
//! Each op sees what it would see untiled: a 3×3 convolution gets a row of
//! halo from the neighbouring bands, a GroupNorm takes its statistics over
//! the whole image (each band's moments combined on the host), and the
//! mid-block attention sees every token (key chunks combined by their
//! log-sum-exp). The result therefore equals the untiled run up to
//! rounding, while the device holds one band's operands: a fixed number of
//! elements whatever the image size.

use flux_lite_core::bands::{AttentionMerge, Moments};
use crate::error::RunError;
use flux_lite_kernels::kernels::Gemm;
use flux_lite_kernels::Gpu;
use crate::run::device_weights::DeviceWeights;
use crate::run::runner::Runner;
use flux_lite_core::ir::{Op, Span};
use flux_lite_core::oracle::ConvShape;
use flux_lite_core::models::tensors::TensorName;
use flux_lite_core::BumpArena;

use flux_lite_core::models::vae::{band_arena_bytes, BAND_ALIGN as ALIGN};

/// Where the banded VAE's scratch file goes when set (the CLI sets it from
/// `FLUX_LITE_SCRATCH_DIR`), else the OS's temporary folder (a tmpfs there
/// keeps the activations in memory or swap; point this at a disk for very
/// large images).
static SCRATCH_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Puts the banded VAE's scratch files in `dir` (once per process).
pub fn set_scratch_dir(dir: std::path::PathBuf) {
    let _ = SCRATCH_DIR.set(dir);
}

/// The whole image's activations: core's full-size layout (every span at
/// its arena offset) in an unnamed scratch file mapped into memory. The
/// file has no name, so it is gone when the process ends, however it ends;
/// its pages are the OS's to write out and read back, so the process holds
/// a band's worth of them, not the image's.
#[derive(Debug)]
pub struct HostTensors {
    map: memmap2::MmapMut,
}

impl HostTensors {
    /// A scratch arena of `elements` f32 values (zero until written) in
    /// the scratch folder ([`set_scratch_dir`]).
    pub fn scratch(elements: u64) -> Result<Self, RunError> {
        Self::scratch_in(&SCRATCH_DIR.get().cloned().unwrap_or_else(std::env::temp_dir), elements)
    }

    /// A scratch arena of `elements` f32 values in a file without a name in `dir`.
    pub fn scratch_in(dir: &std::path::Path, elements: u64) -> Result<Self, RunError> {
        let failed = |e: std::io::Error| RunError::Scratch { dir: dir.to_path_buf(), detail: e.to_string() };
        let file = tempfile::tempfile_in(dir).map_err(failed)?;
        file.set_len(4 * elements.max(1)).map_err(failed)?;
        // SAFETY: the file has no name and is held only here, so nothing
        // else can change or truncate it while it is mapped.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(failed)?;
        Ok(Self { map })
    }

    fn values(&self) -> &[f32] {
        bytemuck::cast_slice(&self.map[..])
    }

    fn values_mut(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.map[..])
    }

    fn range(&self, span: Span, len: u64) -> Result<std::ops::Range<usize>, RunError> {
        let (start, end) = (span.offset as usize, (span.offset + len) as usize);
        if end > self.map.len() / 4 {
            return Err(RunError::Internal(format!("the banded VAE addressed values {start}..{end} of a {}-value scratch arena", self.map.len() / 4)));
        }
        Ok(start..end)
    }

    /// Writes `data` at the start of a span.
    pub fn insert(&mut self, span: Span, data: &[f32]) -> Result<(), RunError> {
        let r = self.range(span, data.len() as u64)?;
        self.values_mut()[r].copy_from_slice(data);
        Ok(())
    }

    /// The first `len` values of a span.
    pub fn get(&self, span: Span, len: u64) -> Result<&[f32], RunError> {
        let r = self.range(span, len)?;
        Ok(&self.values()[r])
    }

    /// The first `len` values of a span, to write.
    fn get_mut(&mut self, span: Span, len: u64) -> Result<&mut [f32], RunError> {
        let r = self.range(span, len)?;
        Ok(&mut self.values_mut()[r])
    }

    /// `dst = src` over `[rows, cols]` views with their strides, row by row
    /// inside the mapping (no copy of the tensor in the process's memory).
    fn copy_rows(&mut self, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
        let (src_stride, dst_stride) = (src.stride.max(cols), dst.stride.max(cols));
        let s = self.range(src, (rows - 1) * src_stride + cols)?;
        let d = self.range(dst, (rows - 1) * dst_stride + cols)?;
        if s.start < d.end && d.start < s.end {
            // Overlapping views: read all of the source before writing any of it.
            let input = self.values()[s.clone()].to_vec();
            let out = &mut self.values_mut()[d];
            for r in 0..rows as usize {
                let (s0, d0) = (r * src_stride as usize, r * dst_stride as usize);
                out[d0..d0 + cols as usize].copy_from_slice(&input[s0..s0 + cols as usize]);
            }
            return Ok(());
        }
        let values = self.values_mut();
        for r in 0..rows as usize {
            let from = s.start + r * src_stride as usize;
            values.copy_within(from..from + cols as usize, d.start + r * dst_stride as usize);
        }
        Ok(())
    }
}

/// Columns `[c0, c1)` of every row of a row-major `[rows, cols]` tensor, packed.
fn gather(src: &[f32], rows: u64, cols: u64, c0: u64, c1: u64) -> Vec<f32> {
    let (cols, c0, c1) = (cols as usize, c0 as usize, c1 as usize);
    (0..rows as usize).flat_map(|r| src[r * cols + c0..r * cols + c1].iter().copied()).collect()
}

/// Writes a packed `[rows, c1 − c0]` band into columns `[c0, c1)` of `[rows, cols]`.
fn scatter(dst: &mut [f32], rows: u64, cols: u64, c0: u64, c1: u64, band: &[f32]) {
    let (cols, c0, c1) = (cols as usize, c0 as usize, c1 as usize);
    let width = c1 - c0;
    for r in 0..rows as usize {
        dst[r * cols + c0..r * cols + c1].copy_from_slice(&band[r * width..(r + 1) * width]);
    }
}

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
        let s = self.0.alloc(4 * elements.max(1), ALIGN).map_err(|e| RunError::Internal(format!("banded VAE: {e}")))?;
        Ok(Span::new(s.offset / 4, 0))
    }
}

impl BandRunner<'_> {
    /// Runs one op of core's decode or encode program on the host-held activations.
    pub fn run(&self, host: &mut HostTensors, op: &Op) -> Result<(), RunError> {
        match op {
            Op::DenormUnpatchify { packed, latent, mean, var, channels, height, width, eps } => {
                let stats = LatentStats { mean, var, eps: *eps };
                self.denorm_unpatchify(host, *packed, *latent, stats, [*channels, *height, *width])
            }
            Op::Conv2d { x, w, bias, y, shape, relu } => self.conv(host, *x, w, bias, *y, *shape, *relu),
            Op::GroupNorm { src, dst, gamma, beta, channels, pixels, groups, eps, silu } => {
                let g = Norm { gamma, beta, channels: *channels, pixels: *pixels, groups: *groups, eps: *eps, silu: *silu };
                self.group_norm(host, *src, *dst, g)
            }
            Op::Add { a, b, dst, rows, cols, relu } => self.add(host, *a, *b, *dst, [*rows, *cols], *relu),
            Op::UpsampleNearest2x { x, y, channels, height, width } => self.upsample(host, *x, *y, *channels, *height, *width),
            Op::Transpose { src, dst, rows, cols } => self.transpose(host, *src, *dst, *rows, *cols),
            Op::Linear { x, w, w_row: 0, bias, y, rows, cols, inner } => self.linear(host, *x, w, bias.as_ref(), *y, Gemm { m: *rows, n: *cols, k: *inner }),
            Op::Attention { q, k, v, o, len, heads, head_dim } => self.attention(host, [*q, *k, *v, *o], *len, *heads, *head_dim),
            Op::Copy { src, dst, rows, cols } => Self::copy(host, *src, *dst, *rows, *cols),
            &Op::TanhClamp { src, dst, count, limit } => self.elementwise(host, src, dst, count, |src, dst, count| Op::TanhClamp { src, dst, count, limit }),
            &Op::Relu { src, dst, count } => self.elementwise(host, src, dst, count, |src, dst, count| Op::Relu { src, dst, count }),
            &Op::ScaleShift { src, dst, count, scale, shift } => {
                self.elementwise(host, src, dst, count, |src, dst, count| Op::ScaleShift { src, dst, count, scale, shift })
            }
            &Op::PixelLevels { src, dst, count } => self.elementwise(host, src, dst, count, |src, dst, count| Op::PixelLevels { src, dst, count }),
            other => Err(RunError::Internal(format!("the banded VAE cannot run {other:?}"))),
        }
    }

    fn operands(&self) -> Operands {
        Operands(BumpArena::new(band_arena_bytes(self.capacity)))
    }

    /// The most units (rows, pixels, tokens) a band can hold when its
    /// operands take `fixed + units · per_unit` elements.
    fn band(&self, fixed: u64, per_unit: u64, what: &str) -> Result<u64, RunError> {
        let units = self.capacity.saturating_sub(fixed) / per_unit.max(1);
        if units == 0 {
            let why = format!("it holds {} values, too few for one {what} of this image ({} needed); use a larger one", self.capacity, fixed + per_unit);
            return Err(RunError::Request(crate::pipeline::job::RequestError::VaeTile { tile: None, why }));
        }
        Ok(units)
    }

    fn exec(&self, op: Op) -> Result<(), RunError> {
        self.gpu.submit(|enc| self.runner.record(self.gpu, enc, self.weights, &op))?;
        Ok(())
    }

    fn upload(&self, span: Span, data: &[f32]) {
        self.runner.write(self.gpu, span, data);
    }

    fn download(&self, span: Span, len: u64) -> Result<Vec<f32>, RunError> {
        Ok(self.runner.read(self.gpu, span, 1, len)?)
    }

    /// An op on each of `count` values alone (`make` builds it over a
    /// band's operands), by runs of values.
    fn elementwise(&self, host: &mut HostTensors, src: Span, dst: Span, count: u64, make: impl Fn(Span, Span, u64) -> Op) -> Result<(), RunError> {
        let band = self.band(0, 2, "value")?;
        for (v0, v1) in bands(count, band) {
            let mut arena = self.operands();
            let (xs, ys) = (arena.take(v1 - v0)?, arena.take(v1 - v0)?);
            self.upload(xs, host.get(src.cols_from(v0), v1 - v0)?);
            self.exec(make(xs, ys, v1 - v0))?;
            let out = self.download(ys, v1 - v0)?;
            host.insert(dst.cols_from(v0), &out)?;
        }
        Ok(())
    }

    /// Packed tokens `[height·width, 4c]` to the latent `[c, 2·height, 2·width]`, by rows of tokens.
    fn denorm_unpatchify(&self, host: &mut HostTensors, packed: Span, latent: Span, stats: LatentStats<'_>, [c, h, w]: [u64; 3]) -> Result<(), RunError> {
        let row = w * 4 * c;
        let band = self.band(0, 2 * row, "row of latent tokens")?;
        for (t0, t1) in bands(h, band) {
            let input = host.get(packed, h * row)?[(t0 * row) as usize..(t1 * row) as usize].to_vec();
            let mut arena = self.operands();
            let (xs, ys) = (arena.take(input.len() as u64)?, arena.take(input.len() as u64)?);
            self.upload(xs, &input);
            let (mean, var, eps) = (stats.mean.clone(), stats.var.clone(), stats.eps);
            self.exec(Op::DenormUnpatchify { packed: xs, latent: ys, mean, var, channels: c, height: t1 - t0, width: w, eps })?;
            let out = self.download(ys, input.len() as u64)?;
            let pixels = 4 * h * w;
            scatter(host.get_mut(latent, c * pixels)?, c, pixels, t0 * 4 * w, t1 * 4 * w, &out);
        }
        Ok(())
    }

    /// A convolution by bands of output rows, each reading the input rows
    /// its kernel covers (a halo from the neighbouring bands; zeros only at
    /// the image border): stride 1 "same" and the encoder's stride-2 downsampling alike.
    #[allow(clippy::too_many_arguments)] // the convolution's operands and its ReLU
    fn conv(&self, host: &mut HostTensors, x: Span, w: &TensorName, bias: &TensorName, y: Span, s: ConvShape, relu: bool) -> Result<(), RunError> {
        if x.offset == y.offset {
            return Err(RunError::Internal(format!("the banded VAE only runs out-of-place convolutions, not {s:?} in place")));
        }
        let (cin, cout, h, wd) = (s.in_channels as u64, s.out_channels as u64, s.height as u64, s.width as u64);
        let (out_h, out_w) = (s.out_height as u64, s.out_width as u64);
        let (fixed, per_row) = s.band_elements();
        let band = self.band(fixed, per_row, "convolution row")?;
        for (y0, y1) in bands(out_h, band) {
            let (g0, g1, pad_top) = s.input_rows(y0 as usize, y1 as usize);
            let (g0, g1) = (g0 as u64, g1 as u64);
            let input = gather(host.get(x, cin * h * wd)?, cin, h * wd, g0 * wd, g1 * wd);
            let mut arena = self.operands();
            let out_len = cout * (y1 - y0) * out_w;
            let (xs, ys) = (arena.take(input.len() as u64)?, arena.take(out_len)?);
            self.upload(xs, &input);
            let shape = ConvShape { height: (g1 - g0) as usize, pad_top, out_height: (y1 - y0) as usize, ..s };
            self.exec(Op::Conv2d { x: xs, w: w.clone(), bias: bias.clone(), y: ys, shape, relu })?;
            let out = self.download(ys, out_len)?;
            scatter(host.get_mut(y, cout * out_h * out_w)?, cout, out_h * out_w, y0 * out_w, y1 * out_w, &out);
        }
        Ok(())
    }

    /// `dst = src` over `[rows, cols]` views of two host tensors: a move on the host.
    fn copy(host: &mut HostTensors, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
        if rows == 0 {
            return Ok(());
        }
        host.copy_rows(src, dst, rows, cols)
    }

    /// GroupNorm in two passes over pixel bands: each band's per-group
    /// moments, merged on the host, then every band normalised with the whole
    /// image's mean and 1/√(var + eps).
    fn group_norm(&self, host: &mut HostTensors, src: Span, dst: Span, g: Norm<'_>) -> Result<(), RunError> {
        let (c, p, groups) = (g.channels, g.pixels, g.groups);
        if groups == 0 || !c.is_multiple_of(groups) {
            return Err(RunError::Internal(format!("group norm: {c} channels in {groups} groups")));
        }
        let per = c / groups;
        let mut moments = vec![Moments::default(); groups as usize];
        for (p0, p1) in bands(p, self.band(2 * groups, c, "GroupNorm pixel")?) {
            let input = gather(host.get(src, c * p)?, c, p, p0, p1);
            let mut arena = self.operands();
            let (xs, ss) = (arena.take(input.len() as u64)?, arena.take(2 * groups)?);
            self.upload(xs, &input);
            self.exec(Op::GroupStats { src: xs, stats: ss, channels: c, pixels: p1 - p0, groups })?;
            let stats = self.download(ss, 2 * groups)?;
            for (m, s) in moments.iter_mut().zip(stats.chunks_exact(2)) {
                m.merge(Moments { count: (per * (p1 - p0)) as f64, mean: s[0] as f64, m2: s[1] as f64 });
            }
        }
        let stats: Vec<f32> = moments.iter().flat_map(|m| [m.mean as f32, (1.0 / (m.variance() + g.eps as f64).sqrt()) as f32]).collect();
        for (p0, p1) in bands(p, self.band(2 * groups, 2 * c, "GroupNorm pixel")?) {
            let input = gather(host.get(src, c * p)?, c, p, p0, p1);
            let mut arena = self.operands();
            let n = input.len() as u64;
            let (xs, ss, ys) = (arena.take(n)?, arena.take(2 * groups)?, arena.take(n)?);
            self.upload(xs, &input);
            self.upload(ss, &stats);
            let (gamma, beta) = (g.gamma.clone(), g.beta.clone());
            let pixels = p1 - p0;
            self.exec(Op::GroupNormApply { src: xs, stats: ss, dst: ys, gamma, beta, channels: c, pixels, groups, silu: g.silu })?;
            let out = self.download(ys, n)?;
            scatter(host.get_mut(dst, c * p)?, c, p, p0, p1, &out);
        }
        Ok(())
    }

    /// `dst = a + b` (ReLU after where `relu`) over `[rows, cols]`, by bands of columns.
    fn add(&self, host: &mut HostTensors, a: Span, b: Span, dst: Span, [rows, cols]: [u64; 2], relu: bool) -> Result<(), RunError> {
        for (c0, c1) in bands(cols, self.band(0, 3 * rows, "sum column")?) {
            let (ia, ib) = (gather(host.get(a, rows * cols)?, rows, cols, c0, c1), gather(host.get(b, rows * cols)?, rows, cols, c0, c1));
            let mut arena = self.operands();
            let (w, n) = (c1 - c0, ia.len() as u64);
            let (sa, sb, sd) = (arena.take(n)?, arena.take(n)?, arena.take(n)?);
            self.upload(sa, &ia);
            self.upload(sb, &ib);
            let view = |s: Span| Span::new(s.offset, w);
            self.exec(Op::Add { a: view(sa), b: view(sb), dst: view(sd), rows, cols: w, relu })?;
            let out = self.download(sd, n)?;
            scatter(host.get_mut(dst, rows * cols)?, rows, cols, c0, c1, &out);
        }
        Ok(())
    }

    /// Nearest ×2 of `[c, h, w]`, by bands of input rows.
    fn upsample(&self, host: &mut HostTensors, x: Span, y: Span, c: u64, h: u64, w: u64) -> Result<(), RunError> {
        for (y0, y1) in bands(h, self.band(0, 5 * c * w, "upsampled row")?) {
            let input = gather(host.get(x, c * h * w)?, c, h * w, y0 * w, y1 * w);
            let mut arena = self.operands();
            let n = input.len() as u64;
            let (xs, ys) = (arena.take(n)?, arena.take(4 * n)?);
            self.upload(xs, &input);
            self.exec(Op::UpsampleNearest2x { x: xs, y: ys, channels: c, height: y1 - y0, width: w })?;
            let out = self.download(ys, 4 * n)?;
            let plane = 4 * h * w;
            scatter(host.get_mut(y, c * plane)?, c, plane, 4 * y0 * w, 4 * y1 * w, &out);
        }
        Ok(())
    }

    /// `dst[c, r] = src[r, c]` by bands along the longer side (the pixels).
    fn transpose(&self, host: &mut HostTensors, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
        let n = rows * cols;
        if cols >= rows {
            // Columns [c0, c1) of src become rows [c0, c1) of dst: contiguous.
            for (c0, c1) in bands(cols, self.band(0, 2 * rows, "transposed column")?) {
                let input = gather(host.get(src, n)?, rows, cols, c0, c1);
                let mut arena = self.operands();
                let (xs, ys) = (arena.take(input.len() as u64)?, arena.take(input.len() as u64)?);
                self.upload(xs, &input);
                self.exec(Op::Transpose { src: Span::new(xs.offset, c1 - c0), dst: Span::new(ys.offset, rows), rows, cols: c1 - c0 })?;
                let out = self.download(ys, input.len() as u64)?;
                host.get_mut(dst, n)?[(c0 * rows) as usize..(c1 * rows) as usize].copy_from_slice(&out);
            }
        } else {
            // Rows [r0, r1) of src become columns [r0, r1) of dst.
            for (r0, r1) in bands(rows, self.band(0, 2 * cols, "transposed row")?) {
                let input = host.get(src, n)?[(r0 * cols) as usize..(r1 * cols) as usize].to_vec();
                let mut arena = self.operands();
                let (xs, ys) = (arena.take(input.len() as u64)?, arena.take(input.len() as u64)?);
                self.upload(xs, &input);
                self.exec(Op::Transpose { src: Span::new(xs.offset, cols), dst: Span::new(ys.offset, r1 - r0), rows: r1 - r0, cols })?;
                let out = self.download(ys, input.len() as u64)?;
                scatter(host.get_mut(dst, n)?, cols, rows, r0, r1, &out);
            }
        }
        Ok(())
    }

    /// `y = x·Wᵀ + b` over contiguous rows, by bands of rows.
    fn linear(&self, host: &mut HostTensors, x: Span, w: &TensorName, bias: Option<&TensorName>, y: Span, s: Gemm) -> Result<(), RunError> {
        let Gemm { m: rows, n: cols, k: inner } = s;
        if x.stride != inner || y.stride != cols {
            return Err(RunError::Internal("the banded VAE only runs linears over contiguous rows".into()));
        }
        for (r0, r1) in bands(rows, self.band(0, inner + cols, "linear row")?) {
            let input = host.get(x, rows * inner)?[(r0 * inner) as usize..(r1 * inner) as usize].to_vec();
            let mut arena = self.operands();
            let n = r1 - r0;
            let (xs, ys) = (arena.take(n * inner)?, arena.take(n * cols)?);
            self.upload(xs, &input);
            let op = Op::Linear {
                x: Span::new(xs.offset, inner),
                w: w.clone(),
                w_row: 0,
                bias: bias.cloned(),
                y: Span::new(ys.offset, cols),
                rows: n,
                cols,
                inner,
            };
            self.exec(op)?;
            let out = self.download(ys, n * cols)?;
            host.get_mut(y, rows * cols)?[(r0 * cols) as usize..(r1 * cols) as usize].copy_from_slice(&out);
        }
        Ok(())
    }

    /// Non-causal attention over `len` tokens `[len, heads·head_dim]`, by
    /// bands of queries and chunks of keys. Each chunk's output and
    /// log-sum-exp are merged on the host (in f64); a single chunk is taken as it is.
    fn attention(&self, host: &mut HostTensors, [q, k, v, o]: [Span; 4], len: u64, heads: u64, head_dim: u64) -> Result<(), RunError> {
        let width = heads * head_dim;
        let n = len * width;
        let band = self.band(0, 4 * width + heads, "attention token")?;
        let chunks: Vec<(u64, u64)> = bands(len, band).collect();
        for &(q0, q1) in &chunks {
            let rows = q1 - q0;
            let queries = host.get(q, n)?[(q0 * width) as usize..(q1 * width) as usize].to_vec();
            let mut merged = AttentionMerge::new(rows, heads, head_dim);
            for &(k0, k1) in &chunks {
                let keys = k0 as usize * width as usize..k1 as usize * width as usize;
                let mut arena = self.operands();
                let (qs, ks, vs) = (arena.take(rows * width)?, arena.take((k1 - k0) * width)?, arena.take((k1 - k0) * width)?);
                let (os, ls) = (arena.take(rows * width)?, arena.take(rows * heads)?);
                self.upload(qs, &queries);
                self.upload(ks, &host.get(k, n)?[keys.clone()]);
                self.upload(vs, &host.get(v, n)?[keys]);
                let view = |s: Span| Span::new(s.offset, width);
                let lse = Span::new(ls.offset, heads);
                let (q_len, kv_len) = (rows, k1 - k0);
                self.exec(Op::PartialAttention { q: view(qs), k: view(ks), v: view(vs), o: view(os), lse, q_len, kv_len, heads, head_dim })?;
                let out = self.download(os, rows * width)?;
                if chunks.len() == 1 {
                    host.get_mut(o, n)?[(q0 * width) as usize..(q1 * width) as usize].copy_from_slice(&out);
                    continue;
                }
                merged.add(&out, &self.download(ls, rows * heads)?);
            }
            if chunks.len() > 1 {
                host.get_mut(o, n)?[(q0 * width) as usize..(q1 * width) as usize].copy_from_slice(&merged.finish());
            }
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
    channels: u64,
    pixels: u64,
    groups: u64,
    eps: f32,
    silu: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_move_a_column_band() {
        let src: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let band = gather(&src, 3, 4, 1, 3);
        assert_eq!(band, [1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
        let mut dst = vec![0.0; 12];
        scatter(&mut dst, 3, 4, 1, 3, &band);
        assert_eq!(dst, [0.0, 1.0, 2.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0, 9.0, 10.0, 0.0]);
        assert_eq!(bands(7, 3).collect::<Vec<_>>(), [(0, 3), (3, 6), (6, 7)]);
    }
}

#[cfg(test)]
mod scratch_tests {
    use super::*;

    /// The banded VAE's activations live in file-backed pages: filling a
    /// 256 MiB scratch arena leaves the process's anonymous memory where it
    /// was (the OS may write those pages out and drop them), where a Vec of
    /// the same size adds all of it; and the file has no name in its folder.
    #[test]
    fn scratch_activations_are_not_anonymous_memory_and_leave_no_file() {
        let _alone = crate::host_memory::measuring_alone();
        let Some(before) = crate::host_memory::now() else {
            flux_lite_kernels::skip::skipped("this OS does not report the process's anonymous memory");
            return;
        };
        let dir = std::env::temp_dir().join(format!("flux-lite-scratch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let elements = 64u64 << 20; // 256 MiB of f32
        let mut host = HostTensors::scratch_in(&dir, elements).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the scratch file has a name");
        let band: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
        for b in 0..64 {
            host.insert(Span::new(b << 20, 0), &band).unwrap();
        }
        assert_eq!(host.get(Span::new(63 << 20, 0), 4).unwrap(), &[0.0, 1.0, 2.0, 3.0]);
        let filled = crate::host_memory::now().unwrap();
        let grown = filled.anonymous.saturating_sub(before.anonymous);
        println!("256 MiB of scratch activations: anonymous memory grew by {:.1} MiB", grown as f64 / (1 << 20) as f64);
        assert!(grown < 32 << 20, "scratch activations counted as anonymous memory: {grown} bytes");
        // The same values in a Vec are anonymous memory, as the measurement shows.
        let in_memory = vec![1.0f32; elements as usize];
        let vec_grown = crate::host_memory::now().unwrap().anonymous.saturating_sub(filled.anonymous);
        assert!(vec_grown > 200 << 20 && in_memory[12345] == 1.0, "a 256 MiB Vec grew anonymous memory by {vec_grown} bytes only");
        // Out of the arena is an error, not a panic.
        assert!(host.get(Span::new(elements - 2, 0), 4).is_err());
        drop(host);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

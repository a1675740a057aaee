//! Where a banded run ([`crate::exec::vae_bands`]) keeps the whole image's
//! activations between its ops, and how a band's operands move between
//! them and the band arena the kernels bind:
//!
//! - [`HostTensors`]: in a scratch file mapped into memory, for a budget
//!   that cannot hold them on the device: a band is gathered on the host,
//!   uploaded, run, read back and scattered;
//! - [`DeviceTensors`]: on the device, in buffers no kernel binds (so no
//!   binding limit applies to them), for an image whose activations the
//!   budget holds but one binding cannot: a band is moved by copies on the
//!   device, with no round trip through the host.
//!
//! Both hold core's full-size layout: every span at its arena offset.

use crate::error::RunError;
use crate::exec::runner::Runner;
use flux_lite_core::ir::{level_words, Span};
use flux_lite_kernels::{DeviceBuffer, Gpu};

/// A band's window on a row-major `[rows, cols]` tensor: columns `[c0, c1)` of each row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub rows: u64,
    pub cols: u64,
    pub c0: u64,
    pub c1: u64,
}

impl Window {
    /// Columns `[c0, c1)` of every row of `[rows, cols]`.
    pub fn columns(rows: u64, cols: u64, c0: u64, c1: u64) -> Self {
        Self { rows, cols, c0, c1 }
    }

    /// Values `[v0, v1)` of a contiguous tensor.
    pub fn run(v0: u64, v1: u64) -> Self {
        Self { rows: 1, cols: v1, c0: v0, c1: v1 }
    }

    /// Values the window holds, packed.
    pub fn values(&self) -> u64 {
        self.rows * (self.c1 - self.c0)
    }

    /// Values of the tensor it reads, up to its last: `(rows − 1)·cols + c1`.
    fn extent(&self) -> u64 {
        (self.rows.max(1) - 1) * self.cols + self.c1
    }

    /// Each row's `(offset in the tensor, offset in the packed band, length)`.
    fn pieces(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let width = self.c1 - self.c0;
        let whole = self.c0 == 0 && self.c1 == self.cols;
        let (count, len) = if whole { (1, self.rows * self.cols) } else { (self.rows, width) };
        (0..count).map(move |r| (r * self.cols + self.c0, r * width, len))
    }
}

/// The whole image's activations, as a banded run keeps them.
pub trait Activations {
    /// `window` of the tensor at `src`, packed into the band arena at `to`.
    fn fetch(&mut self, gpu: &Gpu, band: &Runner, src: Span, window: Window, to: Span) -> Result<(), RunError>;

    /// The packed band at `from` in the band arena, into `window` of the tensor at `dst`.
    fn put(&mut self, gpu: &Gpu, band: &Runner, from: Span, dst: Span, window: Window) -> Result<(), RunError>;

    /// Values computed on the host, written at `dst`.
    fn write(&mut self, gpu: &Gpu, dst: Span, data: &[f32]) -> Result<(), RunError>;

    /// The first `len` values at `span`, read back.
    fn read(&self, gpu: &Gpu, span: Span, len: u64) -> Result<Vec<f32>, RunError>;

    /// The first `count` 8-bit levels at `span` (four to a word, as
    /// [`flux_lite_core::ir::Op::PixelLevels`] writes them), read back.
    fn read_levels(&self, gpu: &Gpu, span: Span, count: u64) -> Result<Vec<u8>, RunError>;

    /// The scratch file, where the activations are on the host (a copy
    /// between two of them is then a move inside it).
    fn on_host(&mut self) -> Option<&mut HostTensors> {
        None
    }
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
    /// A scratch arena of `elements` f32 values (zero until written) in a
    /// file without a name in `dir` (the pipeline's scratch folder,
    /// `pipeline::Options::scratch_dir`).
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
            return Err(beyond(start as u64, end as u64, (self.map.len() / 4) as u64, "the scratch arena"));
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

    /// `dst = src` over `[rows, cols]` views with their strides, row by row
    /// inside the mapping (no copy of the tensor in the process's memory).
    pub fn copy_rows(&mut self, src: Span, dst: Span, rows: u64, cols: u64) -> Result<(), RunError> {
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

impl Activations for HostTensors {
    fn fetch(&mut self, gpu: &Gpu, band: &Runner, src: Span, window: Window, to: Span) -> Result<(), RunError> {
        let tensor = self.get(src, window.extent())?;
        let mut packed = Vec::with_capacity(window.values() as usize);
        for (at, _, len) in window.pieces() {
            packed.extend_from_slice(&tensor[at as usize..(at + len) as usize]);
        }
        band.write(gpu, to, &packed);
        Ok(())
    }

    fn put(&mut self, gpu: &Gpu, band: &Runner, from: Span, dst: Span, window: Window) -> Result<(), RunError> {
        let packed = band.read(gpu, from, 1, window.values())?;
        let r = self.range(dst, window.extent())?;
        let tensor = &mut self.values_mut()[r];
        for (at, from, len) in window.pieces() {
            tensor[at as usize..(at + len) as usize].copy_from_slice(&packed[from as usize..(from + len) as usize]);
        }
        Ok(())
    }

    fn write(&mut self, _gpu: &Gpu, dst: Span, data: &[f32]) -> Result<(), RunError> {
        self.insert(dst, data)
    }

    fn read(&self, _gpu: &Gpu, span: Span, len: u64) -> Result<Vec<f32>, RunError> {
        Ok(self.get(span, len)?.to_vec())
    }

    fn read_levels(&self, _gpu: &Gpu, span: Span, count: u64) -> Result<Vec<u8>, RunError> {
        let words = self.get(span, level_words(count))?;
        Ok(bytemuck::cast_slice::<f32, u8>(words)[..count as usize].to_vec())
    }

    fn on_host(&mut self) -> Option<&mut HostTensors> {
        Some(self)
    }
}

/// The whole image's activations on the device: core's full-size layout
/// across buffers of at most the adapter's largest buffer ("pages"), which
/// no kernel binds: a band's operands reach the band arena by copies.
#[derive(Debug)]
pub struct DeviceTensors {
    pages: Vec<DeviceBuffer>,
    /// f32 values a page holds (the last may hold fewer).
    page: u64,
    len: u64,
}

impl DeviceTensors {
    /// `elements` f32 values (zero until written) in pages of at most
    /// `max_buffer` bytes. Fails as an allocation the device refused.
    pub fn new(gpu: &Gpu, elements: u64, max_buffer: u64) -> Result<Self, RunError> {
        // Pages on 256-byte boundaries, as copies between buffers like them.
        let page = (max_buffer / 256 * 256 / 4).max(64);
        let pages = (0..elements.div_ceil(page)).map(|i| gpu.storage("banded activations", 4 * page.min(elements - i * page))).collect();
        gpu.check_faults()?;
        Ok(Self { pages, page, len: elements })
    }

    /// `[start, start + len)` as `(page, offset in it, length)` pieces, cut at page ends.
    fn locate(&self, start: u64, len: u64) -> Result<Vec<(usize, u64, u64)>, RunError> {
        if start + len > self.len {
            return Err(beyond(start, start + len, self.len, "the device"));
        }
        let mut pieces = Vec::new();
        let (mut at, end) = (start, start + len);
        while at < end {
            let (page, offset) = (at / self.page, at % self.page);
            let take = (self.page - offset).min(end - at);
            pieces.push((page as usize, offset, take));
            at += take;
        }
        Ok(pieces)
    }

    /// Records the copies of `window` between the tensor at `tensor` and
    /// the packed band at `band` in `arena`: into the band when `inward`.
    fn copies(&self, gpu: &Gpu, arena: &DeviceBuffer, tensor: Span, band: Span, window: Window, inward: bool) -> Result<(), RunError> {
        let mut moves = Vec::new();
        for (at, packed, len) in window.pieces() {
            let mut done = 0;
            for (page, offset, take) in self.locate(tensor.offset + at, len)? {
                moves.push((page, 4 * offset, 4 * (band.offset + packed + done), 4 * take));
                done += take;
            }
        }
        gpu.submit(|enc| {
            for &(page, page_at, band_at, bytes) in &moves {
                if inward {
                    enc.copy_buffer_to_buffer(&self.pages[page], page_at, arena, band_at, bytes);
                } else {
                    enc.copy_buffer_to_buffer(arena, band_at, &self.pages[page], page_at, bytes);
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

impl Activations for DeviceTensors {
    fn fetch(&mut self, gpu: &Gpu, band: &Runner, src: Span, window: Window, to: Span) -> Result<(), RunError> {
        self.copies(gpu, &band.arena, src, to, window, true)
    }

    fn put(&mut self, gpu: &Gpu, band: &Runner, from: Span, dst: Span, window: Window) -> Result<(), RunError> {
        self.copies(gpu, &band.arena, dst, from, window, false)
    }

    fn write(&mut self, gpu: &Gpu, dst: Span, data: &[f32]) -> Result<(), RunError> {
        let mut done = 0usize;
        for (page, offset, take) in self.locate(dst.offset, data.len() as u64)? {
            gpu.write(&self.pages[page], 4 * offset, bytemuck::cast_slice(&data[done..done + take as usize]));
            done += take as usize;
        }
        Ok(())
    }

    fn read(&self, gpu: &Gpu, span: Span, len: u64) -> Result<Vec<f32>, RunError> {
        let mut values = Vec::with_capacity(len as usize);
        for (page, offset, take) in self.locate(span.offset, len)? {
            values.extend(gpu.read_f32(&self.pages[page], offset, take as usize)?);
        }
        Ok(values)
    }

    fn read_levels(&self, gpu: &Gpu, span: Span, count: u64) -> Result<Vec<u8>, RunError> {
        let mut levels = Vec::with_capacity(count as usize);
        for (page, offset, take) in self.locate(span.offset, level_words(count))? {
            levels.extend(gpu.read_bytes(&self.pages[page], 4 * offset, 4 * take)?);
        }
        levels.truncate(count as usize);
        Ok(levels)
    }
}

/// How a decode (the VAE's or the preview decoder's) is laid out, as the
/// plan says ([`flux_lite_core::plan::VaePlan`], [`flux_lite_core::plan::PreviewLayout`]):
/// the whole image in one pass, or op by op over bands in the arena a
/// `tile`-pixel square takes (at most one binding) with the whole image's
/// activations in device pages ([`DeviceTensors`]) or in a host scratch
/// file ([`HostTensors`]). A tile that covers the image is the whole decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bands {
    Whole,
    OnDevice { tile: u64 },
    OnHost { tile: u64 },
}

impl Bands {
    /// The layout a plan's tile (`None`: whole) and `on_device` name.
    pub fn of(tile: Option<u64>, on_device: bool) -> Self {
        match (tile, on_device) {
            (None, _) => Self::Whole,
            (Some(tile), true) => Self::OnDevice { tile },
            (Some(tile), false) => Self::OnHost { tile },
        }
    }

    /// The band tile for an image whose longer side is `side` pixels, and
    /// whether the activations stay on the device: `None` for one pass.
    pub fn banded(self, side: u64) -> Option<(u64, bool)> {
        match self {
            Self::Whole => None,
            Self::OnDevice { tile } => Some((tile, true)),
            Self::OnHost { tile } => Some((tile, false)).filter(|_| tile < side),
        }
    }
}

impl From<flux_lite_core::plan::VaePlan> for Bands {
    fn from(p: flux_lite_core::plan::VaePlan) -> Self {
        Self::of(p.tile, p.on_device)
    }
}

impl From<flux_lite_core::plan::PreviewLayout> for Bands {
    fn from(l: flux_lite_core::plan::PreviewLayout) -> Self {
        Self::of(l.tile, l.on_device)
    }
}

/// A banded decode's whole-image activations: device pages allocated once
/// with the decoder (the plan counts them resident) and kept between its
/// decodes, or a host scratch file made for each decode.
#[derive(Debug)]
pub enum BandActivations {
    Device(std::sync::Mutex<DeviceTensors>),
    /// In a scratch file in `dir`, made at each decode.
    Host { elements: u64, dir: std::path::PathBuf },
}

impl BandActivations {
    /// `elements` f32 values on the device (`on_device`) or, at each decode, in a scratch file.
    pub fn new(gpu: &Gpu, elements: u64, on_device: bool) -> Result<Self, RunError> {
        Ok(match on_device {
            true => Self::Device(std::sync::Mutex::new(DeviceTensors::new(gpu, elements, gpu.plan_limits().max_buffer)?)),
            false => Self::Host { elements, dir: std::env::temp_dir() },
        })
    }

    /// Puts the scratch files in `dir` (where the activations are on the host).
    pub fn in_folder(&mut self, dir: &std::path::Path) {
        if let Self::Host { dir: at, .. } = self {
            *at = dir.to_path_buf();
        }
    }

    /// The store for one decode: the device pages, held until dropped, or a new scratch file.
    pub fn hold(&self) -> Result<HeldActivations<'_>, RunError> {
        Ok(match self {
            Self::Device(pages) => HeldActivations::Device(pages.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
            Self::Host { elements, dir } => HeldActivations::Host(HostTensors::scratch_in(dir, *elements)?),
        })
    }
}

/// One decode's store ([`BandActivations::hold`]).
#[derive(Debug)]
pub enum HeldActivations<'a> {
    Device(std::sync::MutexGuard<'a, DeviceTensors>),
    Host(HostTensors),
}

impl HeldActivations<'_> {
    pub fn store(&mut self) -> &mut dyn Activations {
        match self {
            Self::Device(pages) => &mut **pages,
            Self::Host(host) => host,
        }
    }
}

/// A band addressed past the image's activations: a bug in the band's
/// layout, never the request's doing.
fn beyond(start: u64, end: u64, len: u64, held: &str) -> RunError {
    RunError::Internal(format!("a banded run addressed values {start}..{end} of the {len} on {held}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_cuts_rows_or_takes_them_whole() {
        let band = Window::columns(3, 4, 1, 3);
        assert_eq!((band.values(), band.extent()), (6, 11));
        assert_eq!(band.pieces().collect::<Vec<_>>(), [(1, 0, 2), (5, 2, 2), (9, 4, 2)]);
        assert_eq!(Window::columns(3, 4, 0, 4).pieces().collect::<Vec<_>>(), [(0, 0, 12)]);
        let run = Window::run(5, 9);
        assert_eq!((run.values(), run.extent(), run.pieces().collect::<Vec<_>>()), (4, 9, vec![(5, 0, 4)]));
    }

    /// Activations on the device in pages of 64 values (256-byte buffers)
    /// move as those in a scratch file do: a window whose rows straddle
    /// pages fetched into a band arena and put back elsewhere, values
    /// written and read across page ends, bit for bit the host's.
    #[test]
    fn device_pages_move_bands_as_the_scratch_file_does() {
        let gpu = flux_lite_kernels::test_devices::gpu();
        let band = Runner { arena: gpu.storage("band", 4 * 512), rope_cos: gpu.storage("c", 4), rope_sin: gpu.storage("s", 4), key_keep: None, lora: None, operands: None, products_scratch: None };
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
        // Columns 50..110 of a [7, 120] tensor at 5 (the values written from 3 on): every row crosses a page end.
        let window = Window::columns(7, 120, 50, 110);
        let want: Vec<f32> = (0..7).flat_map(|r| (50..110).map(move |c| r * 120 + c + 2)).map(|i| values[i]).collect();
        let mut device = DeviceTensors::new(gpu, 1000, 256).unwrap();
        assert_eq!(device.pages.len(), 16);
        let mut host = HostTensors::scratch_in(&std::env::temp_dir(), 1000).unwrap();
        let stores: [&mut dyn Activations; 2] = [&mut device, &mut host];
        let mut seen = Vec::new();
        for store in stores {
            store.write(gpu, Span::new(3, 0), &values[..900]).unwrap();
            store.fetch(gpu, &band, Span::new(5, 0), window, Span::new(64, 0)).unwrap();
            assert_eq!(band.read(gpu, Span::new(64, 0), 1, window.values()).unwrap(), want);
            // The band's first 60 values into the tail of the last page, and its first 20 into three rows 100 apart.
            store.put(gpu, &band, Span::new(64, 0), Span::new(0, 0), Window::columns(1, 1000, 930, 990)).unwrap();
            store.put(gpu, &band, Span::new(64, 0), Span::new(0, 0), Window::columns(3, 100, 0, 20)).unwrap();
            seen.push(store.read(gpu, Span::new(0, 0), 1000).unwrap());
        }
        assert_eq!(seen[0], seen[1]);
        assert_eq!((&seen[0][930..990], &seen[0][100..120], seen[0][25]), (&want[..60], &want[20..40], values[22]));
        let small = DeviceTensors::new(gpu, 100, 256).unwrap();
        assert!(small.read(gpu, Span::new(90, 0), 20).is_err());
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

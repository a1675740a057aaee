//! Device memory as flux-lite counts it: every buffer a [`DeviceBuffer`],
//! counted from its creation until its last clone is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A buffer made through [`Gpu`]: its bytes count in [`Gpu::memory`] until
/// the last clone of it is dropped.
#[derive(Debug, Clone)]
pub struct DeviceBuffer(pub(super) Arc<CountedBuffer>);

#[derive(Debug)]
pub(super) struct CountedBuffer {
    pub(super) buffer: wgpu::Buffer,
    pub(super) counted: u64,
    pub(super) counter: Arc<MemoryCounter>,
}

impl std::ops::Deref for DeviceBuffer {
    type Target = wgpu::Buffer;

    fn deref(&self) -> &wgpu::Buffer {
        &self.0.buffer
    }
}

impl Drop for CountedBuffer {
    fn drop(&mut self) {
        self.counter.uncount(self.counted);
    }
}

/// Device bytes allocated through [`Gpu`]: every buffer flux-lite creates
/// is a [`DeviceBuffer`], counted from its creation until it is dropped.
/// Readback staging is counted while it lives.
#[derive(Debug, Default)]
pub(super) struct MemoryCounter {
    pub(super) live: AtomicU64,
    pub(super) high_water: AtomicU64,
    /// Buffers created so far.
    pub(super) allocations: AtomicU64,
}

impl MemoryCounter {
    pub(super) fn count(&self, bytes: u64) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.high_water.fetch_max(live, Ordering::Relaxed);
    }

    fn uncount(&self, bytes: u64) {
        let _ = self.live.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l.saturating_sub(bytes)));
    }
}

/// A snapshot of [`Gpu::memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes of the buffers alive now.
    pub live: u64,
    /// The most bytes live at once since the device was made.
    pub high_water: u64,
    /// Buffers created since the device was made.
    pub allocations: u64,
}

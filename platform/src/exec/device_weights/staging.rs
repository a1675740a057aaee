//! The host-visible buffer streamed weights pass through, and the pieces
//! of bytes copied through it.

use super::*;

/// The host-visible buffer streamed weights pass through, mapped for
/// writing whenever the host may fill it.
#[derive(Debug)]
pub(super) struct Staging {
    pub(super) buffer: DeviceBuffer,
    /// Set when the buffer is mapped for writing again after its last copy.
    pub(super) mapped: Arc<AtomicBool>,
    /// The submission of its last copy.
    pub(super) copied: std::sync::Mutex<Option<wgpu::SubmissionIndex>>,
}

impl Staging {
    /// Asks for the buffer back once the device has copied out of it.
    pub(super) fn map_again(&self, copied: wgpu::SubmissionIndex) {
        *self.copied.lock().unwrap_or_else(|e| e.into_inner()) = Some(copied);
        self.mapped.store(false, Ordering::Release);
        let mapped = self.mapped.clone();
        self.buffer.map_async(wgpu::MapMode::Write, .., move |result| {
            if result.is_ok() {
                mapped.store(true, Ordering::Release);
            }
        });
    }

    /// Copies `pieces` to their buffers through this buffer: as many bytes
    /// as it holds at a time, each batch by its own submission.
    pub(super) fn copy(&self, gpu: &Gpu, pieces: &[Piece<'_>]) -> Result<(), GpuError> {
        let capacity = self.buffer.size();
        // (piece, bytes of it already staged)
        let mut next = pieces.iter().map(|p| (p, 0usize));
        let mut current = next.next();
        while current.is_some() {
            self.wait_until_mapped(gpu)?;
            let mut copies: Vec<(u64, &wgpu::Buffer, u64, u64)> = Vec::new();
            {
                let mut view = self.buffer.get_mapped_range_mut(..).map_err(|e| GpuError::Device(e.to_string()))?;
                let mut used = 0u64;
                while let Some((p, done)) = current {
                    if used == capacity {
                        break;
                    }
                    let n = (p.bytes.len() - done).min((capacity - used) as usize);
                    let start = used as usize;
                    view.slice(start..start + n).copy_from_slice(&p.bytes[done..done + n]);
                    // Copies move whole words: a piece's last odd bytes are padded.
                    let padded = (n as u64).next_multiple_of(4);
                    view.slice(start + n..start + padded as usize).fill(0);
                    copies.push((used, p.to, p.at + done as u64, padded));
                    used += padded;
                    current = if done + n == p.bytes.len() { next.next() } else { Some((p, done + n)) };
                }
            }
            self.buffer.unmap();
            let copied = gpu.submit_tracked(|enc| {
                for &(from, to, at, len) in &copies {
                    enc.copy_buffer_to_buffer(&self.buffer, from, to, at, len);
                }
                Ok(())
            })?;
            self.map_again(copied);
        }
        Ok(())
    }

    /// Waits for the device to finish copying out of the buffer.
    pub(super) fn wait_until_mapped(&self, gpu: &Gpu) -> Result<(), GpuError> {
        if !self.mapped.load(Ordering::Acquire) {
            match self.copied.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(copied) => gpu.wait_for(copied)?,
                None => gpu.wait()?,
            }
        }
        if self.mapped.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(GpuError::Device("the weight staging buffer could not be mapped again".into()))
        }
    }
}

/// One run of bytes on its way from the host to a device buffer.
pub(super) struct Piece<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) to: &'a wgpu::Buffer,
    /// Byte offset in `to` (a multiple of 4).
    pub(super) at: u64,
}

pub(super) fn area_piece<'a>(array: &'a [u8], p: &crate::model::df11::AreaPiece, area: &'a wgpu::Buffer) -> Piece<'a> {
    Piece { bytes: &array[p.source.clone()], to: area, at: p.at }
}

/// Where each array of a streamed DF11 group starts in the area: a binding
/// offset on this adapter, and never less than the planner's slot alignment.
pub(super) fn area_align(gpu: &Gpu) -> u64 {
    gpu.binding_alignment().max(SLOT_ALIGN)
}

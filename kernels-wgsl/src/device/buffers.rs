//! The device's buffers and queue: uploads (counted, in chunks the driver
//! can stage), storage and staging buffers, submissions, waits and readbacks.

use super::*;

impl Gpu {
    /// A storage buffer holding `bytes`, padded to a multiple of 4.
    ///
    /// The bytes pass through host staging that wgpu frees only once a
    /// submission has copied them out; loading a whole model between two
    /// submissions would hold a second copy of it on the host. So a large
    /// tensor goes in chunks of [`UPLOAD_CHUNK`], and the staged bytes are
    /// flushed whenever they reach [`UPLOAD_STAGING`] less a chunk: the host
    /// never holds more than [`UPLOAD_STAGING`] of uploads in flight.
    pub fn upload_bytes(&self, label: &str, bytes: &[u8]) -> DeviceBuffer {
        let padded;
        let contents = if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
            bytes
        } else {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
            padded = v;
            &padded
        };
        let size = contents.len() as u64;
        if size <= UPLOAD_CHUNK {
            self.make_room_for_upload(size);
            self.written.fetch_add(size, Ordering::Relaxed);
            let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some(label), contents, usage: storage_usage() });
            return self.counted(buffer, size);
        }
        let buffer = self.storage(label, size);
        self.write(&buffer, 0, contents);
        buffer
    }

    /// Writes `bytes` into `buffer` from byte `at` (a multiple of 4) on, a
    /// chunk at a time; a last partial word is padded with zeros.
    pub fn write(&self, buffer: &wgpu::Buffer, at: u64, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks(UPLOAD_CHUNK as usize).enumerate() {
            let offset = at + i as u64 * UPLOAD_CHUNK;
            let whole = chunk.len() / 4 * 4;
            self.make_room_for_upload(chunk.len() as u64);
            if whole > 0 {
                self.queue.write_buffer(buffer, offset, &chunk[..whole]);
            }
            if whole < chunk.len() {
                let mut word = [0u8; 4];
                word[..chunk.len() - whole].copy_from_slice(&chunk[whole..]);
                self.queue.write_buffer(buffer, offset + whole as u64, &word);
            }
            self.written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }

    /// Bytes written into device buffers from the host so far (tests check
    /// that a phase allocates everything before it writes anything).
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Counts `bytes` about to be staged for an upload, first flushing the
    /// staged ones and waiting for their copies when they would pass
    /// [`UPLOAD_STAGING`]. A failed wait is recorded as a fault and fails the
    /// next submission.
    pub(super) fn make_room_for_upload(&self, bytes: u64) {
        let staged = self.staged_uploads.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if staged > UPLOAD_STAGING {
            self.queue.submit([]);
            let _ = self.wait();
            self.staged_uploads.store(bytes, Ordering::Relaxed);
        }
    }

    /// A uniform buffer holding a dispatch's parameters (rewritable).
    pub fn uniform(&self, label: &str, bytes: &[u8]) -> DeviceBuffer {
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        });
        self.counted(buffer, bytes.len().div_ceil(4) as u64 * 4)
    }

    /// Counts `bytes` of `buffer` until the returned handle is dropped.
    pub(super) fn counted(&self, buffer: wgpu::Buffer, bytes: u64) -> DeviceBuffer {
        #[cfg(any(test, feature = "test-support"))]
        if let Some(limit) = self.injected.memory_limit {
            let live = self.memory.live.load(Ordering::Relaxed);
            if live + bytes > limit {
                self.faults.record(GpuError::OutOfMemory(format!("{bytes} more bytes with {live} live pass the device's {limit} (injected)")));
            }
        }
        self.memory.count(bytes);
        DeviceBuffer(Arc::new(CountedBuffer { buffer, counted: bytes, counter: self.memory.clone() }))
    }

    pub fn upload_f32(&self, label: &str, data: &[f32]) -> DeviceBuffer {
        self.upload_bytes(label, bytemuck::cast_slice(data))
    }

    /// bf16 bit patterns, two per u32 word as the shaders read them.
    pub fn upload_bf16(&self, label: &str, data: &[u16]) -> DeviceBuffer {
        self.upload_bytes(label, bytemuck::cast_slice(data))
    }

    pub fn upload_u32(&self, label: &str, data: &[u32]) -> DeviceBuffer {
        self.upload_bytes(label, bytemuck::cast_slice(data))
    }

    /// An uninitialised (zeroed) storage buffer of at least `bytes`.
    pub fn storage(&self, label: &str, bytes: u64) -> DeviceBuffer {
        let size = bytes.div_ceil(4).max(1) * 4;
        let buffer =
            self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage: storage_usage(), mapped_at_creation: false });
        self.counted(buffer, size)
    }

    /// A buffer timestamp queries resolve into (`bytes`: 8 per query), readable with [`Self::read_bytes`].
    pub fn query_resolve(&self, label: &str, bytes: u64) -> DeviceBuffer {
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.counted(buffer, bytes)
    }

    /// A host-visible buffer of `bytes` (a multiple of 4) the host writes
    /// and the device copies from, mapped for writing at creation.
    pub fn upload_staging(&self, label: &str, bytes: u64) -> DeviceBuffer {
        let size = bytes.div_ceil(4).max(1) * 4;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        self.counted(buffer, size)
    }

    /// Runs `record` on a fresh encoder and submits it.
    pub fn submit(&self, record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), GpuError>) -> Result<(), GpuError> {
        self.submit_tracked(record).map(|_| ())
    }

    /// [`Self::submit`], returning the submission to wait for with [`Self::wait_for`].
    pub fn submit_tracked(
        &self,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), GpuError>,
    ) -> Result<wgpu::SubmissionIndex, GpuError> {
        self.check_interrupt()?;
        self.check_faults()?;
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        record(&mut encoder)?;
        let submission = self.queue.submit([encoder.finish()]);
        let _count = self.submissions.fetch_add(1, Ordering::Relaxed) + 1;
        #[cfg(any(test, feature = "test-support"))]
        if self.injected.lose_device_after == Some(_count) {
            self.device.destroy();
        }
        Ok(submission)
    }

    /// Waits until `submission` (and what was submitted before it) has finished.
    pub fn wait_for(&self, submission: wgpu::SubmissionIndex) -> Result<(), GpuError> {
        self.wait_until(Some(submission))
    }

    /// Copies `count` f32 values starting at element `offset` back to the host.
    pub fn read_f32(&self, buffer: &wgpu::Buffer, offset: u64, count: usize) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_bytes(buffer, offset * 4, count as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        self.read_through_staging(buffer, offset, len.div_ceil(4) * 4, len)
    }

    pub(super) fn read_through_staging(&self, buffer: &wgpu::Buffer, offset: u64, padded: u64, len: u64) -> Result<Vec<u8>, GpuError> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // Counted while it lives, as every buffer is.
        let staging = self.counted(staging, padded);
        self.submit(|enc| {
            enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, padded);
            Ok(())
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        let mapped = rx.recv().map_err(|e| GpuError::Readback(e.to_string()))?;
        self.check_faults()?;
        mapped.map_err(|e| GpuError::Readback(e.to_string()))?;
        let view = staging.get_mapped_range(..).map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = view[..len as usize].to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    /// Waits until all submitted work has finished.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.wait_until(None)
    }

    /// Waits for `submission`, or for everything submitted (`None`).
    pub(super) fn wait_until(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<(), GpuError> {
        let polled = self.device.poll(wgpu::PollType::Wait { submission_index: submission, timeout: None });
        if let Err(wgpu::PollError::WrongSubmissionIndex(..)) = polled {
            // A submission the queue did not take: the device was lost after an
            // earlier one, and its report may not have come yet. Let it come.
            let _ = self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
            self.check_faults()?;
            return Err(GpuError::DeviceLost("a submission was refused: the device was lost".into()));
        }
        // A lost device fails the poll too; the fault says why.
        self.check_faults()?;
        polled.map(|_| ()).map_err(|e| GpuError::Device(one_line(&e.to_string())))
    }
}

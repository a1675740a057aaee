//! Times prepared dispatches: on the GPU's own clock (timestamps written at
//! the start and end of the compute pass) where the adapter has one, else on
//! the host's around submit and wait.

use crate::error::GpuError;
use flux_lite_kernels::{DeviceBuffer, Gpu};
use flux_lite_kernels::{Dispatch};
use std::time::Instant;

/// Where a time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// GPU timestamps around the pass: the kernels' own time.
    Gpu,
    /// The host's clock around submit and wait: includes submission and synchronisation.
    Host,
}

impl Clock {
    pub fn describe(self) -> &'static str {
        match self {
            Clock::Gpu => "GPU timestamps around the pass",
            Clock::Host => "host clock around submit and wait (the adapter has no timestamps we trust)",
        }
    }
}

/// A timestamp query pair and the buffer it resolves into.
#[derive(Debug)]
struct Queries {
    set: wgpu::QuerySet,
    resolved: DeviceBuffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
}

#[derive(Debug)]
pub struct Timer<'g> {
    gpu: &'g Gpu,
    queries: Option<Queries>,
}

impl<'g> Timer<'g> {
    pub fn new(gpu: &'g Gpu) -> Self {
        // A software adapter's timestamps are the host's clock anyway, and
        // lavapipe's have closed passes long before their work was done
        // (docs/performance.md, "How each figure was measured"): there the
        // host clock around submit and wait times every row.
        let queries = (gpu.has_timestamps() && !gpu.is_software()).then(|| Queries {
            set: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: gpu.query_resolve("bench timestamps", 16),
            period: gpu.queue.get_timestamp_period() as f64,
        });
        Self { gpu, queries }
    }

    pub fn clock(&self) -> Clock {
        if self.queries.is_some() {
            Clock::Gpu
        } else {
            Clock::Host
        }
    }

    /// Seconds one run of `dispatches` takes.
    pub fn once(&self, dispatches: &[Dispatch]) -> Result<f64, GpuError> {
        let Some(q) = &self.queries else {
            let t = Instant::now();
            self.gpu.submit(|enc| {
                flux_lite_kernels::encode(enc, dispatches);
                Ok(())
            })?;
            self.gpu.wait()?;
            return Ok(t.elapsed().as_secs_f64());
        };
        self.gpu.submit(|enc| {
            let writes =
                wgpu::ComputePassTimestampWrites { query_set: &q.set, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: Some(1) };
            flux_lite_kernels::encode_timed(enc, dispatches, Some(writes));
            enc.resolve_query_set(&q.set, 0..2, &q.resolved, 0);
            Ok(())
        })?;
        let bytes = self.gpu.read_bytes(&q.resolved, 0, 16)?;
        let tick = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap_or_default());
        Ok(tick(1).saturating_sub(tick(0)) as f64 * q.period * 1e-9)
    }

    /// The median of `repeats` runs after one warm-up run.
    pub fn median(&self, dispatches: &[Dispatch], repeats: usize) -> Result<f64, GpuError> {
        let times = self.sorted(dispatches, repeats)?;
        Ok(times[times.len() / 2])
    }

    /// The fastest of `repeats` runs after one warm-up run: for a ceiling,
    /// the best the adapter showed.
    pub fn fastest(&self, dispatches: &[Dispatch], repeats: usize) -> Result<f64, GpuError> {
        Ok(self.sorted(dispatches, repeats)?[0])
    }

    fn sorted(&self, dispatches: &[Dispatch], repeats: usize) -> Result<Vec<f64>, GpuError> {
        self.once(dispatches)?;
        let mut times = (0..repeats.max(1)).map(|_| self.once(dispatches)).collect::<Result<Vec<_>, _>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times)
    }
}

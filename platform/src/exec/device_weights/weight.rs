//! One weight tensor on the device, and the range scales of its rows.

use super::*;

/// A weight tensor on the device: `buffer` from element `offset` on, with
/// its rows' range scales where the device's products need them.
#[derive(Debug)]
pub struct DeviceWeight {
    pub buffer: DeviceBuffer,
    pub offset: u64,
    pub dtype: WeightDtype,
    pub scales: Option<StoredScales>,
}

/// The matrix tier's range scales of a product's weight (a linear's or a
/// convolution's), measured when the weight reaches the device (at load, or
/// as its block fills its slot) and read by every product over it: `rows`
/// f32s of `buffer` from `offset`, each over `k` values.
#[derive(Debug, Clone)]
pub struct StoredScales {
    pub(super) buffer: DeviceBuffer,
    pub(super) offset: u64,
    pub(super) rows: u64,
    pub(super) k: u64,
}

impl StoredScales {
    /// A buffer of its own holding the row scales of `weight`'s first
    /// `rows` rows of `k` values, measured now.
    pub fn measure(gpu: &Gpu, weight: Weight<'_>, rows: u64, k: u64) -> Result<Self, GpuError> {
        let buffer = gpu.storage("weight row scales", 4 * rows);
        gpu.submit(|enc| kernels::measure_weight_rows(gpu, enc, weight, rows, k, &buffer, 0))?;
        Ok(Self { buffer, offset: 0, rows, k })
    }
}

impl DeviceWeight {
    /// Uploads a tensor as stored (bf16 or f32); f16 is widened to f32 on the host.
    pub fn upload(gpu: &Gpu, component: &str, name: &str, t: TensorRef<'_>) -> Result<Self, LoadError> {
        let weight = Self::allocate(gpu, component, name, t)?;
        weight.fill(gpu, t);
        Ok(weight)
    }

    /// A zeroed buffer for a tensor as [`Self::fill`] writes it.
    pub(super) fn allocate(gpu: &Gpu, component: &str, name: &str, t: TensorRef<'_>) -> Result<Self, LoadError> {
        let dtype = match t.dtype {
            Dtype::BF16 => WeightDtype::Bf16,
            Dtype::F32 | Dtype::F16 => WeightDtype::F32,
            other => {
                return Err(LoadError::WrongTensor {
                    component: component.into(),
                    name: name.into(),
                    expected: "a bf16, f16 or f32 tensor".into(),
                    found: format!("{other:?}"),
                })
            }
        };
        Ok(Self { buffer: gpu.storage(name, plain_bytes(t)), offset: 0, dtype, scales: None })
    }

    /// Writes the tensor into the buffer [`Self::allocate`] made for it.
    pub(super) fn fill(&self, gpu: &Gpu, t: TensorRef<'_>) {
        if t.dtype == Dtype::F16 {
            let mut wide = Vec::with_capacity(t.bytes.len() / 2);
            widen_to_f32(t.dtype, t.bytes, &mut wide);
            gpu.write(&self.buffer, 0, bytemuck::cast_slice(&wide));
        } else {
            gpu.write(&self.buffer, 0, t.bytes);
        }
    }

    pub fn view(&self) -> Weight<'_> {
        let scales = self.scales.as_ref().map(|s| flux_lite_kernels::RowScales { buf: &s.buffer, offset: s.offset, k: s.k });
        Weight { buf: &self.buffer, offset: self.offset, dtype: self.dtype, scales }
    }

    /// Records the measure of the weight's rows' range scales into their place.
    pub(super) fn record_scales(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink) -> Result<(), GpuError> {
        match &self.scales {
            Some(s) => {
                let bare = Weight { scales: None, ..self.view() };
                kernels::measure_weight_rows(gpu, sink, bare, s.rows, s.k, &s.buffer, s.offset)
            }
            None => Ok(()),
        }
    }
}

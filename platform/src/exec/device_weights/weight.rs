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
    /// A convolution's W with each row's taps in (ky, kx, ci) order, as a
    /// channels-last convolution runs them ([`DeviceWeight::upload_taps_last`]);
    /// else as the model's files hold it.
    pub taps_last: bool,
    /// Its values packed as f16 under its rows' kept range scales
    /// ([`DeviceWeight::pack_half`]): what a channels-last convolution
    /// stages as it is.
    pub half_packed: bool,
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
        Ok(Self { buffer: gpu.storage(name, plain_bytes(t)), offset: 0, dtype, scales: None, taps_last: false, half_packed: false })
    }

    /// Uploads a convolution's W `[co, ci, ky, kx]` with each row's taps
    /// permuted into `[ky, kx, ci]` order, the order a channels-last
    /// convolution's A runs in (its B columns then load as bf16 pairs, not
    /// value by value; the same values, so the same sums). Other tensors
    /// (and 1×1 kernels, whose orders agree) as stored.
    pub fn upload_taps_last(gpu: &Gpu, component: &str, name: &str, t: TensorRef<'_>) -> Result<Self, LoadError> {
        let &[co, ci, ky, kx] = t.shape else { return Self::upload(gpu, component, name, t) };
        if ky * kx == 1 {
            return Self::upload(gpu, component, name, t);
        }
        let mut weight = Self::allocate(gpu, component, name, t)?;
        // f16 is widened first, as `fill` writes it.
        let mut wide = Vec::new();
        let stored = if t.dtype == Dtype::F16 && widen_to_f32(t.dtype, t.bytes, &mut wide) { bytemuck::cast_slice(&wide) } else { t.bytes };
        gpu.write(&weight.buffer, 0, &taps_last(stored, [co, ci, ky * kx]));
        weight.taps_last = true;
        Ok(weight)
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
        let scales = self.scales.as_ref().map(|s| flux_lite_kernels::RowScales { buf: &s.buffer, offset: s.offset, k: s.k, packed: self.half_packed });
        Weight { buf: &self.buffer, offset: self.offset, dtype: self.dtype, scales }
    }

    /// Packs the weight in place into the matrix tier's f16 operand under
    /// its rows' kept range scales (measured first, on the bf16 values); a
    /// weight that cannot be ([`Self::record_pack`]) stays as it is.
    pub fn pack_half(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        let mut packs = Vec::new();
        if self.record_pack(gpu, &mut packs)? {
            gpu.submit(|enc| {
                flux_lite_kernels::encode(enc, &packs);
                Ok(())
            })?;
            self.half_packed = true;
        }
        Ok(())
    }

    /// Records the pack of an f32 weight with kept row scales of an even
    /// length into f16 under them, into a buffer of its own (half its
    /// bytes), and gives that buffer; `None` (nothing recorded) for any
    /// other weight. Once the pack has run, [`Self::take_packed`] puts the
    /// buffer in the f32 one's place. Only for a convolution's W: a
    /// channels-last convolution reads its bias in the bias's own dtype,
    /// where a linear reads its bias as wide as W's elements.
    pub(super) fn record_pack_f32(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink) -> Result<Option<DeviceBuffer>, GpuError> {
        let Some(scales) = self.scales.as_ref().filter(|s| self.dtype == WeightDtype::F32 && !self.half_packed && s.k.is_multiple_of(2)) else {
            return Ok(None);
        };
        let packed = gpu.storage("packed weight", 4 * (scales.rows * scales.k / 2).max(1));
        let rows = flux_lite_kernels::Mat { buf: &scales.buffer, offset: scales.offset, stride: 1 };
        kernels::pack_weight_half_f32(gpu, sink, self.view(), &packed, rows, [scales.rows, scales.k])?;
        Ok(Some(packed))
    }

    /// The f16 words [`Self::record_pack_f32`] packed take the f32 values'
    /// place: the weight then reads as a packed bf16 one (two bytes an
    /// element, its words f16).
    pub(super) fn take_packed(&mut self, packed: DeviceBuffer) {
        (self.buffer, self.offset, self.dtype, self.half_packed) = (packed, 0, WeightDtype::Bf16, true);
    }

    /// Records the pack of [`Self::pack_half`] where the weight takes one
    /// ([`Self::packable`], not yet packed), saying whether it did; the
    /// caller marks it packed once the pack has run.
    pub(super) fn record_pack(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink) -> Result<bool, GpuError> {
        if self.half_packed || !self.packable() {
            return Ok(false);
        }
        self.record_pack_words(gpu, sink)?;
        Ok(true)
    }

    /// Whether the weight can be packed into f16 pairs under its kept row
    /// scales: bf16, its rows whole pairs from an even element.
    pub(super) fn packable(&self) -> bool {
        self.dtype == WeightDtype::Bf16 && self.offset.is_multiple_of(2) && self.scales.as_ref().is_some_and(|s| s.k.is_multiple_of(2))
    }

    /// Records the pack of the weight's bf16 words under its kept scales,
    /// whatever it is marked: a slot's weight, marked packed for good,
    /// packed again after each refill.
    pub(super) fn record_pack_words(&self, gpu: &Gpu, sink: &mut dyn flux_lite_kernels::Sink) -> Result<(), GpuError> {
        let Some(scales) = &self.scales else { return Ok(()) };
        let rows = flux_lite_kernels::Mat { buf: &scales.buffer, offset: scales.offset, stride: 1 };
        kernels::pack_weight_half(gpu, sink, self.view(), rows, [scales.rows, scales.k])
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

/// The bytes of W `[co, ci, taps]` (values of equal size) as `[co, taps, ci]`.
fn taps_last(bytes: &[u8], [co, ci, taps]: [usize; 3]) -> Vec<u8> {
    let (row, size) = (ci * taps, bytes.len() / (co * ci * taps).max(1));
    let mut out = vec![0u8; bytes.len()];
    for o in 0..co * row {
        // Output (c, tap, i) takes input (c, i, tap).
        let (c, tap, i) = (o / row, (o % row) / ci, o % ci);
        let from = c * row + i * taps + tap;
        out[o * size..(o + 1) * size].copy_from_slice(&bytes[from * size..(from + 1) * size]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{taps_last, DeviceWeight, TensorRef};
    use safetensors::Dtype;

    /// A 3×3 W in f16 or f32 goes up widened to f32 with its taps last,
    /// the same values in the same places.
    #[test]
    fn a_convolutions_w_goes_up_taps_last_from_f16_as_from_f32() {
        let gpu = flux_lite_kernels::test_devices::gpu();
        // W [2, 3, 3, 3]: small whole numbers, exact in f16.
        let values: Vec<f32> = (0..54).map(|e| e as f32).collect();
        let halves: Vec<u8> = values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        let singles: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = [2, 3, 3, 3];
        let read = |dtype, bytes: &[u8]| {
            let w = DeviceWeight::upload_taps_last(gpu, "test", "w", TensorRef { dtype, shape: &shape, bytes }).unwrap();
            assert!(w.taps_last, "{dtype:?}");
            gpu.read_f32(&w.buffer, 0, 54).unwrap()
        };
        let want: Vec<f32> = bytemuck::cast_slice::<u8, f32>(&taps_last(&singles, [2, 3, 9])).to_vec();
        assert_eq!(read(Dtype::F32, &singles), want);
        assert_eq!(read(Dtype::F16, &halves), want);
    }

    #[test]
    fn a_convolutions_taps_go_last_value_by_value() {
        // W [2, 3, 4]: value (c, i, tap) = 100c + 10i + tap, two bytes each.
        let w: Vec<u16> = (0..2 * 3 * 4).map(|e| (100 * (e / 12) + 10 * ((e % 12) / 4) + e % 4) as u16).collect();
        let permuted = taps_last(bytemuck::cast_slice(&w), [2, 3, 4]);
        let got: &[u16] = bytemuck::cast_slice(&permuted);
        let want: Vec<u16> = (0..24).map(|o| (100 * (o / 12) + 10 * (o % 3) + (o % 12) / 3) as u16).collect();
        assert_eq!(got, &want[..]);
    }
}

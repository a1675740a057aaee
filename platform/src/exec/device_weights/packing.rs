//! Weights packed as the matrix tier's f16 operand where they reach the
//! device: bf16 ones in place, a convolution's f32 one into a buffer of
//! half its bytes.

use super::*;

impl DeviceWeights {
    /// Packs the weights `names` (those with kept row scales) into the
    /// matrix tier's f16 operand, for products that stage them as they are.
    /// One submission for all of them.
    pub fn pack_half(&mut self, gpu: &Gpu, names: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), GpuError> {
        let (mut packs, mut packed) = (Vec::new(), Vec::new());
        for name in names {
            if let Some(w) = self.map.get(name.as_ref()) {
                if w.record_pack(gpu, &mut packs)? {
                    packed.push(name.as_ref().to_string());
                }
            }
        }
        if packed.is_empty() {
            return Ok(());
        }
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, &packs);
            Ok(())
        })?;
        for name in packed {
            if let Some(w) = self.map.get_mut(&name) {
                w.half_packed = true;
            }
        }
        Ok(())
    }

    /// Packs each f32 convolution W `names` names (with kept row scales of
    /// an even length) into f16 under them, each into a buffer of half its
    /// bytes that takes the f32 one's place ([`DeviceWeight::record_pack_f32`]),
    /// the device bytes counted as they fall. One submission for all of them.
    pub fn pack_half_f32(&mut self, gpu: &Gpu, names: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), GpuError> {
        let (mut packs, mut packed) = (Vec::new(), Vec::new());
        for name in names {
            if let Some(w) = self.map.get(name.as_ref()) {
                if let Some(buffer) = w.record_pack_f32(gpu, &mut packs)? {
                    packed.push((name.as_ref().to_string(), buffer));
                }
            }
        }
        if packed.is_empty() {
            return Ok(());
        }
        gpu.submit(|enc| {
            flux_lite_kernels::encode(enc, &packs);
            Ok(())
        })?;
        for (name, buffer) in packed {
            if let Some(w) = self.map.get_mut(&name) {
                self.bytes = self.bytes - w.buffer.size() + buffer.size();
                w.take_packed(buffer);
            }
        }
        Ok(())
    }
}

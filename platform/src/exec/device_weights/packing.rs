//! Weights packed as the matrix tier's f16 operand where they reach the
//! device: bf16 ones in place, a convolution's f32 one into a buffer of
//! half its bytes.

use super::*;

impl DeviceWeights {
    /// Packs the weights `names` (those with kept row scales) into the
    /// matrix tier's f16 operand, for products that stage them as they are.
    /// One submission for all of them.
    pub fn pack_half(&mut self, gpu: &Gpu, names: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), GpuError> {
        self.pack_each(gpu, names, |w, packs| Ok(w.record_pack(gpu, packs)?.then_some(())), |w, ()| w.half_packed = true)
    }

    /// Packs each f32 convolution W `names` names (with kept row scales of
    /// an even length) into f16 under them, each into a buffer of half its
    /// bytes that takes the f32 one's place ([`DeviceWeight::record_pack_f32`]),
    /// the device bytes counted as they fall. One submission for all of them.
    pub fn pack_half_f32(&mut self, gpu: &Gpu, names: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), GpuError> {
        self.pack_each(gpu, names, |w, packs| w.record_pack_f32(gpu, packs), DeviceWeight::take_packed)
    }

    /// Records `record`'s pack of each weight `names` names into one
    /// submission, submits it, then `done` with what each recorded (those
    /// that recorded nothing stay as they are), its device bytes counted anew.
    fn pack_each<T>(
        &mut self,
        gpu: &Gpu,
        names: impl IntoIterator<Item = impl AsRef<str>>,
        record: impl Fn(&DeviceWeight, &mut Vec<flux_lite_kernels::Dispatch>) -> Result<Option<T>, GpuError>,
        done: impl Fn(&mut DeviceWeight, T),
    ) -> Result<(), GpuError> {
        let (mut packs, mut packed) = (Vec::new(), Vec::new());
        for name in names {
            if let Some(w) = self.map.get(name.as_ref()) {
                if let Some(t) = record(w, &mut packs)? {
                    packed.push((name.as_ref().to_string(), t));
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
        for (name, t) in packed {
            if let Some(w) = self.map.get_mut(&name) {
                let before = w.buffer.size();
                done(w, t);
                self.bytes = self.bytes - before + w.buffer.size();
            }
        }
        Ok(())
    }
}

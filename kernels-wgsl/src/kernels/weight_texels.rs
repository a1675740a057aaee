//! CPU adapters' weight texels: the rows of W a lanes linear reads, copied
//! into a texture first (`weight_texels.wgsl`).
//!
//! A CPU driver (lavapipe) fetches a storage load lane by lane in a loop
//! with a branch per lane and per component, where a texel fetch is one
//! unrolled gather: on Mesa 22.3 the lanes linear with W's loads from a
//! texture ran 1.2–1.8× faster than from storage (1024×3072·3072×3072,
//! bf16 W, same sitting). The copy reads each weight once; the product
//! reads it once for every 8 rows of x.

use crate::device::{Gpu, WeightTexels};
use crate::dispatch::{dispatch_with_textures, grid64, to_u32, Launch, Sink, Window};
use crate::error::GpuError;
use crate::kernel::{kernel, Access::Read as R, Kernel, Module};
use bytemuck::{Pod, Zeroable};
use flux_lite_core::plan::WEIGHT_TEXELS_BYTES;
use std::sync::Arc;

/// Texels a row of the texture (a power of two: the kernels split a texel's
/// index into its column and row with a mask and a shift).
pub const TEXEL_ROW: u32 = 2048;
/// Rows of the texture: `WEIGHT_TEXELS_BYTES` of 16-byte texels.
pub const TEXEL_ROWS: u32 = (WEIGHT_TEXELS_BYTES / (16 * TEXEL_ROW as u64)) as u32;
/// Texels the texture holds.
pub const CAPACITY: u64 = TEXEL_ROW as u64 * TEXEL_ROWS as u64;

/// `weight_texels.wgsl`: `count` vec4s of words from vec4 `src_offset` of the source window.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct WeightTexelsParams {
    pub src_offset: u32,
    pub count: u32,
    pub _pad: [u32; 2],
}

pub const WEIGHT_TEXELS: Kernel =
    kernel(Module::WeightTexels, "weight_texels", [64, 1, 1], &[(1, R)], size_of::<WeightTexelsParams>(), false);

/// Binding of the texture in the kernels that read or write it.
pub const TEXEL_BINDING: u32 = 8;

/// Copies vec4s `first .. first + count` of `src` (as vec4s of u32 words)
/// into texels `0 .. count` of the device's weight texels, which it returns.
pub(crate) fn copy_into_texels(gpu: &Gpu, sink: &mut dyn Sink, src: &Window<'_>, first: u64, count: u64) -> Result<Arc<WeightTexels>, GpuError> {
    if count > CAPACITY {
        return Err(GpuError::UnsupportedShape(format!("{count} weight texels exceed the {CAPACITY} planned for them")));
    }
    let texels = gpu.weight_texels();
    let params = WeightTexelsParams { src_offset: to_u32(first, "weight texels source")?, count: to_u32(count, "weight texels")?, _pad: [0; 2] };
    let launch = Launch { kernel: &WEIGHT_TEXELS, constants: &[], params, grid: grid64(count) };
    dispatch_with_textures(gpu, sink, launch, &[(1, src)], &[(2, &texels.view)]);
    Ok(texels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::window;
    use crate::testing::gpu;

    /// The texture's first `texels` texels, as words, read back through a buffer.
    fn read_texels(gpu: &Gpu, texels: &WeightTexels, count: u64) -> Vec<u32> {
        let rows = count.div_ceil(TEXEL_ROW as u64) as u32;
        let bytes_per_row = TEXEL_ROW * 16;
        let out = gpu.storage("texels read back", (rows * bytes_per_row) as u64);
        gpu.submit(|enc| {
            enc.copy_texture_to_buffer(
                texels.texture.as_image_copy(),
                wgpu::TexelCopyBufferInfo { buffer: &out, layout: wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(bytes_per_row), rows_per_image: None } },
                wgpu::Extent3d { width: TEXEL_ROW, height: rows, depth_or_array_layers: 1 },
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.read_bytes(&out, 0, (rows * bytes_per_row) as u64).unwrap_or_else(|e| panic!("{e}")));
        words[..count as usize * 4].to_vec()
    }

    #[test]
    fn the_copy_puts_each_vec4_of_the_window_in_its_texel() {
        let gpu = gpu();
        // Past one row of the texture, from a window that starts mid-buffer
        // and a first vec4 inside it.
        let (lead, first, count) = (37u64, 5u64, TEXEL_ROW as u64 + 300);
        let words: Vec<u32> = (0..(lead + (first + count) * 4 + 11) as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995).collect();
        let buf = gpu.upload_u32("texel source", &words);
        let src = window(gpu, &buf, 4, lead..words.len() as u64, "texel source").unwrap_or_else(|e| panic!("{e}"));
        // The window starts at an aligned offset at or before `lead`: where
        // vec4 `first` of it lies in words.
        let start = lead - src.local as u64;
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let texels = copy_into_texels(gpu, &mut enc, &src, first, count).unwrap_or_else(|e| panic!("{e}"));
        gpu.queue.submit([enc.finish()]);
        let got = read_texels(gpu, &texels, count);
        let want = &words[(start + first * 4) as usize..(start + (first + count) * 4) as usize];
        assert_eq!(got, want);
    }

    #[test]
    fn the_texture_is_the_planned_size() {
        assert_eq!(CAPACITY * 16, WEIGHT_TEXELS_BYTES);
        assert!(TEXEL_ROW.is_power_of_two());
        assert!(Module::WeightTexels.source().contains(&format!("const TEXEL_ROW: u32 = {TEXEL_ROW}u;")));
    }
}

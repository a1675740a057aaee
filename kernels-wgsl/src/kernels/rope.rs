//! Rotary position embeddings in place, interleaved (FLUX.2) or
//! rotate-half (Qwen3), from host-computed cos/sin tables.
//! Shader: `rope.wgsl` beside this file.

use crate::kernel::{kernel, Access::{Read as R, ReadWrite as RW}, Kernel, Module};
use crate::device::Gpu;
use crate::dispatch::{dispatch, grid64, row_chunks, to_u32, Launch, Rows, Sink};
use crate::error::GpuError;
use crate::view::{HeadRows, Mat};
use bytemuck::{Pod, Zeroable};

/// `rope.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RopeParams {
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub offset: u32,
    pub token_stride: u32,
    pub table_row: u32,
    pub _pad: [u32; 2],
}

pub const ROPE_INTERLEAVED: Kernel =
    kernel(Module::Rope, "rope_interleaved", [64, 1, 1], &[(1, RW), (2, R), (3, R)], size_of::<RopeParams>(), false);
pub const ROPE_HALF: Kernel =
    kernel(Module::Rope, "rope_half", [64, 1, 1], &[(1, RW), (2, R), (3, R)], size_of::<RopeParams>(), false);

pub use flux_lite_core::ir::RopeStyle;

/// The cos/sin tables `[rows, head_dim]` a RoPE reads, from row `first_row` on.
#[derive(Debug, Clone, Copy)]
pub struct RopeTables<'a> {
    pub cos: &'a wgpu::Buffer,
    pub sin: &'a wgpu::Buffer,
    pub first_row: u64,
}

/// RoPE in place on `[tokens, heads, head_dim]` rows of `data`; token `t`
/// reads row `first_row + t` of the tables.
pub fn rope(gpu: &Gpu, sink: &mut dyn Sink, style: RopeStyle, data: Mat<'_>, tables: RopeTables<'_>, s: HeadRows) -> Result<(), GpuError> {
    let RopeTables { cos, sin, first_row: table_row } = tables;
    let HeadRows { tokens, heads, head_dim } = s;
    if tokens == 0 {
        return Ok(());
    }
    let data_rows = Rows::mat(data, heads * head_dim, "rope data");
    let table = |buf| Rows::packed(buf, 4, table_row * head_dim, head_dim, "rope table");
    let (cos_rows, sin_rows) = (table(cos), table(sin));
    let kernel = match style {
        RopeStyle::Interleaved => &ROPE_INTERLEAVED,
        RopeStyle::RotateHalf => &ROPE_HALF,
    };
    for rows in row_chunks(gpu, tokens, &[data_rows, cos_rows, sin_rows], 1)? {
        let dw = data_rows.window(gpu, &rows)?;
        let cw = cos_rows.window(gpu, &rows)?;
        let sw = sin_rows.window(gpu, &rows)?;
        if cw.local != sw.local {
            return Err(GpuError::UnsupportedShape("rope cos and sin tables must be equally aligned".into()));
        }
        let params = RopeParams {
            tokens: to_u32(rows.end - rows.start, "rope tokens")?,
            heads: to_u32(heads, "rope heads")?,
            head_dim: to_u32(head_dim, "rope head dim")?,
            offset: dw.local,
            token_stride: to_u32(data.stride, "rope stride")?,
            table_row: cw.local / head_dim as u32,
            _pad: [0; 2],
        };
        let grid = grid64((rows.end - rows.start) * heads * (head_dim / 2));
        dispatch(gpu, sink, Launch { kernel, constants: &[], params, grid }, &[(1, &dw), (2, &cw), (3, &sw)]);
    }
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn rope_interleaved_with_flux_tables() {
        check(RopeStyle::Interleaved, [23, 3, 16], 10);
    }

    #[test]
    fn rope_rotate_half_with_qwen_tables() {
        check(RopeStyle::RotateHalf, [17, 4, 8], 11);
    }

    /// The selftest's RoPE check (the model's tables, a strided view, NaN rows to skip), held to the f32 bound.
    fn check(style: RopeStyle, shape: [usize; 3], seed: u64) {
        let worst = crate::selftest::check_rope(gpu(), style, shape, seed).unwrap_or_else(|e| panic!("rope {style:?}: {e}"));
        assert!(worst <= F32_TOL, "rope {style:?}: relative L2 {worst:.3e} (∞: a column outside the heads was touched)");
    }
}

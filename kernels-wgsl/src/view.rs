//! The two views a launcher takes of device memory: activations (`Mat`, f32
//! rows with a stride) and weights (`Weight`, bf16 or f32 from an offset).
//! They differ because activations are always f32 and addressed by rows,
//! while weights carry their storage type and are addressed as one run.

/// An f32 tensor viewed as rows: row `r` starts at element `offset + r·stride`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub stride: u64,
}

impl<'a> Mat<'a> {
    /// A contiguous `[rows, width]` tensor at the start of `buf`.
    pub fn new(buf: &'a wgpu::Buffer, width: u64) -> Self {
        Self { buf, offset: 0, stride: width }
    }

    /// The same rows starting `cols` elements further right (a column slice).
    pub fn cols_from(self, cols: u64) -> Self {
        Self { offset: self.offset + cols, ..self }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    Bf16,
    F32,
}

impl WeightDtype {
    pub fn bytes(self) -> u64 {
        match self {
            WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    pub(crate) fn constant(self) -> u32 {
        (self == WeightDtype::Bf16) as u32
    }
}

/// A weight tensor (bf16 or f32) starting at element `offset` of `buf`.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub dtype: WeightDtype,
}

impl<'a> Weight<'a> {
    pub fn bf16(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::Bf16 }
    }

    /// The weight from row `row` on, rows being `width` elements.
    pub fn rows_from(self, row: u64, width: u64) -> Self {
        Self { offset: self.offset + row * width, ..self }
    }

    pub fn f32(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::F32 }
    }
}


/// `[tokens, heads, head_dim]` rows: what a RoPE rotates, and what the
/// half-K/V layout packs a (token, head) row at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRows {
    pub tokens: u64,
    pub heads: u64,
    pub head_dim: u64,
}

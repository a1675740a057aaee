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

    /// The rows from row `row` on.
    pub fn rows_from(self, row: u64) -> Self {
        Self { offset: self.offset + row * self.stride, ..self }
    }
}

/// Rows of f16 values, two a u32 word (the even one in the low half), each
/// row divided by its range scale (range_rule.wgsl), with the scales beside
/// them: the matrix tier's products' inputs as their producers write them.
/// `data` counts words (a row of `k` values is `k/2` of them); `scales`
/// holds one f32 a row, or with `piece` one for every `piece` values of a
/// row (each piece under its own range scale; `scales.stride` apart from
/// row to row), as producers that each hold part of a row write them.
#[derive(Debug, Clone, Copy)]
pub struct HalfMat<'a> {
    pub data: Mat<'a>,
    pub scales: Mat<'a>,
    pub piece: Option<u64>,
}

impl<'a> HalfMat<'a> {
    /// f16 rows under one scale a row.
    pub fn rows(data: Mat<'a>, scales: Mat<'a>) -> Self {
        Self { data, scales, piece: None }
    }

    /// f16 rows under a scale every `piece` values.
    pub fn pieces(data: Mat<'a>, scales: Mat<'a>, piece: u64) -> Self {
        Self { data, scales, piece: Some(piece) }
    }

    /// The same rows from value `cols` on: whole pieces (rows under one
    /// scale a row have no columns to start from).
    pub fn cols_from(self, cols: u64) -> Option<Self> {
        let piece = self.piece.filter(|&p| cols.is_multiple_of(p) && p.is_multiple_of(2))?;
        Some(Self { data: self.data.cols_from(cols / 2), scales: self.scales.cols_from(cols / piece), ..self })
    }

    /// The rows from row `row` on, with their scales.
    pub fn rows_from(self, row: u64) -> Self {
        Self { data: self.data.rows_from(row), scales: self.scales.rows_from(row), ..self }
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

/// A weight tensor (bf16 or f32) starting at element `offset` of `buf`,
/// with the range scales of its rows where they were measured when the
/// weight reached the device.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub dtype: WeightDtype,
    pub scales: Option<RowScales<'a>>,
}

/// The matrix tier's range scales of a weight's rows, measured once
/// (`measure_weight_rows`) and read by every product over the weight: the
/// scale of the weight's row `r` is f32 element `offset + r` of `buf`, each
/// measured over the `k` values of its row. Where `packed`, the weight's
/// words are f16 pairs under these scales (`pack_weight_half`), which its
/// products stage as they are.
#[derive(Debug, Clone, Copy)]
pub struct RowScales<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub k: u64,
    pub packed: bool,
}

impl<'a> Weight<'a> {
    pub fn bf16(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::Bf16, scales: None }
    }

    /// The weight from row `row` on, rows being `width` elements (its
    /// scales, where it has them, from the same row on).
    pub fn rows_from(self, row: u64, width: u64) -> Self {
        let scales = self.scales.map(|s| RowScales { offset: s.offset + row, ..s });
        Self { offset: self.offset + row * width, scales, ..self }
    }

    pub fn f32(buf: &'a wgpu::Buffer) -> Self {
        Self { buf, offset: 0, dtype: WeightDtype::F32, scales: None }
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

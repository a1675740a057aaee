//! What a component's weights take, block by block, and how the plan
//! holds them (resident, DF11-resident, streamed).

use super::*;

/// Weight bytes of one block of a component's program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockWeights {
    /// Weights outside DF11 groups, as the device holds them.
    pub plain: u64,
    /// DF11 group weights expanded to bf16 (slot bytes, alignment included).
    pub grouped: u64,
    /// The same groups compressed, as the device holds them.
    pub compressed: u64,
    /// The largest of the block's groups as the streaming area lays it out
    /// (its compressed arrays, each at a [`SLOT_ALIGN`] offset).
    pub largest_group: u64,
    /// Weights in GGML blocks as the device holds them (resident, or
    /// streamed into the slot like plain ones); each linear expands them a
    /// few rows at a time into the packed scratch.
    pub packed: u64,
    /// The same weights expanded to f32 once at load (resident only).
    pub packed_expanded: u64,
    /// The same weights expanded once at load on the half-precision data
    /// path: f16 rows with their range scales where a linear reads them
    /// whole (else f32, as above).
    pub packed_expanded_half: u64,
}

/// A component's weight bytes, summed and maximised over its blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightSizes {
    pub blocks: u64,
    pub plain: u64,
    pub grouped: u64,
    pub compressed: u64,
    /// Largest `plain + grouped` of one block: a streaming slot.
    pub max_block: u64,
    /// Largest `grouped` of one block: a DF11 expansion slot.
    pub max_block_grouped: u64,
    /// Largest group as the streaming area would hold it whole: streamed DF11
    /// groups are copied there compressed, one at a time (in runs of blocks
    /// past [`DF11_STREAM_AREA`]), and expanded into the slot.
    pub max_group: u64,
    /// Weights several blocks read, resident under every strategy.
    pub shared: u64,
    pub packed: u64,
    pub packed_expanded: u64,
    pub packed_expanded_half: u64,
    /// Shared weights in GGML blocks: resident in their blocks, or expanded
    /// to f32 at load when everything is.
    pub shared_packed: u64,
    pub shared_packed_expanded: u64,
    pub shared_packed_expanded_half: u64,
    /// Where a linear over weights in GGML blocks expands rows of them
    /// (0 without such weights); not needed when they are expanded at load.
    pub packed_scratch: u64,
    /// The range scales of the linears' weights' rows, which a device that
    /// rounds products' operands to f16 (the matrix tier) measures once and
    /// keeps under every strategy; not counted by [`Self::bytes`] until
    /// [`Self::keep_row_scales`].
    pub row_scales: u64,
}

impl WeightSizes {
    pub fn add_block(&mut self, b: BlockWeights) {
        self.blocks += 1;
        self.plain += b.plain;
        self.grouped += b.grouped;
        self.compressed += b.compressed;
        self.packed += b.packed;
        self.packed_expanded += b.packed_expanded;
        self.packed_expanded_half += b.packed_expanded_half;
        self.max_block = self.max_block.max(b.plain + b.packed + b.grouped);
        self.max_block_grouped = self.max_block_grouped.max(b.grouped);
        self.max_group = self.max_group.max(b.largest_group);
    }

    /// Counts the weights' row scales as kept (resident, with the shared weights).
    pub fn keep_row_scales(&mut self) {
        self.shared += self.row_scales;
        self.row_scales = 0;
    }

    /// Counts the weights in GGML blocks that are expanded once at load as
    /// the half-precision data path expands them: f16 rows and their scales.
    pub fn expand_half(&mut self) {
        self.packed_expanded = self.packed_expanded_half;
        self.shared_packed_expanded = self.shared_packed_expanded_half;
    }

    /// Whether some weights are held compressed (DF11 groups or GGML
    /// blocks), so keeping them compressed is a strategy.
    pub fn has_df11(&self) -> bool {
        self.compressed > 0 || self.packed > 0
    }

    /// Device bytes of the weights under `s`.
    pub fn bytes(&self, s: WeightStrategy) -> u64 {
        let packed = self.shared_packed + self.packed_scratch;
        self.shared
            + match s {
                WeightStrategy::ResidentBf16 => self.plain + self.grouped + self.packed_expanded + self.shared_packed_expanded,
                WeightStrategy::ResidentDf11 { slots } => packed + self.plain + self.packed + self.compressed + slots as u64 * self.max_block_grouped,
                WeightStrategy::Streamed { slots } => {
                    packed + slots as u64 * self.max_block + self.max_block.min(STREAM_STAGING) + self.max_group.min(DF11_STREAM_AREA)
                }
            }
    }

    /// The strategies that apply, fastest first.
    pub fn strategies(&self) -> impl Iterator<Item = WeightStrategy> {
        let df11 = self.has_df11();
        // GGML blocks need no slot: a second one only serves DF11 groups.
        [
            Some(WeightStrategy::ResidentBf16),
            (self.max_block_grouped > 0).then_some(WeightStrategy::ResidentDf11 { slots: 2 }),
            df11.then_some(WeightStrategy::ResidentDf11 { slots: 1 }),
            Some(WeightStrategy::Streamed { slots: 2 }),
            Some(WeightStrategy::Streamed { slots: 1 }),
        ]
        .into_iter()
        .flatten()
    }
}

/// How a component's weights are held on the device while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStrategy {
    /// Every weight resident as bf16 (DF11 groups expanded once at load;
    /// GGML blocks once, to f32, or to f16 rows on the half-precision data
    /// path).
    ResidentBf16,
    /// Plain weights and compressed DF11 groups resident; each block's
    /// groups expanded into bf16 slot `block mod slots` as it starts. GGML
    /// blocks stay resident in their blocks; each linear expands a few rows
    /// at a time as it runs.
    ResidentDf11 { slots: u8 },
    /// Nothing resident: each block's weights are copied from the mapped
    /// files into slot `block mod slots` as it starts (DF11 groups
    /// compressed, expanded on the device).
    Streamed { slots: u8 },
}

impl fmt::Display for WeightStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: u8| if n == 1 { "" } else { "s" };
        match self {
            WeightStrategy::ResidentBf16 => f.write_str("weights resident, expanded"),
            WeightStrategy::ResidentDf11 { slots } => {
                write!(f, "weights resident compressed (DF11 or GGML blocks), expanded per block into {slots} slot{}", plural(*slots))
            }
            WeightStrategy::Streamed { slots } => write!(f, "streamed per block from host memory into {slots} slot{}", plural(*slots)),
        }
    }
}

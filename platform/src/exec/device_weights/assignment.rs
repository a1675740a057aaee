//! Which weights each block reads alone and which several share, which
//! the products read and in what rows, and their bytes as the planner
//! counts them.

use super::*;

/// The weights of one block, or those several blocks share, by how they are held.
#[derive(Debug, Default, Clone)]
pub(super) struct Held {
    /// Plain tensors (bf16, f16, f32).
    pub(super) plain: Vec<String>,
    /// DF11 groups.
    pub(super) groups: Vec<usize>,
    /// Linears' weights in GGML blocks.
    pub(super) quantized: Vec<String>,
}

/// Which weights each block reads alone, and which several blocks share.
#[derive(Debug, Default)]
pub(super) struct Assignment {
    /// Per block: the weights only it reads, in order of first use.
    pub(super) own: Vec<Held>,
    pub(super) shared: Held,
    /// Weights in GGML blocks that other ops than linears read (a norm's,
    /// say): expanded to f32 once at load under every strategy.
    pub(super) expanded: Vec<String>,
}

impl Assignment {
    pub(super) fn new(store: &WeightStore, blocks: &[Vec<Op>]) -> Self {
        #[derive(PartialEq, Eq, Hash, Clone)]
        enum Key {
            Plain(String),
            Group(usize),
            Quantized(String),
        }
        let mut readers: Vec<(Key, Vec<usize>)> = Vec::new();
        let mut index: HashMap<Key, usize> = HashMap::new();
        // Weights in GGML blocks that something other than a linear's weight reads.
        let unpackable: std::collections::HashSet<&str> = blocks
            .iter()
            .flatten()
            .flat_map(|op| {
                let linear = match op {
                    Op::Linear { w, .. } | Op::LinearSwiGlu { w, .. } | Op::LinearHalf { w, .. } => Some(w.as_str()),
                    _ => None,
                };
                op.weights().map(|n| n.as_str()).filter(move |n| Some(*n) != linear)
            })
            .collect();
        for (b, block) in blocks.iter().enumerate() {
            for name in block.iter().flat_map(|op| op.weights()).map(|n| n.as_str()) {
                let key = match store.df11_location(name) {
                    Some((group, _)) => Key::Group(group),
                    None if store.quantized(name).is_some() => Key::Quantized(name.to_string()),
                    None => Key::Plain(name.to_string()),
                };
                match index.get(&key) {
                    Some(&i) if readers[i].1.last() != Some(&b) => readers[i].1.push(b),
                    Some(_) => {}
                    None => {
                        index.insert(key.clone(), readers.len());
                        readers.push((key, vec![b]));
                    }
                }
            }
        }
        let mut a = Assignment { own: vec![Held::default(); blocks.len()], ..Default::default() };
        for (key, bs) in readers {
            // A tensor that cannot be copied as stored (f16, widened on the
            // host) is resident under every strategy, as shared ones are.
            let fixed = matches!(&key, Key::Plain(n) if store.tensor(n).is_ok_and(|t| !streamable(t)));
            if let Key::Quantized(n) = &key {
                if unpackable.contains(n.as_str()) {
                    a.expanded.push(n.clone());
                    continue;
                }
            }
            let held = match bs.as_slice() {
                &[b] if !fixed => &mut a.own[b],
                _ => &mut a.shared,
            };
            match key {
                Key::Plain(n) => held.plain.push(n),
                Key::Group(g) => held.groups.push(g),
                Key::Quantized(n) => held.quantized.push(n),
            }
        }
        a
    }
}

/// Device bytes of a plain tensor as uploaded (f16 widens to f32).
pub(super) fn plain_bytes(t: TensorRef<'_>) -> u64 {
    let bytes = t.bytes.len() as u64;
    if t.dtype == Dtype::F16 { 2 * bytes } else { bytes }.next_multiple_of(4)
}

/// Whether a tensor can be copied into a slot as stored (bf16 or f32).
pub(super) fn streamable(t: TensorRef<'_>) -> bool {
    matches!(t.dtype, Dtype::BF16 | Dtype::F32)
}

/// A block's weights summed as the planner counts them. A tensor in GGML
/// blocks counts as a DF11 group does: its expansion (f32, or f16 rows on
/// the half-precision data path) as the grouped bytes, its blocks as the
/// compressed ones.
pub(super) fn block_weights(store: &WeightStore, held: &Held, products: &ProductShapes) -> Result<BlockWeights, RunError> {
    let mut b = BlockWeights::default();
    for name in &held.plain {
        b.plain += plain_bytes(store.tensor(name)?).next_multiple_of(SLOT_ALIGN);
    }
    for &g in &held.groups {
        // Streamed, each weight of the group takes its own aligned place (at least the group's expanded bytes).
        let group = compressed(store, g)?;
        b.grouped += group.weight_ranges().map(|r| (2 * r.len() as u64).next_multiple_of(SLOT_ALIGN)).sum::<u64>();
        b.compressed += Df11DeviceGroup::device_bytes_of(&group);
        b.largest_group = b.largest_group.max(area_bytes_of(&group, SLOT_ALIGN));
    }
    for name in &held.quantized {
        let q = quantized(store, name)?;
        b.packed += (q.bytes() as u64).next_multiple_of(SLOT_ALIGN);
        b.packed_expanded += expanded_bytes(&q);
        b.packed_expanded_half += match half_expansion(&q, name, products) {
            Some(rows) => rows.bytes(),
            None => expanded_bytes(&q),
        };
    }
    Ok(b)
}

/// The f32 scratch a linear over GGML blocks expands its rows into: the
/// largest such weight whole, or [`PACKED_SCRATCH`] bytes of whole rows.
pub(super) fn packed_scratch_bytes(store: &WeightStore, a: &Assignment) -> Result<u64, RunError> {
    let mut bytes = 0u64;
    for name in a.own.iter().chain([&a.shared]).flat_map(|h| &h.quantized) {
        let q = quantized(store, name)?;
        let row = 4 * q.shape.last().copied().unwrap_or(1) as u64;
        bytes = bytes.max(expanded_bytes(&q).min(PACKED_SCRATCH.max(row)));
    }
    Ok(bytes)
}

/// The most bytes of f32 rows a linear over GGML blocks expands at once.
pub const PACKED_SCRATCH: u64 = 64 << 20;

/// Slot bytes of a tensor's f32 expansion.
pub(super) fn expanded_bytes(q: &QuantizedRef<'_>) -> u64 {
    (4 * q.elements() as u64).next_multiple_of(SLOT_ALIGN)
}

/// The weights the products of `blocks` read (`Op::Linear`s' and
/// `Op::Conv2d`s'), once each in order of first use, with the rows they read
/// (from row 0 to the last any reads) and the terms of those rows (a
/// convolution's taps); a weight read with two different row widths is left
/// out (its products measure it themselves).
pub fn product_weights(blocks: &[Vec<Op>]) -> Vec<(String, u64, u64)> {
    let mut found: Vec<(String, u64, u64)> = Vec::new();
    let mut mixed = std::collections::HashSet::new();
    for op in blocks.iter().flatten() {
        let (w, last_row, terms) = match op {
            Op::Linear { w, w_row, cols, inner, .. } | Op::LinearHalf { w, w_row, cols, inner, .. } => (w, w_row + cols, *inner),
            Op::LinearSwiGlu { w, w_row, cols, inner, .. } => (w, w_row + 2 * cols, *inner),
            Op::Conv2d { w, shape, .. } | Op::ConvNhwc { w, shape, .. } => (w, shape.out_channels as u64, (shape.in_channels * shape.kernel * shape.kernel) as u64),
            _ => continue,
        };
        match found.iter_mut().find(|(name, ..)| name == w.as_str()) {
            Some((_, rows, k)) if *k == terms => *rows = (*rows).max(last_row),
            Some(_) => {
                mixed.insert(w.to_string());
            }
            None => found.push((w.to_string(), last_row, terms)),
        }
    }
    found.retain(|(name, ..)| !mixed.contains(name));
    found
}

/// The products' weights that keep their rows' range scales on a device
/// that measures them: all but those in GGML blocks (a linear over those
/// expands rows into a scratch, f32, and measures them there).
pub(super) fn scaled_products(store: &WeightStore, blocks: &[Vec<Op>]) -> Vec<(String, u64, u64)> {
    product_weights(blocks).into_iter().filter(|(name, ..)| store.quantized(name).is_none()).collect()
}

/// The rows each product's weight is read in, by name ([`product_weights`]):
/// (rows, terms a row).
pub(super) type ProductShapes = HashMap<String, (u64, u64)>;

pub(super) fn product_shapes(blocks: &[Vec<Op>]) -> ProductShapes {
    product_weights(blocks).into_iter().map(|(name, rows, terms)| (name, (rows, terms))).collect()
}

/// A linear's weight in GGML blocks expanded once at load as the
/// half-precision data path expands it: `rows` rows of `k` f16 values (two
/// a word), then the rows' range scales (an f32 each), in one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HalfRows {
    pub(super) rows: u64,
    pub(super) k: u64,
}

impl HalfRows {
    /// The element (f32) at which the scales follow the words.
    pub(super) fn scales_at(self) -> u64 {
        self.rows * self.k / 2
    }

    pub(super) fn bytes(self) -> u64 {
        4 * (self.scales_at() + self.rows)
    }
}

/// How the half-precision data path expands `name` (in GGML blocks) once
/// at load: straight into f16 rows (`kernels::ggml_expand_half`) where its
/// products read it in rows of its whole width, each whole blocks and runs
/// of the expansion; `None` where it goes to f32 as elsewhere.
pub(super) fn half_expansion(q: &QuantizedRef<'_>, name: &str, products: &ProductShapes) -> Option<HalfRows> {
    let k = q.shape.last().copied().unwrap_or(1) as u64;
    let &(_, terms) = products.get(name)?;
    (terms == k && kernels::expands_half(q.ggml, k)).then(|| HalfRows { rows: q.elements() as u64 / k, k })
}

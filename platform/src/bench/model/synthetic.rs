//! Weights made in memory for the benchmarks: random bf16 values in the
//! shapes a model's programs read, one buffer per distinct tensor of the
//! first block (the others share it).

use super::*;

/// A model's tensor shapes, turned into random bf16 device weights on demand.
/// Every block of a stack shares the first block's tensors.
pub(super) struct SyntheticWeights {
    shapes: HashMap<String, u64>,
}

impl SyntheticWeights {
    pub(super) fn new(specs: impl FnOnce(&mut dyn FnMut(&tensors::TensorSpec))) -> Self {
        let mut shapes = HashMap::new();
        specs(&mut |s| {
            shapes.insert(s.name.to_string(), s.shape.iter().product::<usize>() as u64);
        });
        Self { shapes }
    }

    /// Device weights for every tensor `ops` read, one buffer per tensor of
    /// the first block of each stack.
    pub(super) fn place<'o>(&self, gpu: &Gpu, ops: impl IntoIterator<Item = &'o Op>) -> Result<DeviceWeights, RunError> {
        let mut made: HashMap<String, DeviceBuffer> = HashMap::new();
        let mut weights = DeviceWeights::default();
        let ops: Vec<Op> = ops.into_iter().cloned().collect();
        // The products' weights' row scales, measured once per tensor as
        // the engine measures them at load, where the device keeps them.
        let linears = if gpu.measures_weight_rows() { product_weights(std::slice::from_ref(&ops)) } else { Vec::new() };
        let mut scales_made: HashMap<String, StoredScales> = HashMap::new();
        // On the half-precision data path each product's W as the engine
        // lays it out: packed as f16 under its row scales where the program
        // reads it so, once a buffer (`Op::packed_weight`), a channels-last
        // convolution's taps last (random values: any order is theirs).
        let packed_weights: Vec<String> = ops.iter().filter_map(Op::packed_weight).map(|w| w.to_string()).collect();
        let convolutions: Vec<String> = ops.iter().filter_map(|op| match op {
            Op::ConvNhwc { w, .. } => Some(w.to_string()),
            _ => None,
        }).collect();
        let mut packed: HashMap<String, bool> = HashMap::new();
        for name in ops.iter().flat_map(Op::weights) {
            let name = name.to_string();
            let shared = first_block(&name);
            let elements = *self
                .shapes
                .get(&name)
                .ok_or_else(|| RunError::Internal(format!("the program reads `{name}`, which the model's tensor list lacks")))?;
            let buffer = match made.get(&shared) {
                Some(b) => b.clone(),
                None => {
                    let seed = made.len() as u64 + 100;
                    let b = gpu.upload_bf16(&shared, &random_bf16(elements as usize, seed));
                    made.insert(shared.clone(), b.clone());
                    b
                }
            };
            let scales = match linears.iter().find(|(n, ..)| *n == name) {
                Some(&(_, _, k)) => Some(match scales_made.get(&shared) {
                    Some(s) => s.clone(),
                    None => {
                        let s = StoredScales::measure(gpu, Weight::bf16(&buffer), elements / k, k)?;
                        scales_made.insert(shared.clone(), s.clone());
                        s
                    }
                }),
                None => None,
            };
            let convolution = convolutions.contains(&name);
            let mut weight = DeviceWeight { buffer, offset: 0, dtype: WeightDtype::Bf16, scales, taps_last: convolution, half_packed: false };
            if packed_weights.contains(&name) && gpu.plan_limits().half_operands {
                // A buffer packed once: the weights sharing it read it as its first packing left it.
                match packed.get(&shared) {
                    Some(&was) => weight.half_packed = was,
                    None => {
                        weight.pack_half(gpu)?;
                        packed.insert(shared.clone(), weight.half_packed);
                    }
                }
            }
            weights.insert(&name, weight);
        }
        Ok(weights)
    }

    /// Bf16 weight bytes one block reads, each tensor once.
    pub(super) fn bytes_read(&self, block: &[Op]) -> u64 {
        let mut names: Vec<String> = block.iter().flat_map(Op::weights).map(|n| n.to_string()).collect();
        names.sort();
        names.dedup();
        names.iter().map(|n| 2 * self.shapes.get(n).copied().unwrap_or(0)).sum()
    }
}

/// A stacked block's tensor name split into its stack and the name inside
/// the block (`transformer_blocks.3.attn.to_q.weight` → `transformer_blocks.`,
/// `attn.to_q.weight`).
pub(super) fn in_stack(name: &str) -> Option<(&'static str, &str)> {
    ["single_transformer_blocks.", "transformer_blocks.", "model.layers."]
        .into_iter()
        .find_map(|stack| name.strip_prefix(stack).and_then(|r| r.split_once('.')).map(|(_, rest)| (stack, rest)))
}

/// The name of the same tensor in block 0 of its stack.
pub(super) fn first_block(name: &str) -> String {
    in_stack(name).map_or_else(|| name.to_string(), |(stack, rest)| format!("{stack}0.{rest}"))
}

/// The name inside its block.
pub(super) fn block_local(name: &str) -> &str {
    in_stack(name).map_or(name, |(_, rest)| rest)
}

/// Value `i` of a reproducible stream in [-1, 1) (splitmix64 of the index).
pub(super) fn unit_value(i: u64, seed: u64) -> f32 {
    let mut z = (i ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// `n` values of the stream for `seed`, times `scale`, made on every core.
pub(super) fn random_values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut v = vec![0f32; n];
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        for (j, x) in chunk.iter_mut().enumerate() {
            *x = scale * unit_value(((c << 16) + j) as u64, seed);
        }
    });
    v
}

/// Random bf16 weights of a trained model's scale (|w| < 0.03).
pub(super) fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    random_values(n, seed, 0.03).par_iter().map(|&x| flux_lite_core::numerics::bf16::from_f32(x)).collect()
}

/// Random activations in [-1, 1).
pub(super) fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    random_values(n, seed, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn stacked_names_map_to_their_first_block() {
        assert_eq!(first_block("single_transformer_blocks.7.attn.to_out.weight"), "single_transformer_blocks.0.attn.to_out.weight");
        assert_eq!(first_block("transformer_blocks.12.ff.linear_in.weight"), "transformer_blocks.0.ff.linear_in.weight");
        assert_eq!(first_block("model.layers.35.mlp.up_proj.weight"), "model.layers.0.mlp.up_proj.weight");
        assert_eq!(first_block("norm_out.linear.weight"), "norm_out.linear.weight");
        assert_eq!(block_local("transformer_blocks.3.attn.to_q.weight"), "attn.to_q.weight");
        assert_eq!(block_local("context_embedder.weight"), "context_embedder.weight");
    }
}

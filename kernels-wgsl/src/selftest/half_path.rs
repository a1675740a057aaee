//! The matrix tier's half-precision data path as the transformer runs it,
//! on the adapter's own tiles: products over f16 rows in pieces whose
//! epilogues write f16 pieces (plain, SwiGLU, the queries' and keys'
//! per-head RMSNorm + RoPE), the gated residual onto the f32 stream, and
//! attention over f16 pieces into f16 pieces, each at shapes derived from
//! the adapter's GEMM block (a klein head of 128 is one block row on 16×16
//! tiles) with ragged rows and more than one block, against core's f64
//! reference over the values the f16 inputs stand for. The inputs are
//! exact in f16, so what a check measures is the kernel's own: its f32
//! sums and the one rounding of each output to f16 under its piece's
//! power-of-two scale (at most 2⁻¹¹ of a value: relative L2 within
//! [`HALF_PRODUCT`]). Rows lie orders of magnitude apart in range, so
//! each is measured on its own (the queries', keys' and values' parts of
//! a projection's row apart): the worst row's relative L2, which a
//! wrong row, head or table row cannot hide under a larger one.

use super::{poisoned, run_and_read, worst_rel_l2, Check, Rng, HALF_PRODUCT, MATRIX_ATTENTION, WORST_ROW};
use crate::kernels::attention::{attention_half_into_half, Attention, HalfQkv};
use crate::kernels::attention_chunks::{on_products_in_bands, HeadInputs};
use flux_lite_core::ir::{ChunkedOperands, HeadsOnProducts};
use crate::kernels::linear::{linear_gated, linear_into_half, linear_into_half_normed, linear_swiglu_half, product_norms_heads, product_writes_pieces, swiglu_writes_pieces, Gemm, HeadNorm, Input, MATRIX_BLOCK_TILES};
use crate::kernels::rope::RopeTables;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::view::{HalfMat, Mat, Weight};
use crate::{DeviceBuffer, Gpu, GpuError};
use flux_lite_core::oracle::{self as r, AttentionShape, Weights};

/// The checks `gpu` takes: none off the matrix tier's f16 tiles (no other
/// tier reads or writes f16 pieces).
pub fn half_path_checks(gpu: &Gpu) -> Vec<Check> {
    let Some(block) = gpu.matrix().map(|c| c.size as usize * MATRIX_BLOCK_TILES as usize) else { return Vec::new() };
    if !product_writes_pieces(gpu, block as u64 / 2, false) {
        return Vec::new();
    }
    let tier = gpu.precision().name();
    let outcome = |name: String, tolerance: f64, got: Result<f64, GpuError>| match got {
        Ok(worst) => Check::measured(name, WORST_ROW, worst, tolerance),
        Err(e) => Check::failed(name, WORST_ROW, tolerance, e.to_string()),
    };
    // Two block rows, the second ragged; k over several k steps; pieces of
    // half a block (klein's 64 on 16×16 tiles).
    let (m, k, piece) = (block + 13, 2 * block, block / 2);
    let mut checks = vec![
        outcome(format!("{tier} linear into f16 pieces of {piece}, {m}×{}×{k}, its input f16 pieces", 5 * piece), HALF_PRODUCT, check_linear_into_pieces(gpu, [m, 5 * piece, k], piece)),
        outcome(format!("{tier} linear gated onto the f32 stream, {m}×{}×{k}, its input f16 pieces, bias", 3 * block - 6), HALF_PRODUCT, check_gated(gpu, [m, 3 * block - 6, k], piece)),
    ];
    if swiglu_writes_pieces(gpu, piece as u64) {
        checks.push(outcome(format!("{tier} SwiGLU into f16 pieces of {piece}, {m}×{}×{k}", 3 * piece), HALF_PRODUCT, check_swiglu_into_pieces(gpu, [m, 3 * piece, k], piece)));
    }
    for head_dim in [block, block / 2] {
        if product_norms_heads(gpu, piece as u64, head_dim as u64) {
            checks.push(outcome(
                format!("{tier} q/k/v projection norming its heads of {head_dim} (RMSNorm + RoPE) into f16 pieces of {piece}, {m} rows, 2 heads"),
                HALF_PRODUCT,
                check_normed_projection(gpu, [m, block], head_dim, piece),
            ));
        }
    }
    let on_products = gpu.attention_on_products(true);
    let kernel = match (on_products, crate::kernels::attention::takes_flash(gpu, 128, true)) {
        (true, _) => "products on the GEMM core",
        (false, true) => "flash kernel",
        (false, false) => "one-subgroup kernel",
    };
    checks.push(outcome(format!("{tier} attention ({kernel}) over f16 pieces of 64 into f16 pieces, 150 tokens, 2 heads × 128"), MATRIX_ATTENTION, check_attention_of_pieces(gpu, [150, 2, 128], 64, on_products)));
    // The text encoder's: causal, its padding keys hidden, grouped heads.
    let causal = PiecesCase { len: 150, heads: [4, 2], head_dim: 64, causal: true, padding: 20 };
    let stack = on_products.then(|| [flux_lite_core::ir::ATTENTION_QUERY_BAND, HeadsOnProducts::new(150, 150, 64, 4, u64::MAX).heads]);
    let worst = masked_attention_of_pieces(gpu, causal, 32, stack).map(|(got, want)| worst_rel_l2(&got, &want, 64));
    checks.push(outcome(format!("{tier} causal attention ({kernel}) over f16 pieces of 32, 150 tokens (20 padding), 4 query / 2 kv heads × 64"), MATRIX_ATTENTION, worst));
    checks
}

/// `rows` rows of `cols` values as f16 pieces of `piece`, with `spread`
/// the rows' pieces far apart in range (the first row large, the last
/// small, and within a row one piece large, one small): its words, its
/// scales (a row 1 apart more than its pieces, as a wider tensor's are)
/// and the values they stand for.
struct Pieces {
    words: DeviceBuffer,
    scales: DeviceBuffer,
    values: Vec<f32>,
    cols: usize,
    piece: usize,
}

impl Pieces {
    fn new(gpu: &Gpu, rng: &mut Rng, [rows, cols]: [usize; 2], piece: usize) -> Self {
        Self::spread(gpu, rng, [rows, cols], piece, true)
    }

    fn spread(gpu: &Gpu, rng: &mut Rng, [rows, cols]: [usize; 2], piece: usize, spread: bool) -> Self {
        let mut x = rng.normals(rows * cols, 1.0);
        if !spread {
            return Self::packed(gpu, &x, cols, piece);
        }
        x[..cols].iter_mut().for_each(|v| *v *= 3e4);
        x[(rows - 1) * cols..].iter_mut().for_each(|v| *v *= 1e-4);
        if piece < cols {
            x[cols..cols + piece].iter_mut().for_each(|v| *v *= 2e3);
            x[2 * cols + piece..2 * cols + 2 * piece].iter_mut().for_each(|v| *v *= 1e-3);
        }
        Self::packed(gpu, &x, cols, piece)
    }

    fn packed(gpu: &Gpu, x: &[f32], cols: usize, piece: usize) -> Self {
        let (rows, pieces) = (x.len() / cols, cols / piece);
        let (words, piece_scales) = pack_rows(x, rows * pieces, piece);
        let mut scales = vec![f32::NAN; rows * (pieces + 1)];
        for (i, s) in piece_scales.iter().enumerate() {
            scales[i / pieces * (pieces + 1) + i % pieces] = *s;
        }
        let values = unpack_rows(&words, &piece_scales, piece);
        Self { words: gpu.upload_u32("f16 words", &words), scales: gpu.upload_f32("f16 scales", &scales), values, cols, piece }
    }

    fn half(&self) -> HalfMat<'_> {
        HalfMat::pieces(Mat::new(&self.words, (self.cols / 2) as u64), Mat::new(&self.scales, (self.cols / self.piece + 1) as u64), self.piece as u64)
    }
}

/// An output of `[rows, cols]` f16 pieces of `piece`: written by `write`,
/// then read back as the values its words and scales stand for.
pub(super) fn written_in_pieces(gpu: &Gpu, [rows, cols]: [usize; 2], piece: usize, write: impl FnOnce(&mut wgpu::CommandEncoder, HalfMat<'_>) -> Result<(), GpuError>) -> Result<Vec<f32>, GpuError> {
    let pieces = cols / piece;
    let scales_at = rows * cols / 2;
    let out = poisoned(gpu, scales_at + rows * pieces);
    let dst = HalfMat::pieces(Mat::new(&out, (cols / 2) as u64), Mat { buf: &out, offset: scales_at as u64, stride: pieces as u64 }, piece as u64);
    let all = run_and_read(gpu, &out, scales_at + rows * pieces, |enc| write(enc, dst))?;
    let words: Vec<u32> = all[..scales_at].iter().map(|w| w.to_bits()).collect();
    Ok(unpack_rows(&words, &all[scales_at..], piece))
}

fn gemm([m, n, k]: [usize; 3]) -> Gemm {
    Gemm { m: m as u64, n: n as u64, k: k as u64 }
}

/// `x·Wᵀ` over f16 pieces into f16 pieces.
fn check_linear_into_pieces(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize) -> Result<f64, GpuError> {
    let mut rng = Rng::new(70);
    let x = Pieces::new(gpu, &mut rng, [m, k], piece);
    let w = rng.bf16s(n * k, 0.1);
    let mut want = vec![0.0; m * n];
    r::linear(&x.values, Weights::Bf16(&w), None, m, n, k, &mut want);
    let wb = gpu.upload_bf16("w", &w);
    let got = written_in_pieces(gpu, [m, n], piece, |enc, dst| linear_into_half(gpu, enc, Input::Half(x.half()), Weight::bf16(&wb), dst, gemm([m, n, k])))?;
    Ok(worst_rel_l2(&got, &want, n))
}

/// `stream += gate ⊙ (x·Wᵀ + b)` over f16 pieces onto an f32 stream (the
/// output projections' epilogue).
fn check_gated(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize) -> Result<f64, GpuError> {
    let mut rng = Rng::new(71);
    let x = Pieces::new(gpu, &mut rng, [m, k], piece);
    let (w, b) = (rng.bf16s(n * k, 0.1), rng.bf16s(n, 1.0));
    let (stream, gate) = (rng.normals(m * n, 3.0), rng.normals(n, 1.0));
    let mut product = vec![0.0; m * n];
    r::linear(&x.values, Weights::Bf16(&w), Some(Weights::Bf16(&b)), m, n, k, &mut product);
    let want: Vec<f64> = product.iter().enumerate().map(|(i, p)| f64::from(stream[i]) + f64::from(gate[i % n]) * p).collect();
    let (wb, bb, sb, gb) = (gpu.upload_bf16("w", &w), gpu.upload_bf16("b", &b), gpu.upload_f32("stream", &stream), gpu.upload_f32("gate", &gate));
    let gate_row = Mat { buf: &gb, offset: 0, stride: 0 };
    let got = run_and_read(gpu, &sb, m * n, |enc| linear_gated(gpu, enc, Input::Half(x.half()), Weight::bf16(&wb), Some(Weight::bf16(&bb)), Mat::new(&sb, n as u64), gate_row, gemm([m, n, k])))?;
    Ok(worst_rel_l2(&got, &want, n))
}

/// `silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)` over f16 pieces into f16 pieces, W's gate
/// rows then its up rows (the feed-forward's first product).
fn check_swiglu_into_pieces(gpu: &Gpu, [m, n, k]: [usize; 3], piece: usize) -> Result<f64, GpuError> {
    let mut rng = Rng::new(72);
    let x = Pieces::new(gpu, &mut rng, [m, k], piece);
    let w = rng.bf16s(2 * n * k, 0.1);
    let mut both = vec![0.0; m * 2 * n];
    r::linear(&x.values, Weights::Bf16(&w), None, m, 2 * n, k, &mut both);
    let want: Vec<f64> = (0..m * n).map(|i| r::silu(both[i / n * 2 * n + i % n]) * both[i / n * 2 * n + n + i % n]).collect();
    let wb = gpu.upload_bf16("w", &w);
    let got = written_in_pieces(gpu, [m, n], piece, |enc, dst| linear_swiglu_half(gpu, enc, Input::Half(x.half()), Weight::bf16(&wb), dst, gemm([m, n, k])))?;
    Ok(worst_rel_l2(&got, &want, n))
}

/// The single block's fused projection: queries, keys and values of 2
/// heads of `head_dim` over f16 pieces, the queries' and keys' heads
/// RMS-normed (each kind its own weight) and rotated in interleaved pairs
/// in the epilogue, output row t by table row 3 + t, into f16 pieces.
fn check_normed_projection(gpu: &Gpu, [m, k]: [usize; 2], head_dim: usize, piece: usize) -> Result<f64, GpuError> {
    let (heads, d, eps, first_row) = (2, head_dim, 1e-6, 3usize);
    let part = heads * d;
    let n = 3 * part;
    let mut rng = Rng::new(73 + d as u64);
    let x = Pieces::new(gpu, &mut rng, [m, k], piece);
    let w = rng.bf16s(n * k, 0.1);
    let norms = [rng.bf16s(d, 1.0), rng.bf16s(d, 1.0)];
    // Tables of `d` entries a row, each pair's angle twice (as the model's are).
    let angles: Vec<f64> = (0..(first_row + m) * d).map(|i| ((i / 2) as f64 * 0.37).sin() * 3.0).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let mut product = vec![0.0; m * n];
    r::linear(&x.values, Weights::Bf16(&w), None, m, n, k, &mut product);
    let mut want = product.clone();
    let table = |t: &[f32]| t[first_row * d..].to_vec();
    for (kind, norm) in norms.iter().enumerate() {
        let cols: Vec<f32> = (0..m).flat_map(|t| product[t * n + kind * part..t * n + (kind + 1) * part].iter().map(|v| *v as f32)).collect();
        let mut normed = vec![0.0; m * part];
        r::rms_norm(&cols, Weights::Bf16(norm), m * heads, d, eps, &mut normed);
        let normed: Vec<f32> = normed.iter().map(|v| *v as f32).collect();
        let mut roped = vec![0.0; m * part];
        r::rope_interleaved(&normed, &table(&cos), &table(&sin), m, heads, d, &mut roped);
        for t in 0..m {
            want[t * n + kind * part..t * n + (kind + 1) * part].copy_from_slice(&roped[t * part..(t + 1) * part]);
        }
    }
    let (wb, cb, sb) = (gpu.upload_bf16("w", &w), gpu.upload_f32("cos", &cos), gpu.upload_f32("sin", &sin));
    let (qn, kn) = (gpu.upload_bf16("q norm", &norms[0]), gpu.upload_bf16("k norm", &norms[1]));
    let norm = HeadNorm {
        first: Weight::bf16(&qn),
        second: Weight::bf16(&kn),
        first_cols: part as u64,
        cols: 2 * part as u64,
        head_dim: d as u64,
        eps: eps as f32,
        tables: RopeTables { cos: &cb, sin: &sb, first_row: first_row as u64 },
    };
    let got = written_in_pieces(gpu, [m, n], piece, |enc, dst| linear_into_half_normed(gpu, enc, Input::Half(x.half()), Weight::bf16(&wb), dst, norm, gemm([m, n, k])))?;
    Ok(worst_rel_l2(&got, &want, part))
}

/// Attention over queries, keys and values in f16 pieces (as their
/// projections write them) into f16 pieces (the output projection's input).
fn check_attention_of_pieces(gpu: &Gpu, shape: [usize; 3], piece: usize, on_products: bool) -> Result<f64, GpuError> {
    let [len, heads, head_dim] = shape.map(|x| x as u64);
    let stack = on_products.then(|| [flux_lite_core::ir::ATTENTION_QUERY_BAND, HeadsOnProducts::new(len, len, head_dim, heads, u64::MAX).heads]);
    let (got, want) = attention_of_pieces(gpu, shape, piece, stack)?;
    Ok(worst_rel_l2(&got, &want, shape[2]))
}

/// The attention over f16 pieces of [`check_attention_of_pieces`]'s
/// inputs, on products in bands of `band` queries, `heads` heads stacked
/// (`Some([band, heads])`), or (`None`) on the kernel the device picks;
/// and the f64 attention.
fn attention_of_pieces(gpu: &Gpu, [len, heads, head_dim]: [usize; 3], piece: usize, stack: Option<[u64; 2]>) -> Result<(Vec<f32>, Vec<f64>), GpuError> {
    masked_attention_of_pieces(gpu, PiecesCase { len, heads: [heads; 2], head_dim, causal: false, padding: 0 }, piece, stack)
}

/// An attention over f16 pieces: `len` tokens, `[query, kv]` heads of
/// `head_dim`, causal or not, its last `padding` keys hidden.
#[derive(Debug, Clone, Copy)]
struct PiecesCase {
    len: usize,
    heads: [usize; 2],
    head_dim: usize,
    causal: bool,
    padding: usize,
}

/// [`attention_of_pieces`] of `case`.
fn masked_attention_of_pieces(gpu: &Gpu, case: PiecesCase, piece: usize, stack: Option<[u64; 2]>) -> Result<(Vec<f32>, Vec<f64>), GpuError> {
    let PiecesCase { len, heads: [heads, kv_heads], head_dim, causal, padding } = case;
    let mut rng = Rng::new(74);
    let (width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    // Scores of normal queries and keys; values far apart in range.
    let q = Pieces::spread(gpu, &mut rng, [len, width], piece, false);
    let [k, v] = [false, true].map(|spread| Pieces::spread(gpu, &mut rng, [len, kv_width], piece, spread));
    let s = Attention { q_len: len as u64, kv_len: len as u64, q_heads: heads as u64, kv_heads: kv_heads as u64, head_dim: head_dim as u64, scale: 1.0 / (head_dim as f32).sqrt(), causal };
    let shape = AttentionShape { q_len: len, kv_len: len, q_heads: heads, kv_heads, head_dim, scale: f64::from(s.scale), causal };
    let keep: Vec<u32> = (0..len).map(|i| u32::from(i + padding < len)).collect();
    let key_keep = (padding > 0).then(|| gpu.upload_u32("attention key mask", &keep));
    let mut want = vec![0.0; len * width];
    r::attention(&q.values, &k.values, &v.values, (padding > 0).then_some(&keep[..]), shape, &mut vec![0.0; len], &mut want);
    let qkv = HalfQkv { q: q.half(), k: k.half(), v: v.half() };
    let keep = key_keep.as_deref();
    let got = match stack {
        Some([band, stacked]) => {
            // Poison where no value is written: the rows past each head's band in the stack too.
            let part = HeadsOnProducts::laid_out(s.kv_len, s.head_dim, band.min(s.q_len), stacked);
            let scratch = poisoned(gpu, part.end as usize);
            let operands = poisoned(gpu, ChunkedOperands::new(s.head_dim, stacked, part.chunk).end as usize);
            let buffers = [Mat::new(&scratch, 0), Mat::new(&operands, 0)];
            written_in_pieces(gpu, [len, width], piece, |enc, dst| on_products_in_bands(gpu, enc, HeadInputs::Pieces(qkv), keep, dst, buffers, s, [band, stacked]))?
        }
        None => written_in_pieces(gpu, [len, width], piece, |enc, dst| attention_half_into_half(gpu, enc, qkv, keep, dst, s))?,
    };
    Ok((got, want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::f16_matrix_gpu;

    #[test]
    fn the_half_paths_checks_pass_on_matrix_units_at_the_adapters_block() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        // Every kind: into pieces, gated, SwiGLU, both head widths normed, attention, causal attention.
        super::super::assert_checks_pass(&half_path_checks(&gpu), 7);
    }

    /// The transformer's attention as products on the GEMM core (where the
    /// flash kernel is not proven), whichever path the device takes: over
    /// f16 pieces into f16 pieces, against the f64 attention.
    #[test]
    fn attention_on_products_over_pieces_matches_the_oracle() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        // An odd number of tokens too: its probabilities and values padded to whole f16 pairs.
        for (shape, piece) in [([150, 2, 128], 64), ([70, 3, 64], 32), ([71, 2, 64], 32)] {
            let worst = check_attention_of_pieces(&gpu, shape, piece, true).unwrap_or_else(|e| panic!("{e}"));
            println!("attention on products {shape:?}, pieces of {piece}: worst row's relative L2 {worst:.2e}");
            assert!(worst <= MATRIX_ATTENTION, "{shape:?}: {worst:e}");
        }
    }

    /// The text encoder's attention on products: causal, its padding keys
    /// hidden, four query heads on two kv heads, against the f64 attention;
    /// and its stacks (grouped heads on their shared values in one `P·V`,
    /// a stack starting inside a group) and bands give one stack's bits.
    #[test]
    fn causal_grouped_masked_attention_on_products_matches_the_oracle_in_any_stack() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        let case = PiecesCase { len: 150, heads: [4, 2], head_dim: 64, causal: true, padding: 20 };
        let run = |stack: [u64; 2]| masked_attention_of_pieces(&gpu, case, 32, Some(stack)).unwrap_or_else(|e| panic!("{e}"));
        let (whole, want) = run([150, 4]);
        let worst = worst_rel_l2(&whole, &want, 64);
        println!("causal attention on products, 150 tokens (20 padding), 4 query / 2 kv heads × 64: worst row's relative L2 {worst:.2e}");
        assert!(worst <= MATRIX_ATTENTION, "{worst:e}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for stack in [[150, 3], [150, 1], [64, 2], [7, 3]] {
            assert_eq!(bits(&run(stack).0), bits(&whole), "bands of {}, {} heads a stack", stack[0], stack[1]);
        }
    }

    /// Its bands of queries (each over every key) and its stacks of heads
    /// (each head's `P·V` on its own values in one product) give the bits
    /// of one band of every query and every head at once.
    #[test]
    fn attention_on_products_by_bands_and_stacks_equals_one_band_and_stack_bit_for_bit() {
        let Some(gpu) = f16_matrix_gpu() else { return };
        let bits = |stack: [u64; 2]| {
            let (got, _) = attention_of_pieces(&gpu, [150, 3, 64], 32, Some(stack)).unwrap_or_else(|e| panic!("{e}"));
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let whole = bits([150, 3]);
        // Stacks of two and one (the last stack short), bands of 64 and 7.
        for stack in [[150, 2], [150, 1], [64, 2], [7, 1], [64, 3]] {
            assert_eq!(bits(stack), whole, "bands of {}, {} heads a stack", stack[0], stack[1]);
        }
    }
}

//! The flash attention's start-up check: on a device whose tier is the
//! matrix tier's f16 tiles, `attention_flash.wgsl` runs two small attentions
//! against the exact f64 attention before any run takes it: over f32 rows
//! (every tile edge cut, grouped heads, a causal mask, values far from 1),
//! and the transformer's path, f16 queries, keys and values in pieces into
//! f16 pieces. Both heads are wider than half a workgroup's output dims on
//! 16×16 tiles (64), so the kernel stages its queries in both of its
//! chunks there as klein's heads of 128 make it. A driver that
//! computes it wrongly (an H200 returned NaN for an earlier form) leaves
//! the matrix tier on `attention_matrix.wgsl`, with a notice saying why.

use crate::device::Gpu;
use crate::kernels::attention::{flash_attention, flash_attention_half, Attention, HalfQkv, Qkv};
use crate::probe::ProbeError;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::selftest::rel_l2;
use crate::view::{HalfMat, Mat};
use flux_lite_core::oracle::{self, AttentionShape};
use flux_lite_core::tolerance::kernels::MATRIX_ATTENTION;

const Q_LEN: usize = 70;
const KV_LEN: usize = 77;
const Q_HEADS: usize = 4;
const KV_HEADS: usize = 2;
/// The f32 rows' heads: no whole number of 8×8 or 16×16 tiles.
const HEAD_DIM: usize = 100;
/// The f16 path's heads and pieces: klein's, two pieces a head.
const HALF_HEAD_DIM: usize = 128;
const PIECE: usize = 64;

/// Deterministic values in [-1, 1) times `scale`: no random source needed at start-up.
fn values(count: usize, mul: usize, scale: f32) -> Vec<f32> {
    (0..count).map(|i| (((i * mul + i / 5) % 97) as f32 / 48.5 - 1.0) * scale).collect()
}

fn shape(head_dim: usize) -> AttentionShape {
    let scale = 1.0 / (head_dim as f32).sqrt();
    AttentionShape { q_len: Q_LEN, kv_len: KV_LEN, q_heads: Q_HEADS, kv_heads: KV_HEADS, head_dim, scale: scale as f64, causal: true }
}

/// The probe's queries, keys and values for heads of `head_dim`; values
/// above f16's range, so the range rule's scales are exercised too.
fn inputs(head_dim: usize) -> [Vec<f32>; 3] {
    [values(Q_LEN * Q_HEADS * head_dim, 7, 2.0), values(KV_LEN * KV_HEADS * head_dim, 11, 2.0), values(KV_LEN * KV_HEADS * head_dim, 13, 3.0e5)]
}

/// Runs `attention_flash.wgsl` on `gpu` (a matrix-tier device with f16 tiles) against the exact answer.
pub fn flash_known_answer(gpu: &Gpu) -> Result<(), ProbeError> {
    let [q, k, v] = inputs(HEAD_DIM);
    let s = shape(HEAD_DIM);
    let mut want = vec![0.0; q.len()];
    oracle::attention(&q, &k, &v, None, s, &mut vec![0.0; KV_LEN], &mut want);
    let (qb, kb, vb, ob) = (gpu.upload_f32("flash probe q", &q), gpu.upload_f32("flash probe k", &k), gpu.upload_f32("flash probe v", &v), gpu.storage("flash probe o", (q.len() * 4) as u64));
    let (qw, kw) = ((Q_HEADS * HEAD_DIM) as u64, (KV_HEADS * HEAD_DIM) as u64);
    let qkv = Qkv { q: Mat::new(&qb, qw), k: Mat::new(&kb, kw), v: Mat::new(&vb, kw) };
    let call = Attention { q_len: Q_LEN as u64, kv_len: KV_LEN as u64, q_heads: Q_HEADS as u64, kv_heads: KV_HEADS as u64, head_dim: HEAD_DIM as u64, scale: s.scale as f32, causal: true };
    gpu.submit(|enc| flash_attention(gpu, enc, qkv, Mat::new(&ob, qw), call)).map_err(ProbeError::Gpu)?;
    let got = gpu.read_f32(&ob, 0, q.len()).map_err(ProbeError::Gpu)?;
    check(&got, &want, Layout { what: "over f32 rows", heads: Q_HEADS, head_dim: HEAD_DIM })?;
    half_known_answer(gpu)
}

/// The transformer's path: the same queries, keys and values as f16 rows in
/// pieces (no causal mask, one kv head a query head), the output into f16
/// pieces; against the exact attention over the values the pieces stand for.
fn half_known_answer(gpu: &Gpu) -> Result<(), ProbeError> {
    let [q, k, v] = inputs(HALF_HEAD_DIM);
    let width = Q_HEADS * HALF_HEAD_DIM;
    // Keys and values as wide as the queries: each kv head's rows twice.
    let widen = |x: &[f32]| -> Vec<f32> { x.chunks(KV_HEADS * HALF_HEAD_DIM).take(Q_LEN).flat_map(|row| [row, row].concat()).collect() };
    let (k, v) = (widen(&k), widen(&v));
    let packed: Vec<(Vec<u32>, Vec<f32>)> = [&q, &k, &v].iter().map(|x| pack_rows(x, x.len() / PIECE, PIECE)).collect();
    let stands_for: Vec<Vec<f32>> = packed.iter().map(|(w, s)| unpack_rows(w, s, PIECE)).collect();
    let s = AttentionShape { kv_len: Q_LEN, kv_heads: Q_HEADS, causal: false, ..shape(HALF_HEAD_DIM) };
    let mut want = vec![0.0; q.len()];
    oracle::attention(&stands_for[0], &stands_for[1], &stands_for[2], None, s, &mut vec![0.0; Q_LEN], &mut want);
    let buffers: Vec<_> = packed.iter().map(|(w, sc)| (gpu.upload_u32("flash probe f16 rows", w), gpu.upload_f32("flash probe scales", sc))).collect();
    let pieces = (width / PIECE) as u64;
    let of = |i: usize| HalfMat::pieces(Mat::new(&buffers[i].0, (width / 2) as u64), Mat::new(&buffers[i].1, pieces), PIECE as u64);
    let (ow, os) = (gpu.storage("flash probe o", (q.len() * 2) as u64), gpu.storage("flash probe o scales", Q_LEN as u64 * pieces * 4));
    let out = HalfMat::pieces(Mat::new(&ow, (width / 2) as u64), Mat::new(&os, pieces), PIECE as u64);
    let call = Attention { q_len: Q_LEN as u64, kv_len: Q_LEN as u64, q_heads: Q_HEADS as u64, kv_heads: Q_HEADS as u64, head_dim: HALF_HEAD_DIM as u64, scale: s.scale as f32, causal: false };
    gpu.submit(|enc| flash_attention_half(gpu, enc, HalfQkv { q: of(0), k: of(1), v: of(2) }, out, call)).map_err(ProbeError::Gpu)?;
    let words: Vec<u32> = gpu.read_f32(&ow, 0, q.len() / 2).map_err(ProbeError::Gpu)?.iter().map(|w| w.to_bits()).collect();
    let scales = gpu.read_f32(&os, 0, Q_LEN * pieces as usize).map_err(ProbeError::Gpu)?;
    check(&unpack_rows(&words, &scales, PIECE), &want, Layout { what: "over f16 pieces", heads: Q_HEADS, head_dim: HALF_HEAD_DIM })
}

/// Which of the two attentions an output belongs to, and its rows' layout
/// (`heads` of `head_dim` a query row), to say where a wrong one lies.
#[derive(Debug, Clone, Copy)]
struct Layout {
    what: &'static str,
    heads: usize,
    head_dim: usize,
}

impl Layout {
    /// Output `i` as (query row, head, dim).
    fn place(&self, i: usize) -> (usize, usize, usize) {
        let width = self.heads * self.head_dim;
        (i / width, i % width / self.head_dim, i % self.head_dim)
    }
}

/// Every value finite, and the relative L2 error within the matrix tier's
/// attention bound. A refusal says where: the first wrong output's query
/// row, head and dim, and how many outputs and query rows are not finite.
fn check(got: &[f32], want: &[f64], layout: Layout) -> Result<(), ProbeError> {
    if let Some(i) = got.iter().position(|g| !g.is_finite()) {
        let (row, head, dim) = layout.place(i);
        let bad: Vec<usize> = (0..got.len()).filter(|&j| !got[j].is_finite()).collect();
        let mut rows: Vec<usize> = bad.iter().map(|&j| layout.place(j).0).collect();
        rows.dedup();
        let mut heads: Vec<usize> = bad.iter().map(|&j| layout.place(j).1).collect();
        heads.sort_unstable();
        heads.dedup();
        let detail = format!("{} of {} outputs not finite, in {} query rows ({}–{}), heads {heads:?}", bad.len(), got.len(), rows.len(), rows[0], rows[rows.len() - 1]);
        return Err(ProbeError::Wrong(format!("flash attention {}: output {i} (query row {row}, head {head}, dim {dim}) is {}; {detail}", layout.what, got[i])));
    }
    let err = rel_l2(got, want);
    match err <= MATRIX_ATTENTION {
        true => Ok(()),
        false => Err(ProbeError::Wrong(format!("flash attention {} is {err:.2e} from the exact answer (relative L2; the bound is {MATRIX_ATTENTION:.0e})", layout.what))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_refuses_nan_and_far_answers_and_takes_close_ones() {
        let want = [1.0, -2.0, 3.0];
        let layout = Layout { what: "over f32 rows", heads: 1, head_dim: 3 };
        assert!(check(&[1.0, -2.0, 3.0], &want, layout).is_ok());
        assert!(matches!(check(&[1.0, f32::NAN, 3.0], &want, layout), Err(ProbeError::Wrong(w)) if w.contains("over f32 rows: output 1 (query row 0, head 0, dim 1) is NaN; 1 of 3 outputs not finite, in 1 query rows (0–0), heads [0]")));
        assert!(matches!(check(&[1.5, -2.0, 3.0], &want, layout), Err(ProbeError::Wrong(w)) if w.contains("from the exact answer")));
    }

    #[test]
    fn the_values_pass_f16s_range() {
        for head_dim in [HEAD_DIM, HALF_HEAD_DIM] {
            let [_, _, v] = inputs(head_dim);
            assert!(v.iter().any(|x| x.abs() > 65504.0));
        }
    }
}

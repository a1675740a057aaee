//! The flash attention's known-answer attentions: the start-up check's two
//! ([`CHECK_ROWS`], [`CHECK_PIECES`]) and, for `flux-lite gpu
//! --flash-report`, [`VARIATIONS`] of them that each change one thing (the
//! values' range, the mask, the heads, the head width, whole tiles, the
//! number of key tiles), so that one run on an adapter that fails the check
//! says which shape, values or path the fault follows. Each runs against the
//! exact f64 attention ([`flux_lite_core::oracle::attention`]).

use crate::device::Gpu;
use crate::kernels::attention::{flash_attention, flash_attention_half, Attention, HalfQkv, Qkv};
use crate::probe::ProbeError;
use crate::range_rule::{pack_rows, unpack_rows};
use crate::view::{HalfMat, Mat};
use flux_lite_core::oracle::{self, AttentionShape};

/// The f16 path's pieces: klein's, two to a head of 128.
const PIECE: usize = 64;

/// One attention the flash kernel is run on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    pub name: &'static str,
    /// What it changes from the check it varies.
    pub what: &'static str,
    pub q_len: usize,
    pub kv_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Query i sees keys 0 ..= i.
    pub causal: bool,
    /// The values' largest magnitude (the queries' and keys' is 2).
    pub v_scale: f32,
    /// f16 queries, keys and values in pieces of 64, written into f16
    /// pieces (the transformer's path); else f32 rows into f32 rows.
    pub pieces: bool,
}

/// The check over f32 rows: every tile edge cut (70 queries, 77 keys, heads
/// of 100: no whole number of 8×8 or 16×16 tiles), grouped heads, a causal
/// mask, values far past f16's range. Heads wider than half a workgroup's
/// output dims on 16×16 tiles (64), so the queries are staged in both of
/// the kernel's chunks there, as klein's heads of 128 make it.
pub const CHECK_ROWS: Case = Case {
    name: "check-rows",
    what: "the start-up check over f32 rows",
    q_len: 70,
    kv_len: 77,
    q_heads: 4,
    kv_heads: 2,
    head_dim: 100,
    causal: true,
    v_scale: 3.0e5,
    pieces: false,
};

/// The check of the transformer's path: f16 pieces in and out, one kv head
/// a query head, no mask, klein's heads of 128.
pub const CHECK_PIECES: Case = Case {
    name: "check-pieces",
    what: "the start-up check over f16 pieces",
    q_len: 70,
    kv_len: 70,
    q_heads: 4,
    kv_heads: 4,
    head_dim: 128,
    causal: false,
    v_scale: 3.0e5,
    pieces: true,
};

/// The plainest attention: whole tiles everywhere, no mask, values f16 holds.
const WHOLE_TILES: Case = Case {
    name: "whole-tiles",
    what: "64 queries and 64 keys, one head of 128, no mask, values to 3",
    q_len: 64,
    kv_len: 64,
    q_heads: 1,
    kv_heads: 1,
    head_dim: 128,
    causal: false,
    v_scale: 3.0,
    pieces: false,
};

/// The checks, then one change at a time.
pub const VARIATIONS: [Case; 11] = [
    CHECK_ROWS,
    Case { name: "small-values", what: "values within f16's range (to 3)", v_scale: 3.0, ..CHECK_ROWS },
    Case { name: "no-mask", what: "no causal mask", causal: false, ..CHECK_ROWS },
    Case { name: "one-head", what: "one query head on one kv head", q_heads: 1, kv_heads: 1, ..CHECK_ROWS },
    Case { name: "head-64", what: "heads of 64 (the queries staged in one chunk)", head_dim: 64, ..CHECK_ROWS },
    Case { name: "head-128", what: "heads of 128", head_dim: 128, ..CHECK_ROWS },
    WHOLE_TILES,
    Case { name: "one-key-tile", what: "as whole-tiles with 16 keys (one key tile on any tiles)", kv_len: 16, ..WHOLE_TILES },
    Case { name: "many-keys", what: "as whole-tiles with 520 keys, two heads, values to 3e5", kv_len: 520, q_heads: 2, kv_heads: 2, v_scale: 3.0e5, ..WHOLE_TILES },
    CHECK_PIECES,
    Case { name: "pieces-small", what: "f16 pieces with values within f16's range (to 3)", v_scale: 3.0, ..CHECK_PIECES },
];

/// Whether `gpu` runs the flash attention at all: its tier is the matrix
/// tier's f16 tiles (whether it passed its check or not).
pub fn runs_on(gpu: &Gpu) -> bool {
    gpu.f16_operands()
}

/// Deterministic values in [-1, 1) times `scale`: no random source needed at start-up.
fn values(count: usize, mul: usize, scale: f32) -> Vec<f32> {
    (0..count).map(|i| (((i * mul + i / 5) % 97) as f32 / 48.5 - 1.0) * scale).collect()
}

impl Case {
    fn shape(&self) -> AttentionShape {
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        AttentionShape { q_len: self.q_len, kv_len: self.kv_len, q_heads: self.q_heads, kv_heads: self.kv_heads, head_dim: self.head_dim, scale: scale as f64, causal: self.causal }
    }

    fn call(&self) -> Attention {
        Attention::from(self.shape())
    }

    /// Its queries, keys and values as f32 rows.
    pub fn inputs(&self) -> [Vec<f32>; 3] {
        let kv = self.kv_len * self.kv_heads * self.head_dim;
        [values(self.q_len * self.q_heads * self.head_dim, 7, 2.0), values(kv, 11, 2.0), values(kv, 13, self.v_scale)]
    }

    /// Where output `i` lies.
    pub fn layout(&self) -> Layout {
        Layout { heads: self.q_heads, head_dim: self.head_dim }
    }
}

/// A case's outputs and the exact answer.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub got: Vec<f32>,
    pub want: Vec<f64>,
}

/// Runs `case` on `gpu` (a matrix-tier device with f16 tiles): the flash
/// kernel's outputs beside the exact attention over the values its inputs
/// stand for (f16 pieces: the values the pieces hold).
pub fn run(gpu: &Gpu, case: &Case) -> Result<Outcome, ProbeError> {
    debug_assert!(runs_on(gpu));
    let [q, k, v] = case.inputs();
    let s = case.shape();
    if case.pieces {
        return run_pieces(gpu, case, [q, k, v]);
    }
    let mut want = vec![0.0; q.len()];
    oracle::attention(&q, &k, &v, None, s, &mut vec![0.0; case.kv_len], &mut want);
    let (qb, kb, vb, ob) =
        (gpu.upload_f32("flash probe q", &q), gpu.upload_f32("flash probe k", &k), gpu.upload_f32("flash probe v", &v), gpu.storage("flash probe o", (q.len() * 4) as u64));
    let (qw, kw) = ((case.q_heads * case.head_dim) as u64, (case.kv_heads * case.head_dim) as u64);
    let qkv = Qkv { q: Mat::new(&qb, qw), k: Mat::new(&kb, kw), v: Mat::new(&vb, kw) };
    gpu.submit(|enc| flash_attention(gpu, enc, qkv, Mat::new(&ob, qw), case.call())).map_err(ProbeError::Gpu)?;
    let got = gpu.read_f32(&ob, 0, q.len()).map_err(ProbeError::Gpu)?;
    Ok(Outcome { got, want })
}

/// [`run`] on the transformer's path: each tensor packed into f16 pieces,
/// the output read back from its pieces.
fn run_pieces(gpu: &Gpu, case: &Case, [q, k, v]: [Vec<f32>; 3]) -> Result<Outcome, ProbeError> {
    let widths = [case.q_heads * case.head_dim, case.kv_heads * case.head_dim, case.kv_heads * case.head_dim];
    let packed: Vec<(Vec<u32>, Vec<f32>)> = [&q, &k, &v].iter().map(|x| pack_rows(x, x.len() / PIECE, PIECE)).collect();
    let stands_for: Vec<Vec<f32>> = packed.iter().map(|(w, s)| unpack_rows(w, s, PIECE)).collect();
    let mut want = vec![0.0; q.len()];
    oracle::attention(&stands_for[0], &stands_for[1], &stands_for[2], None, case.shape(), &mut vec![0.0; case.kv_len], &mut want);
    let buffers: Vec<_> = packed.iter().map(|(w, sc)| (gpu.upload_u32("flash probe f16 rows", w), gpu.upload_f32("flash probe scales", sc))).collect();
    let of = |i: usize| HalfMat::pieces(Mat::new(&buffers[i].0, (widths[i] / 2) as u64), Mat::new(&buffers[i].1, (widths[i] / PIECE) as u64), PIECE as u64);
    let pieces = (widths[0] / PIECE) as u64;
    let (ow, os) = (gpu.storage("flash probe o", (q.len() * 2) as u64), gpu.storage("flash probe o scales", case.q_len as u64 * pieces * 4));
    let out = HalfMat::pieces(Mat::new(&ow, (widths[0] / 2) as u64), Mat::new(&os, pieces), PIECE as u64);
    gpu.submit(|enc| flash_attention_half(gpu, enc, HalfQkv { q: of(0), k: of(1), v: of(2) }, out, case.call())).map_err(ProbeError::Gpu)?;
    let words: Vec<u32> = gpu.read_f32(&ow, 0, q.len() / 2).map_err(ProbeError::Gpu)?.iter().map(|w| w.to_bits()).collect();
    let scales = gpu.read_f32(&os, 0, case.q_len * pieces as usize).map_err(ProbeError::Gpu)?;
    Ok(Outcome { got: unpack_rows(&words, &scales, PIECE), want })
}

/// An output's place in its case's rows (`heads` of `head_dim` a query row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub heads: usize,
    pub head_dim: usize,
}

impl Layout {
    /// Output `i` as (query row, head, dim).
    pub fn place(&self, i: usize) -> (usize, usize, usize) {
        let width = self.heads * self.head_dim;
        (i / width, i % width / self.head_dim, i % self.head_dim)
    }
}

/// One output: its index, where it lies, what came and what is right.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Output {
    pub index: usize,
    pub row: usize,
    pub head: usize,
    pub dim: usize,
    pub got: f32,
    pub want: f64,
}

/// What an outcome shows: its outputs that are not finite (how many, in how
/// many query rows and which heads, the first), and the finite ones'
/// relative L2 error and the one farthest from its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub non_finite: usize,
    pub non_finite_rows: Vec<usize>,
    pub non_finite_heads: Vec<usize>,
    pub first_non_finite: Option<Output>,
    pub finite_rel_l2: f64,
    pub farthest: Option<Output>,
}

impl Outcome {
    pub fn finding(&self, layout: Layout) -> Finding {
        let output = |i: usize| {
            let (row, head, dim) = layout.place(i);
            Output { index: i, row, head, dim, got: self.got[i], want: self.want[i] }
        };
        let bad: Vec<usize> = (0..self.got.len()).filter(|&i| !self.got[i].is_finite()).collect();
        let mut rows: Vec<usize> = bad.iter().map(|&i| layout.place(i).0).collect();
        rows.dedup();
        let mut heads: Vec<usize> = bad.iter().map(|&i| layout.place(i).1).collect();
        heads.sort_unstable();
        heads.dedup();
        let finite: Vec<usize> = (0..self.got.len()).filter(|&i| self.got[i].is_finite()).collect();
        let (mut diff2, mut ref2) = (0.0, 0.0);
        for &i in &finite {
            diff2 += (self.got[i] as f64 - self.want[i]).powi(2);
            ref2 += self.want[i].powi(2);
        }
        let farthest = finite.iter().copied().max_by(|&a, &b| (self.got[a] as f64 - self.want[a]).abs().total_cmp(&(self.got[b] as f64 - self.want[b]).abs()));
        Finding {
            non_finite: bad.len(),
            non_finite_rows: rows,
            non_finite_heads: heads,
            first_non_finite: bad.first().map(|&i| output(i)),
            finite_rel_l2: (diff2 / f64::max(ref2, f64::MIN_POSITIVE)).sqrt(),
            farthest: farthest.map(output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variations_each_change_the_check_they_follow() {
        let names: Vec<&str> = VARIATIONS.iter().map(|c| c.name).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!((VARIATIONS[0], VARIATIONS[9]), (CHECK_ROWS, CHECK_PIECES));
        for case in VARIATIONS {
            assert_eq!(case.q_heads % case.kv_heads, 0, "{}", case.name);
            assert!(!case.pieces || case.head_dim % PIECE == 0, "{}", case.name);
        }
    }

    /// Every case within the matrix tier's attention bound on the test
    /// device, twice alike: the cases themselves sound (and, on NVIDIA's
    /// tiles emulated, the kernel as that layout runs it).
    #[test]
    fn every_variation_passes_on_the_test_device_and_repeats() {
        let Some(gpu) = crate::testing::f16_matrix_gpu() else {
            return;
        };
        assert!(runs_on(&gpu));
        for case in VARIATIONS {
            let first = run(&gpu, &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            let f = first.finding(case.layout());
            assert_eq!(f.non_finite, 0, "{}: {f:?}", case.name);
            assert!(f.finite_rel_l2 <= flux_lite_core::tolerance::kernels::MATRIX_ATTENTION, "{}: {f:?}", case.name);
            let again = run(&gpu, &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert!(first.got.iter().zip(&again.got).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", case.name);
        }
    }

    #[test]
    fn a_finding_places_the_outputs_not_finite_and_measures_the_rest() {
        let outcome = Outcome { got: vec![1.0, f32::NEG_INFINITY, 3.0, 4.5, f32::NAN, 6.0], want: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0] };
        let f = outcome.finding(Layout { heads: 1, head_dim: 3 });
        assert_eq!((f.non_finite, f.non_finite_rows.clone(), f.non_finite_heads.clone()), (2, vec![0, 1], vec![0]));
        assert_eq!(f.first_non_finite.map(|o| (o.index, o.row, o.head, o.dim)), Some((1, 0, 0, 1)));
        let want = (0.25f64 / (1.0 + 9.0 + 16.0 + 36.0)).sqrt();
        assert!((f.finite_rel_l2 - want).abs() < 1e-12, "{}", f.finite_rel_l2);
        assert_eq!(f.farthest.map(|o| (o.index, o.row, o.dim)), Some((3, 1, 0)));
    }
}

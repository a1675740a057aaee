//! The matrix tier's chunked attention of one wide head (the VAE's
//! mid-block on the channels-last path) against the f64 attention, run
//! whole or by bands of queries over calls on whole chunks of keys.

use super::{poisoned, rel_l2, Check, Rng, MATRIX_ATTENTION};
use crate::kernels::attention::{Attention, Carry, Qkv};
use crate::kernels::attention_chunks::{attention_chunked, runs_chunked_attention};
use crate::{Gpu, GpuError, Mat};
use flux_lite_core::ir::{chunked_attention_scratch, ChunkedOperands, ATTENTION_KEY_CHUNK};
use flux_lite_core::oracle as r;

/// One head's random queries, keys and values (`q_len`, `kv_len` rows of
/// `d`) and their f64 attention.
#[derive(Debug)]
pub struct OneHead {
    pub q_len: usize,
    pub kv_len: usize,
    pub d: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub want: Vec<f64>,
}

impl OneHead {
    /// Normals times `scales` (queries, keys, values).
    pub fn new([q_len, kv_len, d]: [usize; 3], scales: [f32; 3], seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let (q, k, v) = (rng.normals(q_len * d, scales[0]), rng.normals(kv_len * d, scales[1]), rng.normals(kv_len * d, scales[2]));
        let want = Self::reference(&q, &k, &v, [q_len, kv_len, d]);
        Self { q_len, kv_len, d, q, k, v, want }
    }

    /// The f64 attention of one head's rows.
    pub fn reference(q: &[f32], k: &[f32], v: &[f32], [q_len, kv_len, d]: [usize; 3]) -> Vec<f64> {
        let shape = r::AttentionShape { q_len, kv_len, q_heads: 1, kv_heads: 1, head_dim: d, scale: Self::scale(d) as f64, causal: false };
        let mut want = vec![0.0; q_len * d];
        r::attention(q, k, v, None, shape, &mut vec![0.0; kv_len], &mut want);
        want
    }

    fn scale(d: usize) -> f32 {
        (1.0 / (d as f64).sqrt()) as f32
    }

    /// The output on `gpu`: each band of queries (`(first, end)` rows) over
    /// each call's keys in turn, the softmax carried from call to call.
    pub fn run(&self, gpu: &Gpu, bands: &[(usize, usize)], calls: &[(usize, usize)]) -> Result<Vec<f32>, GpuError> {
        let d = self.d as u64;
        let (qb, kb, vb) = (gpu.upload_f32("q", &self.q), gpu.upload_f32("k", &self.k), gpu.upload_f32("v", &self.v));
        let (ob, state) = (poisoned(gpu, self.q.len()), poisoned(gpu, 2 * self.q_len));
        let scratch = poisoned(gpu, chunked_attention_scratch(self.q_len as u64, d) as usize);
        let operands = poisoned(gpu, ChunkedOperands::new(d, 1, flux_lite_core::ir::ATTENTION_KEY_CHUNK).end as usize);
        let rows = |b, r0: usize| Mat { buf: b, offset: r0 as u64 * d, stride: d };
        for &(q0, q1) in bands {
            for (i, &(k0, k1)) in calls.iter().enumerate() {
                // The state's rows side by side from the band's first, its stride
                // unset, as the banded run's spans carry it.
                let carry = (calls.len() > 1).then(|| Carry { state: Mat { buf: &state, offset: 2 * q0 as u64, stride: 0 }, from_state: i > 0, keep_state: i + 1 < calls.len() });
                let s = Attention { q_len: (q1 - q0) as u64, kv_len: (k1 - k0) as u64, q_heads: 1, kv_heads: 1, head_dim: d, scale: Self::scale(self.d), causal: false };
                let qkv = Qkv { q: rows(&qb, q0), k: rows(&kb, k0), v: rows(&vb, k0) };
                gpu.submit(|enc| attention_chunked(gpu, enc, qkv, rows(&ob, q0), carry, Mat::new(&scratch, 0), &operands, s))?;
            }
        }
        gpu.read_f32(&ob, 0, self.q.len())
    }

    /// [`Self::run`] as one call, its relative L2 against the f64 attention.
    pub fn error(&self, gpu: &Gpu) -> Result<f64, GpuError> {
        Ok(rel_l2(&self.run(gpu, &[(0, self.q_len)], &[(0, self.kv_len)])?, &self.want))
    }
}

/// Where `gpu` runs it: the chunked attention of one head of 512 (the VAE
/// mid-block's width) over three chunks of keys, the last part-filled.
pub fn chunked_attention_checks(gpu: &Gpu) -> Vec<Check> {
    if !runs_chunked_attention(gpu) {
        return Vec::new();
    }
    let name = format!("{} attention on the GEMM core over chunks of {ATTENTION_KEY_CHUNK} keys, 40 queries, 4200 keys, one head × 512 (the VAE mid-block's)", gpu.precision().name());
    vec![match OneHead::new([40, 4200, 512], [1.0; 3], 74).error(gpu) {
        Ok(worst) => Check::measured(name, "relative L2", worst, MATRIX_ATTENTION),
        Err(e) => Check::failed(name, "relative L2", MATRIX_ATTENTION, e.to_string()),
    }]
}

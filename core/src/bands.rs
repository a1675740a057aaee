//! Results computed band by band, combined on the host as if computed whole:
//! attention outputs over key chunks (by their log-sum-exp), for the banded VAE.

use alloc::vec;
use alloc::vec::Vec;

/// Attention outputs of one query band over several key chunks, merged as
/// `Σ exp(lse_j − m)·o_j / Σ exp(lse_j − m)` per row and head, in f64.
#[derive(Debug)]
pub struct AttentionMerge {
    head_dim: usize,
    max: Vec<f64>,
    sum: Vec<f64>,
    acc: Vec<f64>,
}

impl AttentionMerge {
    pub fn new(rows: u64, heads: u64, head_dim: u64) -> Self {
        let (rows, heads, head_dim) = (rows as usize, heads as usize, head_dim as usize);
        Self { head_dim, max: vec![f64::NEG_INFINITY; rows * heads], sum: vec![0.0; rows * heads], acc: vec![0.0; rows * heads * head_dim] }
    }

    /// One key chunk's normalised output `[rows, heads·head_dim]` and log-sum-exp `[rows, heads]`.
    pub fn add(&mut self, out: &[f32], lse: &[f32]) {
        for (i, &l) in lse.iter().enumerate() {
            let l = l as f64;
            if l == f64::NEG_INFINITY {
                continue;
            }
            let m = self.max[i].max(l);
            let (keep, take) = (libm::exp(self.max[i] - m), libm::exp(l - m));
            self.max[i] = m;
            self.sum[i] = self.sum[i] * keep + take;
            let row = &mut self.acc[i * self.head_dim..(i + 1) * self.head_dim];
            for (a, &x) in row.iter_mut().zip(&out[i * self.head_dim..(i + 1) * self.head_dim]) {
                *a = *a * keep + x as f64 * take;
            }
        }
    }

    pub fn finish(&self) -> Vec<f32> {
        let d = self.head_dim;
        (0..self.sum.len()).flat_map(|i| self.acc[i * d..(i + 1) * d].iter().map(move |&a| (a / self.sum[i]) as f32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_attention_chunks_equal_one_softmax() {
        // One query, one head of dim 1, four keys with scores s and values v,
        // split 1 + 3: each chunk normalised on its own.
        let (s, v) = ([0.5f64, 2.0, -1.0, 1.5], [1.0f64, -2.0, 4.0, 3.0]);
        let chunk = |r: std::ops::Range<usize>| {
            let z: f64 = r.clone().map(|j| s[j].exp()).sum();
            let o = r.clone().map(|j| s[j].exp() * v[j]).sum::<f64>() / z;
            ([o as f32], [z.ln() as f32])
        };
        let mut m = AttentionMerge::new(1, 1, 1);
        for r in [0..1, 1..4] {
            let (o, l) = chunk(r);
            m.add(&o, &l);
        }
        let z: f64 = s.iter().map(|x| x.exp()).sum();
        let want = s.iter().zip(&v).map(|(a, b)| a.exp() * b).sum::<f64>() / z;
        assert!((m.finish()[0] as f64 - want).abs() < 1e-6);
    }
}

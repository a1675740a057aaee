//! Results computed band by band, combined on the host as if computed whole:
//! GroupNorm statistics (count, mean, Σ(x − mean)²) and attention outputs
//! over key chunks (by their log-sum-exp). The banded VAE uses both.

use alloc::vec;
use alloc::vec::Vec;

/// Count, mean and Σ(x − mean)² of a set of values, merged band by band (Chan et al.).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    pub count: f64,
    pub mean: f64,
    pub m2: f64,
}

impl Moments {
    pub fn merge(&mut self, other: Moments) {
        let total = self.count + other.count;
        if total == 0.0 {
            return;
        }
        let delta = other.mean - self.mean;
        self.mean += delta * other.count / total;
        self.m2 += other.m2 + delta * delta * self.count * other.count / total;
        self.count = total;
    }

    /// The population variance (what GroupNorm divides by).
    pub fn variance(&self) -> f64 {
        self.m2 / self.count
    }
}

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
    fn moments_merge_to_the_whole_sets_moments() {
        let xs = [3.0f64, -1.0, 4.5, 2.0, 9.0, -7.25, 0.5];
        let of = |s: &[f64]| {
            let mean = s.iter().sum::<f64>() / s.len() as f64;
            Moments { count: s.len() as f64, mean, m2: s.iter().map(|x| (x - mean) * (x - mean)).sum() }
        };
        let mut m = Moments::default();
        for part in [&xs[..2], &xs[2..3], &xs[3..]] {
            m.merge(of(part));
        }
        let whole = of(&xs);
        assert!((m.mean - whole.mean).abs() < 1e-12 && (m.m2 - whole.m2).abs() < 1e-9, "{m:?} vs {whole:?}");
        assert_eq!(m.count, 7.0);
    }

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

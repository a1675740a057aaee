//! The mid-block attention by bands of queries and calls over chunks of
//! keys (`BandRunner::attention`).

use super::{bands, BandRunner};
use crate::error::RunError;
use crate::exec::activations::{Activations, Window};
use flux_lite_core::ir::{chunked_attention_scratch, AttentionCarry, Op, Span, ATTENTION_KEY_CHUNK};
use flux_lite_core::models::vae::chunked_band_elements;
use flux_lite_kernels::kernels::ATTENTION_KEY_TILE;

impl BandRunner<'_> {
    /// The mid-block attention of `q_len` queries over `kv_len` keys (rows
    /// `[n, heads·head_dim]`) by bands of queries, each over calls on
    /// chunks of the keys (a multiple of the kernel's key tile, or of the
    /// chunked attention's chunk) carrying its online softmax from call to
    /// call: the calls meet the whole run's tiles or chunks where it does,
    /// so the bits of the whole call.
    pub(super) fn attention(&self, store: &mut dyn Activations, [q, k, v, o]: [Span; 4], [q_len, kv_len]: [u64; 2], head_dim: u64, form: Attending) -> Result<(), RunError> {
        let (heads, tile) = match form {
            Attending::Carried { heads } => (heads, ATTENTION_KEY_TILE),
            Attending::Chunked => (1, ATTENTION_KEY_CHUNK),
        };
        let width = heads * head_dim;
        // Keys and values take half the band (all of them, or whole tiles),
        // the queries the other half: the bands' sizes do not grow with the image.
        let fits = self.capacity / 2 / (2 * width);
        let key_chunk = if kv_len <= fits { kv_len } else { fits / tile * tile };
        if key_chunk == 0 {
            return Err(RunError::Layout { component: "banded VAE", detail: format!("a band holds {} values, too few for one chunk of {tile} attention keys; give it a larger tile", self.capacity) });
        }
        // Each query's row, output row and state; the chunked attention's scratch besides.
        let (fixed, per_query) = match form {
            Attending::Carried { .. } => (2 * key_chunk * width, 2 * width + 2 * heads),
            Attending::Chunked => chunked_band_elements(head_dim, key_chunk),
        };
        let band = self.band(fixed, per_query, "attention query")?;
        let chunks: Vec<(u64, u64)> = bands(kv_len, key_chunk).collect();
        for (q0, q1) in bands(q_len, band) {
            let rows = q1 - q0;
            let queries = Window::run(q0 * width, q1 * width);
            let mut arena = self.operands();
            let (qs, os, ss) = (arena.take(rows * width)?, arena.take(rows * width)?, arena.take(2 * rows * heads)?);
            let (ks, vs) = (arena.take(key_chunk * width)?, arena.take(key_chunk * width)?);
            let scratch = match form {
                Attending::Chunked => arena.take(chunked_attention_scratch(rows, head_dim))?,
                Attending::Carried { .. } => ss,
            };
            self.fetch(store, q, queries, qs)?;
            for (i, &(k0, k1)) in chunks.iter().enumerate() {
                let keys = Window::run(k0 * width, k1 * width);
                self.fetch(store, k, keys, ks)?;
                self.fetch(store, v, keys, vs)?;
                let carry = (chunks.len() > 1).then_some(AttentionCarry { state: ss, from_state: i > 0, keep_state: i + 1 < chunks.len() });
                let view = |s: Span| Span::new(s.offset, width);
                let [q, k, v, o] = [qs, ks, vs, os].map(view);
                self.exec(match form {
                    Attending::Carried { .. } => Op::CarriedAttention { q, k, v, o, q_len: rows, kv_len: k1 - k0, heads, head_dim, carry },
                    Attending::Chunked => Op::ChunkedAttention { q, k, v, o, scratch, q_len: rows, kv_len: k1 - k0, head_dim, carry },
                })?;
            }
            self.put(store, os, o, queries)?;
        }
        Ok(())
    }
}

/// Which kernel a banded attention's calls run: the carried one over
/// `heads` heads, or the matrix tier's chunked one (one head, a scratch a call).
#[derive(Debug, Clone, Copy)]
pub(super) enum Attending {
    Carried { heads: u64 },
    Chunked,
}

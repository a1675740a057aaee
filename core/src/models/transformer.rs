//! `Flux2Transformer2DModel` as block programs over one activation arena.
//!
//! The residual stream is one `[text + image, D]` tensor with the text rows
//! first: the double blocks update its two parts with their own weights,
//! joint attention runs over it directly, and the single blocks need no
//! concatenation. Every dimension comes from the config.
//!
//! By chunks of tokens (a layout whose `chunk` is below the row count), a
//! block runs twice over its rows a chunk at a time: first every row's keys
//! and values (kept whole), then each chunk's queries, its attention over
//! every key, and the rest of the block, updating the stream's rows in
//! place. Only the stream, the keys and the values are as long as the
//! sequence; each row's arithmetic is the unchunked pass's.
//!
//! In the half-K/V layout (by chunks) the keys and values are kept as f16
//! pairs, each (token, head) row under its range scale: a chunk's keys and
//! values are projected into chunk scratch, normed and roped there, and
//! packed (`Op::HalfPack`); attention reads them packed
//! (`Op::HalfKvAttention`). That halves the floor's keys and values at the
//! cost of rounding them to f16.
//!
//! The image rows are the noise tokens, then the tokens of any reference
//! images: every block runs over both, and only the noise tokens' velocity
//! is computed (diffusers slices the prediction to them).
//!
//! With the klein KV cache (`Flux2KleinKVPipeline`), the first step's
//! pass extracts (`KvPass::Extract`): the reference rows are modulated from
//! a fixed timestep 0 and attend to themselves only, while the text and
//! noise rows attend to every row, and each block's reference keys and
//! values (after RoPE) are kept in the cache. Later steps' passes
//! (`KvPass::Cached`) run the text and noise rows alone, their attention
//! reading the cached reference keys and values in the reference rows of
//! `k` and `v`. diffusers orders the sequence `[text, references, noise]`
//! there; attention does not depend on the order of its keys, so the rows
//! keep this layout's `[text, noise, references]`.

use crate::ir::{linear, linear_swiglu, name, Gate, HeadNorm, LaterModulation, Op, Operand, RopeStyle, Span};
use crate::models::tensors::TensorName;
use core::fmt::Write;

mod layout;
pub use layout::*;

/// The timestep MLP on `sinusoid` into `temb`, and `silu(temb)` into
/// `temb_silu`, which the modulations read (its scratch: `t_hidden`, `t_act`).
fn timestep_embedding(l: &TransformerLayout, sinusoid: Span, [temb, temb_silu]: [Span; 2], emit: &mut impl FnMut(Op)) {
    let d = l.dim;
    emit(linear(sinusoid, name(format_args!("time_guidance_embed.timestep_embedder.linear_1.weight")), l.t_hidden, 1, d, l.sinusoid_dim));
    emit(Op::Silu { src: l.t_hidden, dst: l.t_act, rows: 1, cols: d });
    emit(linear(l.t_act, name(format_args!("time_guidance_embed.timestep_embedder.linear_2.weight")), temb, 1, d, d));
    emit(Op::Silu { src: temb, dst: temb_silu, rows: 1, cols: d });
}

/// Timestep MLP, the shared modulations, and the two input embedders.
pub fn prologue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    let d = l.dim;
    let one = |s: Span| Span::new(s.offset, 0);
    timestep_embedding(l, l.sinusoid, [l.temb, l.temb_silu], &mut emit);
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_img.linear.weight")), l.mod_img, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("double_stream_modulation_txt.linear.weight")), l.mod_txt, 1, 6 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("single_stream_modulation.linear.weight")), l.mod_single, 1, 3 * d, d));
    emit(linear(one(l.temb_silu), name(format_args!("norm_out.linear.weight")), l.mod_out, 1, 2 * d, d));
    if let Some(kv) = l.kv.filter(|kv| kv.pass == KvPass::Extract) {
        // The reference rows' modulations, from the sinusoid of timestep 0.
        timestep_embedding(l, kv.sinusoid, [kv.temb, kv.temb_silu], &mut emit);
        emit(linear(one(kv.temb_silu), name(format_args!("double_stream_modulation_img.linear.weight")), kv.mod_img, 1, 6 * d, d));
        emit(linear(one(kv.temb_silu), name(format_args!("single_stream_modulation.linear.weight")), kv.mod_single, 1, 3 * d, d));
    }
    emit(linear(l.prompt, name(format_args!("context_embedder.weight")), l.stream, l.text, d, l.joint_dim));
    emit(linear(l.latents, name(format_args!("x_embedder.weight")), l.stream.rows_from(l.text), l.active_image(), d, l.in_channels));
}

/// A modulation vector, and where an extracting pass's reference rows find theirs.
#[derive(Clone, Copy)]
struct Modulation {
    vector: Span,
    reference: fn(&KvCache) -> Span,
}

/// Rows that share one modulation: `(first row, rows, modulation vector)`.
type Segment = (u64, u64, Span);

/// The modulation segments of rows `first .. first + rows` under `m`: in an
/// extracting pass the reference rows among them take `m`'s reference vector.
fn segments(l: &TransformerLayout, first: u64, rows: u64, m: Modulation) -> heapless::Vec<Segment, 2> {
    let mut out = heapless::Vec::new();
    let (end, ref_start) = (first + rows, l.text + l.noise);
    match l.kv.filter(|kv| kv.pass == KvPass::Extract && end > ref_start) {
        Some(kv) => {
            if first < ref_start {
                let _ = out.push((first, ref_start - first, m.vector));
            }
            let start = first.max(ref_start);
            let _ = out.push((start, end - start, (m.reference)(&kv)));
        }
        None => {
            let _ = out.push((first, rows, m.vector));
        }
    }
    out
}

/// The stream's rows `first .. first + n` normalised and modulated (chunks
/// `shift`, `scale` of `m`) into `normed`, whose rows start at the stream's
/// row `base`: 0 unchunked, the chunk's first row by chunks.
fn modulate(l: &TransformerLayout, (first, n, base): (u64, u64, u64), m: Modulation, chunks: [u64; 2], emit: &mut impl FnMut(Op)) {
    modulate_segments(l, &segments(l, first, n, m), base, chunks, emit);
}

/// [`modulate`] over every row of `streams` (consecutive rows, unchunked).
fn modulate_streams(l: &TransformerLayout, streams: &[&Stream<'_>], chunks: [u64; 2], emit: &mut impl FnMut(Op)) {
    let segments: heapless::Vec<Segment, 4> = streams.iter().flat_map(|s| segments(l, s.first_row, s.rows, s.modulation)).collect();
    modulate_segments(l, &segments, 0, chunks, emit);
}

/// Segments of the stream's rows normalised and modulated (chunks `shift`,
/// `scale` of each segment's vector) into `normed` (rows from the stream's
/// row `base`): two consecutive segments in one pass, the second's rows
/// under its own modulation ([`LaterModulation`]).
fn modulate_segments(l: &TransformerLayout, segments: &[Segment], base: u64, [shift, scale]: [u64; 2], emit: &mut impl FnMut(Op)) {
    let mut i = 0;
    while i < segments.len() {
        let (r, count, v) = segments[i];
        let next = segments.get(i + 1).filter(|&&(r2, ..)| r2 == r + count);
        let later = next.map(|&(_, _, v2)| LaterModulation { row: count, shift: l.chunk(v2, shift), scale: l.chunk(v2, scale) });
        let tokens = count + next.map_or(0, |&(_, n, _)| n);
        emit(Op::LayerNormModulate { src: l.stream.rows_from(r), dst: l.normed.rows_from(r - base), shift: l.chunk(v, shift), scale: l.chunk(v, scale), later, tokens, d: l.dim, eps: l.eps });
        i += 1 + next.is_some() as usize;
    }
}

/// The gated residual (chunk `gate` of `m`) of `proj` into the stream's rows
/// `first .. first + n`, `proj`'s rows starting at the stream's row `base`.
fn gated_residual(l: &TransformerLayout, (first, n, base): (u64, u64, u64), m: Modulation, gate: u64, emit: &mut impl FnMut(Op)) {
    for (r, count, v) in segments(l, first, n, m) {
        emit(Op::GatedResidual { dst: l.stream.rows_from(r), gate: l.chunk(v, gate), y: l.proj.rows_from(r - base), rows: count, cols: l.dim });
    }
}

/// `x·Wᵀ` (W `w`, rows of `inner` terms) added into the stream's rows
/// `first .. first + n` under chunk `gate` of `m`, in the product's
/// epilogue ([`Gate`], `proj`'s rows from the stream's row `base` its
/// scratch) where one modulation vector covers the rows; else into `proj`
/// and the gated residual of each segment after it.
#[allow(clippy::too_many_arguments)] // the product, the rows, and their gate
fn project_into_stream(l: &TransformerLayout, x: Operand, w: TensorName, inner: u64, (first, n, base): (u64, u64, u64), m: Modulation, gate: u64, emit: &mut impl FnMut(Op)) {
    let proj = l.proj.rows_from(first - base);
    match segments(l, first, n, m).as_slice() {
        &[(r, count, v)] => emit(Op::Linear {
            x,
            w,
            w_row: 0,
            bias: None,
            y: l.stream.rows_from(r),
            rows: count,
            cols: l.dim,
            inner,
            gate: Some(Gate { vector: l.chunk(v, gate), scratch: proj }),
        }),
        _ => {
            emit(linear(x, w, proj, n, l.dim, inner));
            gated_residual(l, (first, n, base), m, gate, emit);
        }
    }
}

/// Attention over every row in `q`, `k`, `v` into `o`, as the pass has
/// it: the cache's copies ([`kv_copies`]), then [`attend`] for every row.
fn attention(l: &TransformerLayout, block: u64, [q, k, v]: [Operand; 3], o: Operand, emit: &mut impl FnMut(Op)) {
    if l.kv.is_some() {
        kv_copies(l, block, k.f32_rows(), v.f32_rows(), emit);
    }
    attend(l, [q, k, v], o, 0, l.active_rows(), emit);
}

/// The KV pipeline's copies between the reference rows of `k`, `v` and
/// cache block `block`: extracting, the rows into the cache (once every
/// row's keys are roped); cached, the cache into the rows (before any
/// query attends).
fn kv_copies(l: &TransformerLayout, block: u64, k: Span, v: Span, emit: &mut impl FnMut(Op)) {
    let Some(kv) = l.kv else { return };
    let refs = |s: Span| s.rows_from(l.text + l.noise);
    for (part, data) in [(0, k), (1, v)] {
        let Some(slot) = kv.slot(block, part) else { continue };
        let (src, dst) = match kv.pass {
            KvPass::Extract => (refs(data), slot),
            KvPass::Cached => (slot, refs(data)),
        };
        emit(Op::Copy { src, dst, rows: kv.references, cols: l.dim });
    }
}

/// Attention of the query rows `first .. first + rows` (`q` and `o` start at
/// row `first`) over the keys of every row: all rows over all rows;
/// extracting, the reference rows over the reference rows only. `o` is f16
/// rows in pieces only where the layout has pieces: laid out whole, without
/// the KV cache, where one [`Op::Attention`] takes every row.
fn attend(l: &TransformerLayout, [q, k, v]: [Operand; 3], o: Operand, first: u64, rows: u64, emit: &mut impl FnMut(Op)) {
    let (heads, hd) = (l.heads, l.head_dim);
    let (all, own) = (l.text + l.image, l.text + l.noise);
    // `q_len` queries over the `kv_len` keys from row `kv_first`, f32 or half.
    let mut cross = |q: Span, o: Span, q_len: u64, kv_first: u64, kv_len: u64| {
        let (k, v) = (k.f32_rows().rows_from(kv_first), v.f32_rows().rows_from(kv_first));
        emit(match l.kv_scales {
            None => Op::CrossAttention { q, k, v, o, q_len, kv_len, heads, head_dim: hd },
            Some([ks, vs]) => Op::HalfKvAttention { q, k, v, k_scales: ks.rows_from(kv_first), v_scales: vs.rows_from(kv_first), o, q_len, kv_len, heads, head_dim: hd },
        })
    };
    match l.kv_pass() {
        None if first == 0 && rows == all && l.kv_scales.is_none() => emit(Op::Attention { q, k, v, o, len: all, heads, head_dim: hd }),
        _ if o.is_half() => unreachable!("the layout keeps a chunked or cached pass's attention output f32"),
        Some(KvPass::Extract) => {
            let (q, o) = (q.f32_rows(), o.f32_rows());
            let end = first + rows;
            if first < own {
                cross(q, o, end.min(own) - first, 0, all);
            }
            if end > own {
                let start = first.max(own);
                cross(q.rows_from(start - first), o.rows_from(start - first), end - start, own, all - own);
            }
        }
        _ => cross(q.f32_rows(), o.f32_rows(), rows, 0, all),
    }
}

/// Where a chunk of rows from `first` gets its keys and values projected:
/// straight into the whole `k` and `v`, or in the half-K/V layout into
/// chunk scratch (`q` and `attn`, free until the chunk's queries), for
/// [`keep_keys_values`] to rope and pack.
fn key_value_targets(l: &TransformerLayout, first: u64) -> [Span; 2] {
    match l.kv_scales {
        None => [l.k.rows_from(first), l.v.rows_from(first)],
        Some(_) => [l.q, l.attn.f32_rows()],
    }
}

/// After a chunk's keys (normed) and values are in [`key_value_targets`]:
/// in the half-K/V layout, RoPE on the chunk's keys and both packed into
/// rows `first .. first + n` (f32 keys are roped all at once by [`rope_keys`]).
fn keep_keys_values(l: &TransformerLayout, first: u64, n: u64, emit: &mut impl FnMut(Op)) {
    let Some([ks, vs]) = l.kv_scales else { return };
    let (heads, head_dim) = (l.heads, l.head_dim);
    emit(Op::RopeInterleaved { data: l.q, table_row: first, tokens: n, heads, head_dim });
    emit(Op::HalfPack { src: l.q, dst: l.k.rows_from(first), scales: ks.rows_from(first), tokens: n, heads, head_dim });
    emit(Op::HalfPack { src: l.attn.f32_rows(), dst: l.v.rows_from(first), scales: vs.rows_from(first), tokens: n, heads, head_dim });
}

/// RoPE on every row's f32 keys, once all are projected (the half-K/V
/// layout ropes each chunk's before packing).
fn rope_keys(l: &TransformerLayout, emit: &mut impl FnMut(Op)) {
    if l.kv_scales.is_none() {
        emit(Op::RopeInterleaved { data: l.k, table_row: 0, tokens: l.active_rows(), heads: l.heads, head_dim: l.head_dim });
    }
}

/// A projection without bias of `x` over W's rows `w_row ..` into `y`
/// (`[rows, cols, inner]`): f32 rows, or f16 rows in pieces through
/// [`Op::LinearHalf`], whose fallback product goes to `scratch` first; with
/// `head_norm`, the queries' and keys' RMSNorm + RoPE with it (in f16 rows,
/// in its epilogue where it can), or as passes after it.
fn projection(x: Operand, (w, w_row): (TensorName, u64), y: Operand, [rows, cols, inner]: [u64; 3], scratch: Span, head_norm: Option<HeadNorm>, emit: &mut dyn FnMut(Op)) {
    if y.is_half() {
        return emit(Op::LinearHalf { x, w, w_row, y, rows, cols, inner, scratch, head_norm });
    }
    emit(Op::Linear { x, w, w_row, bias: None, y: y.data, rows, cols, inner, gate: None });
    for op in head_norm.iter().flat_map(|n| n.passes(y, rows)) {
        emit(op);
    }
}

/// One stream (text or image) of a double block: which rows, which weights.
struct Stream<'a> {
    first_row: u64,
    rows: u64,
    modulation: Modulation,
    q: &'a str,
    k: &'a str,
    v: &'a str,
    out: &'a str,
    q_norm: &'a str,
    k_norm: &'a str,
    ff: &'a str,
}

/// Double-stream block `b`: each stream modulated and projected with its
/// own weights, joint attention over `[text ; image]`, gated residuals,
/// SwiGLU feed-forward.
pub fn double_block(l: &TransformerLayout, b: usize, mut emit: impl FnMut(Op)) {
    let (d, f, hd, heads) = (l.dim, l.mlp, l.head_dim, l.heads);
    let txt = Stream {
        first_row: 0,
        rows: l.text,
        // The text rows are never reference rows.
        modulation: Modulation { vector: l.mod_txt, reference: |kv| kv.mod_img },
        q: "add_q_proj",
        k: "add_k_proj",
        v: "add_v_proj",
        out: "to_add_out",
        q_norm: "norm_added_q",
        k_norm: "norm_added_k",
        ff: "ff_context",
    };
    let img = Stream {
        first_row: l.text,
        rows: l.active_image(),
        modulation: Modulation { vector: l.mod_img, reference: |kv| kv.mod_img },
        q: "to_q",
        k: "to_k",
        v: "to_v",
        out: "to_out.0",
        q_norm: "norm_q",
        k_norm: "norm_k",
        ff: "ff",
    };
    let w = |part: &str| name(format_args!("transformer_blocks.{b}.{part}.weight"));
    let attn_w = |part: &str| name(format_args!("transformer_blocks.{b}.attn.{part}.weight"));
    // The feed-forward of rows `first .. first + n` (from the stream's row
    // `base` in the per-token scratch), added into the stream under gate 5.
    let feed_forward = |s: &Stream<'_>, (first, n, base): (u64, u64, u64), emit: &mut dyn FnMut(Op)| {
        emit(linear_swiglu(l.normed.rows_from(first - base), w(&format_str(s.ff, "linear_in")), 0, l.ff_act, n, f, d, l.ff_in));
        project_into_stream(l, l.ff_act, w(&format_str(s.ff, "linear_out")), f, (first, n, base), s.modulation, 5, &mut { emit });
    };
    if l.by_chunks() {
        // Every row's keys and values first, a chunk at a time; then each
        // chunk's queries, attention over every key, and the rest of the block.
        for s in [&txt, &img] {
            for (r0, n) in l.chunks(s.rows) {
                let g = s.first_row + r0;
                modulate(l, (g, n, g), s.modulation, [0, 1], &mut emit);
                let [k, v] = key_value_targets(l, g);
                for (proj, dst) in [(s.k, k), (s.v, v)] {
                    emit(linear(l.normed, attn_w(proj), dst, n, d, d));
                }
                emit(Op::RmsNormHeads { data: k, w: attn_w(s.k_norm), tokens: n, heads, head_dim: hd, eps: l.eps });
                keep_keys_values(l, g, n, &mut emit);
            }
        }
        rope_keys(l, &mut emit);
        kv_copies(l, b as u64, l.k, l.v, &mut emit);
        for s in [&txt, &img] {
            for (r0, n) in l.chunks(s.rows) {
                let g = s.first_row + r0;
                modulate(l, (g, n, g), s.modulation, [0, 1], &mut emit);
                emit(linear(l.normed, attn_w(s.q), l.q, n, d, d));
                emit(Op::RmsNormRope { data: l.q.into(), w: attn_w(s.q_norm), table_row: g, tokens: n, heads, head_dim: hd, eps: l.eps, pairs: RopeStyle::Interleaved });
                attend(l, [l.q, l.k, l.v].map(Operand::f32), l.attn, g, n, &mut emit);
                project_into_stream(l, l.attn, attn_w(s.out), d, (g, n, g), s.modulation, 2, &mut emit);
                modulate(l, (g, n, g), s.modulation, [3, 4], &mut emit);
                feed_forward(s, (g, n, g), &mut emit);
            }
        }
        return;
    }
    // Both streams' rows are normalised in one pass each time, each under its own modulation.
    modulate_streams(l, &[&txt, &img], [0, 1], &mut emit);
    let [q, k, v] = l.qkv_operands();
    for s in [&txt, &img] {
        let rows = |o: Operand| o.rows_from(s.first_row);
        // The queries and keys normed and rotated, each stream's rows by the
        // table rows of their place in the pass.
        let norm = |w: &str| HeadNorm { first: attn_w(w), second: attn_w(w), first_cols: d, cols: d, head_dim: hd, eps: l.eps, table_row: s.first_row };
        for (proj, dst, head_norm) in [(s.q, q, Some(norm(s.q_norm))), (s.k, k, Some(norm(s.k_norm))), (s.v, v, None)] {
            projection(l.normed.rows_from(s.first_row), (attn_w(proj), 0), rows(dst), [s.rows, d, d], l.proj.rows_from(s.first_row), head_norm, &mut emit);
        }
    }
    attention(l, b as u64, [q, k, v], l.attn, &mut emit);
    for s in [&txt, &img] {
        project_into_stream(l, l.attn.rows_from(s.first_row), attn_w(s.out), d, (s.first_row, s.rows, 0), s.modulation, 2, &mut emit);
    }
    modulate_streams(l, &[&txt, &img], [3, 4], &mut emit);
    for s in [&txt, &img] {
        feed_forward(s, (s.first_row, s.rows, 0), &mut emit);
    }
}

fn format_str(a: &str, b: &str) -> heapless::String<64> {
    let mut s = heapless::String::new();
    s.write_fmt(format_args!("{a}.{b}")).expect("short part names");
    s
}

/// Single-stream block `b` over the whole `[text ; image]` stream: one fused
/// projection to q, k, v and the SwiGLU halves, attention, one output
/// projection of `[attention ; mlp]`, one gated residual. By chunks of
/// tokens: every row's keys and values first, then each chunk's queries,
/// attention over every key, MLP half and output projection.
pub fn single_block(l: &TransformerLayout, b: usize, mut emit: impl FnMut(Op)) {
    let (d, f, hd, heads, rows) = (l.dim, l.mlp, l.head_dim, l.heads, l.active_rows());
    let w = |part: &str| name(format_args!("single_transformer_blocks.{b}.attn.{part}.weight"));
    let block = l.kv.map_or(0, |kv| kv.double_blocks) + b as u64;
    let m = Modulation { vector: l.mod_single, reference: |kv| kv.mod_single };
    // Rows `w_row ..` of the fused weight (0: q, D: k, 2D: v, 3D: the MLP halves).
    let part = |x: Operand, w_row: u64, y: Span, n: u64, cols: u64| Op::Linear { x, w: w("to_qkv_mlp_proj"), w_row, bias: None, y, rows: n, cols, inner: d, gate: None };
    if l.by_chunks() {
        for (r0, n) in l.chunks(rows) {
            modulate(l, (r0, n, r0), m, [0, 1], &mut emit);
            let [k, v] = key_value_targets(l, r0);
            emit(part(l.normed, d, k, n, d));
            emit(part(l.normed, 2 * d, v, n, d));
            emit(Op::RmsNormHeads { data: k, w: w("norm_k"), tokens: n, heads, head_dim: hd, eps: l.eps });
            keep_keys_values(l, r0, n, &mut emit);
        }
        rope_keys(l, &mut emit);
        kv_copies(l, block, l.k, l.v, &mut emit);
        for (r0, n) in l.chunks(rows) {
            modulate(l, (r0, n, r0), m, [0, 1], &mut emit);
            emit(part(l.normed, 0, l.q, n, d));
            emit(Op::RmsNormRope { data: l.q.into(), w: w("norm_q"), table_row: r0, tokens: n, heads, head_dim: hd, eps: l.eps, pairs: RopeStyle::Interleaved });
            attend(l, [l.q, l.k, l.v].map(Operand::f32), l.joined, r0, n, &mut emit);
            emit(linear_swiglu(l.normed, w("to_qkv_mlp_proj"), 3 * d, l.joined.cols_from(d), n, f, d, l.fused));
            project_into_stream(l, l.joined, w("to_out"), d + f, (r0, n, r0), m, 2, &mut emit);
        }
        return;
    }
    modulate(l, (0, rows, 0), m, [0, 1], &mut emit);
    // q, k and v (f32 into the fused rows, or f16 into the layout's `qkv`);
    // then the MLP halves' product and SwiGLU into the joined rows.
    let qkv = l.qkv.unwrap_or(Operand::f32(l.fused));
    // The queries and keys normed and rotated with their product.
    let head_norm = HeadNorm { first: w("norm_q"), second: w("norm_k"), first_cols: d, cols: 2 * d, head_dim: hd, eps: l.eps, table_row: 0 };
    projection(l.normed, (w("to_qkv_mlp_proj"), 0), qkv, [rows, 3 * d, d], l.fused, Some(head_norm), &mut emit);
    emit(linear_swiglu(l.normed, w("to_qkv_mlp_proj"), 3 * d, l.joined.cols_from(d), rows, f, d, l.fused.cols_from(3 * d)));
    let (q, k, v) = (qkv, qkv.cols_from(d), qkv.cols_from(2 * d));
    attention(l, block, [q, k, v], l.joined, &mut emit);
    project_into_stream(l, l.joined, w("to_out"), d + f, (0, rows, 0), m, 2, &mut emit);
}

/// Final AdaLN (scale first, then shift) on the noise rows and the output
/// projection; reference rows get no velocity.
pub fn epilogue(l: &TransformerLayout, mut emit: impl FnMut(Op)) {
    // `normed` holds a chunk of rows when the layout is chunked.
    for (r0, n) in l.chunks(l.noise) {
        let row = l.text + r0;
        let normed = if l.by_chunks() { l.normed } else { l.normed.rows_from(row) };
        emit(Op::LayerNormModulate { src: l.stream.rows_from(row), dst: normed, shift: l.chunk(l.mod_out, 1), scale: l.chunk(l.mod_out, 0), later: None, tokens: n, d: l.dim, eps: l.eps });
        emit(linear(normed, name(format_args!("proj_out.weight")), l.velocity.rows_from(r0), n, l.out_channels, l.dim));
    }
}

/// The timestep the model's sinusoid sees for scheduler timestep `t`: the
/// pipeline passes `t / 1000` and the model multiplies by 1000 again, both in f32.
pub fn model_timestep(t: f32) -> f32 {
    (t / 1000.0) * 1000.0
}

/// The `[cos, sin]` timestep sinusoid of `Flux2` for timestep `t` (see [`model_timestep`]),
/// as diffusers computes it in float32: the exponent `−ln(10⁴)·j/half`, the
/// frequency and the angle `t·f` are rounded to f32 step by step as torch
/// rounds them, then the cos/sin of that f32 angle are taken in f64. (The
/// angle's rounding is the table's real error; torch's own float32 `exp` is
/// off by an ulp for a few `j`, which moves those angles by an ulp.)
pub fn timestep_sinusoid(t: f32, out: &mut [f32]) {
    let half = out.len() / 2;
    for j in 0..half {
        let exponent = (-(libm::log(10000.0) as f32) * j as f32) / half as f32;
        let freq = libm::exp(exponent as f64) as f32;
        let angle = (t * freq) as f64;
        out[j] = libm::cos(angle) as f32;
        out[half + j] = libm::sin(angle) as f32;
    }
}

#[cfg(test)]
mod tests;

//! Tests of `transformer.rs`.

use super::*;
use crate::arena::BumpArena;
use crate::config::TransformerConfig;
use crate::config::klein_4b;

/// Parameters of the 2-D (linear) weights of block 0 under `prefix`.
fn linear_params(cfg: &TransformerConfig, prefix: &str) -> u64 {
    let mut total = 0;
    crate::models::tensors::transformer(cfg, |s| {
        if s.name.starts_with(prefix) && s.shape.len() == 2 {
            total += (s.shape[0] * s.shape[1]) as u64;
        }
    });
    total
}

#[test]
fn block_flops_are_every_weight_once_per_token_plus_attention() {
    // Each linear weight multiplies every token of its stream once (2 FLOPs a
    // parameter): the double block's image and text streams have equal
    // weights, so together they cost tokens × params; attention adds
    // 4·S²·D (scores and the weighted sum) over the joint sequence.
    let cfg = klein_4b::transformer();
    let (text, image) = (512u64, 4096u64);
    let s = text + image;
    let mut arena = BumpArena::new(u64::MAX / 2);
    let l = TransformerLayout::new(&cfg, text, image, &mut arena).unwrap();
    let mut double = 0;
    double_block(&l, 0, |op| double += op.flops());
    let attention = 4 * s * s * 3072;
    assert_eq!(double, s * linear_params(&cfg, "transformer_blocks.0.") + attention);
    let mut single = 0;
    single_block(&l, 0, |op| single += op.flops());
    assert_eq!(single, 2 * s * linear_params(&cfg, "single_transformer_blocks.0.") + attention);
}

#[test]
fn layout_fits_the_4b_model_at_1024px() {
    let cfg = klein_4b::transformer();
    let mut arena = BumpArena::new(u64::MAX / 2);
    let l = TransformerLayout::new(&cfg, 512, 4096, &mut arena).unwrap();
    assert_eq!(l.fused.stride, 3 * 3072 + 2 * 9216);
    assert_eq!(l.joined.data.stride, 3072 + 9216);
    assert!(l.velocity.offset * 4 + 4096 * 128 * 4 <= arena.used());
    // Double-block feed-forward scratch shares bytes with single-block projections.
    let (rows, d, f) = (4608u64, 3072u64, 9216u64);
    assert_eq!(l.ff_in.offset, l.fused.offset);
    let single_scratch = rows * (3 * d + 2 * f) * 4 + rows * (d + f) * 4;
    let others = 7 * rows * d * 4 + 4096 * 128 * 4 * 2 + 512 * 7680 * 4;
    let small = arena.used() - single_scratch - others;
    assert!(small < 1 << 20, "beyond the big spans: {small} bytes");
}

/// The half-K/V layout: keys and values `D/2` words a row with a scale
/// per head, projected into chunk scratch and packed a chunk at a time
/// (each chunk's keys roped before), attention reading them packed; the
/// same FLOPs as the f32 layout, in fewer bytes; never with a kept cache.
#[test]
fn the_half_kv_layout_packs_every_chunk_and_attends_over_the_packed_rows() {
    let cfg = klein_4b::transformer();
    let (text, image, chunk) = (512u64, 4096u64, 1024u64);
    let laid_out = |half_kv: bool, kv_cache: KvMode, references: u64| {
        let mut arena = BumpArena::new(u64::MAX / 2);
        let tokens = Tokens { text, noise: image, references, kv_cache, half_kv, half_operands: false };
        let l = TransformerLayout::chunked(&cfg, tokens, chunk, &mut arena).unwrap();
        (l, arena.high_water())
    };
    let (f32_kv, f32_bytes) = laid_out(false, KvMode::Off, 0);
    let (l, bytes) = laid_out(true, KvMode::Off, 0);
    let rows = text + image;
    assert_eq!((l.k.stride, l.v.stride), (1536, 1536));
    assert_eq!(l.kv_scales.map(|s| s.map(|s| s.stride)), Some([24, 24]));
    // The keys and values take half their f32 bytes, plus a scale a head row.
    assert_eq!(f32_bytes - bytes, 2 * rows * 1536 * 4 - 2 * rows * 24 * 4);
    for block in [true, false] {
        let (mut ops, mut f32_ops) = (Vec::new(), Vec::new());
        let mut flops = [0, 0];
        let program = |l: &TransformerLayout, out: &mut Vec<Op>, flops: &mut u64| {
            let mut emit = |op: Op| {
                *flops += op.flops();
                out.push(op)
            };
            if block { double_block(l, 0, &mut emit) } else { single_block(l, 0, &mut emit) }
        };
        program(&l, &mut ops, &mut flops[0]);
        program(&f32_kv, &mut f32_ops, &mut flops[1]);
        assert_eq!(flops[0], flops[1]);
        let packs: Vec<(Span, u64)> = ops.iter().filter_map(|op| if let Op::HalfPack { dst, tokens, .. } = op { Some((*dst, *tokens)) } else { None }).collect();
        // Keys and values of every chunk: the text rows and each image chunk (double blocks), or the joint rows' chunks.
        let chunks = if block { 1 + image.div_ceil(chunk) } else { rows.div_ceil(chunk) };
        assert_eq!(packs.len() as u64, 2 * chunks);
        assert_eq!(packs.iter().map(|p| p.1).sum::<u64>(), 2 * rows);
        assert!(!ops.iter().any(|op| matches!(op, Op::CrossAttention { .. } | Op::Attention { .. })));
        let attends = ops.iter().filter(|op| matches!(op, Op::HalfKvAttention { k, kv_len, .. } if *k == l.k && *kv_len == rows)).count() as u64;
        assert_eq!(attends, chunks);
        // Each chunk's keys roped (at its own table row) before they are packed; none over the whole keys.
        assert!(!ops.iter().any(|op| matches!(op, Op::RopeInterleaved { data, .. } if *data == l.k)));
    }
    // A kept KV cache copies f32 rows: that layout keeps f32 keys and values.
    let (kept, _) = laid_out(true, KvMode::Keep, 256);
    assert!(kept.kv_scales.is_none() && kept.k.stride == 3072);
    let (recomputed, _) = laid_out(true, KvMode::Recompute, 256);
    assert!(recomputed.kv_scales.is_some());
}

#[test]
fn reference_tokens_run_through_every_block_but_get_no_velocity() {
    let cfg = klein_4b::transformer();
    let mut arena = BumpArena::new(u64::MAX / 2);
    let tokens = Tokens { text: 512, noise: 1024, references: 3072, kv_cache: KvMode::Off, half_kv: false, half_operands: false };
    let l = TransformerLayout::chunked(&cfg, tokens, u64::MAX, &mut arena).unwrap();
    assert_eq!((l.image, l.noise), (4096, 1024));
    let mut embedded_rows = 0;
    prologue(&l, |op| {
        if let Op::Linear { rows, cols: 3072, inner: 128, .. } = op {
            embedded_rows = rows;
        }
    });
    assert_eq!(embedded_rows, 4096, "x_embedder reads noise and reference rows");
    let mut attention_len = 0;
    single_block(&l, 0, |op| {
        if let Op::Attention { len, .. } = op {
            attention_len = len;
        }
    });
    assert_eq!(attention_len, 512 + 4096);
    let mut epilogue_rows = Vec::new();
    epilogue(&l, |op| match op {
        Op::LayerNormModulate { tokens, .. } => epilogue_rows.push(tokens),
        Op::Linear { rows, y, .. } => {
            assert_eq!(y, l.velocity);
            epilogue_rows.push(rows)
        }
        _ => {}
    });
    assert_eq!(epilogue_rows, [1024, 1024], "only the noise tokens get a velocity");
    // The velocity holds the noise rows only; it ends the arena.
    assert_eq!(l.velocity.offset * 4 + 1024 * 128 * 4, arena.used());
}

/// The KV pipeline's passes over one layout: extracting, the reference
/// rows attend to themselves and their keys and values go to the cache;
/// cached, only text and noise rows run, reading the cache back.
#[test]
fn the_kv_passes_split_attention_and_share_the_cache() {
    let cfg = klein_4b::transformer();
    let mut arena = BumpArena::new(u64::MAX / 2);
    let tokens = Tokens { text: 512, noise: 1024, references: 256, kv_cache: KvMode::Keep, half_kv: false, half_operands: false };
    let l = TransformerLayout::chunked(&cfg, tokens, u64::MAX, &mut arena).unwrap();
    let kv = l.kv.unwrap();
    assert_eq!((kv.pass, kv.references, kv.double_blocks), (KvPass::Extract, 256, 5));
    let cached = l.with_pass(KvPass::Cached);
    // Single block 2 is cache block 5 + 2; unchunked, its keys and values are columns of the fused projection.
    let (k, v) = (l.fused.cols_from(3072).rows_from(1536), l.fused.cols_from(2 * 3072).rows_from(1536));
    let (slot_k, slot_v) = (kv.slot(7, 0).unwrap(), kv.slot(7, 1).unwrap());
    for (pass, embedded_rows, copies_want, attentions) in [(&l, 1024 + 256, [(k, slot_k), (v, slot_v)], 2), (&cached, 1024, [(slot_k, k), (slot_v, v)], 1)] {
        let mut embedded = 0;
        prologue(pass, |op| {
            if let Op::Linear { rows, cols: 3072, inner: 128, .. } = op {
                embedded = rows;
            }
        });
        assert_eq!(embedded, embedded_rows);
        let (mut copies, mut attention, mut modulated) = (heapless::Vec::<(Span, Span), 4>::new(), 0, 0);
        single_block(pass, 2, |op| match op {
            Op::Copy { src, dst, rows, cols } => {
                assert_eq!((rows, cols), (256, 3072));
                copies.push((src, dst)).unwrap();
            }
            Op::CrossAttention { q_len, kv_len, .. } => {
                // The references attend to themselves only.
                assert!([(512 + 1024, 512 + 1024 + 256), (256, 256)].contains(&(q_len, kv_len)), "{q_len} over {kv_len}");
                attention += 1;
            }
            Op::LayerNormModulate { tokens, .. } => modulated += tokens,
            _ => {}
        });
        assert_eq!(copies.as_slice(), &copies_want);
        assert_eq!(attention, attentions);
        assert_eq!(modulated, pass.active_rows(), "every active row modulated once");
    }
    // Extracting, the reference rows take the modulation of timestep 0.
    // Each pass's rows by the shift they take (a pass's later rows their own).
    let mut shifts = heapless::Vec::<(u64, Span), 8>::new();
    double_block(&l, 0, |op| {
        if let Op::LayerNormModulate { tokens, shift, later, .. } = op {
            let first = later.map_or(tokens, |m| m.row);
            let _ = shifts.push((first, shift));
            if let Some(m) = later {
                let _ = shifts.push((tokens - m.row, m.shift));
            }
        }
    });
    assert_eq!(&shifts[..3], &[(512, l.chunk(l.mod_txt, 0)), (1024, l.chunk(l.mod_img, 0)), (256, l.chunk(kv.mod_img, 0))]);
    // Recomputing: no cache, every pass extracts, the same ops but the copies.
    let mut arena = BumpArena::new(u64::MAX / 2);
    let r = TransformerLayout::chunked(&cfg, Tokens { kv_cache: KvMode::Recompute, ..tokens }, u64::MAX, &mut arena).unwrap();
    assert_eq!(r.kv.unwrap().cache, None);
    assert_eq!(r.with_pass(KvPass::Cached).kv_pass(), Some(KvPass::Extract));
    let (mut kept, mut recomputed) = (0, 0);
    single_block(&l, 2, |op| kept += !matches!(op, Op::Copy { rows: 256, .. }) as u32);
    single_block(&r, 2, |_| recomputed += 1);
    assert_eq!(kept, recomputed);
}

#[test]
fn double_block_reads_its_own_weights() {
    let cfg = klein_4b::transformer();
    let mut arena = BumpArena::new(u64::MAX / 2);
    let l = TransformerLayout::new(&cfg, 512, 64, &mut arena).unwrap();
    let mut names = heapless::Vec::<crate::models::tensors::TensorName, 32>::new();
    double_block(&l, 3, |op| {
        if let Op::Linear { w, .. } | Op::LinearSwiGlu { w, .. } | Op::LinearHalf { w, .. } | Op::RmsNormHeads { w, .. } | Op::RmsNormRope { w, .. } = op {
            names.push(w).unwrap();
        }
    });
    // 8 attention projections, 4 norms, 2 × 2 feed-forward linears.
    assert_eq!(names.len(), 16);
    assert!(names.iter().all(|n| n.starts_with("transformer_blocks.3.")));
    assert!(names.iter().any(|n| n.as_str() == "transformer_blocks.3.ff_context.linear_out.weight"));
}

/// Where the queries, keys and values are f16 rows in pieces, their
/// projections carry the per-head RMSNorm + RoPE (the runner puts it in
/// their epilogue, or runs it as passes after them) and the programs hold
/// no norm pass of their own; on f32 rows the same norms run as passes.
#[test]
fn half_queries_and_keys_are_normed_with_their_projections() {
    let cfg = klein_4b::transformer();
    let programs = |half_operands: bool| {
        let mut arena = BumpArena::new(u64::MAX / 2);
        let tokens = Tokens { half_operands, ..Tokens::plain(512, 1024) };
        let l = TransformerLayout::chunked(&cfg, tokens, 1536, &mut arena).unwrap();
        let (mut double, mut single) = (Vec::new(), Vec::new());
        double_block(&l, 2, |op| double.push(op));
        single_block(&l, 4, |op| single.push(op));
        (double, single)
    };
    let norms = |ops: &[Op]| ops.iter().filter(|op| matches!(op, Op::RmsNormRope { .. })).count();
    let (double, single) = programs(false);
    assert_eq!((norms(&double), norms(&single)), (4, 2));
    let (double, single) = programs(true);
    assert_eq!((norms(&double), norms(&single)), (0, 0));
    let carried = |ops: &[Op]| -> Vec<(String, String, u64, u64, u64)> {
        ops.iter()
            .filter_map(|op| match op {
                Op::LinearHalf { head_norm: Some(n), .. } => Some((n.first.to_string(), n.second.to_string(), n.first_cols, n.cols, n.table_row)),
                _ => None,
            })
            .collect()
    };
    let name = |s: &str| s.to_string();
    let stream = |q: &str, k: &str, row: u64| {
        [(name(q), name(q), 3072, 3072, row), (name(k), name(k), 3072, 3072, row)]
    };
    let mut want = stream("transformer_blocks.2.attn.norm_added_q.weight", "transformer_blocks.2.attn.norm_added_k.weight", 0).to_vec();
    want.extend(stream("transformer_blocks.2.attn.norm_q.weight", "transformer_blocks.2.attn.norm_k.weight", 512));
    assert_eq!(carried(&double), want);
    let fused = (name("single_transformer_blocks.4.attn.norm_q.weight"), name("single_transformer_blocks.4.attn.norm_k.weight"), 3072, 6144, 0);
    assert_eq!(carried(&single), vec![fused]);
    // The weights an op reads name its norms, once each.
    let single_weights: Vec<&str> = single.iter().find(|op| matches!(op, Op::LinearHalf { .. })).unwrap().weights().map(|n| n.as_str()).collect();
    assert_eq!(single_weights, ["single_transformer_blocks.4.attn.to_qkv_mlp_proj.weight", "single_transformer_blocks.4.attn.norm_q.weight", "single_transformer_blocks.4.attn.norm_k.weight"]);
}

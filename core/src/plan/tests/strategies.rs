//! The transformer's strategies under a budget: weights resident, as DF11
//! or streamed, token chunks and chunked feed-forwards, the KV cache and
//! its precision, the half-precision products' inputs, the minimum budget.

use super::*;

/// The KV pipeline's reference cache lives in the transformer's arena: every
/// block's reference keys and values, in f32.
#[test]
fn the_kv_cache_is_counted_in_the_denoise_arena() {
    let model = Model::klein_4b(false);
    let refs = [(1024, 1024)];
    let plain = PlanInput { references: &refs, ..model.input(1024, None) };
    let cached = PlanInput { kv_cache: true, ..plain };
    let (a, b) = (plan(&plain).unwrap(), plan(&cached).unwrap());
    let c = &model.transformer;
    let cache = 2 * (c.num_layers + c.num_single_layers) as u64 * 4096 * c.inner_dim() as u64 * 4;
    let grown = b.denoise.arena_bytes - a.denoise.arena_bytes;
    assert!(grown >= cache && grown < cache + (1 << 20), "the arena grew by {grown}, the cache is {cache}");
    assert_eq!((a.denoise.kv_cache, b.denoise.kv_cache), (KvMode::Off, KvMode::Keep));
    // A budget without room for the cache in any layout recomputes the references each step instead.
    let least_kept = denoise_options(&cached).unwrap().filter(|p| p.kv_cache == KvMode::Keep).map(|p| p.peak()).min().unwrap();
    let tight = plan(&PlanInput { budget: Some(least_kept - 1), ..cached }).unwrap();
    assert_eq!(tight.denoise.kv_cache, KvMode::Recompute);
    assert!(tight.denoise.peak() < least_kept);
    assert_eq!(minimum_budget(&cached).unwrap(), minimum_budget(&PlanInput { kv_cache: true, ..plain }).unwrap());
    // Without references there is nothing to cache.
    let none = plan(&PlanInput { kv_cache: true, ..model.input(1024, None) }).unwrap();
    assert_eq!(none.denoise, plan(&model.input(1024, None)).unwrap().denoise);
}

/// On a device whose products take f16 inputs (the matrix tier), the
/// transformer's products' inputs are f16 pairs with their scales: the
/// normalised rows with a scale a row, the attention output and the single
/// blocks' `[attention ; mlp]` with a scale every 64 values (klein's
/// pieces), and the queries, keys and values (one `[rows, 3D]` tensor in
/// place of three f32 `[rows, D]`) so too. The arena shrinks by half those
/// rows less their scales, and so does the smallest budget of a whole 1024² run.
#[test]
fn half_products_inputs_shrink_the_denoise_arena_by_half_the_products_inputs() {
    let model = Model::klein_4b(false);
    let f32 = model.input(1024, None);
    let half = PlanInput { limits: DeviceLimits { half_operands: true, ..LIMITS }, ..f32 };
    let (a, b) = (plan(&f32).unwrap(), plan(&half).unwrap());
    let rows = 512 + 4096;
    let (dim, mlp) = (model.transformer.inner_dim() as u64, model.transformer.mlp_hidden_dim() as u64);
    // f32 `[rows, width]`, or f16 `[rows, width/2]` words and `scales` f32 a row, each 256-byte aligned.
    let saved = |width: u64, scales: u64| rows * width * 4 - rows * width * 2 - (rows * scales * 4).div_ceil(256) * 256;
    // The normalised rows, the attention output, and `[attention ; mlp]`
    // (the single blocks' scratch, larger than the double blocks' feed-forward it shares bytes with).
    let expected = saved(dim, 1) + saved(dim, dim / 64) + saved(dim + mlp, (dim + mlp) / 64) + saved(3 * dim, 3 * dim / 64);
    assert!(a.denoise.arena_bytes - b.denoise.arena_bytes == expected, "{} → {}, expected {expected} less", a.denoise.arena_bytes, b.denoise.arena_bytes);
    let (least_f32, least_half) = (minimum_budget(&f32).unwrap(), minimum_budget(&half).unwrap());
    println!("klein-4B 1024²: denoise arena {} → {} bytes, smallest budget {least_f32} → {least_half} bytes", a.denoise.arena_bytes, b.denoise.arena_bytes);
    assert!(least_half < least_f32);
}

/// Where the transformer's attention runs as products on the GEMM core
/// (the flash kernel not proven), the unchunked layout counts their
/// scratch and right operands beside the arena: at 1024², 4608 rows of 128
/// dims, one band of queries, 7 of the 24 heads stacked at a time. The smallest budget of a whole run stays
/// what the VAE or the weights need where that is larger.
#[test]
fn attention_on_products_counts_its_scratch_beside_the_unchunked_arena() {
    let model = Model::klein_4b(false);
    let flash = PlanInput { limits: DeviceLimits { half_operands: true, ..LIMITS }, ..model.input(1024, None) };
    let products = PlanInput { limits: DeviceLimits { attention_products: crate::ir::AttentionProducts { over_pieces: true, over_rows: true }, ..flash.limits }, ..flash };
    let (a, b) = (plan(&flash).unwrap(), plan(&products).unwrap());
    assert_eq!((a.denoise.chunk, b.denoise.chunk), (None, None));
    let scratch = crate::ir::HeadsOnProducts::bytes(4608, 4608, 128, 24, products.limits.max_buffer);
    // 7 heads stacked: their output as f32 rows and their scores' rows (4608 × 2144 words a head: the f16 probabilities of 4032 keys, each piece's exponent and sum); keys and values read where they lie.
    assert_eq!((crate::ir::HeadsOnProducts::new(4608, 4608, 128, 24, u64::MAX).heads, scratch), (7, 310_193_408));
    // Where a buffer holds less, fewer heads: the scratch in one buffer, at least one head.
    for (max_buffer, heads) in [(256 << 20, 6), (64 << 20, 1)] {
        assert_eq!(crate::ir::HeadsOnProducts::new(4608, 4608, 128, 24, max_buffer).heads, heads, "{max_buffer} bytes");
    }
    assert_eq!(b.denoise.other_bytes - a.denoise.other_bytes, scratch);
    assert_eq!(a.denoise.arena_bytes, b.denoise.arena_bytes);
    // Where only the path over f32 rows runs as products, the 4B's attention (over f16 pieces) takes none.
    let rows_only = PlanInput { limits: DeviceLimits { attention_products: crate::ir::AttentionProducts { over_pieces: false, over_rows: true }, ..flash.limits }, ..flash };
    assert_eq!(plan(&rows_only).unwrap().denoise.other_bytes, a.denoise.other_bytes);
    let (least_flash, least_products) = (minimum_budget(&flash).unwrap(), minimum_budget(&products).unwrap());
    println!("klein-4B 1024²: attention on products takes {scratch} bytes beside the arena; smallest budget {least_flash} → {least_products} bytes");
    assert!(least_products >= least_flash);
}

/// The text encoder's causal attention on products (the matrix tier where
/// the flash kernel is not proven) counts its scratch and right operands in
/// the encode phase: Qwen3-4B's 32 heads (on 8 kv heads) of 128 over the
/// 512 prompt tokens, stacked at once, a chunk of 512 keys.
#[test]
fn the_text_encoders_attention_on_products_counts_its_scratch() {
    let model = Model::klein_4b(false);
    let flash = PlanInput { limits: DeviceLimits { half_operands: true, ..LIMITS }, ..model.input(1024, None) };
    let products = PlanInput { limits: DeviceLimits { attention_products: crate::ir::AttentionProducts { over_pieces: true, over_rows: true }, ..flash.limits }, ..flash };
    let (a, b) = (plan(&flash).unwrap(), plan(&products).unwrap());
    let scratch = crate::ir::HeadsOnProducts::bytes(512, 512, 128, 32, LIMITS.max_buffer);
    assert_eq!((crate::ir::HeadsOnProducts::new(512, 512, 128, 32, LIMITS.max_buffer).heads, scratch), (32, 35_014_656));
    assert_eq!(b.encode.other_bytes - a.encode.other_bytes, scratch);
    assert_eq!(a.encode.arena_bytes, b.encode.arena_bytes);
    let rows_only = PlanInput { limits: DeviceLimits { attention_products: crate::ir::AttentionProducts { over_pieces: false, over_rows: true }, ..flash.limits }, ..flash };
    assert_eq!(plan(&rows_only).unwrap().encode.other_bytes, a.encode.other_bytes);
}

#[test]
fn weight_sizes_of_the_4b_transformer() {
    let w = transformer_weights(&klein_4b::transformer(), false);
    // 5 double + 20 single blocks, a prologue and an epilogue.
    assert_eq!(w.blocks, 27);
    let params = (w.plain + w.grouped) / 2;
    assert!((3_800_000_000..4_000_000_000).contains(&params), "{params} parameters");
    // A double block: 8 attention projections of 3072² and 2 × (3072·18432 + 9216·3072) feed-forward.
    let double = 2 * (8 * 3072 * 3072 + 2 * (3072 * 18432 + 9216 * 3072)) as u64;
    assert!(w.max_block >= double && w.max_block < double + (1 << 20), "{}", w.max_block);
    let df11 = transformer_weights(&klein_4b::transformer(), true);
    assert_eq!(df11.plain + df11.grouped / 2 * 2, df11.plain + df11.grouped);
    assert!(df11.compressed * 100 / df11.grouped == DF11_ESTIMATE_PERCENT - 1 || df11.compressed * 100 / df11.grouped == DF11_ESTIMATE_PERCENT);
    // Only biases, norms, the time embedding, x_embedder and proj_out stay plain.
    assert!(df11.plain < 40 << 20, "{} plain bytes", df11.plain);
}

#[test]
fn unbudgeted_runs_keep_everything_resident() {
    for model in [Model::klein_4b(false), Model::klein_4b(true), Model::klein_9b(false)] {
        for size in [512, 1024, 2048, 4096] {
            let input = model.input(size, None);
            let p = plan(&input).unwrap_or_else(|e| panic!("{size}: {e}"));
            assert_eq!(p.encode.weights, WeightStrategy::ResidentBf16);
            assert_eq!(p.denoise.weights, WeightStrategy::ResidentBf16);
            // At 2048² a 256-channel full-resolution activation (4 GiB) exceeds one binding.
            if size <= 1024 {
                assert_eq!(p.decode.tile, None, "{size}: untiled when the binding allows");
            } else {
                let tile = p.decode.tile.unwrap_or_else(|| panic!("{size}: the binding forces tiles"));
                assert!(vae_arena(&model.vae, (tile + 16) / 8, (tile + 16) / 8, LIMITS).is_none(), "{size}: {tile} is the largest tile");
            }
            assert!(p.peak() >= p.denoise.weight_bytes + p.denoise.arena_bytes);
        }
    }
}

#[test]
fn the_4b_transformer_denoises_1024px_within_2_gib_by_streaming() {
    let model = Model::klein_4b(false);
    let p = plan(&model.input(1024, Some(2 * GIB))).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(p.denoise.weights, WeightStrategy::Streamed { .. }), "{:?}", p.denoise.weights);
    assert!(p.denoise.peak() <= 2 * GIB);
    assert!(p.peak() <= 2 * GIB);
    println!("4B at 1024² in 2 GiB: {p:#?}");
}

#[test]
fn a_tiny_budget_names_the_minimum_and_the_minimum_works() {
    for model in [Model::klein_4b(false), Model::klein_4b(true), Model::klein_9b(false), Model::klein_9b(true)] {
        for size in [512, 1024, 2048, 4096] {
            let err = plan(&model.input(size, Some(1024))).unwrap_err();
            let PlanError::TooSmall { minimum, .. } = err else { panic!("{size}: {err}") };
            let p = plan(&model.input(size, Some(minimum))).unwrap_or_else(|e| panic!("{size} at its minimum {minimum}: {e}"));
            assert!(p.peak() <= minimum);
            assert!(plan(&model.input(size, Some(minimum - 1))).is_err(), "{size}: {minimum} is not the smallest");
            // At the minimum nothing slower than one streaming slot (and its staging) is needed.
            let weights = model.input(size, None).transformer_weights;
            assert!(p.denoise.weight_bytes <= weights.bytes(WeightStrategy::Streamed { slots: 1 }));
        }
    }
}

#[test]
fn a_larger_budget_never_picks_a_slower_strategy() {
    let model = Model::klein_4b(true);
    let rank = |s: WeightStrategy| model.input(1024, None).transformer_weights.strategies().position(|t| t == s).unwrap();
    let mut last = usize::MAX;
    for gib in 1..=16 {
        let Ok(p) = plan(&model.input(1024, Some(gib * GIB))) else { continue };
        let r = rank(p.denoise.weights);
        assert!(r <= last, "{gib} GiB picked {:?}", p.denoise.weights);
        last = r;
    }
    assert_eq!(last, 0, "16 GiB keeps the 4B resident");
}

#[test]
fn df11_residency_sits_between_bf16_and_streaming() {
    let model = Model::klein_4b(true);
    let input = model.input(1024, None);
    let options: heapless::Vec<PhasePlan, 8> = denoise_options(&input).unwrap().filter(|p| p.chunk.is_none()).collect();
    let kinds: heapless::Vec<WeightStrategy, 8> = options.iter().map(|p| p.weights).collect();
    assert_eq!(
        kinds.as_slice(),
        &[
            WeightStrategy::ResidentBf16,
            WeightStrategy::ResidentDf11 { slots: 2 },
            WeightStrategy::ResidentDf11 { slots: 1 },
            WeightStrategy::Streamed { slots: 2 },
            WeightStrategy::Streamed { slots: 1 },
        ]
    );
    // Each is smaller than the one before.
    assert!(options.windows(2).all(|w| w[1].peak() < w[0].peak()), "{options:#?}");
    // A plain bf16 model has no DF11 residency.
    let plain = Model::klein_4b(false);
    assert_eq!(denoise_options(&plain.input(1024, None)).unwrap().filter(|p| p.chunk.is_none()).count(), 3);
}

#[test]
fn sizes_that_are_not_whole_latent_tokens_are_refused() {
    let model = Model::klein_4b(false);
    let mut input = model.input(1024, None);
    input.width = 1000;
    assert!(matches!(plan(&input), Err(PlanError::Size(_))));
}

#[test]
fn bytes_print_rounded_up() {
    assert_eq!(format!("{}", Bytes(512)), "512 B");
    assert_eq!(format!("{}", Bytes(2 * GIB)), "2.00 GiB");
    assert_eq!(format!("{}", Bytes(GIB + 1)), "1.01 GiB");
}

/// The figures docs/memory.md quotes: each transformer strategy's phase peak for
/// the 4B at 1024² (`cargo test -p flux-lite-core plan::tests::strategies::figures -- --nocapture`).
#[test]
fn figures_for_the_4b_at_1024px() {
    for df11 in [false, true] {
        let model = Model::klein_4b(df11);
        let input = model.input(1024, None);
        for p in denoise_options(&input).unwrap() {
            println!("4B 1024² denoise, {}: {} (weights {}, activations {})", p.weights, Bytes(p.peak()), Bytes(p.weight_bytes), Bytes(p.arena_bytes));
        }
        let err = plan(&model.input(1024, Some(1024))).unwrap_err();
        println!("{err}");
        assert!(matches!(err, PlanError::TooSmall { minimum, .. } if minimum < 2 * GIB));
    }
    // The VAE decoder at 1024²: untiled, and its smallest tile (a band holds one full-width row).
    let model = Model::klein_4b(true);
    let decode: Vec<VaePlan> = decode_options(&model.input(1024, None)).unwrap().collect();
    let last = decode[decode.len() - 1];
    println!("4B VAE decoder at 1024²: untiled {}; smallest, {}-px tiles: {}", Bytes(decode[0].peak()), last.tile.unwrap(), Bytes(last.peak()));
    // The VAE encoder on a 1024² reference, on this adapter and under WebGPU's default limits
    // (256 MiB buffers, 128 MiB bindings), where only tiles fit.
    let model = Model::klein_4b(true);
    let refs = [(1024, 1024)];
    for (limits, name) in [(LIMITS, "4 GiB bindings"), (DeviceLimits::WEBGPU_DEFAULT, "WebGPU default limits")] {
        let input = PlanInput { references: &refs, limits, ..model.input(1024, None) };
        let options: Vec<VaePlan> = reference_options(&input).unwrap().collect();
        let first = options[0];
        let last = options[options.len() - 1];
        // The smallest tile is the smallest whose band holds one convolution row of the reference.
        let smallest = last.tile.unwrap();
        let row = crate::models::vae_encoder_nhwc::encode_band_minimum(&model.vae, 1024, 1024, limits.half_operands).unwrap();
        let capacity = |t| vae_encoder::band_capacity(&model.vae, t, limits.max_binding, limits.half_operands).unwrap();
        assert!(capacity(smallest) >= row && capacity(smallest - 16) < row, "{smallest}: {row}");
        let tile = first.tile.map_or("untiled".to_string(), |t| format!("{t}-px tiles"));
        println!(
            "4B VAE encoder, 1024² reference, {name}: fastest {tile}: {}; smallest, {smallest}-px tiles: {}",
            Bytes(first.peak()),
            Bytes(last.peak())
        );
    }
}

#[test]
fn the_minimum_budget_is_the_one_a_failed_plan_names() {
    for model in [Model::klein_4b(false), Model::klein_4b(true), Model::klein_9b(true)] {
        for size in [512, 1024, 2048] {
            let PlanError::TooSmall { minimum, .. } = plan(&model.input(size, Some(1024))).unwrap_err() else { panic!("{size}") };
            assert_eq!(minimum_budget(&model.input(size, None)).unwrap(), minimum, "{size}");
        }
    }
}

#[test]
fn phase_options_run_fastest_first_and_end_at_the_phase_minimum() {
    let model = Model::klein_4b(true);
    let input = model.input(1024, None);
    let encode: heapless::Vec<PhasePlan, 8> = encode_options(&input).unwrap().collect();
    assert_eq!(encode.len(), 5);
    assert!(encode.windows(2).all(|w| w[1].peak() < w[0].peak()), "{encode:#?}");
    let decode: heapless::Vec<VaePlan, 128> = decode_options(&input).unwrap().collect();
    assert_eq!(decode[0].tile, None, "untiled first");
    let tiles: heapless::Vec<u64, 128> = decode.iter().filter_map(|p| p.tile).collect();
    assert_eq!(tiles.first(), Some(&1024));
    assert!(tiles.windows(2).all(|w| w[1] + 16 == w[0]));
    // The smallest tile is the smallest whose band holds one convolution row
    // of the 1024-pixel-wide image (128 channels in and out at full resolution).
    let row = vae_nhwc::decode_band_minimum(&model.vae, 128, 128, false).unwrap();
    let capacity = |t: u64| vae::band_capacity(&model.vae, t / 8, LIMITS.max_binding, false).unwrap();
    let smallest = *tiles.last().unwrap();
    assert!(capacity(smallest) >= row && capacity(smallest - 16) < row, "smallest tile {smallest}: a row needs {row} values");
    let smallest = [encode.iter().map(|p| p.peak()).min(), denoise_options(&input).unwrap().map(|p| p.peak()).min(), decode.iter().map(|p| p.peak()).min()];
    assert_eq!(minimum_budget(&input).unwrap(), smallest.iter().map(|m| m.unwrap()).max().unwrap());
    let mut odd = model.input(1024, None);
    odd.height = 1000;
    assert!(decode_options(&odd).is_err());
}

#[test]
fn component_bytes_of_the_4b_transformer() {
    let b = component_bytes(&mut |sink| crate::models::tensors::transformer(&klein_4b::transformer(), sink), crate::df11::layout::TRANSFORMER_GROUPS);
    assert_eq!(b.bf16, 2 * b.parameters);
    assert!((3_800_000_000..4_000_000_000).contains(&b.parameters), "{}", b.parameters);
    // Almost every byte is in a group: the whole is just over the estimate's fraction.
    let percent = b.df11 * 100 / b.bf16;
    assert!((DF11_ESTIMATE_PERCENT..DF11_ESTIMATE_PERCENT + 2).contains(&percent), "{percent}%");
    let vae = component_bytes(&mut |sink| crate::models::tensors::vae(&klein_4b::vae(), sink), &[]);
    assert_eq!(vae.df11, vae.bf16, "nothing of the VAE is grouped");
}

#[test]
fn chunked_feed_forward_lowers_the_minimum_and_takes_the_largest_chunk_that_fits() {
    let model = Model::klein_4b(false);
    let input = model.input(1024, None);
    let all: heapless::Vec<PhasePlan, 16> = denoise_options(&input).unwrap().collect();
    // With half-precision keys and values, each strategy by chunks in even fewer activation bytes.
    let options: heapless::Vec<PhasePlan, 8> = all.iter().filter(|p| !p.half_kv).copied().collect();
    for half in all.iter().filter(|p| p.half_kv) {
        let f32_kv = options.iter().find(|p| p.weights == half.weights && p.chunk.is_some()).unwrap();
        assert!(half.chunk.is_some() && half.arena_bytes < f32_kv.arena_bytes, "{half:#?}");
    }
    // Each weight strategy unchunked, then in the chunks that need the least, far fewer activation bytes.
    assert_eq!(options.len(), 6);
    for pair in options.chunks(2) {
        assert_eq!(pair[0].chunk, None);
        assert!(pair[1].chunk.is_some_and(|c| c.is_multiple_of(CHUNK_ROWS) && (c / CHUNK_ROWS).is_power_of_two()), "{pair:#?}");
        assert_eq!(pair[0].weights, pair[1].weights);
        assert!(pair[1].arena_bytes * 2 < pair[0].arena_bytes, "{pair:#?}");
    }
    let streamed = options[4];
    let chunked = options[5];
    println!("4B 1024² streamed 1 slot: {} unchunked, {} as {chunked}", Bytes(streamed.peak()), Bytes(chunked.peak()));
    // A budget between the two chunks by as many rows as fit: the next larger chunk would not.
    let budget = (streamed.peak() + chunked.peak()) / 2;
    let p = plan(&model.input(1024, Some(budget))).unwrap_or_else(|e| panic!("{e}"));
    let rows = p.denoise.chunk.expect("chunked");
    assert!(rows > chunked.chunk.unwrap() && rows < 512 + 4096, "{rows}");
    assert!(p.denoise.peak() <= budget);
    let denoise = DenoiseOptions::new(&input).unwrap();
    let larger = denoise.chunked(p.denoise.weights).find(|q| q.chunk == Some(2 * rows)).expect("a larger chunk");
    assert!(larger.peak() > budget, "{rows} is the largest chunk");
    // The whole run's minimum is now the chunked one, far below the unchunked 1.54 GiB.
    let minimum = minimum_budget(&input).unwrap();
    assert!(minimum < streamed.peak() && minimum < GIB, "{}", Bytes(minimum));
}

/// `KvPrecision::F32` offers only f32 keys and values (a higher minimum),
/// `F16` only the half-K/V layouts; `Auto` both, f32 first.
#[test]
fn the_kv_precision_chooses_which_layouts_are_offered() {
    let model = Model::klein_4b(true);
    let with = |kv_precision| PlanInput { kv_precision, ..model.input(4096, None) };
    let offered = |p| denoise_options(&with(p)).unwrap().map(|o| o.half_kv).collect::<Vec<bool>>();
    assert!(offered(KvPrecision::F32).iter().all(|h| !h) && offered(KvPrecision::F16).iter().all(|h| *h));
    let auto = offered(KvPrecision::Auto);
    assert!(auto.contains(&true) && auto.contains(&false));
    let minimum = |p| minimum_budget(&with(p)).unwrap();
    assert_eq!(minimum(KvPrecision::Auto), minimum(KvPrecision::F16));
    assert!(minimum(KvPrecision::F32) > minimum(KvPrecision::Auto) + GIB / 2, "{} vs {}", minimum(KvPrecision::F32), minimum(KvPrecision::Auto));
    // With room for f32 keys and values, auto takes them.
    let roomy = plan(&model.input(1024, None)).unwrap();
    assert!(!roomy.denoise.half_kv);
}

#[test]
fn a_4096px_image_needs_far_less_by_chunks() {
    for model in [Model::klein_4b(true), Model::klein_9b(true)] {
        let input = model.input(4096, None);
        let minimum = minimum_budget(&input).unwrap();
        let p = plan(&model.input(4096, Some(minimum))).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.denoise.chunk.is_some(), "{p:#?}");
        // Unchunked, the keys' window of the fused projection (66048 rows of 27648) exceeds even a 4 GiB binding.
        assert!(denoise_options(&input).unwrap().all(|p| p.chunk.is_some()));
        let (arena, other) = denoise_fixed(&input, 512 + 256 * 256, KvMode::Off, false).unwrap();
        let w = input.transformer_weights;
        let unchunked = arena + other + w.strategies().map(|s| w.bytes(s)).min().unwrap();
        println!("4096²: minimum {} with {}; {} unchunked", Bytes(minimum), p.denoise, Bytes(unchunked));
        // The 7 full-size token spans (stream, norm, q, k, v, attention, projection) remain.
        assert!(minimum * 3 < unchunked * 2, "{} vs {}", Bytes(minimum), Bytes(unchunked));
    }
}

#[test]
fn attention_keys_beyond_one_binding_force_chunks_or_are_refused_up_front() {
    let model = Model::klein_4b(false);
    // lavapipe's limits: WebGPU's 128 MiB bindings, 2 GiB buffers.
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    let webgpu = |size: u64| PlanInput { limits: lavapipe, ..model.input(size, None) };
    // 4608 tokens: the fused projection's key window (27648-wide rows, 510 MB) exceeds 128 MiB;
    // the chunked single blocks keep keys in 3072-wide rows (57 MB).
    let p = plan(&webgpu(1024)).unwrap();
    assert!(p.denoise.chunk.is_some(), "{:?}", p.denoise);
    assert!(denoise_options(&webgpu(1024)).unwrap().all(|o| o.chunk.is_some()));
    // On a device with 4 GiB bindings the unchunked pass is the fastest.
    assert_eq!(plan(&model.input(1024, None)).unwrap().denoise.chunk, None);
    // 16896 tokens × 3072 × 4 bytes = 207 MB of f32 keys in any layout: only keys in f16 (104 MB) fit.
    let p = plan(&webgpu(2048)).unwrap();
    assert!(p.denoise.half_kv && p.denoise.chunk.is_some(), "{:?}", p.denoise);
    assert!(denoise_options(&webgpu(2048)).unwrap().all(|o| o.half_kv));
    // 37376 tokens: 230 MB of keys even in f16.
    match plan(&webgpu(3072)) {
        Err(e @ PlanError::AttentionTooLarge { tokens: 37376, bytes: 229_638_144, .. }) => {
            assert!(e.to_string().contains("37376 tokens"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Reference tokens count: 1024² with a 256² reference is 4864 tokens, 60 MB: it fits chunked.
    // (A 1024² reference's untiled encoder arena, 1.7 GB, exceeds WebGPU's 256 MiB buffer.)
    let refs = [(256, 256)];
    assert!(plan(&PlanInput { references: &refs, ..webgpu(1024) }).unwrap().denoise.chunk.is_some());
    // Under WebGPU's default 256 MiB buffers, 1024² runs by chunks of tokens (stream, keys and
    // values whole: 170 MB); at 1536² those three alone (358 MB) exceed the buffer.
    let strict = |size| PlanInput { limits: DeviceLimits::WEBGPU_DEFAULT, ..model.input(size, None) };
    let p = plan(&strict(1024)).unwrap();
    assert!(p.denoise.chunk.is_some() && p.denoise.arena_bytes <= DeviceLimits::WEBGPU_DEFAULT.max_buffer, "{:?}", p.denoise);
    assert!(matches!(plan(&strict(1536)), Err(PlanError::ArenaTooLarge { phase: "the transformer", .. })));
}

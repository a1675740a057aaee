use super::*;
use crate::config::{klein_4b, klein_9b};
use crate::models::transformer::KvMode;
use crate::models::{vae, vae_encoder, vae_nhwc};

const GIB: u64 = 1 << 30;
/// An adapter with large buffers (Metal on a Mac with 32 GB or more reports
/// a largest buffer of about 16 GiB) and bindings up to 4 GiB − 4: the
/// tables of docs/memory.md are for it. NVIDIA's Vulkan driver allows 4 GiB buffers,
/// so there the transformer's arena refuses 4096² (`REAL_LIMITS` below).
const LIMITS: DeviceLimits = DeviceLimits { max_buffer: 16 * GIB, max_binding: 4 * GIB - 4, half_operands: false };

struct Model {
    transformer: TransformerConfig,
    text_encoder: Qwen3Config,
    vae: VaeConfig,
    df11: bool,
}

impl Model {
    fn klein_4b(df11: bool) -> Self {
        Self { transformer: klein_4b::transformer(), text_encoder: klein_4b::text_encoder(), vae: klein_4b::vae(), df11 }
    }

    fn klein_9b(df11: bool) -> Self {
        Self { transformer: klein_9b::transformer(), text_encoder: klein_9b::text_encoder(), vae: klein_9b::vae(), df11 }
    }

    fn input(&self, size: u64, budget: Option<u64>) -> PlanInput<'_> {
        PlanInput {
            transformer: &self.transformer,
            text_encoder: &self.text_encoder,
            vae: &self.vae,
            width: size,
            height: size,
            prompt_tokens: 512,
            references: &[],
            transformer_weights: transformer_weights(&self.transformer, self.df11),
            text_encoder_weights: text_encoder_weights(&self.text_encoder, self.df11),
            vae_weight_bytes: vae_decoder_weights(&self.vae),
            vae_encoder_weight_bytes: vae_encoder_weights(&self.vae),
            tokenizer_bytes: tokenizer_bytes(TOKENIZER_FILE_BYTES),
            limits: LIMITS,
            budget,
            vae_tile: None,
            kv_cache: false,
            kv_precision: KvPrecision::Auto,
            previews: &[],
        }
    }
}

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

/// A preview decoder is resident beside the transformer: the denoise
/// phase and the smallest budget grow by exactly its bytes, and a budget
/// that just fit without it no longer does.
#[test]
fn the_preview_decoder_is_counted_in_the_denoise_phase() {
    let model = Model::klein_4b(false);
    let without = model.input(1024, None);
    let preview = 300 << 20;
    let layouts = [PreviewLayout { tile: None, on_device: true, device: preview, host: 0 }];
    let with = PlanInput { previews: &layouts, ..model.input(1024, None) };
    let (a, b) = (plan(&without).unwrap(), plan(&with).unwrap());
    assert_eq!(b.denoise.peak(), a.denoise.peak() + preview);
    assert_eq!((a.preview, b.preview), (None, Some(layouts[0])));
    assert_eq!(b.decode, a.decode);
    let (least_without, least_with) = (minimum_budget(&without).unwrap(), minimum_budget(&with).unwrap());
    assert!(least_with > least_without && least_with <= least_without + preview, "{least_without} → {least_with}");
    assert!(plan(&PlanInput { budget: Some(least_without), ..with }).is_err());
}

/// TAEF2's shape (`taesd.py`'s decoder for FLUX.2's 32 latent channels).
fn taef2() -> crate::models::tiny_decoder::TinyDecoderConfig {
    crate::models::tiny_decoder::TinyDecoderConfig::taesd_shape(32, 64, &[3, 3, 3, 1], true).unwrap()
}

/// The preview decoder runs whole where the adapter binds its activations,
/// else by bands: first with the whole image's activations on the device
/// (bands of a binding), then with them in a host scratch file, in an arena
/// that stops growing with the image: at 4096² its activations (64 channels
/// at full size, 4 GiB) exceed every binding, and the host's bands hold it
/// in a fixed arena whatever the image's size.
#[test]
fn the_preview_decoder_runs_by_bands_when_its_activations_exceed_a_binding() {
    let weights = 4 << 20;
    let at = |size: u64| preview_layouts(&taef2(), size, size, weights, LIMITS, None).unwrap();
    let small = at(512);
    assert_eq!((small[0].tile, small[0].on_device), (None, true), "{small:?}");
    // 64 channels × 512² f32 in each of three buffers, and the levels read back.
    assert!(small[0].device > weights + 3 * 64 * 512 * 512 * 4 && small[0].device < weights + (224 << 20), "{small:?}");
    let large = at(4096);
    assert!(large.iter().all(|l| l.tile.is_some()), "{large:?}");
    // On the device: every activation (three of 4 GiB), bands of a binding between them.
    let whole = crate::models::tiny_decoder::arena_bytes(&taef2(), 512, 512).unwrap();
    assert!(whole > 3 * (4 << 30), "{whole}");
    assert_eq!((large[0].tile, large[0].on_device), (Some(4096), true));
    assert!(large[0].device > weights + whole + (4 << 30) - 4 && large[0].device < weights + whole + (4 << 30) + (256 << 20), "{large:?}");
    let host = &large[1..];
    assert!(host.iter().all(|l| !l.on_device), "{large:?}");
    let tiles: Vec<u64> = host.iter().filter_map(|l| l.tile).collect();
    assert!(tiles.windows(2).all(|w| w[0] > w[1]) && large.windows(2).all(|w| w[0].device > w[1].device), "{large:?}");
    // The largest host band is capped by one binding: its arena and its staging.
    assert!(host[0].device <= weights + 2 * (LIMITS.max_binding + (1 << 20)), "{large:?}");
    // The host holds a band and the image's RGB; the activations are in a scratch file.
    assert!(host.iter().all(|l| l.host < 3 * 4096 * 4096 + LIMITS.max_binding + (1 << 20)), "{large:?}");
    // At 8192² the smallest band still holds a row (64 channels, twice as wide), far below the whole decode's 48 GiB.
    assert!(at(8192).last().is_some_and(|l| l.device < weights + (256 << 20)), "{:?}", at(8192).last());
    // A forced tile is the only layout, on the host; one that covers the image is the whole decode.
    let forced = preview_layouts(&taef2(), 512, 512, weights, LIMITS, Some(128)).unwrap();
    assert_eq!(forced.iter().map(|l| (l.tile, l.on_device)).collect::<Vec<_>>(), [(Some(128), false)]);
    assert_eq!(preview_layouts(&taef2(), 512, 512, weights, LIMITS, Some(1024)).unwrap().as_slice(), &small[..1]);
    assert_eq!(preview_layouts(&taef2(), 512, 512, weights, LIMITS, Some(24)), Err(PlanError::VaeTileSize { tile: 24, unit: 16 }));
    // A band must hold one row of the widest convolution: 64 channels, 4096 wide.
    let narrow = DeviceLimits { max_buffer: 256 << 20, max_binding: 1 << 20, half_operands: false };
    let err = preview_layouts(&taef2(), 4096, 4096, weights, narrow, None).unwrap_err();
    assert!(matches!(err, PlanError::PreviewTooWide { width: 4096, limit: 1048576, .. }), "{err}");
}

/// On an adapter of 128 MiB bindings and 2 GiB buffers (a CPU adapter's),
/// TAEF2 at 1024² (activations of 256 MiB, 805 MB in all) runs by bands of
/// a binding with its activations on the device, before any host layout.
#[test]
fn a_preview_beyond_a_binding_keeps_its_activations_on_the_device_first() {
    let cpu = DeviceLimits { max_buffer: (2 * GIB) - 1, max_binding: 128 << 20, half_operands: false };
    let layouts = preview_layouts(&taef2(), 1024, 1024, 4 << 20, cpu, None).unwrap();
    let whole = crate::models::tiny_decoder::arena_bytes(&taef2(), 128, 128).unwrap();
    assert!(whole > 800_000_000 && whole < 2 * GIB, "{whole}");
    assert_eq!((layouts[0].tile, layouts[0].on_device), (Some(1024), true), "{layouts:?}");
    assert!(layouts[0].device > (4 << 20) + whole + (128 << 20) && layouts[0].device < (4 << 20) + whole + (192 << 20), "{layouts:?}");
    assert!(layouts[1..].iter().all(|l| !l.on_device) && layouts.len() > 2, "{layouts:?}");
}

/// The planner takes the fastest preview layout that fits beside the
/// transformer's fastest layout within the budget: whole without one,
/// banded under a budget the whole one overflows; the smallest budget
/// counts the smallest preview layout.
#[test]
fn the_planner_takes_the_fastest_preview_layout_the_budget_holds() {
    let model = Model::klein_4b(false);
    let layouts = preview_layouts(&taef2(), 2048, 2048, 4 << 20, LIMITS, None).unwrap();
    assert!(layouts.len() > 2 && layouts[0].tile.is_none(), "{layouts:?}");
    let with = PlanInput { previews: &layouts, ..model.input(2048, None) };
    let free = plan(&with).unwrap();
    assert_eq!(free.preview, Some(layouts[0]));
    // A budget just under the fastest run's peak: the same transformer layout, a banded preview.
    let tight = plan(&PlanInput { budget: Some(free.denoise.peak() - 1), ..with }).unwrap();
    assert_eq!((tight.denoise.weights, tight.denoise.chunk), (free.denoise.weights, free.denoise.chunk));
    assert!(tight.preview.is_some_and(|p| p.tile.is_some()), "{:?}", tight.preview);
    let least = minimum_budget(&with).unwrap();
    let smallest = layouts.last().copied().unwrap();
    let without = minimum_budget(&model.input(2048, None)).unwrap();
    assert!(least <= without + smallest.device + smallest.host + (64 << 20), "{without} + {smallest:?} → {least}");
    assert!(plan(&PlanInput { budget: Some(least), ..with }).is_ok());
    assert!(plan(&PlanInput { budget: Some(least - 1), ..with }).is_err());
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
fn the_vae_tiles_when_the_budget_is_tight_and_its_arena_stops_growing() {
    let model = Model::klein_4b(false);
    let untiled = plan(&model.input(1024, None)).unwrap().decode;
    assert_eq!(untiled.tile, None);
    let budget = untiled.peak() * 3 / 4;
    let tight = plan(&model.input(1024, Some(budget))).unwrap_or_else(|e| panic!("{e}"));
    let tile = tight.decode.tile.expect("tiled under half the untiled bytes");
    assert!(tile.is_multiple_of(16) && tile < 1024);
    assert!(tight.decode.peak() <= budget);
    // A 4× larger image (2× per side) under the same budget decodes in the same arena.
    // (The transformer needs more at 2048²: the decode phase alone is checked.)
    let larger = decode_options(&model.input(2048, None)).unwrap().find(|p| p.peak() <= budget).expect("the decode fits");
    assert_eq!(larger.tile, Some(tile));
    assert_eq!(larger.arena_bytes, tight.decode.arena_bytes);
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
/// the 4B at 1024² (`cargo test -p flux-lite-core plan::tests::figures -- --nocapture`).
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
fn reference_images_add_their_tokens_and_an_encoder_phase() {
    let model = Model::klein_4b(false);
    let plain = plan(&model.input(1024, None)).unwrap();
    assert_eq!(plain.references, None);
    let refs = [(1024, 1024), (512, 768)];
    let with = PlanInput { references: &refs, ..model.input(1024, None) };
    let p = plan(&with).unwrap();
    let r = p.references.expect("an encoder phase");
    // The arena is the largest reference's: 3 activations of 128 channels at full resolution, at least.
    assert!(r.arena_bytes >= 3 * 128 * 1024 * 1024 * 4, "{}", r.arena_bytes);
    assert_eq!(r.arena_bytes, vae_encoder::arena_bytes(&model.vae, 1024, 1024, with.limits.half_operands).unwrap());
    assert_eq!(r.weight_bytes, vae_encoder_weights(&model.vae));
    // 4096 + 3072 more image tokens in every activation of the transformer.
    assert!(p.denoise.arena_bytes > plain.denoise.arena_bytes * 2, "{} vs {}", p.denoise.arena_bytes, plain.denoise.arena_bytes);
    assert!(p.peak() >= r.peak());
    assert_eq!(r.tile, None, "untiled when the budget allows");
    // The smallest budget for the run covers the encoder's smallest layout, and runs.
    let min = minimum_budget(&with).unwrap();
    let smallest = reference_options(&with).unwrap().map(|o| o.peak()).min().unwrap();
    assert!(min >= smallest);
    assert!(plan(&PlanInput { budget: Some(min), ..with }).is_ok());
}

#[test]
fn the_reference_encode_tiles_under_a_tight_budget_and_its_arena_stops_growing() {
    // bf16 weights: a DF11 model's streaming area would set the budget's floor above the encode's.
    let model = Model::klein_4b(false);
    let one = [(1024, 1024)];
    let with = |refs, budget| PlanInput { references: refs, ..model.input(512, budget) };
    let untiled = plan(&with(&one, None)).unwrap().references.unwrap();
    assert_eq!(untiled.tile, None);
    // A budget below the untiled encode's peak: the encoder takes the largest tile that fits.
    let budget = untiled.peak() * 3 / 4;
    let p = plan(&with(&one, Some(budget))).unwrap_or_else(|e| panic!("{e}"));
    let r = p.references.unwrap();
    let tile = r.tile.expect("a tiled encode");
    assert!(r.peak() <= budget && r.arena_bytes < untiled.arena_bytes, "{r:?}");
    println!("1024² reference under {}: {tile}-px tiles, peak {}", Bytes(budget), Bytes(r.peak()));
    // The next larger tile would not have fitted.
    let larger = reference_options(&with(&one, None)).unwrap().find(|o| o.tile == Some(tile + 16)).unwrap();
    assert!(larger.peak() > budget);
    // The same tile for a reference of 4× the pixels (as sizes go past what the
    // pipeline prepares): the same arena, the same peak.
    let four = [(2048, 2048)];
    // The host holds the prepared image (f32 RGB) and its tokens, which grow with it.
    let big = reference_options(&with(&four, None)).unwrap().find(|o| o.tile == Some(tile)).unwrap();
    assert_eq!((big.arena_bytes, big.device()), (r.arena_bytes, r.device()));
    let (pixels, tokens) = (4 * 3 * (2048 * 2048 - 1024 * 1024), 4 * 128 * (128 * 128 - 64 * 64));
    assert_eq!(big.host_bytes - r.host_bytes, pixels + tokens);
    // A reference smaller than the tile is encoded whole, costing the device no more than the tile.
    let mixed = [(1024, 1024), (256, 256)];
    let m = reference_options(&with(&mixed, None)).unwrap().find(|o| o.tile == Some(tile)).unwrap();
    assert_eq!(m.device(), r.device());
    // Every option is listed fastest first: untiled, then tiles from the largest down.
    let tiles: Vec<Option<u64>> = reference_options(&with(&one, None)).unwrap().map(|o| o.tile).collect();
    assert_eq!(tiles[0], None);
    assert!(tiles[1..].windows(2).all(|w| w[0] > w[1]), "{tiles:?}");
}

#[test]
fn a_reference_beyond_the_adapters_binding_is_tiled_or_refused_up_front() {
    let model = Model::klein_4b(false);
    // 4096² × 128 channels × 4 bytes exceeds a 4 GiB binding: no untiled option, tiles instead.
    let refs = [(4096, 4096)];
    let input = PlanInput { references: &refs, ..model.input(1024, None) };
    let r = plan(&input).unwrap_or_else(|e| panic!("{e}")).references.unwrap();
    assert!(r.tile.is_some_and(|t| t < 4096), "{r:?}");
    assert!(reference_options(&input).unwrap().all(|o| o.tile.is_some()));
    // Bindings of 64 KiB hold no band with one 4096-pixel convolution row (131 channels of it).
    let tiny = DeviceLimits { max_buffer: 1 << 20, max_binding: 64 << 10, half_operands: false };
    match reference_options(&PlanInput { limits: tiny, ..input }).map(|mut o| o.next()) {
        Err(e @ PlanError::ReferenceTooLarge { width: 4096, height: 4096, bytes, limit }) => {
            assert!(bytes > limit);
            assert!(e.to_string().contains("4096×4096 reference image"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let odd = [(1000, 1024)];
    assert!(matches!(plan(&PlanInput { references: &odd, ..model.input(1024, None) }), Err(PlanError::Size(_))));
}

#[test]
fn attention_keys_beyond_one_binding_force_chunks_or_are_refused_up_front() {
    let model = Model::klein_4b(false);
    // lavapipe's limits: WebGPU's 128 MiB bindings, 2 GiB buffers.
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false };
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

/// Where the adapter cannot bind the decode, the fastest layout keeps the
/// image's activations on the device (bands of one binding between them),
/// counted whole on the device; a budget without room for them takes the
/// host's tiles; a forced tile stays on the host.
#[test]
fn a_decode_the_adapter_cannot_bind_keeps_its_activations_on_the_device_where_the_budget_holds_them() {
    let model = Model::klein_4b(false);
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false };
    let input = PlanInput { limits: lavapipe, ..model.input(1024, None) };
    let options: Vec<VaePlan> = decode_options(&input).unwrap().collect();
    let first = options[0];
    assert_eq!((first.tile, first.on_device), (Some(1024), true), "{options:?}");
    let activations = vae::arena_bytes(&model.vae, 128, 128, false).unwrap();
    assert!(first.other_bytes > activations && first.arena_bytes <= lavapipe.max_buffer, "the activations in pages, the band arena one buffer: {first:?}");
    assert!(options[1..].iter().all(|p| !p.on_device && p.tile.is_some_and(|t| t < 1024)) && options.len() > 2, "{options:?}");
    // It costs the image's activations more than the host's largest tile: a budget chooses.
    assert!(options[1].device() + activations / 2 < first.device(), "{options:?}");
    let planned = plan(&input).unwrap().decode;
    assert_eq!((planned.tile, planned.on_device), (Some(1024), true));
    // A forced tile bands on the host; an adapter that binds the decode takes it whole.
    assert!(decode_options(&PlanInput { vae_tile: Some(256), ..input }).unwrap().all(|p| !p.on_device));
    assert_eq!(plan(&model.input(1024, None)).unwrap().decode.tile, None);
}

#[test]
fn a_forced_vae_tile_is_the_only_layout_and_is_checked_against_the_budget() {
    let model = Model::klein_4b(false);
    let free = model.input(1024, None);
    let forced = |tile, budget| PlanInput { vae_tile: Some(tile), budget, ..free };
    // The forced tile is planned (and printed by `gen --verbose`), not patched in after planning.
    let options: Vec<VaePlan> = decode_options(&forced(256, None)).unwrap().collect();
    assert_eq!(options.iter().map(|p| p.tile).collect::<Vec<_>>(), [Some(256)]);
    assert_eq!(plan(&forced(256, None)).unwrap().decode.tile, Some(256));
    // A tile that covers the image decodes it untiled, as the decoder does.
    assert_eq!(plan(&forced(1024, None)).unwrap().decode.tile, None);
    // The planned run fits its minimum; a forced untiled decode does not, and
    // is refused up front with the smallest budget that works with that tile.
    let budget = minimum_budget(&free).unwrap();
    assert!(plan(&PlanInput { budget: Some(budget), ..free }).is_ok());
    match plan(&forced(1024, Some(budget))) {
        Err(PlanError::TooSmall { phase: "the VAE decoder", minimum, .. }) => {
            assert!(minimum > budget, "{minimum} ≤ {budget}");
            assert_eq!(minimum, minimum_budget(&forced(1024, None)).unwrap());
            assert!(plan(&forced(1024, Some(minimum))).is_ok());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan(&forced(100, None)).unwrap_err(), PlanError::VaeTileSize { tile: 100, unit: 16 });
    // 16-pixel bands cannot hold one 1024-pixel row of the full-resolution convolutions (the smallest tile is 48).
    assert_eq!(plan(&forced(16, None)).unwrap_err(), PlanError::VaeTileTooSmall { tile: 16, what: "the VAE decoder" });
    assert!(plan(&forced(48, None)).is_ok());
}

/// A byte count as docs/memory.md's tables write it: GiB to two decimals
/// (rounded up, as [`Bytes`]), below that whole MiB.
fn readme(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.2} GiB", libm::ceil(bytes as f64 / GIB as f64 * 100.0) / 100.0)
    } else {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// docs/memory.md's text with every run of whitespace one space (its sentences wrap).
fn readme_text() -> String {
    include_str!("../../../docs/memory.md").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The figures docs/memory.md must quote, checked all at once so that one
/// run lists every disagreement.
struct Quotes {
    text: String,
    missing: Vec<String>,
}

impl Quotes {
    fn check(&mut self, figure: &str) {
        if !self.text.contains(figure) {
            self.missing.push(figure.to_string());
        }
    }
}

impl Drop for Quotes {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(self.missing.is_empty(), "docs/memory.md does not say these (the planner and the page disagree):\n{}", self.missing.join("\n"));
        }
    }
}

#[test]
fn the_readme_figures_are_the_planners() {
    let mut q = Quotes { text: readme_text(), missing: Vec::new() };
    let mut quoted = |figure: &str| q.check(figure);
    // The 4B transformer at 1024², one row per weight strategy (DF11 sizes estimated).
    let model = Model::klein_4b(true);
    let input = model.input(1024, None);
    let options: Vec<PhasePlan> = denoise_options(&input).unwrap().collect();
    let names = [
        (WeightStrategy::ResidentBf16, "resident bf16"),
        (WeightStrategy::ResidentDf11 { slots: 2 }, "DF11 resident, 2 slots"),
        (WeightStrategy::ResidentDf11 { slots: 1 }, "DF11 resident, 1 slot"),
        (WeightStrategy::Streamed { slots: 2 }, "streamed, 2 slots"),
        (WeightStrategy::Streamed { slots: 1 }, "streamed, 1 slot"),
    ];
    for (strategy, name) in names {
        let whole = options.iter().find(|p| p.weights == strategy && p.chunk.is_none()).unwrap();
        let chunked = options.iter().find(|p| p.weights == strategy && p.chunk.is_some() && !p.half_kv).unwrap();
        let half_kv = options.iter().find(|p| p.weights == strategy && p.half_kv).unwrap();
        let mut row = format!(
            "| {name} | {} | {} | {} | {} | {}",
            readme(whole.peak()),
            readme(whole.weight_bytes),
            readme(whole.arena_bytes),
            readme(whole.host_bytes),
            readme(chunked.peak())
        );
        if strategy == WeightStrategy::ResidentBf16 {
            row += &format!(" ({})", readme(chunked.arena_bytes));
        }
        row += &format!(" | {}", readme(half_kv.peak()));
        if strategy == WeightStrategy::ResidentBf16 {
            row += &format!(" ({})", readme(half_kv.arena_bytes));
        }
        quoted(&(row + " |"));
    }
    // The text encoder's phase.
    let te: Vec<PhasePlan> = encode_options(&input).unwrap().collect();
    let te_peak = |s| readme(te.iter().find(|p| p.weights == s).unwrap().peak());
    quoted(&format!("| resident bf16 | {} |", te_peak(WeightStrategy::ResidentBf16)));
    let (d2, d1) = (te_peak(WeightStrategy::ResidentDf11 { slots: 2 }), te_peak(WeightStrategy::ResidentDf11 { slots: 1 }));
    quoted(&format!("| DF11 resident, 2 / 1 slots | {} / {} |", d2.trim_end_matches(" GiB"), d1));
    quoted(&format!("| streamed, 2 / 1 slots | {} / {} |", te_peak(WeightStrategy::Streamed { slots: 2 }), te_peak(WeightStrategy::Streamed { slots: 1 })));
    // The VAE decoder at 1024²: smallest tile, the largest under 128 MiB bindings, untiled.
    let decode: Vec<VaePlan> = decode_options(&input).unwrap().collect();
    let smallest = decode[decode.len() - 1];
    quoted(&format!("needs {} in its smallest tile at 1024² ({} pixels", readme(smallest.peak()), smallest.tile.unwrap()));
    quoted(&format!("against {} untiled", readme(decode[0].peak())));
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false };
    let bound = PlanInput { limits: lavapipe, ..input };
    let largest = decode_options(&bound).unwrap().find(|p| p.tile.is_some() && !p.on_device).unwrap();
    quoted(&format!("{} in the largest tile lavapipe's 128 MiB bindings allow ({} px)", readme(largest.peak()), largest.tile.unwrap()));
    // The VAE encoder on a 1024² reference.
    let refs = [(1024, 1024)];
    let roomy: Vec<VaePlan> = reference_options(&PlanInput { references: &refs, ..input }).unwrap().collect();
    let webgpu: Vec<VaePlan> = reference_options(&PlanInput { references: &refs, limits: DeviceLimits::WEBGPU_DEFAULT, ..input }).unwrap().collect();
    let last = webgpu[webgpu.len() - 1];
    quoted(&format!("needs {} untiled, {} in {}-pixel tiles under WebGPU's default", readme(roomy[0].peak()), readme(webgpu[0].peak()), webgpu[0].tile.unwrap()));
    quoted(&format!("and {} in its smallest tile ({} px)", readme(last.peak()), last.tile.unwrap()));
    // Whole runs: the 4B's smallest budget and its unchunked streamed peak, the 9B, and 4096².
    quoted(&format!("the smallest budget for a whole 1024² run is {}", readme(minimum_budget(&input).unwrap())));
    let streamed_1 = options.iter().find(|p| p.weights == WeightStrategy::Streamed { slots: 1 } && p.chunk.is_none()).unwrap();
    quoted(&format!("by streaming ({} unchunked)", readme(streamed_1.peak())));
    let nine = Model::klein_9b(true);
    let nine_resident = plan(&Model::klein_9b(false).input(1024, None)).unwrap();
    quoted(&format!("needs at least {} at 1024²", readme(minimum_budget(&nine.input(1024, None)).unwrap())));
    quoted(&format!("{} with everything resident", readme(nine_resident.peak())));
    let four_k = |m: &Model| readme(minimum_budget(&m.input(4096, None)).unwrap());
    quoted(&format!("budgets are {} (4B) and {} (9B)", four_k(&model), four_k(&nine)));
    // The whole-process table: each side of the smallest budget and of everything resident.
    for (name, m) in [("4B", &model), ("9B", &nine)] {
        for size in [1024, 4096] {
            let input = m.input(size, None);
            let need = minimum_need(&input).unwrap();
            let resident = plan(&input).unwrap();
            let row = format!(
                "| {name} | {size}² | {} | {} | {} | {} | {} | {} |",
                readme(need.total()),
                readme(need.device),
                readme(need.host),
                readme(resident.peak()),
                readme(resident.device_peak()),
                readme(resident.host_peak())
            );
            quoted(&row);
        }
    }
}

/// Limits as wgpu reports them on real adapters: NVIDIA's Vulkan driver
/// (4 GiB buffers, bindings capped at 2³¹−1), Mesa's AMD and Intel drivers
/// (2 GiB), Metal with its binding clamped to 2³¹−1, WebGPU's defaults.
const REAL_LIMITS: [(&str, DeviceLimits); 4] = [
    ("NVIDIA Vulkan", DeviceLimits { max_buffer: 4 * GIB, max_binding: 2 * GIB - 1, half_operands: false }),
    ("Mesa AMD/Intel", DeviceLimits { max_buffer: 2 * GIB, max_binding: 2 * GIB - 1, half_operands: false }),
    ("Metal", DeviceLimits { max_buffer: 16 * GIB, max_binding: 2 * GIB - 1, half_operands: false }),
    ("WebGPU defaults", DeviceLimits::WEBGPU_DEFAULT),
];

/// Every activation arena the plan lays out is one buffer: for both
/// models, sizes 512–4096 and each real limit set, a plan either keeps its
/// transformer arena within the largest buffer or refuses up front.
#[test]
fn planned_arenas_fit_the_adapters_largest_buffer() {
    for model in [Model::klein_4b(false), Model::klein_9b(false)] {
        for (name, limits) in REAL_LIMITS {
            for size in (512..=4096).step_by(256) {
                let input = PlanInput { limits, ..model.input(size, None) };
                match plan(&input) {
                    Ok(p) => {
                        assert!(p.largest_buffer() <= limits.max_buffer, "{name}, {size}²: arena {} above {}", p.largest_buffer(), limits.max_buffer);
                        assert!(p.largest_buffer() >= p.denoise.arena_bytes.max(p.decode.arena_bytes).max(p.encode.arena_bytes));
                        let binding = largest_binding(&input, &p).unwrap();
                        assert!(binding <= limits.max_binding, "{name}, {size}²: binding {binding} above {}", limits.max_binding);
                    }
                    Err(PlanError::ArenaTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
                    Err(PlanError::AttentionTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
                    Err(PlanError::VaeTooWide { .. } | PlanError::ReferenceTooLarge { .. }) => {}
                    Err(e) => panic!("{name}, {size}²: {e}"),
                }
            }
        }
    }
}

/// Where the unchunked arena is larger than the adapter's largest buffer, a
/// chunked one is taken (the 4B at 4096² on NVIDIA's 4 GiB buffers, and at
/// 6144² with keys and values in f16: 3.6 GB of stream, keys and values);
/// where every layout is, the plan refuses up front, naming the smallest
/// arena (the 4B at 8192²: 6.5 GB of them even with f16 keys and values).
#[test]
fn an_arena_above_the_largest_buffer_takes_chunks_or_is_refused_up_front() {
    let model = Model::klein_4b(false);
    let wide = plan(&model.input(2048, None)).unwrap();
    let limits = DeviceLimits { max_buffer: wide.denoise.arena_bytes - 1, ..LIMITS };
    let p = plan(&PlanInput { limits, ..model.input(2048, None) }).unwrap();
    assert!(p.denoise.arena_bytes < wide.denoise.arena_bytes && p.denoise.chunk.is_some(), "{:?}", p.denoise);
    let nvidia = REAL_LIMITS[0].1;
    let p = plan(&PlanInput { limits: nvidia, ..model.input(4096, None) }).unwrap();
    assert!(p.denoise.chunk.is_some() && p.denoise.arena_bytes <= nvidia.max_buffer, "{:?}", p.denoise);
    let p = plan(&PlanInput { limits: nvidia, ..model.input(6144, None) }).unwrap();
    assert!(p.denoise.half_kv && p.denoise.arena_bytes <= nvidia.max_buffer, "{:?}", p.denoise);
    match plan(&PlanInput { limits: nvidia, ..model.input(8192, None) }) {
        Err(e @ PlanError::ArenaTooLarge { bytes, limit, .. }) => {
            assert!(bytes > limit && limit == 4 * GIB);
            assert!(e.to_string().contains("above the adapter's largest buffer"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

//! The preview decoder beside the transformer: counted in the denoise
//! phase, whole or by bands, its activations on the device or the host.

use super::*;

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
    crate::models::tiny_decoder::TinyDecoderConfig::taef2_shape(32, 8).unwrap()
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
    let whole = crate::models::tiny_decoder::arena_bytes(&taef2(), 512, 512, false).unwrap();
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
    let narrow = DeviceLimits { max_buffer: 256 << 20, max_binding: 1 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    let err = preview_layouts(&taef2(), 4096, 4096, weights, narrow, None).unwrap_err();
    assert!(matches!(err, PlanError::PreviewTooWide { width: 4096, limit: 1048576, .. }), "{err}");
}

/// Where the device's products take f16 inputs the preview decoder runs
/// channels-last with f16 activations (`tiny_decoder_nhwc`): 136 bytes a
/// pixel of 64 channels in each of its three buffers where f32 took 256,
/// and the image's f32 values and its levels (a byte each) apart. At 1024²
/// its arena falls from 772 MiB to 427 MiB, and the device memory of its
/// fastest layout with it.
#[test]
fn the_channels_last_preview_decoder_holds_about_half_the_bytes() {
    use crate::models::tiny_decoder::arena_bytes;
    let [f32, half] = [false, true].map(|nhwc| arena_bytes(&taef2(), 128, 128, nhwc).unwrap());
    println!("TAEF2 at 1024²: arena {f32} bytes channel-major f32, {half} channels-last f16");
    // The packed and the unpatchified latent, three buffers, the norms' statistics (and the image apart), each aligned.
    let norms = 4 * crate::models::group_norm::NormScratch::elements(4, 1024);
    let near = |got: u64, want: u64| got >= want && got < want + 8 * crate::ir::ALIGN;
    assert!(near(f32, (2 * 32 * 128 * 128 + 3 * 64 * 1024 * 1024) * 4 + norms), "{f32}");
    assert!(near(half, (2 * 32 * 128 * 128 + 3 * 34 * 1024 * 1024 + 3 * 1024 * 1024) * 4 + 3 * 1024 * 1024 + norms), "{half}");
    let weights = 4 << 20;
    let [a, b] = [false, true].map(|half_operands| preview_layouts(&taef2(), 1024, 1024, weights, DeviceLimits { half_operands, ..LIMITS }, None).unwrap()[0]);
    assert_eq!((a.tile, b.tile), (None, None));
    // The arenas' difference, give or take the dispatches' parameters (the programs' steps differ).
    let fell = a.device - b.device;
    assert!(fell.abs_diff(f32 - half) < 64 << 10, "{a:?} {b:?}");
}

/// On an adapter of 128 MiB bindings and 2 GiB buffers (a CPU adapter's),
/// TAEF2 at 1024² (activations of 256 MiB, 805 MB in all) runs by bands of
/// a binding with its activations on the device, before any host layout.
#[test]
fn a_preview_beyond_a_binding_keeps_its_activations_on_the_device_first() {
    let cpu = DeviceLimits { max_buffer: (2 * GIB) - 1, max_binding: 128 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    let layouts = preview_layouts(&taef2(), 1024, 1024, 4 << 20, cpu, None).unwrap();
    let whole = crate::models::tiny_decoder::arena_bytes(&taef2(), 128, 128, false).unwrap();
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

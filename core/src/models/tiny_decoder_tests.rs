//! Tests of `tiny_decoder.rs`: the structure read from tensors' names, and the channel-major program.

use super::*;

/// diffusers' `AutoencoderTiny` decoder tensors with 2 latent channels,
/// widths (8, 8), blocks (2, 1): conv, ReLU, 2 blocks, upsample, conv, 1 block, conv out
/// (modules 0 to 7).
fn diffusers_names() -> heapless::Vec<(heapless::String<64>, heapless::Vec<usize, 4>), 64> {
    let mut v = heapless::Vec::new();
    let mut add = |n: &str, s: &[usize]| {
        let _ = v.push((heapless::String::try_from(n).unwrap_or_default(), heapless::Vec::from_slice(s).unwrap_or_default()));
    };
    add("decoder.layers.0.weight", &[8, 2, 3, 3]);
    add("decoder.layers.0.bias", &[8]);
    for m in [2, 3, 6] {
        for k in [0, 2, 4] {
            add(&format_name(m, k, "weight"), &[8, 8, 3, 3]);
            add(&format_name(m, k, "bias"), &[8]);
        }
    }
    add("decoder.layers.5.weight", &[8, 8, 3, 3]);
    add("decoder.layers.7.weight", &[3, 8, 3, 3]);
    add("decoder.layers.7.bias", &[3]);
    add("encoder.layers.0.weight", &[8, 3, 3, 3]);
    v
}

fn format_name(m: u32, k: u32, what: &str) -> heapless::String<64> {
    let mut s = heapless::String::new();
    let _ = fmt::Write::write_fmt(&mut s, format_args!("decoder.layers.{m}.conv.{k}.{what}"));
    s
}

fn parse(names: &[(heapless::String<64>, heapless::Vec<usize, 4>)]) -> Result<TinyDecoderConfig, TinyDecoderError> {
    TinyDecoderConfig::from_tensors(names.iter().map(|(n, s)| (n.as_str(), s.as_slice())))
}

#[test]
fn the_structure_comes_from_the_names() {
    let cfg = parse(&diffusers_names()).unwrap();
    assert_eq!(cfg.layout, KeyLayout::Diffusers);
    assert_eq!(cfg.latent_channels, 2);
    assert_eq!(cfg.scale(), 2);
    let kinds: heapless::Vec<u16, 8> = cfg.stages.iter().map(|s| match s {
        Stage::ConvIn { module, .. } | Stage::Block { module, .. } | Stage::Upsample { module, .. } | Stage::ConvOut { module, .. } => *module,
    }).collect();
    assert_eq!(kinds.as_slice(), &[0, 2, 3, 5, 6, 7]);
    assert!(matches!(cfg.stages[3], Stage::Upsample { channels_in: 8, out: 8, .. }));
    // At a 4×6 latent: 8 channels at 8×12 is the widest.
    assert_eq!(cfg.largest_activation(24), 8 * 96);
}

#[test]
fn a_missing_upsampling_gap_or_a_wrong_bias_is_named() {
    let mut names = diffusers_names();
    // The bias of the upsampling convolution makes it a convolution to RGB in the middle.
    let _ = names.push((heapless::String::try_from("decoder.layers.5.bias").unwrap_or_default(), heapless::Vec::from_slice(&[8]).unwrap_or_default()));
    let err = parse(&names).unwrap_err();
    assert_eq!(err, TinyDecoderError::Structure(5, "the last convolution should follow a block directly and give 3 channels"));
    let mut names = diffusers_names();
    let at = names.iter().position(|(n, _)| n.as_str() == "decoder.layers.7.bias").unwrap();
    names[at].1 = heapless::Vec::from_slice(&[4]).unwrap_or_default();
    let err = parse(&names).unwrap_err();
    assert!(matches!(err, TinyDecoderError::Shape(ref n, _) if n.as_str() == "decoder.layers.7.bias"), "{err:?}");
    assert_eq!(parse(&[]).unwrap_err(), TinyDecoderError::NoDecoder);
}

#[test]
fn the_program_ends_in_levels_of_the_image_size() {
    let cfg = parse(&diffusers_names()).unwrap();
    let l = TinyDecoderLayout::new(&cfg, 4, 6, 1e-4, false, &mut BumpArena::new(u64::MAX)).unwrap();
    assert_eq!(l.image_size(), (8, 12));
    let mut last = None;
    let mut convs = 0;
    decode(&l, |op| {
        convs += matches!(op, Op::Conv2d { .. }) as u32;
        last = Some(op);
    });
    assert_eq!(convs, 1 + 3 * 3 + 1 + 1);
    assert_eq!(last, Some(Op::PixelLevels { src: l.decoded(), dst: l.levels(), count: 3 * 8 * 12 }));
}

//! The Qwen3 text encoder on the GPU against transformers: the stacked
//! prompt embedding and each picked hidden state, pad rows included.

#![allow(clippy::unwrap_used)]

use flux_lite_core::ir::Op;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::components::text_encoder::TextEncoder;
use flux_lite_platform::RunError;
use flux_lite_tests::{gpu, model_dir, rel_l2, Goldens, CASES};

const TOL: f64 = flux_lite_tests::tolerance::f32::TEXT_ENCODER;

fn ids(g: &Goldens, name: &str) -> Vec<u32> {
    g.i64(name).0.iter().map(|&v| u32::try_from(v).unwrap()).collect()
}

fn encoder(model: &str) -> (ModelFolder, TextEncoder) {
    let folder = ModelFolder::open(&model_dir(model)).unwrap();
    let store = folder.weights(Component::TextEncoder).unwrap();
    let picks = folder.text_encoder.output_layers();
    let enc = TextEncoder::new(gpu(), &folder.text_encoder, store, flux_lite_core::plan::WeightStrategy::ResidentBf16, 512, picks).unwrap();
    (folder, enc)
}

/// Checks one prompt's embedding in full and per picked layer; returns the worst relative L2.
fn check(case: &str, enc: &TextEncoder, g: &Goldens, prefix: &str) -> f64 {
    let got = enc.encode(gpu(), &ids(g, &format!("{prefix}input_ids")), &ids(g, &format!("{prefix}attention_mask")), &mut |_| {}).unwrap();
    let want = g.f32(&format!("{prefix}prompt_embeds")).0;
    let (err, worst) = rel_l2(&got, &want);
    eprintln!("{case} {prefix}prompt_embeds: relative L2 {err:.2e}, worst element {worst}: {} vs {}", got[worst], want[worst]);
    assert!(err <= TOL, "{case} {prefix}prompt_embeds: relative L2 {err:.3e} > {TOL:.0e}");
    if prefix.is_empty() {
        let h = enc.config.hidden_size;
        for (slot, k) in enc.layout.picks.iter().enumerate() {
            let layer: Vec<f32> = got.chunks_exact(3 * h).flat_map(|row| row[slot * h..][..h].to_vec()).collect();
            let (e, w) = rel_l2(&layer, &g.f32(&format!("hidden_states.{k}")).0);
            eprintln!("{case} hidden_states.{k}: relative L2 {e:.2e}, worst element {w}");
            assert!(e <= TOL, "{case} hidden_states.{k}: relative L2 {e:.3e} > {TOL:.0e}");
        }
        // Pad rows (all 512 are used by the transformer) carry real values.
        let mask = ids(g, "attention_mask");
        let last_pad = mask.iter().rposition(|&m| m == 0).unwrap();
        assert!(got[last_pad * 3 * h..][..3 * h].iter().any(|&v| v != 0.0), "{case}: pad rows are empty");
    }
    err
}

#[test]
fn prompt_embeddings_match_transformers_for_every_case() {
    for case in CASES {
        let g = Goldens::load(case);
        let model = g.case_json()["model"].as_str().unwrap().to_string();
        let (folder, enc) = encoder(&model);
        let picks: Vec<usize> = g.case_json()["text_encoder_out_layers"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(picks, folder.text_encoder.output_layers(), "{case}: the pipeline's picks are L/4, L/2, 3L/4");
        check(case, &enc, &g, "");
        if g.case_json()["cfg"].as_bool().unwrap() {
            check(case, &enc, &g, "negative_");
        }
    }
}

#[test]
fn only_the_layers_up_to_the_last_pick_are_uploaded() {
    let (folder, enc) = encoder("tiny-b");
    let last = *folder.text_encoder.output_layers().iter().max().unwrap();
    assert!(last < folder.text_encoder.num_hidden_layers);
    let names: Vec<String> = enc.blocks().iter().flatten().flat_map(Op::weights).map(|n| n.to_string()).collect();
    assert!(names.iter().any(|n| n.starts_with(&format!("model.layers.{}.", last - 1))));
    assert!(!names.iter().any(|n| n.starts_with(&format!("model.layers.{last}.")) || n == "model.norm.weight"));
    assert!(!names.iter().any(|n| n.contains("embed_tokens")), "the embedding table stays on the host");
    // Everything on the device is exactly what the program reads.
    let store = folder.weights(Component::TextEncoder).unwrap();
    let read: u64 = {
        let mut uniq = names.clone();
        uniq.sort();
        uniq.dedup();
        uniq.iter().map(|n| store.tensor(n).unwrap().bytes.len() as u64).sum()
    };
    assert_eq!(enc.weight_bytes(), read);
}

#[test]
fn bad_token_ids_and_lengths_are_refused() {
    let (folder, enc) = encoder("tiny-a");
    let mut ids = vec![0u32; 512];
    let mask = vec![1u32; 512];
    ids[7] = folder.text_encoder.vocab_size as u32;
    let err = enc.encode(gpu(), &ids, &mask, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, RunError::Input { component: "text encoder", detail } if detail.contains("token id 485")), "{err}");
    let err = enc.encode(gpu(), &ids[..10], &mask[..10], &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("512"), "{err}");
}

#[test]
fn a_text_encoder_with_heads_of_32_matches_transformers() {
    let (enc, g) = flux_lite_tests::wide_heads_text_encoder(gpu());
    let got = flux_lite_tests::encode_goldens(gpu(), &enc, &g);
    let (err, worst) = rel_l2(&got, &g.f32("prompt_embeds").0);
    eprintln!("wide-heads prompt_embeds: relative L2 {err:.2e}, worst element {worst}");
    assert!(err <= TOL, "wide-heads prompt_embeds: relative L2 {err:.3e} > {TOL:.0e}");
}

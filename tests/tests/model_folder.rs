//! The loader on the real saved model folders (single-file and sharded), and
//! its errors on damaged copies.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::LoadError;
use flux_lite_tests::{copy_tree, model_dir, scratch_dir};
use safetensors::tensor::Dtype;

#[test]
fn tiny_a_configs_come_from_the_folder() {
    let m = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    assert!(m.index.is_distilled);
    assert_eq!((m.transformer.num_layers, m.transformer.num_single_layers), (2, 2));
    assert_eq!((m.transformer.num_attention_heads, m.transformer.attention_head_dim), (4, 16));
    assert_eq!(m.transformer.out_channels, 16, "out_channels: null means in_channels");
    assert_eq!(m.transformer.mlp_hidden_dim(), 192);
    // transformers 5 spelling: rope_parameters.rope_theta
    assert_eq!(m.text_encoder.rope_theta, 1e6);
    assert_eq!(m.text_encoder.output_layers(), [1, 2, 3]);
    assert_eq!(m.vae.scale_factor(), 2);
    assert!(m.scheduler.use_dynamic_shifting);
    assert_eq!(m.scheduler.shift, 3.0);
}

#[test]
fn tiny_b_configs_come_from_the_folder() {
    let m = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    assert!(!m.index.is_distilled);
    assert_eq!(m.transformer.axes_dims_rope.as_slice(), &[4, 4, 8, 8]);
    // transformers 4 spelling: top-level rope_theta
    assert_eq!(m.text_encoder.rope_theta, 1e6);
    assert_eq!(m.text_encoder.output_layers(), [2, 4, 6]);
    assert_eq!(m.vae.scale_factor(), 4);
    assert_eq!(m.vae.block_out_channels.as_slice(), &[16, 32, 32]);
}

#[test]
fn every_component_holds_exactly_the_expected_tensors() {
    for model in ["tiny-a", "tiny-b"] {
        let m = ModelFolder::open(&model_dir(model)).unwrap();
        for c in Component::ALL {
            let store = m.weights(c).unwrap_or_else(|e| panic!("{model}: {e}"));
            assert_eq!(store.names().count(), m.expected_tensors(c).len(), "{model} {}", c.dir());
        }
    }
}

#[test]
fn sharded_weights_are_read_across_files() {
    let m = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    let te = m.weights(Component::TextEncoder).unwrap();
    // Layer 0 and the last layer live in different shards of tiny-b.
    let first = te.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    let last = te.tensor("model.layers.7.mlp.down_proj.weight").unwrap();
    assert_eq!((first.dtype, first.shape), (Dtype::BF16, &[48usize, 48][..]));
    assert_eq!(last.shape, &[48, 80]);
    assert_eq!(last.bytes.len(), 48 * 80 * 2);
    // The stored values are the generator's: running_var was drawn from U(0.5, 2).
    let vae = m.weights(Component::Vae).unwrap();
    let var = vae.tensor("bn.running_var").unwrap();
    for pair in var.bytes.chunks_exact(2) {
        let v = flux_lite_core::numerics::bf16::to_f32(u16::from_le_bytes([pair[0], pair[1]]));
        assert!((0.5..=2.0).contains(&v), "{v}");
    }
}

fn damaged_copy(name: &str, model: &str) -> std::path::PathBuf {
    let dir = scratch_dir(name);
    copy_tree(&model_dir(model), &dir);
    dir
}

#[test]
fn truncated_safetensors_names_the_file() {
    let dir = damaged_copy("truncated", "tiny-a");
    let file = dir.join("vae/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let m = ModelFolder::open(&dir).unwrap();
    let err = m.weights(Component::Vae).unwrap_err();
    assert!(matches!(err, LoadError::Safetensors { .. }), "{err}");
    assert!(err.to_string().contains("diffusion_pytorch_model.safetensors"), "{err}");
}

#[test]
fn config_that_disagrees_with_the_weights_names_the_tensor() {
    let dir = damaged_copy("wrong-shape", "tiny-a");
    let cfg = dir.join("text_encoder/config.json");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("\"intermediate_size\": 64", "\"intermediate_size\": 72");
    std::fs::write(&cfg, text).unwrap();
    let err = ModelFolder::open(&dir).unwrap().weights(Component::TextEncoder).unwrap_err();
    assert!(matches!(&err, LoadError::WrongTensor { name, .. } if name == "model.layers.0.mlp.gate_proj.weight"), "{err}");
}

#[test]
fn missing_shard_and_missing_config_are_reported_by_path() {
    let dir = damaged_copy("missing-shard", "tiny-b");
    std::fs::remove_file(dir.join("text_encoder/model-00003-of-00004.safetensors")).unwrap();
    let err = ModelFolder::open(&dir).unwrap().weights(Component::TextEncoder).unwrap_err();
    assert!(err.to_string().contains("model-00003-of-00004.safetensors"), "{err}");

    std::fs::remove_file(dir.join("vae/config.json")).unwrap();
    let err = ModelFolder::open(&dir).unwrap_err();
    assert!(err.to_string().contains("vae/config.json"), "{err}");
}

#[test]
fn invalid_json_and_bad_fields_are_errors() {
    let dir = damaged_copy("bad-json", "tiny-a");
    std::fs::write(dir.join("scheduler/scheduler_config.json"), "{ not json").unwrap();
    let err = ModelFolder::open(&dir).unwrap_err();
    assert!(matches!(err, LoadError::Json { .. }) && err.to_string().contains("scheduler_config.json"), "{err}");

    let dir = damaged_copy("bad-field", "tiny-a");
    let cfg = dir.join("transformer/config.json");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("\"num_attention_heads\": 4", "\"num_attention_heads\": \"four\"");
    std::fs::write(&cfg, text).unwrap();
    let err = ModelFolder::open(&dir).unwrap_err();
    assert!(err.to_string().contains("`num_attention_heads` should be a non-negative integer"), "{err}");
}

#[test]
fn an_unread_tensor_is_tolerated_and_named() {
    let dir = damaged_copy("extra", "tiny-a");
    let file = dir.join("transformer/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    let extra = [0u8; 4];
    tensors.push(("guidance_embedder.weight".into(), safetensors::tensor::TensorView::new(Dtype::BF16, vec![2], &extra).unwrap()));
    let out = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(&file, out).unwrap();
    // As diffusers loads such a file (with a warning), the weights open and the extra is named.
    let store = ModelFolder::open(&dir).unwrap().weights(Component::Transformer).unwrap();
    assert_eq!(store.unread(), ["guidance_embedder.weight"]);
    let warning = store.unread_warning().unwrap();
    assert!(warning.starts_with("warning: transformer: 1 tensors") && warning.contains("`guidance_embedder.weight`"), "{warning}");
}

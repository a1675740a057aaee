//! `flux-lite compress` on the tiny-b model: the output is a complete model
//! folder whose weights are exactly the original ones, in the layout of the
//! official DF11 compressor (the transformer file byte-identical to the one
//! `dfloat11` 0.5.0 wrote, test_vectors/generate_df11.py), that `gen` draws
//! the same pixels from; and bad requests leave nothing behind.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_tests::{model_dir, only_an_error_line, read_png, scratch_dir, test_vectors};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MODEL: &str = "tiny-b";
const FIELDS: [&str; 6] = ["luts", "encoded_exponent", "sign_mantissa", "output_positions", "gaps", "split_positions"];

fn flux_lite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap()
}

fn compress(model: &Path, output: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["compress", "--model", model.to_str().unwrap(), "--output", output.to_str().unwrap()];
    args.extend(extra);
    flux_lite(&args)
}

fn succeeded(run: &Output) -> String {
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    String::from_utf8_lossy(&run.stdout).into_owned()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn official_transformer() -> PathBuf {
    test_vectors().join("goldens/df11/tiny-b-transformer")
}

/// tiny-b with both components compressed, into a fresh scratch folder.
fn compressed(test: &str, extra: &[&str]) -> (PathBuf, Output) {
    let dir = scratch_dir(test);
    let out = dir.join(format!("{MODEL}-df11"));
    let mut args = vec!["--components", "transformer,text_encoder"];
    args.extend(extra);
    let run = compress(&model_dir(MODEL), &out, &args);
    succeeded(&run);
    assert_eq!(names_in(&dir), [format!("{MODEL}-df11")], "only the output folder is left");
    (out, run)
}

#[test]
fn the_compressed_folder_holds_the_same_weights_in_the_official_layout() {
    let (out, run) = compressed("compress-layout", &[]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    print!("{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("transformer: ") && lines[0].contains("in 9 DF11 groups"), "{stdout}");
    assert!(lines[1].starts_with("text_encoder: ") && lines[1].contains("in 8 DF11 groups"), "{stdout}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("group 9/9") && stderr.contains("group 8/8"), "the progress bar: {stderr}");

    // The whole folder is there; only the compressed components' weights and configs are new.
    let (source, out_root) = (model_dir(MODEL), &out);
    assert_eq!(names_in(out_root), names_in(&source));
    assert_eq!(names_in(&out.join("transformer")), ["config.json", "model.safetensors"]);
    assert_eq!(names_in(&out.join("text_encoder")), ["config.json", "generation_config.json", "model.safetensors"]);
    for file in [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokenizer/chat_template.jinja",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/generation_config.json",
    ] {
        assert!(std::fs::read(out.join(file)).unwrap() == std::fs::read(source.join(file)).unwrap(), "{file} differs");
    }

    // Every component holds exactly the original tensors, byte for byte, once expanded.
    let original = ModelFolder::open(&source).unwrap_or_else(|e| panic!("{e}"));
    let df11 = ModelFolder::open(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(df11.transformer, original.transformer);
    assert_eq!(df11.text_encoder, original.text_encoder);
    for (c, groups) in [(Component::Transformer, 9), (Component::TextEncoder, 8), (Component::Vae, 0)] {
        let want = original.weights(c).unwrap_or_else(|e| panic!("{e}"));
        let mut got = df11.weights(c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.df11_groups().len(), groups, "{}", c.dir());
        got.expand_df11_on_host().unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = want.names().collect();
        assert_eq!(got.names().collect::<Vec<_>>(), names, "{}", c.dir());
        for name in names {
            let (a, b) = (got.tensor(name).unwrap(), want.tensor(name).unwrap());
            assert_eq!((a.dtype, a.shape), (b.dtype, b.shape), "{}: {name}", c.dir());
            assert!(a.bytes == b.bytes, "{}: {name}: bytes differ", c.dir());
        }
    }

    // The transformer's groups are the official compressor's, byte for byte (and so is the whole file).
    let ours_path = out.join("transformer/model.safetensors");
    let official_path = official_transformer().join("model.safetensors");
    let (ours_bytes, official_bytes) = (std::fs::read(&ours_path).unwrap(), std::fs::read(&official_path).unwrap());
    let (ours, official) = (SafeTensors::deserialize(&ours_bytes).unwrap(), SafeTensors::deserialize(&official_bytes).unwrap());
    let groups: Vec<&str> = official.names().into_iter().filter_map(|n| n.strip_suffix(".luts")).collect();
    assert_eq!(groups.len(), 9);
    for group in groups {
        for field in FIELDS {
            let name = format!("{group}.{field}");
            let (a, b) = (ours.tensor(&name).unwrap(), official.tensor(&name).unwrap());
            assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
            assert!(a.data() == b.data(), "{name}: differs from the official file");
        }
    }
    assert_eq!(ours.len(), official.len(), "the same tensors");
    assert!(ours_bytes == official_bytes, "model.safetensors differs from the official file");

    // The text encoder: one group per layer; the embedding table stays bf16.
    let te_bytes = std::fs::read(out.join("text_encoder/model.safetensors")).unwrap();
    let te = SafeTensors::deserialize(&te_bytes).unwrap();
    for layer in 0..original.text_encoder.num_hidden_layers {
        for field in FIELDS {
            let t = te.tensor(&format!("model.layers.{layer}.{field}")).unwrap();
            let (dtype, rank) = match field {
                "split_positions" => (Dtype::I64, 1),
                "luts" => (Dtype::U8, 2),
                _ => (Dtype::U8, 1),
            };
            assert_eq!((t.dtype(), t.shape().len()), (dtype, rank), "layer {layer} {field}");
        }
        assert_eq!(te.tensor(&format!("model.layers.{layer}.split_positions")).unwrap().shape(), [6]);
        assert!(te.tensor(&format!("model.layers.{layer}.mlp.up_proj.weight")).is_err());
    }
    assert_eq!(te.tensor("model.embed_tokens.weight").unwrap().dtype(), Dtype::BF16);

    // config.json: every diffusers / transformers field kept, `dfloat11_config` added.
    let official_df11 = json(&official_transformer().join("config.json"))["dfloat11_config"].clone();
    for (component, df11_config) in [
        ("transformer", official_df11),
        (
            "text_encoder",
            serde_json::json!({
                "version": "0.5.0",
                "threads_per_block": [512],
                "bytes_per_thread": 8,
                "pattern_dict": { r"model\.layers\.\d+": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                    "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] },
            }),
        ),
    ] {
        let (want, got) = (json(&source.join(component).join("config.json")), json(&out.join(component).join("config.json")));
        for (key, value) in want.as_object().unwrap() {
            assert_eq!(&got[key], value, "{component}/config.json: {key}");
        }
        assert_eq!(got.as_object().unwrap().len(), want.as_object().unwrap().len() + 1, "{component}/config.json");
        assert_eq!(got["dfloat11_config"], df11_config, "{component}/config.json");
        // In the official order: the loader matches patterns in dict order.
        let keys = |v: &Value| v["pattern_dict"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&got["dfloat11_config"]), keys(&df11_config), "{component}: pattern order");
    }
}

#[test]
fn gen_draws_the_same_pixels_from_the_compressed_folder() {
    let (out, _) = compressed("compress-gen", &["--quiet"]);
    let dir = out.parent().unwrap().to_path_buf();
    let png = |model: &Path, extra: &[&str], name: &str| {
        let path = dir.join(name);
        let mut args = vec!["gen", "--model", model.to_str().unwrap(), "--prompt", "a fox in the snow", "--seed", "7"];
        args.extend(["--steps", "2", "--width", "32", "--height", "32", "--guidance", "1", "--quiet", "--output"]);
        args.push(path.to_str().unwrap());
        args.extend(extra);
        succeeded(&flux_lite(&args));
        read_png(&path)
    };
    let plain = png(&model_dir(MODEL), &[], "plain.png");
    let df11 = png(&out, &[], "df11.png");
    let official = official_transformer();
    let official_transformer = png(&model_dir(MODEL), &["--transformer", official.to_str().unwrap()], "official.png");
    assert_eq!((plain.width, plain.height), (32, 32));
    assert!(df11.rgb == plain.rgb, "the compressed folder draws other pixels");
    assert!(official_transformer.rgb == plain.rgb, "the official DF11 transformer draws other pixels");
}

#[test]
fn bad_requests_are_one_error_line_and_leave_nothing() {
    let dir = scratch_dir("compress-errors");
    let model = model_dir(MODEL);
    let existing = dir.join("existing");
    std::fs::create_dir(&existing).unwrap();
    let line = only_an_error_line(&compress(&model, &existing, &[]));
    assert!(line.contains("--output") && line.contains("existing"), "{line}");
    assert!(names_in(&existing).is_empty(), "the existing folder was written to");

    let out = dir.join("out");
    let line = only_an_error_line(&compress(&model, &out, &["--components", "transformer,unet"]));
    assert!(line.contains("--components") && line.contains("unet"), "{line}");
    let line = only_an_error_line(&compress(&model, &out, &["--components", "vae"]));
    assert!(line.contains("--components") && line.contains("vae"), "{line}");
    let line = only_an_error_line(&compress(Path::new("/no/such/model"), &out, &[]));
    assert!(line.contains("/no/such/model"), "{line}");
    let line = only_an_error_line(&compress(&model, &dir.join("no-such-parent/out"), &[]));
    assert!(line.contains("--output") && line.contains("no-such-parent"), "{line}");
    assert_eq!(names_in(&dir), ["existing"], "an output was created");
}

/// A weight that is not bf16 is found after the copying has started: the
/// run fails naming it and the half-built folder goes away.
#[test]
fn a_failing_run_leaves_no_folder() {
    let dir = scratch_dir("compress-failing");
    let model = dir.join("model");
    flux_lite_tests::copy_tree(&model_dir(MODEL), &model);
    let shard = model.join("transformer/diffusion_pytorch_model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in st.tensors() {
        let (dtype, data) = if name == "context_embedder.weight" {
            let widened = t.data().chunks_exact(2).flat_map(|c| (f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)).to_le_bytes());
            (Dtype::F32, widened.collect())
        } else {
            (t.dtype(), t.data().to_vec())
        };
        tensors.push((name, dtype, t.shape().to_vec(), data));
    }
    let views = tensors.iter().map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()));
    std::fs::write(&shard, safetensors::serialize(views, None).unwrap()).unwrap();

    let out = dir.join("out");
    let line = only_an_error_line(&compress(&model, &out, &["--quiet"]));
    assert!(line.contains("context_embedder.weight") && line.contains("bf16"), "{line}");
    let line = only_an_error_line(&compress(&model, &model.join("inside"), &[]));
    assert!(line.contains("--output") && line.contains("inside"), "{line}");
    assert_eq!(names_in(&dir), ["model"], "partial output left behind");
    assert!(!model.join("inside").exists());
}

//! Fuzz targets. Each takes arbitrary bytes, puts them where a hostile model
//! folder or prompt would, and runs the code that reads them: it may return an
//! error, never panic, hang or allocate without bound. `fuzz/` runs them under
//! libFuzzer (`ci/fuzz.sh`); `tests/tests/fuzz_corpus.rs` replays the inputs it
//! kept. The first input byte picks which file the rest replaces. Each returns
//! whether the input was accepted all the way through (the seeds must be).

use crate::{copy_tree_where, model_dir, test_vectors};
use flux_lite_core::df11::{Df11Fields, Df11Group};
use flux_lite_core::plan::{self as planner, DeviceLimits};
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::pipeline::planning::ModelSizes;
use flux_lite_platform::model::safetensors_store::{widen_to_f32, WeightStore};
use flux_lite_platform::model::tokenizer::PromptTokenizer;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A fuzz target: whether the input was accepted all the way through.
pub type Target = fn(&[u8]) -> bool;

/// The targets, by the name `fuzz/` and `ci/fuzz.sh` know them.
pub const TARGETS: [(&str, Target); 4] =
    [("model_configs", model_configs), ("weights", weights), ("df11", df11), ("tokenizer", tokenizer)];

/// A private copy of test vectors for one target in this process, made once.
fn workspace(target: &str, make: impl FnOnce(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flux-lite-fuzz-{}-{target}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    make(&dir);
    dir
}

/// Writes `bytes` to `path`, replacing what the previous input left there.
fn put(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("fuzz workspace {}: {e}", path.display()))
}

/// The config files of a model folder, in the order the selector byte picks them.
const CONFIG_FILES: [&str; 5] = [
    "model_index.json",
    "transformer/config.json",
    "text_encoder/config.json",
    "vae/config.json",
    "scheduler/scheduler_config.json",
];

/// One config of tiny-a's folder (configs only) replaced by the input; the
/// folder is opened and, when it opens, planned at two sizes as `info` does,
/// with sizes estimated from the configs.
pub fn model_configs(data: &[u8]) -> bool {
    static DIR: OnceLock<(PathBuf, Vec<Vec<u8>>)> = OnceLock::new();
    let (dir, originals) = DIR.get_or_init(|| {
        let dir = workspace("model_configs", |d| copy_tree_where(&model_dir("tiny-a"), d, &|p| p.extension().is_some_and(|e| e == "json")));
        let originals = CONFIG_FILES.iter().map(|f| std::fs::read(dir.join(f)).expect("tiny-a config")).collect();
        (dir, originals)
    });
    let Some((&pick, rest)) = data.split_first() else { return false };
    let pick = pick as usize % CONFIG_FILES.len();
    for (i, (file, original)) in CONFIG_FILES.iter().zip(originals).enumerate() {
        put(&dir.join(file), if i == pick { rest } else { original });
    }
    let Ok(model) = ModelFolder::open(dir) else { return false };
    let Ok(sizes) = ModelSizes::from_files_or_configs(&model) else { return false };
    let mut accepted = true;
    for (width, height) in [(64, 48), (1024, 1024)] {
        if flux_lite_platform::pipeline::denoise::latent_grid(&model.vae, width, height).is_err() {
            accepted = false;
            continue;
        }
        let input = sizes.plan_input(&model, width, height, &[], DeviceLimits::WEBGPU_DEFAULT, None);
        if let Ok(minimum) = planner::minimum_budget(&input) {
            let mut tight = input;
            tight.budget = Some(minimum);
            accepted &= planner::plan(&tight).is_ok();
        }
        accepted &= planner::plan(&input).is_ok();
        match planner::denoise_options(&input) {
            Ok(options) => options.for_each(drop),
            Err(_) => accepted = false,
        }
        match planner::decode_options(&input) {
            Ok(options) => options.for_each(drop),
            Err(_) => accepted = false,
        };
    }
    accepted
}

/// A weight file replaced by the input: tiny-a's text encoder (plain bf16),
/// tiny-b's DF11 transformer, or tiny-q's GGUF transformer. The store is
/// opened and checked against the architecture; every tensor is read, DF11
/// groups expanded on the host, GGML blocks measured against their shapes.
pub fn weights(data: &[u8]) -> bool {
    // The workspace: tiny-a/, tiny-b/, and df11/ (the DF11 transformer tiny-b runs with).
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        workspace("weights", |d| {
            copy_tree_where(&model_dir("tiny-a"), &d.join("tiny-a"), &|_| true);
            copy_tree_where(&model_dir("tiny-b"), &d.join("tiny-b"), &|_| true);
            copy_tree_where(&test_vectors().join("goldens/df11/tiny-b-transformer"), &d.join("df11"), &|_| true);
            copy_tree_where(&model_dir("tiny-q"), &d.join("tiny-q"), &|_| true);
        })
    });
    let Some((&pick, rest)) = data.split_first() else { return false };
    let opened = match pick % 3 {
        0 => {
            let tiny_a = dir.join("tiny-a");
            put(&tiny_a.join("text_encoder/model.safetensors"), rest);
            ModelFolder::open(&tiny_a).and_then(|m| m.weights(Component::TextEncoder))
        }
        1 => {
            let df11 = dir.join("df11");
            put(&df11.join("model.safetensors"), rest);
            ModelFolder::open(&dir.join("tiny-b")).and_then(|m| m.with_transformer(&df11)).and_then(|m| m.weights(Component::Transformer))
        }
        _ => {
            let tiny_q = dir.join("tiny-q");
            put(&tiny_q.join("transformer/tiny-q.gguf"), rest);
            ModelFolder::open(&tiny_q).and_then(|m| m.weights(Component::Transformer))
        }
    };
    opened.is_ok_and(read_every_tensor)
}

fn read_every_tensor(mut store: WeightStore) -> bool {
    if store.expand_df11_on_host().is_err() {
        return false;
    }
    let names: Vec<String> = store.names().map(String::from).collect();
    let mut widened = Vec::new();
    names.iter().all(|name| {
        widened.clear();
        if let Some(q) = store.quantized(name) {
            let blocks = q.elements() / q.ggml.block_elements();
            return q.elements().is_multiple_of(q.ggml.block_elements()) && q.bytes() == blocks * q.ggml.block_bytes();
        }
        store.tensor(name).is_ok_and(|t| widen_to_f32(t.dtype, t.bytes, &mut widened))
    })
}

/// The six arrays of one DF11 group carved from the input (five little-endian
/// u16 lengths first, the last array takes the rest), checked, and expanded.
pub fn df11(data: &[u8]) -> bool {
    let Some((lengths, mut rest)) = data.split_first_chunk::<10>() else { return false };
    let mut field = |i: usize| {
        let len = if i < 5 { u16::from_le_bytes([lengths[2 * i], lengths[2 * i + 1]]) as usize } else { rest.len() };
        let (taken, left) = rest.split_at(len.min(rest.len()));
        rest = left;
        taken
    };
    let fields = Df11Fields {
        luts: field(0),
        encoded_exponent: field(1),
        sign_mantissa: field(2),
        output_positions: field(3),
        gaps: field(4),
        split_positions: field(5),
    };
    let Ok(group) = Df11Group::new(fields) else { return false };
    let mut out = vec![0u16; group.n_elements()];
    let _: Vec<_> = group.weight_ranges().collect();
    flux_lite_platform::model::df11::expand_on_host(&group, &mut out).is_ok()
}

/// tiny-a's `tokenizer.json` or `tokenizer_config.json` replaced by the input
/// (then a fixed prompt is encoded), or the input as the prompt (lossy UTF-8)
/// for tiny-a's own tokenizer.
pub fn tokenizer(data: &[u8]) -> bool {
    static DIR: OnceLock<(PathBuf, Vec<u8>, Vec<u8>, PromptTokenizer)> = OnceLock::new();
    let (dir, json, config, own) = DIR.get_or_init(|| {
        let dir = workspace("tokenizer", |d| copy_tree_where(&model_dir("tiny-a/tokenizer"), d, &|_| true));
        let read = |f: &str| std::fs::read(dir.join(f)).expect("tiny-a tokenizer");
        let own = PromptTokenizer::load(&dir).expect("tiny-a tokenizer loads");
        (dir.clone(), read("tokenizer.json"), read("tokenizer_config.json"), own)
    });
    let Some((&pick, rest)) = data.split_first() else { return false };
    let encode = |t: &PromptTokenizer, prompt: &str| {
        let Ok(p) = t.encode_prompt(prompt, 512) else { return false };
        assert_eq!((p.input_ids.len(), p.attention_mask.len()), (512, 512), "a prompt is padded or cut to max_len");
        assert_eq!(p.attention_mask.iter().filter(|&&m| m == 1).count(), p.real_tokens);
        true
    };
    match pick % 3 {
        0 | 1 => {
            let replaced = pick % 3 == 0;
            put(&dir.join("tokenizer.json"), if replaced { rest } else { json });
            put(&dir.join("tokenizer_config.json"), if replaced { config } else { rest });
            PromptTokenizer::load(dir).is_ok_and(|t| encode(&t, "a photo of a cat, 35mm"))
        }
        _ => encode(own, &String::from_utf8_lossy(rest)),
    }
}

/// Valid inputs for `target` built from the test vectors (libFuzzer's starting
/// corpus, and cases the corpus replay always runs): every file a target can
/// replace, as it is, behind each selector byte that picks it.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let read = |path: PathBuf| std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let behind = |pick: u8, bytes: Vec<u8>| [vec![pick], bytes].concat();
    let tiny_a = model_dir("tiny-a");
    match target {
        "model_configs" => CONFIG_FILES.iter().enumerate().map(|(i, f)| behind(i as u8, read(tiny_a.join(f)))).collect(),
        "weights" => vec![
            behind(0, read(tiny_a.join("text_encoder/model.safetensors"))),
            behind(1, read(test_vectors().join("goldens/df11/tiny-b-transformer/model.safetensors"))),
            behind(2, read(model_dir("tiny-q").join("transformer/tiny-q.gguf"))),
        ],
        "df11" => df11_seeds(&read(test_vectors().join("goldens/df11/synthetic.safetensors"))),
        "tokenizer" => vec![
            behind(0, read(tiny_a.join("tokenizer/tokenizer.json"))),
            behind(1, read(tiny_a.join("tokenizer/tokenizer_config.json"))),
            behind(2, "A red fox in the snow, golden hour, 35mm photograph".into()),
        ],
        _ => panic!("no fuzz target `{target}`"),
    }
}

/// Each group of the DF11 goldens in [`df11`]'s layout.
fn df11_seeds(file: &[u8]) -> Vec<Vec<u8>> {
    let tensors = safetensors::SafeTensors::deserialize(file).expect("DF11 goldens");
    let mut groups: Vec<String> =
        tensors.names().iter().filter_map(|n| n.strip_suffix(".encoded_exponent")).map(String::from).collect();
    groups.sort();
    let field_names = ["luts", "encoded_exponent", "sign_mantissa", "output_positions", "gaps", "split_positions"];
    groups
        .iter()
        .map(|g| {
            let fields: Vec<&[u8]> =
                field_names.iter().map(|f| tensors.tensor(&format!("{g}.{f}")).expect("DF11 field").data()).collect();
            let mut seed: Vec<u8> = fields[..5].iter().flat_map(|f| (f.len() as u16).to_le_bytes()).collect();
            fields.iter().for_each(|f| seed.extend_from_slice(f));
            seed
        })
        .collect()
}

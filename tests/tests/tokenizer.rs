//! The prompt tokenizer against transformers' goldens (chat template, ids,
//! masks, truncation) on both tiny models, its settings from
//! `tokenizer_config.json`, and its errors on damaged copies.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::tokenizer::{render_chat, PaddingSide, PromptTokenizer, MAX_SEQUENCE_LENGTH};
use flux_lite_platform::LoadError;
use flux_lite_tests::{copy_tree, model_dir, scratch_dir, test_vectors, Goldens, CASES};
use serde_json::Value;
use std::path::{Path, PathBuf};

const MODELS: [&str; 2] = ["tiny-a", "tiny-b"];

fn tokenizer_dir(model: &str) -> PathBuf {
    model_dir(model).join("tokenizer")
}

fn load(dir: &Path) -> PromptTokenizer {
    PromptTokenizer::load(dir).unwrap_or_else(|e| panic!("{e}"))
}

/// One case of `goldens/tokenizer_cases.json`.
#[derive(Debug)]
struct Case {
    prompt: String,
    rendered: String,
    tokens: Vec<String>,
    num_tokens: usize,
    input_ids: Vec<u32>,
    attention_mask: Vec<u32>,
}

fn cases() -> (usize, Vec<Case>) {
    let path = test_vectors().join("goldens/tokenizer_cases.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let str_of = |v: &Value| v.as_str().unwrap().to_string();
    let u32s = |v: &Value| v.as_array().unwrap().iter().map(|x| u32::try_from(x.as_u64().unwrap()).unwrap()).collect();
    let cases = json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: str_of(&c["prompt"]),
            rendered: str_of(&c["rendered"]),
            tokens: c["tokens_untruncated"].as_array().unwrap().iter().map(str_of).collect(),
            num_tokens: c["num_tokens_untruncated"].as_u64().unwrap() as usize,
            input_ids: u32s(&c["input_ids"]),
            attention_mask: u32s(&c["attention_mask"]),
        })
        .collect::<Vec<_>>();
    assert_eq!(cases.len(), 13, "{}", path.display());
    (json["max_length"].as_u64().unwrap() as usize, cases)
}

/// Every golden case through `tok`, checked field by field against transformers.
fn check_all_cases(tok: &PromptTokenizer, what: &str) {
    let (max_len, cases) = cases();
    assert_eq!(max_len, MAX_SEQUENCE_LENGTH);
    let mut truncated = 0;
    for case in &cases {
        let name = format!("{what}, prompt {:?}", case.prompt.chars().take(40).collect::<String>());
        assert_eq!(render_chat(&case.prompt), case.rendered, "{name}: rendered");
        assert_eq!(tok.token_strings(&case.rendered).unwrap(), case.tokens, "{name}: tokens");

        let t = tok.encode_prompt(&case.prompt, max_len).unwrap();
        assert_eq!(t.input_ids, case.input_ids, "{name}: input_ids");
        assert_eq!(t.attention_mask, case.attention_mask, "{name}: attention_mask");
        assert_eq!(t.untruncated_tokens(), case.num_tokens, "{name}: untruncated length");
        assert_eq!(t.real_tokens, case.num_tokens.min(max_len), "{name}: real tokens");
        assert_eq!(t.dropped, case.num_tokens.saturating_sub(max_len), "{name}: dropped");
        assert_eq!(t.attention_mask.iter().filter(|&&m| m == 1).count(), t.real_tokens, "{name}: mask count");
        assert_eq!(t.truncation_warning().is_some(), t.dropped > 0, "{name}: warning");
        truncated += usize::from(t.dropped > 0);
    }
    assert_eq!(truncated, 1, "{what}: the goldens hold exactly one prompt longer than {max_len} tokens");
}

#[test]
fn golden_cases_match_transformers_on_both_models() {
    for model in MODELS {
        let tok = load(&tokenizer_dir(model));
        assert_eq!(tok.pad_id(), 480, "{model}: <|endoftext|>");
        assert_eq!(tok.padding_side(), PaddingSide::Right, "{model}");
        check_all_cases(&tok, model);
    }
}

#[test]
fn the_long_prompt_is_cut_to_its_first_512_tokens_with_a_warning() {
    let tok = load(&tokenizer_dir("tiny-a"));
    let (max_len, cases) = cases();
    let case = cases.iter().find(|c| c.num_tokens > max_len).unwrap();
    let t = tok.encode_prompt(&case.prompt, max_len).unwrap();
    assert_eq!((t.real_tokens, t.dropped), (512, case.num_tokens - 512));
    assert!(t.attention_mask.iter().all(|&m| m == 1));
    // The first 512 tokens, so the template's tail (`<|im_end|>`, the assistant turn) is gone.
    let full = tok.encode_raw(&case.rendered).unwrap();
    assert_eq!(full.len(), case.num_tokens);
    assert_eq!(t.input_ids, full[..512]);
    assert_eq!(
        t.truncation_warning().unwrap(),
        format!(
            "warning: the prompt is {} tokens long with its chat template; the last {} were dropped \
             (the text encoder reads 512)",
            case.num_tokens,
            case.num_tokens - 512
        )
    );
}

#[test]
fn short_prompts_pad_with_endoftext_and_need_no_warning() {
    let tok = load(&tokenizer_dir("tiny-b"));
    let t = tok.encode_prompt("", 512).unwrap();
    assert_eq!((t.real_tokens, t.dropped), (17, 0));
    assert!(t.truncation_warning().is_none());
    assert!(t.input_ids[17..].iter().all(|&id| id == 480));
    // A max_len shorter than the template alone still cuts and counts.
    let t = tok.encode_prompt("", 5).unwrap();
    assert_eq!((t.input_ids.len(), t.real_tokens, t.dropped), (5, 5, 12));
    assert_eq!(t.input_ids[0], 481, "<|im_start|> first");
}

/// The ids the pipeline goldens were generated from (the text encoder's inputs).
#[test]
fn pipeline_goldens_ids_match() {
    for case in CASES {
        let goldens = Goldens::load(case);
        let json = goldens.case_json();
        let model = json["model"].as_str().unwrap();
        let tok = load(&tokenizer_dir(model));
        let mut prompts = vec![("", json["prompt"].as_str().unwrap())];
        if json["cfg"].as_bool().unwrap() {
            prompts.push(("negative_", "")); // diffusers' negative prompt for base models
        }
        for (prefix, prompt) in prompts {
            let t = tok.encode_prompt(prompt, MAX_SEQUENCE_LENGTH).unwrap();
            let ids: Vec<u32> = goldens.i64(&format!("{prefix}input_ids")).0.iter().map(|&v| v as u32).collect();
            let mask: Vec<u32> = goldens.i64(&format!("{prefix}attention_mask")).0.iter().map(|&v| v as u32).collect();
            assert_eq!(t.input_ids, ids, "{case}: {prefix}input_ids");
            assert_eq!(t.attention_mask, mask, "{case}: {prefix}attention_mask");
        }
    }
}

/// A copy of tiny-a's tokenizer folder in a scratch dir, with `edit` applied to
/// one of its JSON files.
fn edited_copy(name: &str, file: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = scratch_dir(name);
    copy_tree(&tokenizer_dir("tiny-a"), &dir);
    let path = dir.join(file);
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    dir
}

#[test]
fn left_padding_from_tokenizer_config_puts_the_pads_first() {
    let dir = edited_copy("tok-left", "tokenizer_config.json", |j| j["padding_side"] = "left".into());
    let tok = load(&dir);
    assert_eq!(tok.padding_side(), PaddingSide::Left);
    let right = load(&tokenizer_dir("tiny-a"));
    for prompt in ["a red fox in the snow", ""] {
        let l = tok.encode_prompt(prompt, 512).unwrap();
        let r = right.encode_prompt(prompt, 512).unwrap();
        let (n, pads) = (r.real_tokens, 512 - r.real_tokens);
        assert_eq!((l.real_tokens, l.dropped), (n, 0));
        assert!(l.input_ids[..pads].iter().all(|&id| id == 480), "{prompt:?}: pads first");
        assert_eq!(l.input_ids[pads..], r.input_ids[..n], "{prompt:?}: then the tokens");
        assert!(l.attention_mask[..pads].iter().all(|&m| m == 0));
        assert!(l.attention_mask[pads..].iter().all(|&m| m == 1));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_tokenizer_config_padding_is_right_with_endoftext() {
    let dir = scratch_dir("tok-no-config");
    copy_tree(&tokenizer_dir("tiny-a"), &dir);
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    let tok = load(&dir);
    assert_eq!((tok.padding_side(), tok.pad_id()), (PaddingSide::Right, 480));
    check_all_cases(&tok, "no tokenizer_config.json");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pad_token_may_be_an_added_token_object_or_absent() {
    let dir = edited_copy("tok-pad-object", "tokenizer_config.json", |j| {
        j["pad_token"] = serde_json::json!({"content": "<|im_end|>", "lstrip": false, "normalized": false,
            "rstrip": false, "single_word": false, "special": true, "__type": "AddedToken"});
    });
    assert_eq!(load(&dir).pad_id(), 482);
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = edited_copy("tok-pad-missing", "tokenizer_config.json", |j| {
        j.as_object_mut().unwrap().remove("pad_token");
        j.as_object_mut().unwrap().remove("padding_side");
    });
    let tok = load(&dir);
    assert_eq!((tok.padding_side(), tok.pad_id()), (PaddingSide::Right, 480));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_tokenizer_config_settings_are_errors_naming_the_field() {
    let dir = edited_copy("tok-pad-unknown", "tokenizer_config.json", |j| j["pad_token"] = "<pad>".into());
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(matches!(&err, LoadError::Field { field, .. } if field == "pad_token"), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json") && err.to_string().contains("<pad>"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = edited_copy("tok-side-bad", "tokenizer_config.json", |j| j["padding_side"] = "middle".into());
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(matches!(&err, LoadError::Field { field, .. } if field == "padding_side"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = scratch_dir("tok-config-bad-json");
    copy_tree(&tokenizer_dir("tiny-a"), &dir);
    std::fs::write(dir.join("tokenizer_config.json"), "{\"padding_side\": ").unwrap();
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(matches!(err, LoadError::Json { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Older Qwen files write merges as `"a b"` strings; they must give the same tokens.
#[test]
fn merges_written_as_strings_give_the_same_ids() {
    let dir = edited_copy("tok-legacy-merges", "tokenizer.json", |j| {
        let merges = j["model"]["merges"].as_array_mut().unwrap();
        for m in merges.iter_mut() {
            let pair = m.as_array().unwrap();
            let (a, b) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
            assert!(!a.contains(' ') && !b.contains(' '), "byte-level symbols hold no spaces");
            *m = format!("{a} {b}").into();
        }
    });
    check_all_cases(&load(&dir), "merges as strings");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Truncation and padding configured inside tokenizer.json must not leak into ours.
#[test]
fn truncation_and_padding_in_tokenizer_json_are_ignored() {
    let dir = edited_copy("tok-own-trunc", "tokenizer.json", |j| {
        j["truncation"] = serde_json::json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
        j["padding"] = serde_json::json!({"strategy": {"Fixed": 16}, "direction": "Left", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "!"});
    });
    check_all_cases(&load(&dir), "tokenizer.json with its own truncation and padding");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_tokenizer_json_is_an_error_naming_it() {
    let dir = scratch_dir("tok-missing");
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(matches!(err, LoadError::Io { .. }), "{err}");
    assert!(err.to_string().contains(&dir.join("tokenizer.json").display().to_string()), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_tokenizer_json_is_an_error_not_a_panic() {
    let original = std::fs::read(tokenizer_dir("tiny-a").join("tokenizer.json")).unwrap();
    let damaged: [(&str, Vec<u8>); 4] = [
        ("truncated", original[..original.len() / 2].to_vec()),
        ("empty", Vec::new()),
        ("not a tokenizer", b"{\"version\": \"1.0\"}".to_vec()),
        ("not UTF-8", vec![0xff, 0xfe, 0x00, 0x7b]),
    ];
    for (what, bytes) in damaged {
        let dir = scratch_dir("tok-damaged");
        copy_tree(&tokenizer_dir("tiny-a"), &dir);
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, bytes).unwrap();
        let err = PromptTokenizer::load(&dir).unwrap_err();
        assert!(matches!(err, LoadError::Tokenizer { .. }), "{what}: {err}");
        assert!(err.to_string().contains(&path.display().to_string()), "{what}: {err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

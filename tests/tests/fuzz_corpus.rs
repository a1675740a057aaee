//! Replays the fuzz targets' seeds and every input kept in
//! `fuzz/regressions/<target>/` (cases libFuzzer found, minimised, then
//! fixed): the seeds must be accepted, and no input may panic. `ci/fuzz.sh` is what searches for new ones.

use flux_lite_tests::fuzz::{seeds, TARGETS};
use flux_lite_tests::test_vectors;

/// What a kept input must give now that its bug is fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Refused,
}

/// Every input kept in `fuzz/regressions/<target>/`, with its expected
/// outcome. A file there that is not listed, or a listed one that is
/// missing, fails the test: nothing is skipped silently.
const REGRESSIONS: &[(&str, &str, Outcome)] = &[
    // tokenizer.json replaced by a file whose `decoder` is malformed JSON
    // (the tokenizers library panicked on it): refused by the JSON check.
    ("tokenizer", "decoder-invalid-json-panicked", Outcome::Refused),
];

fn regressions_dir() -> std::path::PathBuf {
    test_vectors().join("../fuzz/regressions")
}

fn replay(target: &str) {
    let run = TARGETS.iter().find(|(name, _)| *name == target).expect("a target").1;
    let seeds = seeds(target);
    assert!(!seeds.is_empty());
    for (i, seed) in seeds.iter().enumerate() {
        assert!(run(seed), "{target}: seed {i}, a valid input, was not accepted");
    }
    for &(_, file, outcome) in REGRESSIONS.iter().filter(|(t, _, _)| *t == target) {
        let path = regressions_dir().join(target).join(file);
        let input = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let got = if run(&input) { Outcome::Accepted } else { Outcome::Refused };
        assert_eq!(got, outcome, "{}", path.display());
    }
}

#[test]
fn every_kept_regression_input_is_listed_with_its_outcome() {
    let mut on_disk = Vec::new();
    for target in std::fs::read_dir(regressions_dir()).expect("fuzz/regressions/ exists") {
        let target = target.unwrap().path();
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        assert!(TARGETS.iter().any(|(t, _)| *t == name), "fuzz/regressions/{name}: no such target");
        for file in std::fs::read_dir(&target).unwrap() {
            on_disk.push((name.clone(), file.unwrap().file_name().to_string_lossy().into_owned()));
        }
    }
    on_disk.sort();
    let mut listed: Vec<(String, String)> = REGRESSIONS.iter().map(|(t, f, _)| (t.to_string(), f.to_string())).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "fuzz/regressions/ and REGRESSIONS differ");
}

#[test]
fn the_tokenizer_regression_is_refused_with_a_json_error() {
    use flux_lite_platform::model::tokenizer::PromptTokenizer;
    let input = std::fs::read(regressions_dir().join("tokenizer/decoder-invalid-json-panicked")).unwrap();
    // Selector byte 0: the rest replaces tokenizer.json.
    assert_eq!(input[0] % 3, 0);
    let dir = flux_lite_tests::scratch_dir("fuzz-regression-tokenizer");
    flux_lite_tests::copy_tree(&flux_lite_tests::model_dir("tiny-a/tokenizer"), &dir);
    std::fs::write(dir.join("tokenizer.json"), &input[1..]).unwrap();
    let err = PromptTokenizer::load(&dir).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json") && err.contains("invalid JSON"), "{err}");
}

#[test]
fn model_configs_seeds_and_regressions_do_not_panic() {
    replay("model_configs");
}

#[test]
fn weights_seeds_and_regressions_do_not_panic() {
    replay("weights");
}

#[test]
fn df11_seeds_and_regressions_do_not_panic() {
    replay("df11");
}

#[test]
fn tokenizer_seeds_and_regressions_do_not_panic() {
    replay("tokenizer");
}

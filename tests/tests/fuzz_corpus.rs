//! Replays the fuzz targets' seeds and every input kept in
//! `fuzz/regressions/<target>/` (cases libFuzzer found, minimised, then
//! fixed): the seeds must be accepted, and no input may panic. `ci/fuzz.sh` is what searches for new ones.

use flux_lite_tests::fuzz::{seeds, TARGETS};
use flux_lite_tests::test_vectors;

fn replay(target: &str) {
    let run = TARGETS.iter().find(|(name, _)| *name == target).expect("a target").1;
    let seeds = seeds(target);
    assert!(!seeds.is_empty());
    for (i, seed) in seeds.iter().enumerate() {
        assert!(run(seed), "{target}: seed {i}, a valid input, was not accepted");
    }
    let kept = test_vectors().join("../fuzz/regressions").join(target);
    if let Ok(entries) = std::fs::read_dir(&kept) {
        for entry in entries {
            let path = entry.expect("dir entry").path();
            let _accepted_or_refused = run(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
        }
    }
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

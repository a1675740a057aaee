//! Writes each fuzz target's seeds (built from test_vectors/) into
//! `DIR/<target>/seed-N`, the starting corpus of `ci/fuzz.sh`.
//! Usage: cargo run -p flux-lite-tests --example fuzz_seeds -- DIR

use flux_lite_tests::fuzz::{seeds, TARGETS};
use std::path::PathBuf;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("error: give the corpus folder (usage: fuzz_seeds DIR)");
        std::process::exit(2);
    };
    for (target, _) in TARGETS {
        let folder = dir.join(target);
        let written = std::fs::create_dir_all(&folder).and_then(|()| {
            seeds(target).iter().enumerate().try_for_each(|(i, s)| std::fs::write(folder.join(format!("seed-{i}")), s))
        });
        if let Err(e) = written {
            eprintln!("error: {}: {e}", folder.display());
            std::process::exit(1);
        }
    }
}

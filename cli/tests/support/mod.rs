//! What several of the CLI's test files share.

use flux_lite_tests::model_dir;
use std::path::Path;
use std::process::{Command, Output};

/// `flux-lite gen` on tiny model `model` with `args`, quietly, on the f32
/// tier (the one the diffusers goldens hold to exactly), writing `out`.
pub fn gen_f32(model: &str, args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model"])
        .arg(model_dir(model))
        .args(args)
        .args(["--quiet", "--precision", "f32", "--output"])
        .arg(out)
        .output()
        .unwrap()
}

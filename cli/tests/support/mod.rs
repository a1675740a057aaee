//! What several of the CLI's test files share.

use flux_lite_tests::model_dir;
use std::path::Path;
use std::process::{Command, Output};

/// `flux-lite gen` on tiny model `model` with `args`, quietly, on the f32
/// tier (the one the diffusers goldens hold to exactly), writing `out`.
#[allow(dead_code)] // each test file that includes this module uses its part
pub fn gen_f32(model: &str, args: &[&str], out: &Path) -> Output {
    gen_on("f32", model, args, out)
}

/// [`gen_f32`] on precision tier `tier`.
pub fn gen_on(tier: &str, model: &str, args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model"])
        .arg(model_dir(model))
        .args(args)
        .args(["--quiet", "--precision", tier, "--output"])
        .arg(out)
        .output()
        .unwrap()
}

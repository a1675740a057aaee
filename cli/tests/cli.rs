//! The binary as a user meets it: output on success, one `error:` line and a
//! non-zero exit on bad input.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::only_an_error_line;
use std::path::Path;
use std::process::{Command, Output};

fn flux_lite(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flux-lite"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run flux-lite")
}

fn tiny(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models").join(name).display().to_string()
}

#[test]
fn info_summarises_a_model_folder() {
    let out = flux_lite(&["info", "--model", &tiny("tiny-a")], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("transformer: 2 double + 2 single blocks, 4 heads × 16"), "{stdout}");
    assert!(stdout.contains("prompt layers [1, 2, 3]"), "{stdout}");
    assert!(stdout.contains("distilled: true"), "{stdout}");
}

#[test]
fn info_on_a_missing_folder_is_only_an_error_line() {
    let line = only_an_error_line(&flux_lite(&["info", "--model", "/no/such/model"], &[]));
    assert!(line.contains("/no/such/model"), "{line}");
}

#[test]
fn unknown_backend_is_only_an_error_line() {
    let line = only_an_error_line(&flux_lite(&["gpu"], &[("FLUX_LITE_BACKEND", "glide")]));
    assert!(line.contains("FLUX_LITE_BACKEND") && line.contains("glide"), "{line}");
}

#[test]
fn an_adapter_is_picked_by_index_or_name_and_a_wrong_one_lists_them() {
    let out = flux_lite(&["gpu"], &[("FLUX_LITE_ADAPTER", "no-such-gpu")]);
    let line = only_an_error_line(&out);
    assert!(line.contains("FLUX_LITE_ADAPTER=no-such-gpu names none of the adapters (0: "), "{line}");
    for pick in ["0", "llvmpipe"] {
        let out = flux_lite(&["gpu"], &[("FLUX_LITE_ADAPTER", pick)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && stdout.contains("llvmpipe"), "{pick}: {stdout}");
    }
}

/// `gen --verbose` with `extra` flags and environment: (exit ok, stderr).
fn verbose_gen(extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let dir = flux_lite_tests::scratch_dir(&format!("cli-tier-{}{}", extra.join(""), env.iter().map(|(_, v)| *v).collect::<String>()));
    let out = dir.join("out.png");
    let args = ["gen", "--model", &tiny("tiny-a"), "--prompt", "a fox", "--seed", "1", "--steps", "1", "--width", "32", "--height", "32"];
    let run = flux_lite(&[&args[..], &["--verbose", "--quiet", "--output", out.to_str().unwrap()], extra].concat(), env);
    (run.status.success(), String::from_utf8_lossy(&run.stderr).into_owned())
}

fn precision_line(stderr: &str) -> &str {
    stderr.lines().find(|l| l.starts_with("precision: ")).unwrap_or_else(|| panic!("no precision line: {stderr}"))
}

#[test]
fn auto_takes_the_tier_gpu_names_and_steps_down_when_its_check_fails() {
    let gpu = flux_lite(&["gpu"], &[]);
    let stdout = String::from_utf8_lossy(&gpu.stdout);
    let taken = stdout.lines().find_map(|l| l.strip_prefix("tier auto takes: ")).unwrap_or_else(|| panic!("{stdout}"));
    let tier = taken.split([' ', '(']).next().unwrap().to_string();
    println!("auto takes {tier} here");
    // On a CPU adapter (lavapipe) auto takes f32, saying why; the half tiers run only when named.
    let cpu = stdout.lines().any(|l| l.starts_with("adapter: ") && l.ends_with(", Cpu)"));
    assert!(!cpu || (tier == "f32" && taken.contains("is a CPU adapter")), "{stdout}");
    // And says how its CPU-shaped kernels read shared rows; forced to read
    // them in every lane, it says that instead.
    let reads = |out: &str| out.lines().find_map(|l| l.strip_prefix("CPU-shaped kernels: ")).map(str::to_string);
    assert_eq!(cpu, reads(&stdout).is_some(), "{stdout}");
    if cpu {
        let per_lane = flux_lite(&["gpu"], &[("FLUX_LITE_PER_LANE_READS", "1")]);
        let per_lane = String::from_utf8_lossy(&per_lane.stdout).into_owned();
        assert!(reads(&per_lane).is_some_and(|r| r.starts_with("every row read in every lane")), "{per_lane}");
    }

    let (ok, stderr) = verbose_gen(&[], &[]);
    assert!(ok, "{stderr}");
    assert!(precision_line(&stderr).starts_with(&format!("precision: {tier}")), "{stderr}");
    assert!(!cpu || (precision_line(&stderr).contains("(auto: ") && precision_line(&stderr).contains("is a CPU adapter")), "{stderr}");
    assert!(!stderr.contains("notice:"), "{stderr}");

    // The taken tier's check made to fail, as a faulty driver's would: one
    // notice line, and the run goes on one tier down.
    if tier == "f32" {
        flux_lite_tests::skipped("auto takes f32 here, there is no tier to step down from");
        return;
    }
    let (ok, stderr) = verbose_gen(&[], &[("FLUX_LITE_FAIL_TIER_PROBE", &tier)]);
    assert!(ok, "{stderr}");
    let notices: Vec<&str> = stderr.lines().filter(|l| l.starts_with("notice: ")).collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(notices[0].contains(&format!("the {tier} tier failed its known-answer check")), "{stderr}");
    let below = if tier == "matrix" { "f16" } else { "f32" };
    assert!(precision_line(&stderr).starts_with(&format!("precision: {below}")), "{stderr}");
}

#[test]
fn a_tier_the_adapter_lacks_is_one_error_line_and_a_bad_name_another() {
    let gpu = flux_lite(&["gpu"], &[]);
    let stdout = String::from_utf8_lossy(&gpu.stdout).into_owned();
    for tier in ["f16", "matrix"] {
        let line = stdout.lines().find(|l| l.starts_with(&format!("{tier} tier: "))).unwrap_or_else(|| panic!("{stdout}"));
        if !line.contains("unavailable") {
            println!("{line}: nothing to refuse");
            continue;
        }
        let (ok, stderr) = verbose_gen(&["--precision", tier], &[]);
        assert!(!ok);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(errors.len() == 1 && errors[0].starts_with(&format!("error: the {tier} precision tier cannot run on")), "{stderr}");
    }
    let (ok, stderr) = verbose_gen(&["--precision", "bf16"], &[]);
    assert!(!ok && stderr.trim().lines().count() == 1 && stderr.contains("--precision \"bf16\": expected auto, f32, f16 or matrix"), "{stderr}");
}

/// `flux-lite info … | head -1` and `flux-lite selftest | head -1`: the
/// reader goes away after one line; the command ends quietly (no panic, a
/// clean exit), as any Unix tool does.
#[test]
fn a_reader_that_goes_away_ends_a_report_quietly() {
    use std::io::{BufRead, BufReader};
    let model = flux_lite_tests::model_dir("tiny-a");
    for args in [vec!["info", "--model", model.to_str().unwrap()], vec!["selftest"]] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flux-lite"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        // The reader is dropped here: every later write meets a closed pipe.
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!first.is_empty(), "{args:?}: no first line");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
    }
}

/// `gpu --kernel-sources DIR` writes each module's source as the build has
/// it, and `FLUX_LITE_KERNEL_DIR=DIR` builds the kernels from those files
/// (said on standard error), the run succeeding as with the built-in ones.
#[test]
fn kernel_sources_are_written_and_read_back_in_place_of_the_built_in_ones() {
    let dir = flux_lite_tests::scratch_dir("cli-kernel-sources");
    let out = flux_lite(&["gpu", "--kernel-sources", &dir.display().to_string()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for module in flux_lite_kernels::Module::ALL {
        let written = std::fs::read_to_string(dir.join(format!("{module:?}.wgsl"))).unwrap();
        assert_eq!(written, module.source(), "{module:?}");
    }
    let dir_text = dir.display().to_string();
    let out = flux_lite(&["bench", "kernels", "--model", &tiny("tiny-a"), "--only", "linear", "--repeats", "1"], &[("FLUX_LITE_KERNEL_DIR", &dir_text)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("kernel bench: built from {}", dir.join("Bench.wgsl").display())), "{stderr}");
}

/// A kernel folder whose replacement the launchers could not bind (here an
/// entry point renamed) is refused before the device is made: one error
/// line naming the file and why.
#[test]
fn a_kernel_folder_variant_that_cannot_be_bound_is_refused_with_one_line() {
    let dir = flux_lite_tests::scratch_dir("cli-kernel-folder-refused");
    let file = dir.join("RangeScales.wgsl");
    std::fs::write(&file, flux_lite_kernels::Module::RangeScales.source().replace("fn range_scales(", "fn measured(")).unwrap();
    let out = flux_lite(&["gpu"], &[("FLUX_LITE_KERNEL_DIR", &dir.display().to_string())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {}: no entry point range_scales", file.display())), "{stderr}");
}

/// The GPU machine's diagnosis scripts still find what they change in the
/// kernels as built (a kernel edited since would otherwise cost a device
/// session its variants): `ci/flash_variants.py` and `ci/linear_variants.py`
/// over `gpu --kernel-sources`, each variant written and changed from the
/// built source (but `linear_variants`' `base`, the kernel as built), and
/// each one a folder the engine takes: every entry point there, using the
/// storage bindings its launchers bind (checked from the sources when the
/// device is made, so on any adapter); on the matrix tier each flash variant
/// that fixes passes the start-up checks and each that probes fails the
/// one over f32 rows alone (the linear's are wrong by design).
#[test]
fn the_gpu_variant_scripts_apply_to_the_kernels_as_built() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = flux_lite_tests::scratch_dir("cli-variant-scripts");
    let sources = dir.join("sources");
    let out = flux_lite(&["gpu", "--kernel-sources", &sources.display().to_string()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (script, modules) in [("flash_variants.py", ["AttentionFlash8", "AttentionFlash16"]), ("linear_variants.py", ["LinearMatrix8Vec4", "LinearMatrix16Vec4"])] {
        let variants = dir.join(script.trim_end_matches(".py"));
        let run = Command::new("python3").arg(repo.join("ci").join(script)).arg(&sources).arg(&variants).output();
        let Ok(run) = run else {
            flux_lite_tests::skipped("no python3 to run ci/*_variants.py");
            return;
        };
        assert!(run.status.success(), "{script}: {}", String::from_utf8_lossy(&run.stderr));
        let listed = String::from_utf8_lossy(&run.stdout).to_string();
        let names: Vec<&str> = listed.lines().filter_map(|l| l.split('\t').next()).collect();
        assert!(names.len() >= 2, "{script}: variants {names:?}");
        for line in listed.lines() {
            let name = line.split('\t').next().unwrap_or_default();
            let probe = line.split('\t').nth(1) == Some("probe");
            for module in modules {
                let built = std::fs::read_to_string(sources.join(format!("{module}.wgsl"))).unwrap();
                let variant = std::fs::read_to_string(variants.join(name).join(format!("{module}.wgsl"))).unwrap_or_else(|e| panic!("{script} {name} {module}: {e}"));
                assert_eq!(variant == built, name == "base", "{script}: variant {name} of {module} {}", if name == "base" { "differs from the kernel as built" } else { "is the kernel as built" });
            }
            let folder = variants.join(name).display().to_string();
            let taken = flux_lite(&["gpu"], &[("FLUX_LITE_KERNEL_DIR", &folder)]);
            let said = String::from_utf8_lossy(&taken.stdout);
            assert!(taken.status.success(), "{script}: variant {name}: {}", String::from_utf8_lossy(&taken.stderr));
            // The flash variants that fix compute the kernel's answer: where
            // the matrix tier runs (CI's rerun on Mesa 26), each passes the
            // flash attention's start-up checks; a probe writes something
            // else into the f32 output alone, so it fails the check over f32
            // rows and leaves the path over f16 pieces on the flash kernel.
            if script == "flash_variants.py" && said.contains("matrix tier: matrix (") {
                assert_eq!(said.contains("; flash attention)"), !probe, "{script}: variant {name}: {said}");
                if probe {
                    assert!(said.contains("; flash attention over f16 pieces; the transformer's and the text encoder's attention as products on the GEMM core) (notice: the flash attention failed its known-answer check"), "{script}: variant {name}: {said}");
                    assert!(said.contains("attention over f32 rows runs as products on the GEMM core (the transformer's and the text encoder's) or on the matrix tier's one-subgroup kernel, over f16 pieces on the flash kernel"), "{script}: variant {name}: {said}");
                }
            }
        }
    }
}

/// `gpu --flash-report DIR` where the matrix tier runs (CI's rerun on Mesa
/// 26): a line a case, each case's outputs and exact answers in DIR with
/// `cases.tsv` listing them, which `ci/flash_analyse.py` reads. Where it
/// cannot (Mesa 22: no cooperative matrices), one `error:` line saying why.
#[test]
fn the_flash_report_writes_every_cases_outputs_or_says_why_it_cannot() {
    let dir = flux_lite_tests::scratch_dir("cli-flash-report");
    let out = flux_lite(&["gpu", "--flash-report", &dir.display().to_string()], &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: the matrix precision tier cannot run on"), "{stderr}");
        assert!(std::env::var_os("FLUX_LITE_REQUIRE_MATRIX").is_none(), "the matrix tier was required: {stderr}");
        flux_lite_tests::skipped("no matrix tier here for gpu --flash-report to run on");
        return;
    }
    let cases = flux_lite_platform::flash_cases::VARIATIONS;
    let index = std::fs::read_to_string(dir.join("cases.tsv")).unwrap();
    assert_eq!(index.lines().count(), cases.len() + 1, "{index}");
    for case in cases {
        let outputs = case.q_len * case.q_heads * case.head_dim;
        assert!(stdout.lines().any(|l| l.starts_with(&format!("{}: all {outputs} finite; ", case.name)) && l.contains("repeats bit for bit: yes")), "{}: {stdout}", case.name);
        assert_eq!(std::fs::metadata(dir.join(format!("{}.got.f32", case.name))).unwrap().len(), outputs as u64 * 4, "{}", case.name);
        assert_eq!(std::fs::metadata(dir.join(format!("{}.want.f64", case.name))).unwrap().len(), outputs as u64 * 8, "{}", case.name);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(analysed) = Command::new("python3").arg(repo.join("ci/flash_analyse.py")).arg(&dir).output() else {
        flux_lite_tests::skipped("no python3 to run ci/flash_analyse.py");
        return;
    };
    let said = String::from_utf8_lossy(&analysed.stdout);
    assert!(analysed.status.success(), "{}", String::from_utf8_lossy(&analysed.stderr));
    assert_eq!(said.matches("  not finite: 0 of ").count(), cases.len(), "{said}");
    // The analysis models the kernel's softmax state (its tiles, its lazy
    // maximum): the `rowsums` probe's sums match it on every f32 case.
    let tile = if stdout.contains("16×16 f16 tiles") { "16" } else { "8" };
    let sources = dir.join("sources");
    assert!(flux_lite(&["gpu", "--kernel-sources", &sources.display().to_string()], &[]).status.success());
    let variants = dir.join("variants");
    let made = Command::new("python3").arg(repo.join("ci/flash_variants.py")).arg(&sources).arg(&variants).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let probed = dir.join("rowsums");
    let out = flux_lite(&["gpu", "--flash-report", &probed.display().to_string()], &[("FLUX_LITE_KERNEL_DIR", &variants.join("rowsums").display().to_string())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let analysed = Command::new("python3").arg(repo.join("ci/flash_analyse.py")).arg(&probed).args(["--probe", "rowsums", "--tile", tile]).output().unwrap();
    let said = String::from_utf8_lossy(&analysed.stdout);
    let f32_cases = cases.iter().filter(|c| !c.pieces).count();
    assert_eq!(said.matches("rowsums against the kernel's arithmetic modelled here: 0 of ").count(), f32_cases, "{said}");
}

//! `--memory-budget` end to end on every tiny model: 1 KiB fails at once
//! naming the smallest budget; that budget works, its measured peak stays
//! within it, the latents are byte-identical to the unbudgeted run's (the
//! transformer and text encoder only change where their weights live) and
//! the PNG stays within the f32 image tolerance (the VAE may decode in bands).

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{exact_bytes, model_dir, read_png, scratch_dir};
use std::path::Path;
use std::process::{Command, Output};

/// `gen` of `model` at 64×48 with `steps` steps.
fn gen_steps(model: &Path, out: &Path, steps: u32, extra: &[&str]) -> Output {
    let (png, latents) = (out.join("out.png"), out.join("latents.safetensors"));
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .arg("gen")
        .args(["--model", model.to_str().unwrap(), "--prompt", "a red fox in the snow", "--seed", "7", "--steps", &steps.to_string()])
        .args(["--width", "64", "--height", "48", "--quiet", "--precision", "f32"])
        .args(["--output", png.to_str().unwrap(), "--output-latents", latents.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

/// [`gen_steps`] with one step: for checks about anything but the steps.
fn gen(model: &Path, out: &Path, extra: &[&str]) -> Output {
    gen_steps(model, out, 1, extra)
}

/// The figure after `key ` in the line starting with `prefix`.
fn figure(stderr: &str, prefix: &str, key: &str) -> u64 {
    let line = stderr.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line in {stderr}"));
    let after = line.split(&format!("{key} ")).nth(1).unwrap_or_else(|| panic!("no {key} in {line}"));
    after.split(',').next().unwrap().trim().parse().unwrap_or_else(|e| panic!("{key} in {line}: {e}"))
}

/// Two steps on a distilled model (every weight used twice, a streamed one
/// uploaded again); one on a guided model, whose step already runs the
/// transformer twice (with the prompt and with the empty negative).
fn check_model(name: &str, steps: u32, half_kv: bool) {
    check_run(name, name, steps, half_kv, &[]);
}

/// `check_model` for a run of `name` with `extra` flags, in scratch folder
/// `label`; `half_kv`: the minimum is the plan's half-K/V layout (the
/// transformer's phase sets it, and keys and values in f16 lower it), whose
/// latents are held to that layout's bound instead of bit for bit.
fn check_run(label: &str, name: &str, steps: u32, half_kv: bool, extra: &[&str]) {
    let gen = |model: &Path, out: &Path, extra: &[&str]| gen_steps(model, out, steps, extra);
    let model = model_dir(name);
    let dir = scratch_dir(&format!("budget-{label}"));
    let (free, tight, tiny) = (dir.join("free"), dir.join("tight"), dir.join("tiny"));
    for d in [&free, &tight, &tiny] {
        std::fs::create_dir_all(d).unwrap();
    }

    let run = gen(&model, &tiny, &[&["--memory-budget", "1KiB"], extra].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{name}: 1 KiB must fail");
    let line = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("--memory-budget 1.00 KiB") && line.contains("the smallest budget that works"), "{line}");
    let minimum = exact_bytes(line);
    assert!(!tiny.join("out.png").exists() && !tiny.join("latents.safetensors").exists(), "{name}: a refused run wrote a file");

    let run = gen(&model, &free, extra);
    assert!(run.status.success(), "{name}: {}", String::from_utf8_lossy(&run.stderr));
    let budget = format!("{minimum}B");
    let run = gen(&model, &tight, &[&["--memory-budget", budget.as_str(), "--verbose"], extra].concat());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{name} at its minimum {minimum} B: {stderr}");
    let device = |key| figure(&stderr, "device bytes: ", key);
    let (peak, allowed, planned) = (device("peak"), device("budget"), device("planned"));
    let with_host = figure(&stderr, "host bytes: ", "planned with the device");
    eprintln!("{name}: minimum {minimum} B; device peak {peak} B, planned {planned} B; with the host {with_host} B of {allowed} B\n{stderr}");
    assert_eq!(allowed, minimum, "{name}: the budget line names the budget given");
    // The budget bounds the planned device and host bytes together, and the
    // device's measured peak stays within its part.
    assert!(with_host <= allowed, "{name}: planned {with_host} B above the budget {allowed} B");
    assert!(peak <= planned, "{name}: device peak {peak} B above the planned {planned} B");
    assert!(stderr.contains("plan: text encoder") && stderr.contains("transformer"), "{stderr}");
    if extra.contains(&"--image") {
        assert!(stderr.contains("plan: VAE encoder"), "{stderr}");
    }

    // The tensor's bytes, not the file's: metadata keys may come in any order.
    let latents = |d: &Path| {
        let bytes = std::fs::read(d.join("latents.safetensors")).unwrap();
        safetensors::SafeTensors::deserialize(&bytes).unwrap().tensor("latents").unwrap().data().to_vec()
    };
    let plan_line = stderr.lines().find(|l| l.starts_with("plan: text encoder")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(plan_line.contains("keys and values in f16"), half_kv, "{name}: {plan_line}");
    if half_kv {
        let floats = |b: Vec<u8>| b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>();
        let (got, want) = (floats(latents(&tight)), floats(latents(&free)));
        let (err, _) = flux_lite_tests::rel_l2(&got, &want);
        eprintln!("{name}: latents with keys and values in f16, relative L2 {err:.2e} from the unbudgeted run's");
        assert!(err > 0.0 && err <= flux_lite_tests::tolerance::half_kv::LATENTS, "{name}: {err:.3e}");
    } else {
        assert!(latents(&free) == latents(&tight), "{name}: the budgeted latents differ");
    }
    let (a, b) = (read_png(&free.join("out.png")), read_png(&tight.join("out.png")));
    let max = a.rgb.iter().zip(&b.rgb).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
    let mean = a.rgb.iter().zip(&b.rgb).map(|(x, y)| x.abs_diff(*y) as f64).sum::<f64>() / a.rgb.len() as f64;
    eprintln!("{name}: budgeted PNG max |Δ| {max}, mean {mean:.4}");
    if half_kv {
        // The image bar every layout or tier that rounds is held to.
        use flux_lite_tests::tolerance::other_tiers::{PNG_MAX_LEVELS, PNG_MEAN_LEVELS};
        assert!(max <= PNG_MAX_LEVELS && mean <= PNG_MEAN_LEVELS, "{name}: budgeted PNG max |Δ| {max}, mean {mean:.5}");
    } else {
        flux_lite_tests::tolerance::assert_png_close(&format!("{name}: budgeted PNG"), &b.rgb, &a.rgb);
    }
}

#[test]
fn tiny_a_runs_at_its_minimum_budget() {
    check_model("tiny-a", 2, true);
}

/// The exact path: with `--kv-precision f32` the smallest budget is the one
/// with keys and values in f32, and the latents are the unbudgeted run's bit
/// for bit.
#[test]
fn tiny_a_with_f32_keys_and_values_runs_exactly_at_that_minimum() {
    check_run("tiny-a-f32", "tiny-a", 2, false, &["--kv-precision", "f32"]);
}

#[test]
fn tiny_b_runs_at_its_minimum_budget() {
    check_model("tiny-b", 1, false);
}

#[test]
fn tiny_b_with_a_reference_image_runs_at_its_minimum_budget() {
    // The reference adds a VAE-encoder phase and 72 image tokens to every transformer pass.
    let reference = flux_lite_tests::test_vectors().join("goldens/tiny-b/reference-cfg/ref0.png");
    check_run("tiny-b-reference", "tiny-b", 1, false, &["--image", reference.to_str().unwrap()]);
}

#[test]
fn bad_budgets_are_one_error_line() {
    for bad in ["3GB", "lots", "0B"] {
        let dir = scratch_dir(&format!("budget-bad-{bad}"));
        let run = gen(&model_dir("tiny-a"), &dir, &["--memory-budget", bad]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{bad}");
        assert!(stderr.contains("--memory-budget"), "{bad}: {stderr}");
        assert!(!dir.join("out.png").exists());
    }
}

#[test]
fn a_forced_vae_tile_is_planned_and_refused_before_any_upload_when_it_does_not_fit() {
    let model = model_dir("tiny-a");
    let dir = scratch_dir("budget-forced-tile");
    // The run's smallest budget decodes the 64×48 image in small tiles.
    let run = gen(&model, &dir, &["--memory-budget", "1KiB"]);
    let minimum = exact_bytes(String::from_utf8_lossy(&run.stderr).lines().find(|l| l.starts_with("error: ")).unwrap());
    let budget = format!("{minimum}B");
    // A 64-pixel tile covers the image: an untiled decode, which that budget cannot hold.
    let run = gen(&model, &dir, &["--memory-budget", budget.as_str(), "--vae-tile", "64", "--verbose"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("--memory-budget") && line.contains("the VAE decoder needs more"), "{line}");
    assert!(exact_bytes(line) > minimum, "{line}");
    // Refused by the plan: no weights were uploaded, no progress or timing was printed.
    assert!(!stderr.contains("plan: ") && !stderr.contains("time: "), "{stderr}");
    assert!(!dir.join("out.png").exists() && !dir.join("latents.safetensors").exists());
    // The tile the budget's plan picks, forced, is the one planned, printed and used.
    let planned = gen(&model, &dir, &["--memory-budget", budget.as_str(), "--verbose"]);
    let stderr = String::from_utf8_lossy(&planned.stderr);
    let vae_line = stderr.lines().find(|l| l.starts_with("plan: VAE in bands")).unwrap_or_else(|| panic!("{stderr}")).to_string();
    let tile = vae_line.split_whitespace().find_map(|w| w.strip_suffix("-pixel")).unwrap();
    let run = gen(&model, &dir, &["--memory-budget", budget.as_str(), "--vae-tile", tile, "--verbose"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.lines().any(|l| l == vae_line), "{vae_line} not in {stderr}");
    // Not a multiple of the latent cell: named by its flag.
    let run = gen(&model, &dir, &["--vae-tile", "18"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("error: --vae-tile 18: not a positive multiple of 4 pixels"), "{stderr}");
}

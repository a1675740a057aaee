//! `gen --lora`: adapters in the three published layouts reproduce the
//! images diffusers renders with them (test_vectors/generate_lora.py), on
//! bf16 weights, on DF11 weights and streamed under a budget; scale 0 is no
//! adapter; a bad adapter is one error line naming its file and key, and no image.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{model_dir, read_png, scratch_dir, test_vectors, the_error_line};
use safetensors::tensor::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FOX: &str = "a red fox in the snow";

fn lora_file(name: &str) -> PathBuf {
    test_vectors().join("goldens/lora").join(name)
}

fn golden(case: &str) -> Vec<u8> {
    read_png(&test_vectors().join("goldens/lora").join(case).join("image.png")).rgb
}

/// The goldens' steps (generate_lora.py).
const GOLDEN_STEPS: u32 = 2;

/// `gen` of `model` at the goldens' settings (seed 42, 32²) with `steps` and `extra` flags.
fn gen_steps(model: &Path, out: &Path, steps: u32, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model.to_str().unwrap(), "--prompt", FOX, "--seed", "42", "--steps", &steps.to_string(), "--width", "32", "--height", "32"])
        .args(["--precision", "f32", "--quiet", "--output", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

/// One step: for the checks that compare with no golden (errors, warnings,
/// plans, scale 0 against no adapter).
fn gen(model: &Path, out: &Path, extra: &[&str]) -> Output {
    gen_steps(model, out, 1, extra)
}

/// A PNG made at the goldens' steps, to compare with one.
fn made_like_the_golden(model: &Path, out: &Path, extra: &[&str]) -> (Vec<u8>, String) {
    made_steps(model, out, GOLDEN_STEPS, extra)
}

/// A PNG made in one step.
fn made(model: &Path, out: &Path, extra: &[&str]) -> (Vec<u8>, String) {
    made_steps(model, out, 1, extra)
}

fn made_steps(model: &Path, out: &Path, steps: u32, extra: &[&str]) -> (Vec<u8>, String) {
    let done = gen_steps(model, out, steps, extra);
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "{stderr}");
    (read_png(out).rgb, stderr)
}

fn arg(file: &str, scale: &str) -> String {
    format!("{}:{scale}", lora_file(file).display())
}

#[test]
fn each_layout_reproduces_its_diffusers_golden() {
    let dir = scratch_dir("lora-layouts");
    let model = model_dir("tiny-a");
    for (case, adapters) in [
        ("peft", vec![arg("peft.safetensors", "1")]),
        ("bfl", vec![arg("bfl.safetensors", "1")]),
        ("kohya", vec![arg("kohya.safetensors", "1")]),
        ("two", vec![arg("peft.safetensors", "0.8"), arg("kohya.safetensors", "0.5")]),
    ] {
        let flags: Vec<&str> = adapters.iter().flat_map(|a| ["--lora", a.as_str()]).collect();
        let (rgb, _) = made_like_the_golden(&model, &dir.join(format!("{case}.png")), &[&flags[..], &["--verbose"]].concat());
        flux_lite_tests::tolerance::assert_png_close(&format!("LoRA {case} against diffusers"), &rgb, &golden(case));
    }
}

/// The smallest budget `gen` accepts, from its refusal of 1 KiB.
fn smallest_budget(model: &Path, out: &Path, extra: &[&str]) -> String {
    let refused = gen_steps(model, out, GOLDEN_STEPS, &[extra, &["--memory-budget", "1KiB"]].concat());
    let line = the_error_line(&refused);
    line.rsplit('(').next().and_then(|t| t.split(' ').next()).unwrap_or_else(|| panic!("{line}")).to_string() + "B"
}

#[test]
fn two_adapters_on_df11_and_streamed_weights_reproduce_the_golden() {
    let dir = scratch_dir("lora-df11");
    let model = model_dir("tiny-a");
    let df11 = dir.join("tiny-a-df11");
    let compressed = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["compress", "--model", model.to_str().unwrap(), "--output", df11.to_str().unwrap(), "--components", "transformer", "--quiet"])
        .output()
        .unwrap();
    assert!(compressed.status.success(), "{}", String::from_utf8_lossy(&compressed.stderr));
    let (peft, kohya) = (arg("peft.safetensors", "0.8"), arg("kohya.safetensors", "0.5"));
    let adapters = ["--lora", peft.as_str(), "--lora", kohya.as_str()];
    let want = golden("two");
    let (df11_rgb, _) = made_like_the_golden(&df11, &dir.join("df11.png"), &adapters);
    flux_lite_tests::tolerance::assert_png_close("two adapters on DF11 weights", &df11_rgb, &want);
    // Streamed under the smallest budget with keys and values in f32, the
    // exact path (the smallest budget of all takes them in f16).
    let adapters = [&adapters[..], &["--kv-precision", "f32"]].concat();
    for (name, folder) in [("bf16", &model), ("DF11", &df11)] {
        let out = dir.join(format!("streamed-{name}.png"));
        let budget = smallest_budget(folder, &out, &adapters);
        let (rgb, stderr) = made_like_the_golden(folder, &out, &[&adapters[..], &["--memory-budget", &budget, "--verbose"]].concat());
        assert!(stderr.contains("streamed per block"), "{name} under {budget} was not streamed: {stderr}");
        flux_lite_tests::tolerance::assert_png_close(&format!("two adapters on {name} weights streamed under {budget}"), &rgb, &want);
    }
}

#[test]
fn scale_zero_is_no_adapter_exactly_and_the_plan_counts_the_adapters() {
    let dir = scratch_dir("lora-zero");
    let model = model_dir("tiny-a");
    let (plain, plain_log) = made(&model, &dir.join("plain.png"), &["--verbose"]);
    let zero = arg("peft.safetensors", "0");
    let (zeroed, _) = made(&model, &dir.join("zero.png"), &["--lora", &zero]);
    assert!(plain == zeroed, "scale 0 changed the image");
    // Adapters raise the smallest budget by their bytes on the device.
    let one = arg("peft.safetensors", "1");
    let out = dir.join("budget.png");
    let exact = |line: String| flux_lite_tests::exact_bytes(&line);
    let without = exact(the_error_line(&gen(&model, &out, &["--memory-budget", "1KiB"])));
    let with = exact(the_error_line(&gen(&model, &out, &["--lora", &one, "--memory-budget", "1KiB"])));
    assert!(with > without, "the plan did not count the adapter: {with} vs {without} bytes");
    assert!(plain_log.contains("wrote"), "{plain_log}");
}

/// A tensor to write: name, dtype, shape, values.
type Tensor = (String, Dtype, Vec<usize>, Vec<f32>);

/// Writes f32 `tensors` (name, dtype, shape, values) to a safetensors file.
fn write_lora(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<f32>)]) {
    assert!(tensors.iter().all(|t| t.1 == Dtype::F32));
    let data: Vec<Vec<u8>> = tensors.iter().map(|(_, _, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let views = tensors.iter().zip(&data).map(|((name, dtype, shape, _), d)| (name.to_string(), *dtype, shape.clone(), d.as_slice()));
    flux_lite_platform::pipeline::output::write_tensors(path, views, &[]).unwrap();
}

/// A down/up pair for `module` (diffusers names, under `transformer.`).
fn pair(module: &str, rank: usize, inner: usize, out: usize, value: f32) -> [Tensor; 2] {
    [
        (format!("transformer.{module}.lora_A.weight"), Dtype::F32, vec![rank, inner], vec![value; rank * inner]),
        (format!("transformer.{module}.lora_B.weight"), Dtype::F32, vec![out, rank], vec![value; out * rank]),
    ]
}

fn write_pairs(path: &Path, pairs: &[Tensor]) {
    let tensors: Vec<(&str, Dtype, Vec<usize>, Vec<f32>)> = pairs.iter().map(|(n, d, s, v)| (n.as_str(), *d, s.clone(), v.clone())).collect();
    write_lora(path, &tensors);
}

#[test]
fn a_bad_adapter_is_one_error_line_naming_its_file_and_key() {
    let dir = scratch_dir("lora-bad");
    let model = model_dir("tiny-a");
    let out = dir.join("out.png");
    // tiny-a: inner dim 64; to_q is 64×64.
    let q = "transformer_blocks.0.attn.to_q";
    let cases: Vec<(&str, Vec<Tensor>, Vec<&str>)> = vec![
        (
            "another-model",
            vec![
                ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight".into(), Dtype::F32, vec![4, 320], vec![0.1; 4 * 320]),
                ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight".into(), Dtype::F32, vec![320, 4], vec![0.1; 4 * 320]),
            ],
            vec!["no key adapts this model's transformer", "lora_unet_down_blocks_0_attentions_0_proj_in"],
        ),
        (
            "rank-mismatch",
            vec![
                (format!("transformer.{q}.lora_A.weight"), Dtype::F32, vec![4, 64], vec![0.1; 4 * 64]),
                (format!("transformer.{q}.lora_B.weight"), Dtype::F32, vec![64, 2], vec![0.1; 64 * 2]),
            ],
            vec!["transformer.transformer_blocks.0.attn.to_q.lora_B.weight", "rank 2", "rank 4"],
        ),
        ("wrong-shape", pair(q, 4, 96, 64, 0.1).to_vec(), vec!["transformer.transformer_blocks.0.attn.to_q.lora_A.weight", "takes 96 inputs", "64×64"]),
        (
            "nan",
            {
                let mut p = pair(q, 4, 64, 64, 0.1).to_vec();
                p[1].3[7] = f32::NAN;
                p
            },
            vec!["transformer.transformer_blocks.0.attn.to_q.lora_B.weight", "non-finite", "element 7"],
        ),
        (
            "lokr",
            vec![("diffusion_model.double_blocks.0.img_attn.qkv.lokr_w1".into(), Dtype::F32, vec![4, 4], vec![0.1; 16])],
            vec!["LoKr or LoHa", "LoRA adapters only"],
        ),
        (
            "no-up",
            vec![(format!("transformer.{q}.lora_A.weight"), Dtype::F32, vec![4, 64], vec![0.1; 4 * 64])],
            vec!["transformer.transformer_blocks.0.attn.to_q.lora_A.weight", "has no `transformer.transformer_blocks.0.attn.to_q.lora_B.weight`"],
        ),
    ];
    for (name, tensors, needles) in cases {
        let file = dir.join(format!("{name}.safetensors"));
        write_pairs(&file, &tensors);
        let line = the_error_line(&gen(&model, &out, &["--lora", file.to_str().unwrap()]));
        assert!(line.contains(&format!("{name}.safetensors")), "{name}: the file is not named: {line}");
        for needle in needles {
            assert!(line.contains(needle), "{name}: {needle:?} not in {line:?}");
        }
        assert!(!out.exists(), "{name}: a failed run left an image");
    }
    // A truncated file, and one that does not exist.
    let whole = std::fs::read(lora_file("bfl.safetensors")).unwrap();
    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &whole[..whole.len() - 100]).unwrap();
    let line = the_error_line(&gen(&model, &out, &["--lora", truncated.to_str().unwrap()]));
    assert!(line.contains("truncated.safetensors") && line.contains("not a safetensors file"), "{line}");
    let line = the_error_line(&gen(&model, &out, &["--lora", dir.join("absent.safetensors").to_str().unwrap()]));
    assert!(line.contains("absent.safetensors"), "{line}");
    let line = the_error_line(&gen(&model, &out, &["--lora", "x.safetensors:inf"]));
    assert!(line.contains("--lora x.safetensors:inf"), "{line}");
    assert!(!out.exists());
}

#[test]
fn a_partly_matching_adapter_says_what_it_adapted_and_lists_the_rest_with_verbose() {
    let dir = scratch_dir("lora-partial");
    let model = model_dir("tiny-a");
    let file = dir.join("partial.safetensors");
    let mut tensors = pair("transformer_blocks.0.attn.to_q", 2, 64, 64, 0.01).to_vec();
    tensors.extend(pair("transformer_blocks.9.attn.to_q", 2, 64, 64, 0.01));
    tensors.extend(pair("time_guidance_embed.guidance_embedder.linear_1", 2, 256, 64, 0.01));
    tensors.push(("text_encoder.model.layers.0.mlp.up_proj.lora_A.weight".into(), Dtype::F32, vec![2, 8], vec![0.01; 16]));
    write_pairs(&file, &tensors);
    let lora = file.to_str().unwrap();
    let (_, quiet) = made(&model, &dir.join("a.png"), &["--lora", lora]);
    let warning = quiet.lines().find(|l| l.contains("matched no module")).unwrap_or_else(|| panic!("{quiet}"));
    assert!(warning.starts_with("warning: ") && warning.contains("partial.safetensors") && warning.contains("adapted 1 modules; 4 keys"), "{warning}");
    assert!(warning.contains("--verbose lists them"), "{warning}");
    assert!(quiet.contains("1 text-encoder keys are not supported"), "{quiet}");
    let (_, verbose) = made(&model, &dir.join("b.png"), &["--lora", lora, "--verbose"]);
    let listed = verbose.lines().find(|l| l.contains("matched no module")).unwrap();
    assert!(listed.contains("transformer.transformer_blocks.9.attn.to_q.lora_A.weight") && listed.contains("guidance_embedder"), "{listed}");
    assert!(verbose.contains("lora: ") && verbose.contains("1 modules, rank 2"), "{verbose}");
}

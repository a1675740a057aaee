//! Helpers for the end-to-end tests: where the test vectors live and how to
//! read the diffusers goldens.

#![allow(clippy::unwrap_used)]

pub mod fuzz;
pub mod tolerance;

use flux_lite_core::plan::WeightStrategy;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
use flux_lite_platform::Gpu;
use safetensors::tensor::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// A test's one line when this machine lacks what it needs (`skipped: <test>: <why>`, counted by ci/test.sh).
pub use flux_lite_kernels::skip::skipped;

/// The `TIER tier: …` line (`f16` or `matrix`) of `flux-lite gpu` run with
/// the binary at `flux_lite`: the configuration taken, or `unavailable (why)`.
pub fn tier_line(flux_lite: &str, tier: &str) -> String {
    let out = std::process::Command::new(flux_lite).arg("gpu").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("{tier} tier: ");
    stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {tier} tier line in {stdout}")).to_string()
}

/// Whether the adapter here runs `tier`; where it does not, says so
/// (`skipped: …`), unless `FLUX_LITE_REQUIRE_MATRIX` is set (CI's run on
/// Mesa 26, which has both half tiers), where that fails.
pub fn tier_here(flux_lite: &str, tier: &str) -> bool {
    let line = tier_line(flux_lite, tier);
    if !line.contains("unavailable") {
        return true;
    }
    flux_lite_kernels::test_devices::missing_tier(&line);
    false
}

/// `test_vectors/` at the top of the repository.
pub fn test_vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors")
}

/// A tiny model folder, e.g. `tiny-a`.
pub fn model_dir(name: &str) -> PathBuf {
    test_vectors().join("models").join(name)
}

/// A decoded 8-bit RGB PNG and its text chunks (tEXt and iTXt).
#[derive(Debug)]
pub struct Png {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
    pub text: Vec<(String, String)>,
}

pub fn read_png(path: &Path) -> Png {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().unwrap();
    let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut rgb).unwrap();
    assert_eq!((frame.color_type, frame.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight), "{}", path.display());
    rgb.truncate(frame.buffer_size());
    let info = reader.info();
    let mut text: Vec<(String, String)> = info.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
    text.extend(info.utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())));
    Png { width: frame.width as usize, height: frame.height as usize, rgb, text }
}

/// The golden tensors of one case (`tiny-a/one-step`), read into memory.
#[derive(Debug)]
pub struct Goldens {
    pub dir: PathBuf,
    bytes: Vec<u8>,
}

impl Goldens {
    /// The folder of a case (`case.json`, `goldens.safetensors`, `image.png`).
    pub fn dir(case: &str) -> PathBuf {
        test_vectors().join("goldens").join(case)
    }

    pub fn load(case: &str) -> Self {
        let dir = Self::dir(case);
        let path = dir.join("goldens.safetensors");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self { dir, bytes }
    }

    fn view(&self, name: &str) -> (Dtype, Vec<usize>, &[u8]) {
        let st = SafeTensors::deserialize(&self.bytes).expect("goldens are valid safetensors");
        let t = st.tensor(name).unwrap_or_else(|_| panic!("golden tensor {name} missing in {}", self.dir.display()));
        let data = t.data();
        // Re-borrow from our own buffer so the slice outlives `st`.
        let start = data.as_ptr() as usize - self.bytes.as_ptr() as usize;
        (t.dtype(), t.shape().to_vec(), &self.bytes[start..start + data.len()])
    }

    /// An f32 tensor and its shape.
    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let (dtype, shape, data) = self.view(name);
        assert_eq!(dtype, Dtype::F32, "{name}");
        (data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), shape)
    }

    /// An i64 tensor and its shape.
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        let (dtype, shape, data) = self.view(name);
        assert_eq!(dtype, Dtype::I64, "{name}");
        (data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(), shape)
    }

    /// A u8 tensor and its shape.
    pub fn u8(&self, name: &str) -> (Vec<u8>, Vec<usize>) {
        let (dtype, shape, data) = self.view(name);
        assert_eq!(dtype, Dtype::U8, "{name}");
        (data.to_vec(), shape)
    }

    pub fn case_json(&self) -> serde_json::Value {
        self.json("case.json")
    }

    /// A JSON file of the case's folder.
    pub fn json(&self, file: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
    }
}

/// The cases the generator wrote.
pub const CASES: [&str; 5] = ["tiny-a/one-step", "tiny-a/four-step-wide", "tiny-b/three-step", "tiny-b/cfg", "tiny-9b/two-step"];

/// The reference-image cases of `generate_references.py`.
pub const REFERENCE_CASES: [&str; 4] = ["tiny-a/reference-one", "tiny-a/reference-two", "tiny-b/reference-cfg", "tiny-9b-kv/reference-kv"];

/// Largest |a − b| and where it is.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().fold((0.0, 0), |(m, at), (i, (x, y))| {
        let d = (x - y).abs();
        if d > m || d.is_nan() { (d, i) } else { (m, at) }
    })
}

/// A fresh, empty scratch folder for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flux-lite-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Copies a folder tree (the tiny models are small).
pub fn copy_tree(from: &Path, to: &Path) {
    copy_tree_where(from, to, &|_| true);
}

/// Copies the files of a folder tree for which `keep` holds (every folder is made).
pub fn copy_tree_where(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree_where(&entry.path(), &target, keep);
        } else if keep(&entry.path()) {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Reads a running command's stderr until `needle` appears (e.g. the
/// progress bar's `denoise`) and returns what was read; fails if the command
/// ends first.
pub fn read_stderr_until(stderr: &mut std::process::ChildStderr, needle: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = std::io::Read::read(stderr, &mut buf).unwrap();
        assert!(n > 0, "the command ended before printing {needle:?}: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// The one `error: …` line of a failed command (other lines, such as the
/// seed, may come before it); it must not have panicked.
pub fn the_error_line(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line expected, got {stderr:?}");
    errors[0].to_string()
}

/// The exact byte count of a figure line: `… 2.28 MiB (2380544 B)`, or
/// `… 5.03 MiB (5268992 B): 2.28 MiB on the device and …`.
pub fn exact_bytes(line: &str) -> u64 {
    let inner = line.rsplit_once('(').unwrap_or_else(|| panic!("no byte count in {line}")).1;
    let count = inner.split_once(" B)").unwrap_or_else(|| panic!("no byte count in {line}")).0;
    count.parse().unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// [`the_error_line`] of a command whose stderr holds nothing else.
pub fn only_an_error_line(out: &std::process::Output) -> String {
    let line = the_error_line(out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().filter(|l| !l.trim().is_empty()).count(), 1, "one line expected, got {stderr:?}");
    line
}

/// Two forward passes (timesteps 900 and 400) of `t` from fixed prompt and
/// latent values for `text` prompt tokens: the velocity.
pub fn velocity_of_two_passes(gpu: &Gpu, t: &Transformer, text: usize) -> Vec<f32> {
    let prompt: Vec<f32> = (0..text * t.layout.joint_dim as usize).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let latents: Vec<f32> = (0..t.layout.noise as usize * t.layout.in_channels as usize).map(|i| ((i * 53 % 89) as f32 / 44.0) - 1.0).collect();
    t.set_prompt(gpu, &prompt).unwrap();
    t.set_latents(gpu, &latents).unwrap();
    // Two passes: the second finds weight slots holding the previous pass's last blocks.
    for step in [900.0, 400.0] {
        t.forward(gpu, step, &mut |_| {}).unwrap();
    }
    t.velocity(gpu).unwrap()
}

/// Relative L2 error of `got` against `want`, and the element with the largest |Δ|.
pub fn rel_l2(got: &[f32], want: &[f32]) -> (f64, usize) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let (mut d2, mut r2) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        d2 += (g as f64 - w as f64).powi(2);
        r2 += (w as f64).powi(2);
    }
    ((d2 / r2.max(f64::MIN_POSITIVE)).sqrt(), max_abs_diff(got, want).1)
}

/// Fails with the worst element named when `got` is further than `tol` (relative L2) from `want`.
pub fn assert_rel_l2(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let (err, worst) = rel_l2(got, want);
    println!("{what}: relative L2 {err:.2e} (bound {tol:.0e})");
    assert!(
        err <= tol,
        "{what}: relative L2 error {err:.3e} > {tol:.0e}; worst element {worst}: got {} want {}",
        got[worst],
        want[worst]
    );
}

/// Fails unless `got` holds `want`'s bits, naming how many values differ and the first.
pub fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let differing: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
    println!("{what}: {} of {} values differ", differing.len(), got.len());
    if let Some(&i) = differing.first() {
        panic!("{what}: {} of {} values differ from the bits wanted; the first, {i}: got {} want {}", differing.len(), got.len(), got[i], want[i]);
    }
}

/// The devices the tests run on (one per test binary, a tier's, the
/// missing-tier rule): the kernels' test support, shared by every crate.
pub use flux_lite_kernels::test_devices::{gpu, has_f16_tiles, tier_gpu, with_f16_tiles};

/// A golden case with its model's transformer on the test device, laid out
/// for the case's image size.
#[derive(Debug)]
pub struct TransformerCase {
    pub name: &'static str,
    pub goldens: Goldens,
    pub transformer: Transformer,
    pub steps: usize,
    pub cfg: bool,
}

impl TransformerCase {
    pub fn load(name: &'static str) -> Self {
        Self::load_on(gpu(), name)
    }

    /// The case with its transformer on `gpu` (another precision tier's device).
    pub fn load_on(gpu: &Gpu, name: &'static str) -> Self {
        Self::load_laid_out(gpu, name, None, false)
    }

    /// The case with its transformer on `gpu` by chunks of `chunk` token
    /// rows (`None`: unchunked), with keys and values in half precision.
    pub fn load_laid_out(gpu: &Gpu, name: &'static str, chunk: Option<usize>, half_kv: bool) -> Self {
        let goldens = Goldens::load(name);
        let json = goldens.case_json();
        let field = |k: &str| json[k].clone();
        let model_name = field("model").as_str().map(str::to_string).unwrap_or_else(|| panic!("{name}: case.json model"));
        let model = ModelFolder::open(&model_dir(&model_name)).unwrap_or_else(|e| panic!("{e}"));
        let shape: Vec<usize> = field("noise_shape")
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).map(|v| v as usize).collect())
            .unwrap_or_default();
        assert_eq!(shape.len(), 4, "{name}: noise_shape");
        let store = model.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
        let grids = LatentGrids { half_kv, ..LatentGrids::noise_only(shape[2], shape[3]) };
        let transformer = Transformer::new(gpu, &model.transformer, store, WeightStrategy::ResidentBf16, chunk, 512, &grids).unwrap_or_else(|e| panic!("{e}"));
        let steps = field("steps").as_u64().unwrap_or_else(|| panic!("{name}: steps")) as usize;
        let cfg = field("cfg").as_bool().unwrap_or_else(|| panic!("{name}: cfg"));
        Self { name, goldens, transformer, steps, cfg }
    }
}

/// The text encoder whose heads split into f16 pieces
/// (`test_vectors/generate_wide_heads.py`) on `gpu`, over the 512 tokens its
/// goldens hold, and those goldens (`input_ids`, `attention_mask`, `prompt_embeds`).
pub fn wide_heads_text_encoder(gpu: &Gpu) -> (flux_lite_platform::components::text_encoder::TextEncoder, Goldens) {
    use flux_lite_platform::model::config_json::{qwen3, JsonFile};
    use flux_lite_platform::model::safetensors_store::WeightStore;
    let dir = model_dir("wide-heads").join("text_encoder");
    let config = qwen3(&JsonFile::read(&dir.join("config.json")).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"));
    let store = WeightStore::open(&dir, "text_encoder").unwrap_or_else(|e| panic!("{e}"));
    let picks = config.output_layers();
    let encoder = flux_lite_platform::components::text_encoder::TextEncoder::new(gpu, &config, store, WeightStrategy::ResidentBf16, 512, picks)
        .unwrap_or_else(|e| panic!("{e}"));
    (encoder, Goldens::load("wide-heads"))
}

/// The prompt embedding `encoder` makes of `goldens`' tokens.
pub fn encode_goldens(gpu: &Gpu, encoder: &flux_lite_platform::components::text_encoder::TextEncoder, goldens: &Goldens) -> Vec<f32> {
    let ids = |name: &str| -> Vec<u32> { goldens.i64(name).0.iter().map(|&v| u32::try_from(v).unwrap_or(u32::MAX)).collect() };
    encoder.encode(gpu, &ids("input_ids"), &ids("attention_mask"), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

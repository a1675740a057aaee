//! Latent previews against NumPy: the tiny models' latent-to-RGB maps
//! (fitted by least squares against diffusers' decode of each tiny VAE,
//! test_vectors/generate_previews.py) drawn over seeded latents, as the
//! engine draws them after each step.

#![allow(clippy::unwrap_used)]

use flux_lite_platform::model::ModelFolder;
use flux_lite_platform::pipeline::preview::latent_rgb;
use flux_lite_tests::{model_dir, test_vectors};
use safetensors::SafeTensors;

#[test]
fn each_tiny_models_preview_matches_numpy() {
    let bytes = std::fs::read(test_vectors().join("goldens/previews.safetensors")).unwrap();
    let goldens = SafeTensors::deserialize(&bytes).unwrap();
    for name in ["tiny-a", "tiny-b", "tiny-9b"] {
        let model = ModelFolder::open(&model_dir(name)).unwrap();
        let map = latent_rgb(&model).unwrap_or_else(|e| panic!("{name}: {e}"));
        let latents: Vec<f32> = goldens.tensor(&format!("{name}.latents")).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let grid: Vec<i64> = goldens.tensor(&format!("{name}.grid")).unwrap().data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        let want = goldens.tensor(&format!("{name}.rgb")).unwrap();
        let (width, height, rgb) = map.draw(&latents, (grid[0] as usize, grid[1] as usize), &model.vae).unwrap();
        assert_eq!([height, width, 3], [want.shape()[0], want.shape()[1], want.shape()[2]], "{name}");
        let worst = rgb.iter().zip(want.data()).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let off = rgb.iter().zip(want.data()).filter(|(a, b)| a != b).count();
        println!("{name}: {width}×{height} preview, {off} of {} bytes differ from NumPy's, by at most {worst}", rgb.len());
        // Both round (v + 1) / 2 · 255 + 0.5 down; only sums landing within an
        // ulp of a level boundary may round the other way.
        assert!(worst <= 1, "{name}: a level {worst} off NumPy's");
        assert!(off * 100 <= rgb.len(), "{name}: {off} of {} bytes differ", rgb.len());
    }
}

#[test]
fn a_vae_without_a_map_is_refused_by_name() {
    // tiny-a's VAE with its map removed: 4 latent channels, not FLUX.2's 32.
    let dir = std::env::temp_dir().join(format!("flux-lite-no-map-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&model_dir("tiny-a"), &dir);
    std::fs::remove_file(dir.join("vae/latent_rgb.json")).unwrap();
    let model = ModelFolder::open(&dir).unwrap();
    let err = latent_rgb(&model).unwrap_err().to_string();
    assert!(err.contains("no latent-to-RGB map for this VAE (4 latent channels") && err.contains("vae/latent_rgb.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Counts the previews an observer is handed, asking for them when `every` is set.
struct Previews {
    every: Option<usize>,
    seen: usize,
}

impl flux_lite_platform::Observer for Previews {
    fn previews(&self) -> Option<usize> {
        self.every
    }

    fn preview(&mut self, _p: &flux_lite_platform::Preview<'_>) {
        self.seen += 1;
    }
}

/// Previews off cost nothing: the run with them off creates exactly the
/// buffers a run creates. On, they are drawn on the GPU: a few buffers made
/// once before the first step (the map, the levels, the dispatch's
/// parameters), then one readback a preview.
#[test]
fn previews_off_add_no_work_and_on_add_one_readback_each() {
    use flux_lite_platform::{Job, Limits, Options, Pipeline, Prompt};
    let pipeline = Pipeline::open(&model_dir("tiny-a"), Options::default()).unwrap();
    let run = |steps: usize, every: Option<usize>| {
        let job = Job { width: Some(32), height: Some(32), steps: Some(steps), seed: Some(1), ..Job::new(Prompt::text("a fox")) };
        let job = job.resolve(pipeline.model(), &Limits::default()).unwrap();
        let before = pipeline.gpu().memory().allocations;
        let mut observer = Previews { every, seen: 0 };
        pipeline.run(&job, &mut observer, &mut |_| Ok(())).unwrap();
        (pipeline.gpu().memory().allocations - before, observer.seen)
    };
    let (off, seen_off) = run(3, None);
    let (off_again, _) = run(3, None);
    assert_eq!(seen_off, 0);
    assert_eq!(off, off_again, "two runs without previews create different buffers");
    let (on3, seen3) = run(3, Some(1));
    let (off2, _) = run(2, None);
    let (on2, seen2) = run(2, Some(1));
    assert_eq!((seen2, seen3), (2, 3));
    let (extra2, extra3) = (on2 - off2, on3 - off);
    assert_eq!(extra3 - extra2, 1, "a preview more is one readback more");
    assert_eq!(extra2, 3 + 2, "the map, the levels and the parameters once, then a readback a preview");
}

/// The tiny preview decoders (test_vectors/generate_tiny_decoder.py): one
/// in diffusers' `AutoencoderTiny` layout, one in TAESD's with TAEF2's
/// global-norm blocks, each with random weights, decoding seeded packed
/// latents through tiny-a's VAE statistics as diffusers' `AutoencoderTiny`
/// and `taesd.py`'s modules decode them: whole, and by bands of an 8-pixel
/// tile (a convolution's halo from the neighbouring bands, the global
/// norm's statistics over the whole image) with the activations in a host
/// scratch file or on the device, within the same bounds.
#[test]
fn the_tiny_decoders_decode_as_their_references() {
    tiny_decodes(flux_lite_tests::gpu(), flux_lite_tests::tolerance::f32::TINY_DECODED, 1);
}

/// The same on the half tiers (on the matrix tier's f16 tiles, the
/// channels-last program: f16 activations, every ReLU in a convolution's
/// epilogue, the global norm read by its convolution), within the bound
/// `other_tiers` states; by bands bit for bit what the whole decode gives.
#[test]
fn the_tiny_decoders_decode_as_their_references_on_the_half_tiers() {
    use flux_lite_platform::Precision;
    use flux_lite_tests::tolerance::other_tiers;
    for gpu in [Precision::F16, Precision::Matrix].into_iter().filter_map(flux_lite_tests::tier_gpu) {
        tiny_decodes(&gpu, other_tiers::TINY_DECODED, other_tiers::TINY_LEVELS);
    }
}

/// Each golden tiny decoder's decode on `gpu`, whole and by bands, within
/// `bound` (relative L2 of the values) and `levels` of the reference's
/// 8-bit levels; a banded decode gives the whole one's values bit for bit.
fn tiny_decodes(gpu: &flux_lite_platform::Gpu, bound: f64, levels: u8) {
    use flux_lite_platform::components::tiny_decoder::{TinyDecoder, TinyDecoderFile};
    use flux_lite_platform::exec::activations::Bands;
    use flux_lite_platform::model::Component;
    let dir = test_vectors().join("goldens/tiny_decoder");
    let bytes = std::fs::read(dir.join("cases.safetensors")).unwrap();
    let cases = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> { cases.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let vae_store = model.weights(Component::Vae).unwrap();
    let latents = f32s("latents");
    let (width, height) = (20, 12);
    let tier = gpu.precision().name();
    for (case, file) in [("diffusers", "diffusers.safetensors"), ("taesd", "taesd.safetensors")] {
        let decoder = TinyDecoderFile::open(&dir.join(file)).unwrap_or_else(|e| panic!("{case}: {e}"));
        let mut whole: Option<Vec<f32>> = None;
        for bands in [Bands::Whole, Bands::OnHost { tile: 8 }, Bands::OnDevice { tile: 8 }] {
            let tiny = TinyDecoder::new(gpu, &decoder, &model.vae, &vae_store, width, height, bands).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!((tiny.size(), tiny.is_banded()), ((width, height), bands != Bands::Whole));
            assert_eq!(tiny.is_channels_last(), flux_lite_tests::has_f16_tiles(gpu), "{tier}: channels-last on the matrix tier's f16 tiles only");
            let label = format!("{tier}, {case}, {bands:?}");
            let (decoded, rgb) = tiny.decode(gpu, &latents, true).unwrap();
            let (decoded, want) = (decoded.unwrap(), f32s(case));
            let (err, at) = flux_lite_tests::rel_l2(&decoded, &want);
            // The levels as diffusers' post-processing rounds the reference's values.
            let pixels = width * height;
            let level = |v: f32| ((v as f64 * 0.5 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8;
            let worst = (0..pixels).flat_map(|i| (0..3).map(move |c| (i, c))).map(|(i, c)| rgb[3 * i + c].abs_diff(level(want[c * pixels + i]))).max().unwrap();
            println!("{label}: decoded relative L2 {err:.2e}, worst element {at}: got {} want {}; levels at most {worst} off", decoded[at], want[at]);
            assert!(err <= bound, "{label}: relative L2 {err:.3e}");
            assert!(worst <= levels, "{label}: a level {worst} off");
            match &whole {
                None => whole = Some(decoded),
                Some(w) => flux_lite_tests::assert_same_bits(&format!("{label} vs whole"), &decoded, w),
            }
        }
    }
}

/// A tiny decoder's file in f16 or bf16 (as published or converted
/// decoders may come) decodes as one in f32 holding the same values, bit
/// for bit, on every tier here (its convolutions without a bias given zero
/// ones in their W's dtype); on the matrix tier's f16 tiles every
/// convolution's W is packed as f16 at load.
#[test]
fn a_half_precision_tiny_decoder_decodes_as_the_f32_file_of_its_values() {
    use flux_lite_platform::components::tiny_decoder::{TinyDecoder, TinyDecoderFile};
    use flux_lite_platform::exec::activations::Bands;
    use flux_lite_platform::model::Component;
    use flux_lite_platform::Precision;
    use safetensors::Dtype;
    let dir = test_vectors().join("goldens/tiny_decoder");
    let bytes = std::fs::read(dir.join("taesd.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> =
        file.tensors().into_iter().map(|(name, t)| (name, t.shape().to_vec(), t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())).collect();
    // The tensors with each value rounded to `dtype`, stored as it and as f32.
    let write = |path: &std::path::Path, dtype: Dtype, stored: Dtype| {
        let encode = |v: f32| -> Vec<u8> {
            let rounded = match dtype {
                Dtype::F16 => half::f16::from_f32(v).to_f32(),
                _ => half::bf16::from_f32(v).to_f32(),
            };
            match stored {
                Dtype::F16 => half::f16::from_f32(rounded).to_le_bytes().to_vec(),
                Dtype::BF16 => half::bf16::from_f32(rounded).to_le_bytes().to_vec(),
                _ => rounded.to_le_bytes().to_vec(),
            }
        };
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors.iter().map(|(n, shape, v)| (n.clone(), shape.clone(), v.iter().flat_map(|&x| encode(x)).collect())).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data.iter().map(|(n, shape, b)| (n.clone(), safetensors::tensor::TensorView::new(stored, shape.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    };
    let scratch = tempfile::tempdir().unwrap();
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap();
    let vae_store = model.weights(Component::Vae).unwrap();
    let latents: Vec<f32> = {
        let cases = std::fs::read(dir.join("cases.safetensors")).unwrap();
        SafeTensors::deserialize(&cases).unwrap().tensor("latents").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let tiers: Vec<_> = [Precision::F32, Precision::F16, Precision::Matrix].into_iter().filter_map(flux_lite_tests::tier_gpu).collect();
    for dtype in [Dtype::F16, Dtype::BF16] {
        let (half_path, f32_path) = (scratch.path().join(format!("{dtype:?}.safetensors")), scratch.path().join(format!("{dtype:?} as f32.safetensors")));
        write(&half_path, dtype, dtype);
        write(&f32_path, dtype, Dtype::F32);
        let convolutions = TinyDecoderFile::open(&f32_path).map(|f| {
            let mut n = 0;
            f.config.tensors(|t| n += (t.shape.len() == 4) as usize);
            n
        }).unwrap();
        for gpu in &tiers {
            let tier = gpu.precision().name();
            let [half, f32] = [&half_path, &f32_path].map(|path| {
                let decoder = TinyDecoderFile::open(path).unwrap();
                let tiny = TinyDecoder::new(gpu, &decoder, &model.vae, &vae_store, 20, 12, Bands::Whole).unwrap_or_else(|e| panic!("{tier}: {}: {e}", path.display()));
                let packed = if flux_lite_tests::has_f16_tiles(gpu) { convolutions } else { 0 };
                assert_eq!(tiny.packed_weights(), packed, "{tier}: {}", path.display());
                tiny.decode(gpu, &latents, true).unwrap().0.unwrap()
            });
            flux_lite_tests::assert_same_bits(&format!("{tier}: the {dtype:?} file against the f32 one"), &half, &f32);
        }
    }
}

#[test]
fn a_tiny_decoder_for_another_vae_is_refused_by_name() {
    use flux_lite_platform::components::tiny_decoder::TinyDecoderFile;
    let decoder = TinyDecoderFile::open(&test_vectors().join("goldens/tiny_decoder/taesd.safetensors")).unwrap();
    // tiny-b's VAE: check its latent channels and scale differ from tiny-a's.
    let model = ModelFolder::open(&model_dir("tiny-b")).unwrap();
    if model.vae.latent_channels == 4 && model.vae.scale_factor() == 2 {
        panic!("tiny-b's VAE is tiny-a's shape; this test needs another");
    }
    let err = decoder.check_fits(&model.vae).unwrap_err().to_string();
    assert!(err.contains("taesd.safetensors") && err.contains("a decoder of 4 latent channels at 2×"), "{err}");
    let err = TinyDecoderFile::open(&model_dir("tiny-a").join("vae/diffusion_pytorch_model.safetensors")).unwrap_err().to_string();
    assert!(err.contains("not a tiny decoder"), "{err}");
}

/// The bench's TAEF2-shaped decoder is built as `taesd.py` stacks its
/// modules: the builder at the golden decoder's widths gives the structure
/// read from that file's tensors.
#[test]
fn the_taesd_shape_is_what_taesd_py_stacks() {
    use flux_lite_core::models::tiny_decoder::TinyDecoderConfig;
    use flux_lite_platform::components::tiny_decoder::TinyDecoderFile;
    let file = TinyDecoderFile::open(&test_vectors().join("goldens/tiny_decoder/taesd.safetensors")).unwrap();
    let built = TinyDecoderConfig::taesd_shape(4, 16, &[2, 1], true).unwrap();
    assert_eq!(built, file.config);
}

/// An image whose tiny decode needs a binding the adapter lacks is planned
/// by bands of a binding with its activations on the device; one whose
/// widest convolution's row exceeds the binding is refused by the plan,
/// before anything runs, naming the decoder's file.
#[test]
fn a_preview_decoder_beyond_the_adapters_bindings_runs_by_bands_or_is_refused_up_front() {
    use flux_lite_platform::pipeline::{planning, Request};
    use flux_lite_platform::{Gpu, GpuOptions};
    let decoder = test_vectors().join("goldens/tiny_decoder/taesd.safetensors");
    let model = ModelFolder::open(&model_dir("tiny-a")).unwrap().with_preview_decoder(&decoder).unwrap();
    let request = Request { width: 64, height: 64, steps: 1, seed: 0, guidance: 1.0, vae_tile: None, memory_budget: None, references: Vec::new(), lora: Default::default(), init: None, kv_cache: false, kv_precision: Default::default() };
    let sizes = planning::ModelSizes::from_files(&model).unwrap();
    assert_eq!(planning::plan(flux_lite_tests::gpu(), &model, &sizes, &request).unwrap().preview.map(|p| p.tile), Some(None));
    // 64×64: 16 channels at full size and the 64-wide pool at 32×32 take 256 KiB an activation.
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(128 * 1024), ..Default::default() }).unwrap();
    let banded = planning::plan(&small, &model, &sizes, &request).unwrap().preview.unwrap();
    assert_eq!((banded.tile, banded.on_device), (Some(64), true), "{banded:?}");
    // A row of the 16-channel convolutions at 64 wide, with its halo, takes more than 8 KiB.
    let narrow = Gpu::new(&GpuOptions { max_storage_binding: Some(8 * 1024), ..Default::default() }).unwrap();
    let err = planning::plan(&narrow, &model, &sizes, &request).unwrap_err().to_string();
    assert!(err.contains("taesd.safetensors: the preview decoder cannot run at 64×64: one row of the preview decoder's widest convolution at 64 pixels wide needs"), "{err}");
    // A forced VAE tile bands the preview too.
    let forced = planning::plan(flux_lite_tests::gpu(), &model, &sizes, &Request { vae_tile: Some(32), ..request }).unwrap();
    assert_eq!(forced.preview.map(|p| (p.tile, p.on_device)), Some((Some(32), false)));
}

/// Collects the previews' pixels.
struct Kept {
    images: Vec<Vec<u8>>,
}

impl flux_lite_platform::Observer for Kept {
    fn previews(&self) -> Option<usize> {
        Some(1)
    }

    fn preview(&mut self, p: &flux_lite_platform::Preview<'_>) {
        self.images.push(p.rgb.to_vec());
    }
}

/// A run whose VAE tile bands the preview decoder (activations on the
/// host), and one on an adapter whose bindings cannot hold it whole (bands
/// with the activations on the device), draw the previews the whole
/// decoder draws, a level apart at most (the global norm's statistics are
/// summed in another order).
#[test]
fn banded_previews_draw_what_whole_ones_draw() {
    use flux_lite_platform::{GpuOptions, Job, Limits, Options, Pipeline, Prompt};
    let decoder = test_vectors().join("goldens/tiny_decoder/taesd.safetensors");
    let open = |gpu: GpuOptions| Pipeline::open(&model_dir("tiny-a"), Options { preview_decoder: Some(decoder.clone()), gpu, ..Options::default() }).unwrap();
    let run = |pipeline: &Pipeline, vae_tile: Option<usize>| {
        let job = Job { width: Some(64), height: Some(48), steps: Some(2), seed: Some(3), vae_tile, ..Job::new(Prompt::text("a fox")) };
        let job = job.resolve(pipeline.model(), &Limits::default()).unwrap();
        let layout = pipeline.plan(&job).unwrap().preview.map(|p| (p.tile, p.on_device));
        let mut kept = Kept { images: Vec::new() };
        pipeline.run(&job, &mut kept, &mut |_| Ok(())).unwrap();
        (layout, kept.images)
    };
    let roomy = open(flux_lite_kernels::test_devices::options());
    // 64×48: the 16-channel activations at full size take 192 KiB.
    let narrow = open(GpuOptions { max_storage_binding: Some(128 * 1024), ..flux_lite_kernels::test_devices::options() });
    let (whole, on_host, on_device) = (run(&roomy, None), run(&roomy, Some(16)), run(&narrow, None));
    assert_eq!((whole.0, on_host.0, on_device.0), (Some((None, true)), Some((Some(16), false)), Some((Some(64), true))));
    for (label, banded) in [("on the host", &on_host.1), ("on the device", &on_device.1)] {
        assert_eq!((whole.1.len(), banded.len()), (2, 2));
        for (a, b) in whole.1.iter().zip(banded) {
            assert_eq!(a.len(), 64 * 48 * 3);
            let worst = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
            assert!(worst <= 1, "a preview banded {label} is {worst} levels off the whole one's");
        }
    }
}

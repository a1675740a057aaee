//! GGUF weights: every GGML type expanded on the device bit for bit as
//! gguf-py's `dequantize` (test_vectors/gguf, written by
//! `test_vectors/generate_gguf.py` with gguf-py's own writer).

#![allow(clippy::unwrap_used)]

use flux_lite_core::ggml::GgmlType;
use flux_lite_kernels::kernels;
use flux_lite_platform::model::gguf;
use flux_lite_platform::{Gpu, GpuOptions};
use flux_lite_tests::test_vectors;
use safetensors::SafeTensors;

fn read(name: &str) -> Vec<u8> {
    let path = test_vectors().join("gguf").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A quantized tensor of `blocks.gguf`: its GGML blocks and gguf-py's expansion of them (f32 bits).
struct Golden {
    tensor: gguf::GgufTensor,
    blocks: Vec<u8>,
    want: Vec<u32>,
}

/// Every quantized tensor of `blocks.gguf` with gguf-py's expansion from `expanded.safetensors`.
fn goldens() -> Vec<Golden> {
    let file = read("blocks.gguf");
    let expanded_bytes = read("expanded.safetensors");
    let expanded = SafeTensors::deserialize(&expanded_bytes).unwrap();
    let header = gguf::parse(&file).unwrap();
    header
        .tensors
        .into_iter()
        .filter(|t| t.ggml.is_quantized())
        .map(|t| {
            let want: Vec<u32> = expanded.tensor(&t.name).unwrap().data().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!(want.len(), t.elements(), "{}", t.name);
            Golden { blocks: file[t.range.clone()].to_vec(), tensor: t, want }
        })
        .collect()
}

/// Each quantized tensor of the file, from a source offset that is not a
/// binding boundary into a poisoned f32 buffer at a non-zero offset, on the
/// default device and on one whose 2 KiB bindings cut it into a dispatch a
/// block or two: the f32 bits of gguf-py, and nothing around them written.
#[test]
fn every_type_expands_on_the_device_bit_for_bit_as_gguf_py() {
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(2048), ..Default::default() }).unwrap();
    let quantized = goldens();
    assert_eq!(quantized.len(), 10, "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K … Q6_K");
    for gpu in [flux_lite_tests::gpu(), &small] {
        for Golden { tensor: t, blocks, want } in &quantized {
            let lead = 8usize;
            let mut src = vec![0xabu8; lead];
            src.extend(blocks);
            let src = gpu.upload_bytes("blocks", &src);
            let base = 64usize;
            let poison = 0x7fc0_beefu32;
            let out = gpu.upload_u32("expanded", &vec![poison; base + want.len() + 64]);
            let n_blocks = (t.elements() / t.ggml.block_elements()) as u64;
            gpu.submit(|enc| kernels::ggml_expand(gpu, enc, kernels::GgmlBlocks { ggml: t.ggml, scale: 1.0, buf: &src, at: lead as u64 }, n_blocks, &out, base as u64)).unwrap();
            let got: Vec<u32> = gpu.read_bytes(&out, 0, out.size()).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if let Some(k) = (0..want.len()).find(|&k| got[base + k] != want[k]) {
                panic!(
                    "{} on {}: element {k}: {:e} ({:#010x}), gguf-py {:e} ({:#010x})",
                    t.name,
                    gpu.describe(),
                    f32::from_bits(got[base + k]),
                    got[base + k],
                    f32::from_bits(want[k]),
                    want[k]
                );
            }
            assert!(got[..base].iter().chain(&got[base + want.len()..]).all(|&w| w == poison), "{}: words outside its place written", t.name);
        }
    }
}

/// Each quantized tensor's rows expanded straight into the matrix tier's
/// f16 operand (`ggml_expand_half`), from a source offset that is not a
/// binding boundary, on the default device and on one whose 2 KiB bindings
/// take a row a dispatch: gguf-py's values packed under the range rule
/// (`range_rule::pack_rows`), words and scales, and nothing around them written.
#[test]
fn every_type_expands_into_f16_rows_as_the_range_rule_packs_gguf_pys_values() {
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(2048), ..Default::default() }).unwrap();
    for gpu in [flux_lite_tests::gpu(), &small] {
        for Golden { tensor: t, blocks, want } in goldens() {
            let (rows, k) = (t.shape[0], t.shape[1]);
            assert!(kernels::expands_half(t.ggml, k as u64), "{}", t.name);
            let values: Vec<f32> = want.iter().map(|&b| f32::from_bits(b)).collect();
            let (want_words, want_scales) = flux_lite_kernels::range_rule::pack_rows(&values, rows, k);
            let lead = 8usize;
            let mut src = vec![0xabu8; lead];
            src.extend(&blocks);
            let src = gpu.upload_bytes("blocks", &src);
            let (words_at, scales_at, poison) = (64usize, 8usize, 0x7fc0_beefu32);
            let words = gpu.upload_u32("words", &vec![poison; words_at + rows * k / 2 + 64]);
            let scales = gpu.upload_u32("scales", &vec![poison; scales_at + rows + 8]);
            gpu.submit(|enc| kernels::ggml_expand_half(gpu, enc, kernels::GgmlBlocks { ggml: t.ggml, scale: 1.0, buf: &src, at: lead as u64 }, [rows as u64, k as u64], (&words, words_at as u64), (&scales, scales_at as u64))).unwrap();
            let read = |b: &flux_lite_kernels::DeviceBuffer| -> Vec<u32> { gpu.read_bytes(b, 0, b.size()).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect() };
            let (got_words, got_scales) = (read(&words), read(&scales));
            let on = gpu.describe();
            assert_eq!(&got_words[words_at..words_at + rows * k / 2], &want_words[..], "{} on {on}: f16 words", t.name);
            let scales_bits: Vec<u32> = want_scales.iter().map(|s| s.to_bits()).collect();
            assert_eq!(&got_scales[scales_at..scales_at + rows], &scales_bits[..], "{} on {on}: row scales", t.name);
            let outside = got_words[..words_at].iter().chain(&got_words[words_at + rows * k / 2..]).chain(&got_scales[..scales_at]).chain(&got_scales[scales_at + rows..]);
            assert!(outside.into_iter().all(|&w| w == poison), "{} on {on}: words outside its place written", t.name);
        }
    }
}

/// On the matrix tier, tiny-q's transformer expanded once at load takes
/// each linear's weight in GGML blocks straight into f16 rows under their
/// range scales, as the products read a packed weight: every weight the
/// store holds in blocks (the file's 14 quantized tensors of
/// generate_gguf_model.py's `QUANTIZED`, its two fused QKV ones split into
/// three: each a linear's weight read in whole rows), none left in f32. Its velocity is
/// bit for bit that of the weights kept in their blocks, whose linears
/// expand their rows into f16 as they run (in one pass, and on 128 KiB
/// bindings in many). Its device bytes are within the planner's count for
/// this data path, and under that of f32 expansions.
#[test]
fn a_gguf_transformer_on_the_matrix_tier_expands_into_f16_at_load_with_the_bits_of_its_blocks() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    use flux_lite_platform::model::{Component, ModelFolder};
    let (text, lat_h, lat_w) = (8, 2, 3);
    let model = ModelFolder::open(&flux_lite_tests::model_dir("tiny-q")).unwrap();
    // The queries' and keys' norms as passes: the in-blocks products cannot
    // take them in their epilogue, whose sums of squares run in another order.
    let run_normed = |binding: Option<u64>, strategy, head_norm_passes: bool| {
        let mut options = GpuOptions { precision: flux_lite_platform::Precision::Matrix, max_storage_binding: binding, ..flux_lite_kernels::test_devices::options() };
        options.faults.head_norm_passes = head_norm_passes;
        let gpu = flux_lite_kernels::test_devices::tier_gpu_with(options)?;
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(&gpu, &model.transformer, store, strategy, None, text, &LatentGrids::noise_only(lat_h, lat_w)).unwrap();
        let expansions = expansions(&gpu, t.blocks(), &model.weights(Component::Transformer).unwrap());
        Some((flux_lite_tests::velocity_of_two_passes(&gpu, &t, text), t.half_packed_weights(), t.weight_bytes(), t.dispatches(), expansions))
    };
    let run = |binding, strategy| run_normed(binding, strategy, false);
    let Some((expanded, packed, bytes, expanded_dispatches, _)) = run(None, WeightStrategy::ResidentBf16) else { return };
    assert!(expanded.iter().all(|v| v.is_finite()));
    // With the queries' and keys' norms as passes after their projections:
    // the same velocity up to the norms' rounding, which the epilogue does
    // once where the passes round twice.
    let (passes, _, _, _, _) = run_normed(None, WeightStrategy::ResidentBf16, true).unwrap();
    let largest = expanded.iter().fold(0f32, |m, v| m.max(v.abs()));
    let moved = passes.iter().zip(&expanded).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    println!("tiny-q velocity with the head norms in the epilogue: max |Δ| {moved} against the passes' (largest |v| {largest})");
    assert!(passes.iter().all(|v| v.is_finite()) && moved > 0.0, "the epilogue's norms round once");
    let store = model.weights(Component::Transformer).unwrap();
    let in_ggml_blocks = store.names().filter(|name| store.quantized(name).is_some()).count();
    assert!(in_ggml_blocks >= 14, "{in_ggml_blocks} weights in GGML blocks");
    let mut sizes = Transformer::weight_sizes(&model.transformer, &store, text, lat_h * lat_w).unwrap();
    sizes.keep_row_scales();
    let as_f32 = sizes.bytes(WeightStrategy::ResidentBf16);
    sizes.expand_half();
    let planned = sizes.bytes(WeightStrategy::ResidentBf16);
    println!("tiny-q expanded at load on the matrix tier: {packed} weights packed ({in_ggml_blocks} from GGML blocks), {bytes} device bytes of weights, planned {planned} (f32 expansions: {as_f32})");
    assert!(bytes <= planned, "{bytes} device bytes of weights, planned {planned}");
    assert!(planned < as_f32, "f16 rows ({planned} B) should take less than f32 ones ({as_f32} B)");
    // Kept in blocks, a product expands its rows into f16 as it runs and
    // takes the expanded weight's epilogue (f16 pieces, heads normed, the
    // gated residual, SwiGLU): its expansions are its only extra dispatches.
    for binding in [None, Some(128 << 10)] {
        let (got, in_blocks, _, dispatches, expansions) = run(binding, WeightStrategy::ResidentDf11 { slots: 1 }).unwrap();
        println!("tiny-q kept in GGML blocks, bindings {binding:?}: {dispatches} dispatches a pass ({expansions} expansions in one run each), expanded at load {expanded_dispatches}");
        assert_eq!(packed, in_blocks + in_ggml_blocks, "bindings {binding:?}: the weights in GGML blocks expanded into f16 at load");
        assert!(got.iter().map(|v| v.to_bits()).eq(expanded.iter().map(|v| v.to_bits())), "in blocks, bindings {binding:?}: the velocity differs from the expanded weights'");
        if binding.is_none() {
            assert_eq!(dispatches, expanded_dispatches + expansions, "one expansion a product's weight rows, nothing else added");
        }
    }
}

/// The expansions of a forward pass of `blocks` on `gpu` whose weights in
/// GGML blocks (`store`'s) stay so, every product's rows in one run: one for
/// each product over such a weight, two for a SwiGLU product that takes its
/// epilogue (its gate rows, then its up rows; one where it cannot write its
/// f16 pieces and runs as a product of both halves and passes).
fn expansions(gpu: &flux_lite_platform::Gpu, blocks: &[Vec<flux_lite_core::ir::Op>], store: &flux_lite_platform::model::safetensors_store::WeightStore) -> usize {
    use flux_lite_core::ir::Op;
    blocks
        .iter()
        .flatten()
        .map(|op| match op {
            Op::Linear { w, .. } | Op::LinearHalf { w, .. } if store.quantized(w).is_some() => 1,
            Op::LinearSwiGlu { w, y, .. } if store.quantized(w).is_some() => match y.piece {
                Some(piece) if !flux_lite_kernels::kernels::swiglu_writes_pieces(gpu, piece) => 1,
                _ => 2,
            },
            _ => 0,
        })
        .sum()
}

/// The file gguf-py wrote reads with the shapes and types it was given.
#[test]
fn gguf_py_files_parse_with_their_shapes_and_types() {
    let file = read("blocks.gguf");
    let header = gguf::parse(&file).unwrap();
    assert_eq!(header.architecture.as_deref(), Some("flux"));
    for t in &header.tensors {
        assert_eq!(t.shape, vec![6, 512], "{}", t.name);
        assert_eq!(GgmlType::from_name(&t.name), Some(t.ggml), "{} is named after its type", t.name);
        assert_eq!(t.range.len() as u64, t.ggml.bytes_of(6 * 512).unwrap());
    }
}

/// tiny-q's transformer, one GGUF file holding every quantized type (its
/// `transformer/` folder holds it beside config.json), placed every way the
/// planner may place it: expanded once at load, kept in GGML blocks (one
/// or two slots: the blocks need none), streamed from the file into slots: the
/// velocity is bit for bit the same, and the device bytes stay within the
/// planner's count of that strategy, which counts the blocks, not an expansion.
/// Kept or streamed, a linear expands its weight's rows into a scratch as it
/// runs, as many as the scratch holds at a time.
#[test]
fn a_gguf_transformer_runs_the_same_under_every_strategy() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    use flux_lite_platform::model::{Component, ModelFolder};
    let gpu = flux_lite_tests::gpu();
    let model = ModelFolder::open(&flux_lite_tests::model_dir("tiny-q")).unwrap();
    let (text, lat_h, lat_w) = (8, 2, 3);
    let store = model.weights(Component::Transformer).unwrap();
    let types = store.quantized_types();
    assert_eq!(types.len(), 10, "every quantized type: {types:?}");
    let sizes = Transformer::weight_sizes(&model.transformer, &store, text, lat_h * lat_w).unwrap();
    assert!(sizes.has_df11(), "blocks kept quantized are a strategy");
    let mut want = None;
    let mut expanded_dispatches = 0;
    for strategy in [
        WeightStrategy::ResidentBf16,
        WeightStrategy::ResidentDf11 { slots: 1 },
        WeightStrategy::ResidentDf11 { slots: 2 },
        WeightStrategy::Streamed { slots: 1 },
        WeightStrategy::Streamed { slots: 2 },
    ] {
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(gpu, &model.transformer, store, strategy, None, text, &LatentGrids::noise_only(lat_h, lat_w)).unwrap();
        let got = flux_lite_tests::velocity_of_two_passes(gpu, &t, text);
        assert!(t.weight_bytes() <= sizes.bytes(strategy), "{strategy:?}: {} device bytes, planned {}", t.weight_bytes(), sizes.bytes(strategy));
        // Kept in blocks, a product takes the expanded weight's epilogue (the
        // gated residual, SwiGLU): its expansions are its only extra dispatches.
        match strategy {
            WeightStrategy::ResidentBf16 => expanded_dispatches = t.dispatches(),
            WeightStrategy::ResidentDf11 { .. } => {
                let expansions = expansions(gpu, t.blocks(), &model.weights(Component::Transformer).unwrap());
                assert_eq!(t.dispatches(), expanded_dispatches + expansions, "{strategy:?}");
            }
            _ => {}
        }
        assert!(got.iter().all(|v| v.is_finite()));
        match &want {
            None => want = Some(got),
            Some(w) => assert!(got.iter().map(|v| v.to_bits()).eq(w.iter().map(|v| v.to_bits())), "{strategy:?}: the velocity differs"),
        }
    }
    // On a device whose 128 KiB bindings hold 32 to 128 rows of f32 at a time,
    // each linear over GGML blocks expands and multiplies its rows in many
    // passes: the velocity is still bit for bit the one of the weights
    // expanded whole at load on that device.
    let small = flux_lite_platform::Gpu::new(&flux_lite_platform::GpuOptions { max_storage_binding: Some(128 << 10), ..Default::default() }).unwrap();
    let mut whole = None;
    for strategy in [WeightStrategy::ResidentBf16, WeightStrategy::ResidentDf11 { slots: 1 }, WeightStrategy::Streamed { slots: 1 }] {
        let store = model.weights(Component::Transformer).unwrap();
        let t = Transformer::new(&small, &model.transformer, store, strategy, None, text, &LatentGrids::noise_only(lat_h, lat_w)).unwrap();
        let got = flux_lite_tests::velocity_of_two_passes(&small, &t, text);
        match &whole {
            None => whole = Some(got),
            Some(w) => assert!(got.iter().map(|v| v.to_bits()).eq(w.iter().map(|v| v.to_bits())), "{strategy:?} in passes: the velocity differs"),
        }
    }
    let kept = sizes.bytes(WeightStrategy::ResidentDf11 { slots: 1 });
    let expanded = sizes.bytes(WeightStrategy::ResidentBf16);
    // One f32 slot of the largest block beside every block's GGML bytes, against every weight as f32.
    assert!(kept < expanded, "kept in blocks ({kept} B) is under expanded to f32 ({expanded} B)");
}

/// The host's expansion (the text encoder's embedding rows use it): every
/// type bit for bit as gguf-py, as the device's.
#[test]
fn every_type_expands_on_the_host_bit_for_bit_as_gguf_py() {
    for Golden { tensor: t, blocks, want } in goldens() {
        let mut got = vec![f32::NAN; t.elements()];
        flux_lite_core::ggml::expand_into(t.ggml, 1.0, &blocks, &mut got);
        if let Some(k) = (0..want.len()).find(|&k| got[k].to_bits() != want[k]) {
            panic!("{}: element {k}: {:e}, gguf-py {:e}", t.name, got[k], f32::from_bits(want[k]));
        }
    }
}

/// `flux-lite quantize`'s K-quant blocks are llama.cpp's reference
/// quantizers' (`test_vectors/generate_kquants.py`): every block of every
/// type byte for byte, over weight-like rows, outliers, one-signed,
/// constant, all-zero, near-subnormal (degenerate fits) and large blocks.
#[test]
fn k_quants_are_llama_cpps_reference_blocks() {
    use flux_lite_platform::model::quantize::quantize;
    let dir = test_vectors().join("goldens/kquants");
    let input: Vec<f32> = std::fs::read(dir.join("input.bin")).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    for ggml in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let want = std::fs::read(dir.join(format!("{}.bin", ggml.name()))).unwrap();
        let got = quantize(ggml, &input);
        assert_eq!(got.len(), want.len(), "{}", ggml.name());
        let bb = ggml.block_bytes();
        let differing: Vec<usize> = (0..want.len() / bb).filter(|b| got[b * bb..(b + 1) * bb] != want[b * bb..(b + 1) * bb]).collect();
        assert!(differing.is_empty(), "{}: blocks {differing:?} of {} differ from llama.cpp's", ggml.name(), want.len() / bb);
    }
}

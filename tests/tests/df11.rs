//! The DF11 codec against files written by the official compressor (pip `dfloat11` 0.5.0, see
//! `test_vectors/generate_df11.py`): the tiny-b transformer as an official DF11 folder, and
//! synthetic groups. Every group decodes bit for bit to the original bf16 words, and our
//! encoder, given the same weights, writes a group that decodes the same, within 1% of the
//! official size (printed) and, for these vectors, byte-identical.

use flux_lite_core::df11::{Codebook, Df11Field, Df11Fields, Df11Group, Df11GroupBuf};
use flux_lite_platform::model::config_json::JsonFile;
use flux_lite_platform::model::df11::{field_dtype, Df11Config};
use flux_lite_tests::{model_dir, test_vectors};
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The model whose transformer generate_df11.py compressed.
const MODEL: &str = "tiny-b";

fn df11_dir() -> PathBuf {
    test_vectors().join("goldens/df11")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse<'a>(bytes: &'a [u8], path: &Path) -> SafeTensors<'a> {
    SafeTensors::deserialize(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The six fields of group `prefix`, with the dtypes official files use.
fn fields<'a>(st: &'a SafeTensors<'a>, prefix: &str) -> Df11Fields<'a> {
    let get = |field: Df11Field| {
        let name = format!("{prefix}.{}", field.name());
        let t = st.tensor(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), field_dtype(field), "{name}");
        let rank = if field == Df11Field::Luts { 2 } else { 1 };
        assert_eq!(t.shape().len(), rank, "{name}");
        t.data()
    };
    Df11Fields {
        luts: get(Df11Field::Luts),
        encoded_exponent: get(Df11Field::EncodedExponent),
        sign_mantissa: get(Df11Field::SignMantissa),
        output_positions: get(Df11Field::OutputPositions),
        gaps: get(Df11Field::Gaps),
        split_positions: get(Df11Field::SplitPositions),
    }
}

fn words(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

fn decode(group: &Df11Group<'_>) -> Vec<u16> {
    let mut out = vec![0xdead; group.n_elements()];
    group.decode_into(&mut out).unwrap_or_else(|e| panic!("{e}"));
    out
}

/// Where two groups differ, field by field (`None`: byte-identical).
fn differences(ours: &Df11Fields<'_>, official: &Df11Fields<'_>) -> Option<String> {
    let differ: Vec<&str> =
        Df11Field::ALL.iter().filter(|&&f| ours.get(f) != official.get(f)).map(|f| f.name()).collect();
    (!differ.is_empty()).then(|| differ.join(", "))
}

/// The official DF11 transformer folder: the file, each group's weight names in concatenation
/// order (from `dfloat11_config.pattern_dict`), and the original bf16 weights.
struct Transformer {
    path: PathBuf,
    bytes: Vec<u8>,
    groups: BTreeMap<String, Vec<String>>,
    original: BTreeMap<String, Vec<u16>>,
}

impl Transformer {
    fn load() -> Self {
        let dir = df11_dir().join(format!("{MODEL}-transformer"));
        let json = JsonFile::read(&dir.join("config.json")).unwrap_or_else(|e| panic!("{e}"));
        let df11 = &json.value["dfloat11_config"];
        assert_eq!(df11["version"], "0.5.0");
        assert_eq!(df11["threads_per_block"], serde_json::json!([512]));
        assert_eq!(df11["bytes_per_thread"], 8);
        let patterns = Df11Config::read(&json).unwrap_or_else(|e| panic!("{e}")).expect("dfloat11_config");

        let path = dir.join("model.safetensors");
        let bytes = read(&path);
        let names: Vec<String> = parse(&bytes, &path).names().into_iter().map(str::to_string).collect();
        let mut groups = BTreeMap::new();
        for prefix in names.iter().filter_map(|n| n.strip_suffix(".luts")) {
            assert_eq!(patterns.patterns_matching(prefix).count(), 1, "{prefix}: exactly one pattern");
            groups.insert(prefix.to_string(), patterns.weights_of(prefix).expect("a pattern"));
        }

        let mut original = BTreeMap::new();
        let bf16_dir = model_dir(MODEL).join("transformer");
        for entry in std::fs::read_dir(&bf16_dir).expect("transformer dir") {
            let file = entry.expect("entry").path();
            if file.extension().is_some_and(|e| e == "safetensors") {
                let data = read(&file);
                for (name, t) in parse(&data, &file).tensors() {
                    assert_eq!(t.dtype(), Dtype::BF16, "{name}");
                    original.insert(name, words(t.data()));
                }
            }
        }
        Self { path, bytes, groups, original }
    }

    /// The original weights of a group's linears, in concatenation order.
    fn weights(&self, prefix: &str) -> Vec<&[u16]> {
        self.groups[prefix]
            .iter().map(|n| self.original.get(n).unwrap_or_else(|| panic!("{n} not in the bf16 model")).as_slice()).collect()
    }
}

#[test]
fn official_transformer_decodes_to_the_bf16_weights() {
    let tr = Transformer::load();
    let st = parse(&tr.bytes, &tr.path);
    // FLUX.2 klein layout: 12 linears per double block, 2 per single block, 5 lone linears.
    let blocks = (1, 3);
    assert_eq!(tr.groups.len(), blocks.0 + blocks.1 + 5, "{:?}", tr.groups.keys());
    let mut compressed = 0;
    for prefix in tr.groups.keys() {
        let group = Df11Group::new(fields(&st, prefix)).unwrap_or_else(|e| panic!("{prefix}: {e}"));
        let weights = tr.weights(prefix);
        let decoded = decode(&group);
        let ranges: Vec<_> = group.weight_ranges().collect();
        assert_eq!(ranges.len(), weights.len(), "{prefix}: split_positions");
        for (i, (range, want)) in ranges.into_iter().zip(&weights).enumerate() {
            let got = &decoded[range];
            assert_eq!(got.len(), want.len(), "{prefix}: linear {i} length");
            if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
                panic!("{prefix}: linear {i} element {k}: {:#06x}, want {:#06x}", got[k], want[k]);
            }
        }
        compressed += weights.len();
        assert!(group.official_shared_mem_bytes() <= 48 * 1024, "{prefix}");
    }
    // Everything else (norms inside the blocks too) is stored as the original bf16.
    let is_field = |name: &str| {
        tr.groups.keys().any(|p| Df11Field::ALL.iter().any(|f| name == format!("{p}.{}", f.name())))
    };
    let mut rest = 0;
    for (name, t) in st.tensors() {
        if !is_field(&name) {
            assert_eq!(words(t.data()), tr.original[&name], "{name}");
            rest += 1;
        }
    }
    assert_eq!(compressed + rest, tr.original.len(), "every bf16 tensor is compressed or kept");
}

#[test]
fn our_encoder_matches_the_official_transformer() {
    let tr = Transformer::load();
    let st = parse(&tr.bytes, &tr.path);
    let (mut ours_total, mut official_total, mut identical) = (0, 0, 0);
    for prefix in tr.groups.keys() {
        let official = fields(&st, prefix);
        let weights = tr.weights(prefix);
        let ours = Df11GroupBuf::encode(&weights).unwrap_or_else(|e| panic!("{prefix}: {e}"));
        let group = ours.group().unwrap_or_else(|e| panic!("{prefix}: {e}"));
        assert!(decode(&group) == weights.concat(), "{prefix}: our group does not decode to the weights");
        let (a, b) = (ours.total_bytes(), official.total_bytes());
        let diff = differences(&ours.fields(), &official);
        println!("{prefix}: ours {a} bytes, official {b} bytes, {}", diff.as_deref().map_or("identical".into(), |d| format!("differ in {d}")));
        assert!((a as f64 - b as f64).abs() <= 0.01 * b as f64, "{prefix}: {a} vs {b} bytes");
        ours_total += a;
        official_total += b;
        identical += usize::from(diff.is_none());
    }
    println!(
        "{MODEL} transformer: ours {ours_total} bytes, official {official_total} bytes ({:+.3}%), {identical} of {} groups byte-identical",
        100.0 * (ours_total as f64 / official_total as f64 - 1.0),
        tr.groups.len()
    );
    assert!((ours_total as f64 - official_total as f64).abs() <= 0.01 * official_total as f64);
    // The format allows other bytes (numpy's choice among equal counts when the 32-bit cap
    // kicks in, spec §2.3; our padded positions, §2.7), but neither happens here.
    assert_eq!(identical, tr.groups.len(), "every group byte-identical to the official one");
}

const CASES: [&str; 4] = ["near_uniform", "long_codes", "many_blocks", "multi_linear"];

#[test]
fn synthetic_groups() {
    let path = df11_dir().join("synthetic.safetensors");
    let bytes = read(&path);
    let st = parse(&bytes, &path);
    for case in CASES {
        let official = fields(&st, case);
        let group = Df11Group::new(official).unwrap_or_else(|e| panic!("{case}: {e}"));
        let words_t = st.tensor(&format!("{case}.weights")).expect("weights");
        assert_eq!(words_t.dtype(), Dtype::BF16);
        let want = words(words_t.data());
        let got = decode(&group);
        if let Some(k) = (0..want.len()).find(|&k| got[k] != want[k]) {
            panic!("{case}: element {k}: {:#06x}, want {:#06x}", got[k], want[k]);
        }
        assert_eq!(got.len(), want.len(), "{case}");

        // The code book from the stored histogram, and the group our encoder writes with it.
        let counts_t = st.tensor(&format!("{case}.counts")).expect("counts");
        let counts: Vec<u64> = counts_t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8")) as u64).collect();
        let codebook = Codebook::from_counts(&counts.try_into().expect("256 counts")).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(codebook.luts() == official.luts, "{case}: our code book's luts differ from the official ones");
        let linears: Vec<&[u16]> = group.weight_ranges().map(|r| &want[r]).collect();
        let ours = Df11GroupBuf::encode_with(&codebook, &linears).unwrap_or_else(|e| panic!("{case}: {e}"));
        let diff = differences(&ours.fields(), &official);
        println!(
            "{case}: {} elements, {} blocks, {} LUT rows, longest code {} bits; ours {} bytes, official {} bytes, {}",
            group.n_elements(),
            group.n_blocks(),
            group.n_luts(),
            codebook.max_len(),
            ours.total_bytes(),
            official.total_bytes(),
            diff.as_deref().map_or("identical".into(), |d| format!("differ in {d}"))
        );
        assert_eq!(diff, None, "{case}");
    }
}

#[test]
fn synthetic_cases_cover_what_they_claim() {
    let path = df11_dir().join("synthetic.safetensors");
    let bytes = read(&path);
    let st = parse(&bytes, &path);
    let group = |case| Df11Group::new(fields(&st, case)).unwrap_or_else(|e| panic!("{case}: {e}"));
    let long = group("long_codes");
    let lengths = &long.fields().luts[long.fields().luts.len() - 256..];
    assert_eq!(lengths.iter().max(), Some(&32), "long_codes reaches 32-bit codes");
    assert_eq!(long.n_luts(), 5, "long_codes uses all four lookup levels");
    assert!(group("many_blocks").n_blocks() >= 3);
    assert_eq!(group("many_blocks").n_luts(), 18, "many_blocks has 16 sub-tables, the most there can be");
    assert_eq!(group("multi_linear").split_positions().collect::<Vec<_>>(), [1536, 2304]);
    let near_uniform = group("near_uniform");
    let lengths = &near_uniform.fields().luts[near_uniform.fields().luts.len() - 256..];
    assert_eq!(lengths.iter().filter(|&&l| l != 0).count(), 240, "near_uniform codes every exponent 0..=239");
}

/// Every official group (the tiny-b transformer's and the synthetic ones)
/// expanded by the `df11_decode` kernel into a slot at a non-zero offset, on
/// the default device and on one whose 64 KiB bindings split the larger
/// groups into dispatches of two or three blocks: bit for bit the CPU
/// decode, and the slot around it untouched.
#[test]
fn the_gpu_kernel_decodes_official_groups_bit_for_bit() {
    use flux_lite_platform::model::df11::Df11DeviceGroup;
    use flux_lite_platform::{Gpu, GpuOptions};
    let transformer = df11_dir().join("tiny-b-transformer/model.safetensors");
    let synthetic = df11_dir().join("synthetic.safetensors");
    let (tb, sb) = (read(&transformer), read(&synthetic));
    let (ts, ss) = (parse(&tb, &transformer), parse(&sb, &synthetic));
    let mut groups: Vec<(String, Df11Fields<'_>)> = CASES.iter().map(|c| (c.to_string(), fields(&ss, c))).collect();
    for (name, _) in ts.tensors() {
        if let Some(prefix) = name.strip_suffix(".encoded_exponent") {
            groups.push((prefix.to_string(), fields(&ts, prefix)));
        }
    }
    assert!(groups.len() >= 13, "four synthetic groups and nine from the transformer");
    let small = Gpu::new(&GpuOptions { max_storage_binding: Some(64 * 1024), ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
    for gpu in [flux_lite_tests::gpu(), &small] {
        for (name, f) in &groups {
            let group = Df11Group::new(*f).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = decode(&group);
            let device = Df11DeviceGroup::upload(gpu, &group);
            // Poisoned words before, inside and after the group's place in the slot.
            let base = 128usize;
            let poison = vec![0xbeefu16; base + want.len() + 130];
            let poison_bytes: Vec<u8> = poison.iter().flat_map(|w| w.to_le_bytes()).collect();
            let slot = gpu.upload_bytes("slot", &poison_bytes);
            gpu.submit(|enc| device.record_decode(gpu, enc, &slot, base as u64)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let bytes = gpu.read_bytes(&slot, 0, 2 * poison.len() as u64).unwrap_or_else(|e| panic!("{e}"));
            let got = words(&bytes);
            if let Some(k) = (0..want.len()).find(|&k| got[base + k] != want[k]) {
                panic!("{name}: element {k} of {}: {:#06x}, want {:#06x}", want.len(), got[base + k], want[k]);
            }
            assert!(got[..base].iter().all(|&w| w == 0xbeef), "{name}: words before the group were written");
            // The word holding an odd group's last element may gain a zero high half.
            let after = base + want.len().next_multiple_of(2);
            assert!(got[after..].iter().all(|&w| w == 0xbeef), "{name}: words after the group were written");
        }
    }
}

/// Streaming under a budget copies a group into a small device area in runs
/// of whole blocks (`AreaRun`): each run's pieces alone (tables, exponents,
/// signs and mantissas, gaps, positions), decoded by `df11_decode_blocks`
/// into the slot after one `df11_clear`. With an area that holds only a few
/// blocks, every multi-block group comes out bit for bit the CPU decode.
#[test]
fn a_group_streamed_through_a_small_area_in_runs_decodes_bit_for_bit() {
    use flux_lite_kernels::kernels;
    use flux_lite_platform::model::df11::{block_positions, AreaRun};
    let gpu = flux_lite_tests::gpu();
    let synthetic = df11_dir().join("synthetic.safetensors");
    let sb = read(&synthetic);
    let ss = parse(&sb, &synthetic);
    let align = gpu.binding_alignment().max(256);
    let mut runs_seen = 0;
    for case in CASES {
        let group = Df11Group::new(fields(&ss, case)).unwrap_or_else(|e| panic!("{case}: {e}"));
        if group.n_blocks() < 3 {
            continue;
        }
        let want = decode(&group);
        let positions = block_positions(&group);
        // Room for the first block's pieces (and what their padding leaves): several runs.
        let capacity = AreaRun::new(&group, &positions, 0..1, align).bytes;
        let runs = AreaRun::cut(&group, &positions, capacity, align).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(runs.len() >= 2 && runs.iter().all(|r| r.bytes <= capacity), "{case}: {} runs", runs.len());
        assert_eq!(runs.first().unwrap().blocks.start, 0);
        assert!(runs.windows(2).all(|w| w[0].blocks.end == w[1].blocks.start) && runs.last().unwrap().blocks.end == group.n_blocks() as u64);
        runs_seen += runs.len();
        let base = 256u64;
        let slot = gpu.upload_bytes("slot", &vec![0xabu8; 2 * (base as usize + want.len() + 2)]);
        let f = group.fields();
        let position_bytes: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
        for (i, run) in runs.iter().enumerate() {
            // The area as the staging copies leave it: each piece at its place, the rest poisoned.
            let mut area = vec![0x5au8; capacity as usize];
            for (array, piece) in [(f.luts, &run.luts), (f.encoded_exponent, &run.stream), (f.sign_mantissa, &run.sign_mantissa), (f.gaps, &run.gaps), (&position_bytes[..], &run.positions)] {
                let bytes = &array[piece.source.clone()];
                area[piece.at as usize..][..bytes.len()].copy_from_slice(bytes);
                area[piece.at as usize + bytes.len()..(piece.at + piece.len) as usize].fill(0);
            }
            let area = gpu.upload_bytes("area", &area);
            let arrays = run.arrays(&area, &group, &positions);
            gpu.submit(|enc| {
                if i == 0 {
                    kernels::df11_clear(gpu, enc, arrays, &slot, base)?;
                }
                kernels::df11_decode_blocks(gpu, enc, arrays, &slot, base, run.blocks.clone())
            })
            .unwrap_or_else(|e| panic!("{case} run {i}: {e}"));
        }
        let got = words(&gpu.read_bytes(&slot, 2 * base, 2 * want.len() as u64).unwrap());
        if let Some(k) = (0..want.len()).find(|&k| got[k] != want[k]) {
            panic!("{case}: element {k} of {}: {:#06x}, want {:#06x}", want.len(), got[k], want[k]);
        }
    }
    assert!(runs_seen >= 4, "no group was large enough to stream in runs");
}

/// A model folder with the official DF11 transformer: the store expands every
/// group and then holds exactly the plain transformer's tensors, byte for byte.
#[test]
fn an_official_df11_folder_loads_as_the_bf16_transformer() {
    use flux_lite_platform::model::{Component, ModelFolder};
    let plain = ModelFolder::open(&model_dir(MODEL)).unwrap_or_else(|e| panic!("{e}"));
    let want = plain.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
    let df11 = ModelFolder::open(&model_dir(MODEL))
        .and_then(|m| m.with_transformer(&df11_dir().join("tiny-b-transformer")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(df11.transformer, plain.transformer, "the architecture comes from the model folder");
    let mut got = df11.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.df11_groups().len(), 9);
    got.expand_df11_on_host().unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = want.names().collect();
    assert_eq!(got.names().collect::<Vec<_>>(), names);
    for name in names {
        let (a, b) = (got.tensor(name).unwrap(), want.tensor(name).unwrap());
        assert_eq!((a.dtype, a.shape), (b.dtype, b.shape), "{name}");
        assert!(a.bytes == b.bytes, "{name}: expanded bytes differ");
    }
}

/// The transformer run from the official DF11 groups, expanded on the device
/// per block (one or two slots), once at load, or on the host and streamed,
/// computes the bf16 model's velocity bit for bit; per-block expansion keeps
/// only one block's groups expanded at a time.
#[test]
fn the_transformer_runs_from_groups_expanded_on_the_device() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_platform::model::{Component, ModelFolder};
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    let gpu = flux_lite_tests::gpu();
    let (text, lat_h, lat_w) = (8, 2, 3);
    let run = |model: &ModelFolder, placement: WeightStrategy| {
        let store = model.weights(Component::Transformer).unwrap_or_else(|e| panic!("{e}"));
        let t = Transformer::new(gpu, &model.transformer, store, placement, None, text, &LatentGrids::noise_only(lat_h, lat_w)).unwrap_or_else(|e| panic!("{e}"));
        (flux_lite_tests::velocity_of_two_passes(gpu, &t, text), t.weight_bytes(), t.weight_slot_bytes())
    };
    let plain = ModelFolder::open(&model_dir(MODEL)).unwrap_or_else(|e| panic!("{e}"));
    let (want, plain_bytes, _) = run(&plain, WeightStrategy::ResidentBf16);
    let df11 = ModelFolder::open(&model_dir(MODEL))
        .and_then(|m| m.with_transformer(&df11_dir().join("tiny-b-transformer")))
        .unwrap_or_else(|e| panic!("{e}"));
    let groups_bf16: u64 = {
        let store = df11.weights(Component::Transformer).unwrap();
        store.df11_groups().map(|g| 2 * g.elements).sum()
    };
    let mut slots = Vec::new();
    let strategies = [
        WeightStrategy::ResidentBf16,
        WeightStrategy::ResidentDf11 { slots: 1 },
        WeightStrategy::ResidentDf11 { slots: 2 },
        WeightStrategy::Streamed { slots: 1 },
        WeightStrategy::Streamed { slots: 2 },
    ];
    let sizes = {
        let store = df11.weights(Component::Transformer).unwrap();
        Transformer::weight_sizes(&df11.transformer, &store, text, lat_h * lat_w).unwrap()
    };
    for placement in strategies {
        let (got, bytes, slot) = run(&df11, placement);
        assert!(bytes <= sizes.bytes(placement), "{placement:?}: {bytes} device bytes, planned {}", sizes.bytes(placement));
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "{placement:?}: velocity differs from bf16");
        println!("{placement:?}: {bytes} device bytes of weights, {slot} in slots (bf16 model: {plain_bytes}; groups as bf16: {groups_bf16})");
        slots.push(slot);
    }
    assert_eq!(slots[0], 0, "expanded at load: no slots");
    assert!(slots[1] > 0 && 2 * slots[1] < groups_bf16, "one slot holds one block's groups, not all: {slots:?}");
    assert!(slots[2] > slots[1] && slots[2] <= 2 * slots[1], "two slots: {slots:?}");
}

/// Nothing is allocated on the device inside the denoising loop: forward
/// passes, guidance and Euler steps under each strategy create no buffer (a
/// device of its own, so other tests' buffers are not counted).
#[test]
fn forward_passes_allocate_no_device_memory() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_platform::model::{Component, ModelFolder};
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    use flux_lite_platform::{Gpu, GpuOptions};
    let gpu = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let df11 = ModelFolder::open(&model_dir(MODEL))
        .and_then(|m| m.with_transformer(&df11_dir().join("tiny-b-transformer")))
        .unwrap_or_else(|e| panic!("{e}"));
    for strategy in [WeightStrategy::ResidentBf16, WeightStrategy::ResidentDf11 { slots: 1 }, WeightStrategy::Streamed { slots: 2 }] {
        let store = df11.weights(Component::Transformer).unwrap();
        let t = Transformer::new(&gpu, &df11.transformer, store, strategy, None, 8, &LatentGrids::noise_only(2, 2)).unwrap_or_else(|e| panic!("{e}"));
        t.set_prompt(&gpu, &vec![0.5; 8 * t.layout.joint_dim as usize]).unwrap();
        t.set_latents(&gpu, &vec![0.25; 4 * t.layout.in_channels as usize]).unwrap();
        let before = gpu.memory();
        for (sigma, next) in [(1.0, 0.5), (0.5, 0.0)] {
            t.forward(&gpu, sigma * 1000.0, &mut |_| {}).unwrap();
            t.keep_unconditional(&gpu).unwrap();
            t.forward(&gpu, sigma * 1000.0, &mut |_| {}).unwrap();
            t.guide(&gpu, 4.0).unwrap();
            t.euler_step(&gpu, sigma, next).unwrap();
        }
        let after = gpu.memory();
        assert_eq!(after.allocations, before.allocations, "{strategy:?}: buffers created inside the loop");
        assert_eq!(after.live, before.live, "{strategy:?}");
    }
}

/// A device that cannot hold a component's weights fails before the first
/// byte of them is written: every buffer (resident tensors, groups kept
/// compressed or expanded at load, slots, the streaming area and staging)
/// is allocated first. Each strategy's device bytes are measured on a roomy
/// device, then a device with one byte less refuses them.
#[test]
fn weights_are_allocated_before_any_is_written() {
    use flux_lite_core::plan::WeightStrategy;
    use flux_lite_kernels::FaultInjection;
    use flux_lite_platform::components::transformer::{LatentGrids, Transformer};
    use flux_lite_platform::model::{Component, ModelFolder};
    use flux_lite_platform::exec::device_weights::DeviceWeights;
    use flux_lite_platform::{Gpu, GpuError, GpuOptions, RunError};
    let df11 = ModelFolder::open(&model_dir(MODEL))
        .and_then(|m| m.with_transformer(&df11_dir().join("tiny-b-transformer")))
        .unwrap_or_else(|e| panic!("{e}"));
    let gpu = flux_lite_tests::gpu();
    for strategy in [WeightStrategy::ResidentBf16, WeightStrategy::ResidentDf11 { slots: 1 }, WeightStrategy::Streamed { slots: 2 }] {
        let store = df11.weights(Component::Transformer).unwrap();
        let t = Transformer::new(gpu, &df11.transformer, store, strategy, None, 8, &LatentGrids::noise_only(2, 2)).unwrap_or_else(|e| panic!("{e}"));
        let fresh = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let limit = fresh.memory().live + t.weight_bytes() - 1;
        drop(fresh);
        let faults = FaultInjection { memory_limit: Some(limit), ..Default::default() };
        let small = Gpu::new(&GpuOptions { faults, ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
        let written = small.bytes_written();
        let store = df11.weights(Component::Transformer).unwrap();
        match DeviceWeights::for_blocks(&small, &store, t.blocks(), strategy) {
            Err(RunError::Gpu(GpuError::OutOfMemory(_))) => {}
            other => panic!("{strategy:?}: {} bytes of weights under a device of one byte less: {other:?}", t.weight_bytes()),
        }
        assert_eq!(small.bytes_written(), written, "{strategy:?}: weights written before the allocation failed");
    }
}

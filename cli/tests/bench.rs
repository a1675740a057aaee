//! `flux-lite bench df11` runs on any machine and prints its figures beside
//! their ceilings; the GPU expansion it times is checked bit for bit.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn df11_bench_prints_host_and_gpu_figures_with_their_ceilings() {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "df11", "--elements", "100003", "--repeats", "1"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    assert!(stdout.contains("100003 bf16 weights"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("host decode, 1 thread:") && l.contains("GB/s") && l.contains("copy, 1 thread:")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("gpu decode") && l.contains("buffer copy:") && l.ends_with("bit-exact")), "{stdout}");
}

#[test]
fn df11_bench_rejects_an_empty_group() {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "df11", "--elements", "0", "--no-gpu"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "error: --elements must be at least 1");
}

/// The value after `prefix` on the line that starts with it, up to `until`.
fn figure_after(stdout: &str, prefix: &str, until: &str) -> String {
    let line = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix:?} in {stdout}"));
    line[prefix.len()..].split(until).next().unwrap().to_string()
}

/// `bench traffic`'s dispatch counts: step, double block, single block, VAE
/// decode, VAE encode, text encoder, end to end, preview decode.
fn traffic_dispatches(stdout: &str) -> [u64; 8] {
    ["step: ", "double block: ", "single block: ", "vae decode: ", "vae encode: ", "text encoder: ", "end to end (", "preview decode ("].map(|p| {
        let line = stdout.lines().find(|l| l.starts_with(p)).unwrap_or_else(|| panic!("no line {p:?} in {stdout}"));
        let (_, rest) = line.split_once(": ").unwrap();
        rest.split(" dispatches").next().unwrap().parse().unwrap()
    })
}

/// The `X` of `… N dispatches, X GB moved …` on the line starting `prefix`.
fn gb_moved(stdout: &str, prefix: &str) -> f64 {
    let rest = figure_after(stdout, prefix, " GB moved");
    rest.rsplit(", ").next().unwrap().parse().unwrap()
}

fn bench_traffic(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "traffic"]).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn traffic_prints_the_step_its_blocks_and_the_decode_from_the_configs_alone() {
    let matrix = bench_traffic(&["--model", "klein-4b", "--precision", "matrix"]);
    print!("{matrix}");
    let f32 = bench_traffic(&["--model", "klein-4b", "--precision", "f32"]);
    assert!(matrix.starts_with("model shapes: FLUX.2-klein-4B; 1024×1024: 512 prompt + 4096 image tokens; the matrix tier's data path"), "{matrix}");
    let step = matrix.lines().find(|l| l.starts_with("step: ")).unwrap();
    assert!(step.contains(" dispatches, ") && step.contains(" GB moved, ") && step.contains(" TFLOP, roofline ") && step.ends_with(" ms on H200"), "{step}");
    let vae = matrix.lines().find(|l| l.starts_with("vae decode: ")).unwrap();
    assert!(vae.contains(" GB moved, ") && vae.ends_with(" ms on H200"), "{vae}");
    // The step with its attention as products on the GEMM core (the matrix
    // tier where the flash kernel's check fails), on the matrix tier only:
    // 25 blocks' attention, each 24 heads in stacks of 7, 7, 7 and 3: a
    // stack of g heads takes, for each of two chunks of keys, each head's
    // keys packed and its scores' product into probabilities (2g), the
    // stack's combining pass, values' pack and P·V (3), then one pass
    // dividing its rows by their sums into each head's pieces (1); the
    // queries', keys' and values' f16 pieces read as stored.
    let products = "step, attention as products on the GEMM core (where the flash kernel's check fails): ";
    assert!(matrix.lines().any(|l| l.starts_with(products) && l.ends_with(" ms on H200")) && !f32.contains(products), "{matrix}{f32}");
    let stack = |g: u64| 2 * (2 * g + 3) + 1;
    // The line two below `whole`'s, its attention's.
    let attention_of = |whole: &str| {
        let lines: Vec<&str> = matrix.lines().collect();
        let at = lines.iter().position(|l| l.starts_with(whole)).unwrap_or_else(|| panic!("no {whole:?} line: {matrix}"));
        figure_after(lines[at + 2], "  of which attention: ", " dispatches")
    };
    assert_eq!(attention_of(products), (25 * (3 * stack(7) + stack(3))).to_string(), "{matrix}");
    // The text encoder's causal attention so too: 27 layers, each its 32
    // heads (on 8 kv heads) in one stack over one chunk of its 512 keys,
    // each kv head's keys packed once for its 4 query heads' scores.
    let encoder = "text encoder, attention as products on the GEMM core (where the flash kernel's check fails): ";
    assert!(!f32.contains(encoder), "{f32}");
    assert_eq!(attention_of(encoder), (27 * ((8 + 32 + 3) + 1)).to_string(), "{matrix}");
    // Each whole's roofline again with its products' workgroups in whole
    // waves of the H200's 264 slots: never shorter; the text encoder's
    // products, 512 rows (4 blocks) tall, more than twice as long so.
    for (what, tier) in [("text encoder: ", &matrix), ("step: ", &matrix), ("step, attention as products", &matrix), ("vae decode: ", &matrix), ("end to end (", &matrix), ("step: ", &f32)] {
        let lines: Vec<&str> = tier.lines().collect();
        let at = lines.iter().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no {what:?} line: {tier}"));
        let roofline: f64 = lines[at].split("roofline ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        let filled: f64 = lines[at + 1].strip_prefix("  in whole waves (each product's workgroups 264 at a time, two on each multiprocessor): ").unwrap_or_else(|| panic!("{}", lines[at + 1])).trim_end_matches(" ms").parse().unwrap();
        assert!(filled >= roofline && (what != "text encoder: " || filled > 2.0 * roofline), "{what}: {roofline} ms, in whole waves {filled} ms");
    }
    // Its P·V over a stack of 7 heads fills 252 blocks a product, where one head's fills 36.
    assert!(matrix.contains("  its P·V in stacks of 7 of 24 heads: 252 blocks of 128 × 128 a product, where one head's alone gives 36 "), "{matrix}");
    // The matrix tier measures the f32 inputs of its products in passes of
    // their own (outside the blocks: the timestep's, the embedders' and the
    // final projection's); inside the blocks every product's input comes as
    // f16 rows with its scales, which need none.
    let by_op = |s: &str, kind: &str| rows_under(s, "| step, by op |").into_iter().find(|r| r[0] == kind).unwrap_or_else(|| panic!("no {kind} row: {s}"));
    let (m_linear, f_linear) = (by_op(&matrix, "linear")[1].parse::<u64>().unwrap(), by_op(&f32, "linear")[1].parse::<u64>().unwrap());
    assert!(m_linear > f_linear && m_linear < 2 * f_linear, "linear dispatches: matrix {m_linear}, f32 {f_linear}");
    let ln_gb = |s: &str| by_op(s, "layer norm + modulation")[2].parse::<f64>().unwrap();
    assert!(ln_gb(&matrix) < ln_gb(&f32), "{matrix}{f32}");
    let [m_step, m_double, m_single, m_vae, _, m_text, m_e2e, m_preview] = traffic_dispatches(&matrix);
    let [f_step, f_double, f_single, f_vae, _, f_text, _, f_preview] = traffic_dispatches(&f32);
    // The tiers differ by the measuring passes the matrix tier adds and by
    // the queries' and keys' RMSNorm + RoPE passes it folds into their
    // projections: four a double block (image and text, queries and keys),
    // two a single block.
    assert!(rows_under(&matrix, "| step, by op |").iter().all(|r| r[0] != "RMS norm + RoPE"), "{matrix}");
    let f_norms = by_op(&f32, "RMS norm + RoPE")[1].parse::<u64>().unwrap();
    assert_eq!(m_step + f_norms, f_step + (m_linear - f_linear), "{matrix}{f32}");
    assert!(m_double + 4 == f_double && m_single + 2 == f_single, "{matrix}{f32}");
    // The matrix decode's stream is f16 as its convolutions write it: no packs, no copies.
    assert!(m_vae < f_vae, "{matrix}{f32}");
    // f16 operands in pieces: the step moves less than on f32 activations,
    // and at most 40% of what it moved before the half-precision path
    // (76.8 GB, docs/performance.md). The channels-last VAE decode reads
    // its convolutions' inputs as f16 as the ops before wrote them (no
    // measuring pass: as many convolution dispatches as on f32, and the
    // attention's output projection as a 1×1 convolution onto the stream),
    // normalised as it reads them, and moves at most 40% of the f32 decode.
    assert!(gb_moved(&matrix, "step: ") < 0.4 * 76.8 && gb_moved(&matrix, "step: ") < gb_moved(&f32, "step: "), "{matrix}{f32}");
    assert!(gb_moved(&matrix, "vae decode: ") <= 0.4 * gb_moved(&f32, "vae decode: "), "{matrix}{f32}");
    let conv_dispatches = |s: &str| rows_under(s, "| vae decode, by op |").into_iter().find(|r| r[0] == "convolution").unwrap()[1].parse::<u64>().unwrap();
    assert_eq!(conv_dispatches(&matrix), conv_dispatches(&f32) + 1, "{matrix}{f32}");
    // The encoder alike (channels-last, f16, its downsamplers strided
    // convolutions of the stream): at most 40% of the f32 encode's bytes
    // outside the mid-block attention, in fewer dispatches (no copies after
    // the downsamplers, no separate GroupNorm passes). Its attention, on
    // the GEMM core on the matrix tier, writes and reads each chunk's f32
    // scores and f16 probabilities (3.2 GB at 1024²), where the f32 tier's
    // one kernel moves its q, k, v and output alone: 5 chunks of 4032 keys
    // (the last of 256), 5 dispatches each, the queries' pack and the normalisation.
    let attention = |s: &str, table: &str| rows_under(s, table).into_iter().find(|r| r[0] == "attention").unwrap();
    let outside = |s: &str| gb_moved(s, "vae encode: ") - attention(s, "| vae encode, by op |")[2].parse::<f64>().unwrap();
    assert!(outside(&matrix) <= 0.4 * outside(&f32), "{matrix}{f32}");
    assert_eq!(attention(&matrix, "| vae encode, by op |")[1], "27", "{matrix}");
    assert_eq!(attention(&matrix, "| vae decode, by op |")[1], "27", "{matrix}");
    let encode_dispatches = |s: &str| figure_after(s, "vae encode: ", " dispatches").parse::<u64>().unwrap() - attention(s, "| vae encode, by op |")[1].parse::<u64>().unwrap();
    assert!(encode_dispatches(&matrix) < encode_dispatches(&f32), "{matrix}{f32}");
    // A preview's tiny decode (TAEF2's shape) channels-last: one dispatch a
    // convolution (41: no measuring pass, no ReLU, add or upsampling pass),
    // at most half the f32 decode's bytes.
    let preview_convs = |s: &str| rows_under(s, "| preview decode, by op |").into_iter().find(|r| r[0] == "convolution").unwrap()[1].parse::<u64>().unwrap();
    assert_eq!(preview_convs(&matrix), 41, "{matrix}");
    assert!(m_preview < f_preview && gb_moved(&matrix, "preview decode (") <= 0.5 * gb_moved(&f32, "preview decode ("), "{matrix}{f32}");
    assert!(matrix.lines().any(|l| l.starts_with("preview decode (") && l.ends_with("% of the VAE decode's roofline")), "{matrix}");
    // The table's kinds add up to the step.
    let by_op: u64 = rows_under(&matrix, "| step, by op |").iter().map(|r| r[1].parse::<u64>().unwrap()).sum();
    assert_eq!(by_op, m_step);
    // The prompt's encode: klein-4B's Qwen3-4B up to its deepest picked
    // layer; on the matrix tier in f16 pieces, its q/k norms and RoPE one
    // pass each (not two), its linears' inputs without measuring passes.
    assert!(matrix.lines().any(|l| l.starts_with("text encoder: ") && l.ends_with(" on H200 (512 tokens, 27 of 36 layers)")), "{matrix}");
    assert_eq!(f_text - m_text, 2 * 27, "{matrix}{f32}");
    assert!(gb_moved(&matrix, "text encoder: ") < gb_moved(&f32, "text encoder: "), "{matrix}{f32}");
    let text_by_op: u64 = rows_under(&matrix, "| text encoder, by op |").iter().map(|r| r[1].parse::<u64>().unwrap()).sum();
    assert_eq!(text_by_op, m_text);
    // End to end as `gen` runs klein (distilled): the prompt's encode, 4 steps, the decode.
    assert!(matrix.contains("\nend to end (the prompt's encode, 4 steps, the decode): "), "{matrix}");
    assert_eq!(m_e2e, m_text + 4 * m_step + m_vae);
    let roofline_ms = |s: &str, prefix: &str| figure_after(s, prefix, " ms on H200").rsplit("roofline ").next().unwrap().parse::<f64>().unwrap();
    let parts = roofline_ms(&matrix, "text encoder: ") + 4.0 * roofline_ms(&matrix, "step: ") + roofline_ms(&matrix, "vae decode: ");
    assert!((roofline_ms(&matrix, "end to end (") - parts).abs() < 0.01, "{matrix}");
}

#[test]
fn traffic_refuses_a_size_the_vae_cannot_take() {
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "traffic", "--width", "1000"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim(), "error: --width 1000 is not a positive multiple of 16");
}

/// `bench traffic` counts, from the programs alone, the dispatches `bench
/// kernels` prepares on the adapter for the same step, blocks and decode on
/// `tier`.
fn traffic_counts_what_bench_prepares(tier: &str) {
    let flux_lite = env!("CARGO_BIN_EXE_flux-lite");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_vectors/models/tiny-a");
    let args = ["bench", "kernels", "--model", model, "--only", "blocks,step,vae", "--tokens", "40", "--step-sizes", "32", "--vae-size", "32", "--repeats", "1", "--precision", tier];
    let out = Command::new(flux_lite).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let rows = table_rows(&stdout);
    let prepared = |what: &str| rows.iter().find(|r| r[0] == what).unwrap_or_else(|| panic!("no {what} row: {stdout}"))[7].parse::<u64>().unwrap();
    let counted = bench_traffic(&["--model", model, "--width", "32", "--height", "32", "--precision", tier]);
    let [step, double, single, vae, encode, text, e2e, preview] = traffic_dispatches(&counted);
    assert_eq!(
        [prepared("denoising step"), prepared("double block"), prepared("single block"), prepared("VAE decode"), prepared("VAE encode"), prepared("text encoder"), prepared("end to end"), prepared("tiny decoder")],
        [step, double, single, vae, encode, text, e2e, preview],
        "{tier}: prepared (bench kernels) against counted (bench traffic):\n{stdout}{counted}"
    );
    println!("{tier}: step {step}, double block {double}, single block {single}, VAE decode {vae}, VAE encode {encode}, text encoder {text}, end to end {e2e}, preview decode {preview} dispatches, prepared and counted alike");
}

#[test]
fn traffic_counts_the_dispatches_bench_prepares_on_f32_and_f16() {
    let flux_lite = env!("CARGO_BIN_EXE_flux-lite");
    for tier in ["f32", "f16"].into_iter().filter(|t| *t == "f32" || flux_lite_tests::tier_here(flux_lite, t)) {
        traffic_counts_what_bench_prepares(tier);
    }
}

/// Run again on Mesa 26, where the matrix tier is (CI's filter `matrix`).
#[test]
fn traffic_counts_the_dispatches_bench_prepares_on_the_matrix_tier() {
    if flux_lite_tests::tier_here(env!("CARGO_BIN_EXE_flux-lite"), "matrix") {
        traffic_counts_what_bench_prepares("matrix");
    }
}

/// The rows of the table under the header line starting `header`, e.g.
/// `bench kernels`' main one: `| what | shape | time | GFLOP/s | GB/s | bound | % |`.
fn rows_under(stdout: &str, header: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with("| "))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

fn table_rows(stdout: &str) -> Vec<Vec<String>> {
    rows_under(stdout, "| what |")
}

#[test]
fn kernels_bench_prints_every_row_beside_the_ceilings_of_the_same_run() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_vectors/models/tiny-a");
    let args = ["bench", "kernels", "--model", model, "--tokens", "40,96", "--vae-size", "32", "--step-sizes", "32", "--df11-elements", "5000", "--repeats", "1"];
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("adapter: ")), "{stdout}");
    let ceilings = stdout.lines().find(|l| l.starts_with("ceilings measured in this run: FMA peak ")).expect("a ceilings line");
    assert!(ceilings.contains(" GFLOP/s, copy ") && ceilings.ends_with("GB/s (bytes read + written)"), "{ceilings}");
    assert!(stdout.contains("| what | shape | time | GFLOP/s | GB/s | bound | % of bound | dispatches |"), "{stdout}");

    let rows = table_rows(&stdout);
    // tiny-a's blocks have five distinct linear shapes; per token count: those,
    // a LoRA side product on each, attention, a double and a single block;
    // then the VAE's up block, its whole decode and encode and the tiny preview
    // decoder beside them, DF11, the text encoder, and per image size a step, a decode and the sum.
    let per_tokens = ["linear"; 5].into_iter().chain(["LoRA"; 5]).chain(["attention", "double block", "single block"]);
    // DF11's expansion, then each quantized GGUF type's.
    let expansions = std::iter::once("DF11 expansion").chain(["GGUF"; 10]);
    let expected: Vec<&str> =
        per_tokens.clone().chain(per_tokens).chain(["VAE up block", "VAE decode", "VAE encode", "tiny decoder"]).chain(expansions).chain(["text encoder", "denoising step", "VAE decode", "end to end"]).collect();
    let whats: Vec<&str> = rows.iter().map(|r| r[0].split(' ').next().unwrap_or("")).collect();
    let expected_first: Vec<&str> = expected.iter().map(|w| w.split(' ').next().unwrap()).collect();
    assert_eq!(whats, expected_first, "{stdout}");
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        assert!(r[2].ends_with(" s") || r[2].ends_with(" ms") || r[2].ends_with(" µs"), "time {r:?}");
        let number = |c: &str| c == "–" || c.parse::<f64>().is_ok_and(|v| v >= 0.0);
        assert!(number(&r[3]) && number(&r[4]), "rates {r:?}");
        assert!(r[5] == "FMA" || r[5] == "copy", "bound {r:?}");
        assert!(r[6].strip_suffix('%').is_some_and(|p| p.parse::<f64>().is_ok_and(|v| v > 0.0)), "share {r:?}");
        // Every row here runs one prepared list of dispatches (no banded decode at 32²).
        assert!(r[7].parse::<u64>().is_ok_and(|d| d > 0), "dispatches {r:?}");
    }
    assert!(rows.iter().any(|r| r[1] == "40×64 · 64×64") && rows.iter().any(|r| r[1] == "96×64 · 64×64"), "{stdout}");
    let tiny = stdout.lines().find(|l| l.starts_with("tiny decoder (TAEF2's shape, --preview-decoder) at 32×32: ")).expect("the tiny decoder's share");
    assert!(tiny.contains("% of the VAE decode's time (") && tiny.ends_with("% of its operations)"), "{tiny}");
    // Which kernel the VAE's attention rows timed: the f32 tier's tiled one here (the matrix tier's chunked products on f16 tiles).
    let attention = stdout.lines().find(|l| l.starts_with("the VAE's mid-block attention (one head of ")).expect("the VAE attention's kernel");
    assert!(attention.ends_with(", carried across key chunks as the bands run it): attention") || attention.ends_with("the softmax carried between them (attention_chunks)"), "{attention}");
    // tiny-a is distilled: 4 steps of one pass each.
    let e2e = rows.iter().find(|r| r[0] == "end to end").unwrap();
    assert_eq!(e2e[1], "32×32: encode + 4 steps + decode");
    // DF11 does no arithmetic the ceilings count; copy bounds it.
    let df11 = rows.iter().find(|r| r[0] == "DF11 expansion").unwrap();
    assert_eq!((df11[3].as_str(), df11[5].as_str()), ("–", "copy"));
    let q4k = rows.iter().find(|r| r[0] == "GGUF Q4_K expansion").unwrap();
    assert_eq!((q4k[3].as_str(), q4k[5].as_str()), ("–", "copy"));
}

#[test]
fn kernels_bench_refuses_bad_lists_and_sizes() {
    for (args, message) in [
        (&["--tokens", "12,x"][..], "\"12,x\": expected numbers separated by commas, e.g. 768,1536"),
        (&["--only", "linear,gemm"][..], "--only \"gemm\": expected some of linear, lora, attention, blocks, ops, vae, vae-ops, df11, step, tiers"),
        (&["--vae-size", "40"][..], "--vae-size 40 is not a multiple of 16"),
        (&["--model", "/nonexistent/model"][..], "/nonexistent/model"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["bench", "kernels"]).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[test]
fn kernels_bench_on_the_matrix_tier_bounds_the_linears_and_attention_by_the_matrix_units() {
    let tier = flux_lite_tests::tier_line(env!("CARGO_BIN_EXE_flux-lite"), "matrix");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_vectors/models/tiny-a");
    let args = ["bench", "kernels", "--model", model, "--only", "linear", "--tokens", "40", "--repeats", "1", "--precision", "matrix"];
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if tier.contains("unavailable") {
        // Where the adapter has no cooperative matrices: one error line saying so.
        flux_lite_kernels::test_devices::missing_tier(format_args!("no matrix tier here ({tier}): checking the refusal only"));
        assert!(!out.status.success());
        assert!(stderr.trim().starts_with("error: the matrix precision tier cannot run on") && stderr.trim().lines().count() == 1, "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stdout}{stderr}");
    print!("{stdout}");
    assert!(stdout.contains("precision: matrix (") && stdout.contains("matrix units "), "{stdout}");
    let rows = table_rows(&stdout);
    assert!(!rows.is_empty() && rows.iter().all(|r| r[0].starts_with("linear ") && r[5] == "matrix"), "{rows:?}");
    // On f16 operands (lavapipe's) each shape's row over f32 x and bf16 W is
    // followed by the same product over the f16 operands kept in memory,
    // which needs no pass measuring x's rows: one dispatch to the other's two.
    assert!(rows.len() == 10, "tiny-a's five shapes, two rows each: {rows:?}");
    for pair in rows.chunks(2) {
        let (converted, in_memory) = (&pair[0], &pair[1]);
        assert_eq!(in_memory[0], format!("{}, f16 x and W in memory", converted[0]), "{pair:?}");
        assert_eq!(in_memory[1], converted[1], "{pair:?}");
        assert_eq!([&converted[7], &in_memory[7]], ["2", "1"], "{pair:?}");
    }
    // Attention likewise: over f32 queries, keys and values, then over f16
    // pieces in memory (the blocks' operands there), both on matrix units.
    let args = ["bench", "kernels", "--model", model, "--only", "attention", "--tokens", "40", "--repeats", "1", "--precision", "matrix"];
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let rows = table_rows(&stdout);
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names.len(), 3, "{rows:?}");
    assert_eq!(names[0], "attention", "{rows:?}");
    assert!(names[1].starts_with("attention, f16 pieces of ") && names[1].ends_with(" in memory in and out"), "{rows:?}");
    // And as products on the GEMM core, what runs the blocks' attention where the flash kernel's check fails.
    assert!(names[2].starts_with("attention as products on the GEMM core, f16 pieces of ") && names[2].ends_with(" in and out"), "{rows:?}");
    assert!(rows.iter().all(|r| r[5] == "matrix") && rows[..2].iter().all(|r| r[7] == "1"), "{rows:?}");
    // A head at a time: its queries, keys and values widened, the chunked attention's passes, its output packed.
    assert!(rows[2][7].parse::<u64>().is_ok_and(|n| n > 10), "{rows:?}");
    // The VAE's attention rows name what they timed: the chunked attention's
    // products on the matrix linear, never the flash kernel.
    let args = ["bench", "kernels", "--model", model, "--only", "vae", "--vae-size", "32", "--repeats", "1", "--precision", "matrix"];
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let attention = stdout.lines().find(|l| l.starts_with("the VAE's mid-block attention (one head of ")).expect("the VAE attention's kernel");
    assert!(attention.ends_with(": Q·Kᵀ and P·V on the matrix linear over chunks of 4032 keys, the softmax carried between them (attention_chunks)"), "{attention}");
}

#[test]
fn kernels_bench_sets_the_tiers_side_by_side() {
    let flux_lite = env!("CARGO_BIN_EXE_flux-lite");
    let tiers: Vec<&str> = ["f32", "f16", "matrix"].into_iter().filter(|t| *t == "f32" || flux_lite_tests::tier_here(flux_lite, t)).collect();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_vectors/models/tiny-a");
    let args = ["bench", "kernels", "--model", model, "--only", "tiers", "--tokens", "40", "--repeats", "1"];
    let out = Command::new(flux_lite).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    for tier in &tiers {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("- {tier}: FMA peak "))), "{tier}: {stdout}");
    }
    let rows = rows_under(&stdout, "| linear | shape | FLOP/byte |");
    // The matrix tier's f16 operands (lavapipe's) add a column: the same
    // products over the operands kept in memory.
    let columns = tiers.len() + tiers.contains(&"matrix") as usize;
    if tiers.contains(&"matrix") {
        assert!(stdout.contains("| matrix, f16 x and W in memory: time (% of ceiling) |"), "{stdout}");
    }
    // tiny-a's five linear shapes; per row: name, shape, intensity, a cell per column, a ratio per column past f32.
    assert_eq!(rows.len(), 5, "{stdout}");
    for r in &rows {
        assert_eq!(r.len(), 3 + 2 * columns - 1, "{r:?}");
        assert!(r[2].parse::<f64>().is_ok_and(|v| v > 0.0), "intensity {r:?}");
        for cell in &r[3..3 + columns] {
            let share = cell.split('(').nth(1).and_then(|c| c.strip_suffix("%)")).unwrap_or_else(|| panic!("{cell}"));
            assert!(share.parse::<f64>().is_ok_and(|v| v > 0.0), "{cell}");
        }
        for ratio in &r[3 + columns..] {
            assert!(ratio.strip_suffix('×').is_some_and(|v| v.parse::<f64>().is_ok_and(|v| v > 0.0)), "{ratio}");
        }
    }
}

/// `--only ops` and `--only vae-ops`: every op of tiny-a's first double and
/// single block, and of its VAE decode, timed alone on `tier`, as the step
/// and the decode record them: the ops together prepare the dispatches the
/// whole block (the whole decode) prepares, each sum row says so, and the
/// products say what they read (f16 in memory on the half-precision data
/// path, f32 elsewhere).
fn ops_prepare_what_their_whole_prepares(tier: &str, half_path: bool) {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../test_vectors/models/tiny-a");
    let args = ["bench", "kernels", "--model", model, "--only", "blocks,ops,vae,vae-ops", "--tokens", "40", "--vae-size", "32", "--repeats", "1", "--precision", tier];
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    let rows = table_rows(&stdout);
    let dispatches = |r: &Vec<String>| r[7].parse::<u64>().unwrap();
    for whole in ["double block", "single block", "VAE decode"] {
        let row = rows.iter().find(|r| r[0] == whole).unwrap_or_else(|| panic!("no {whole} row: {stdout}"));
        let sum = rows.iter().find(|r| r[0] == format!("{whole}, the sum of its ops timed alone")).unwrap_or_else(|| panic!("no sum of the {whole}'s ops: {stdout}"));
        let parts: Vec<&Vec<String>> = rows.iter().filter(|r| r[0].starts_with(&format!("{whole}: "))).collect();
        assert_eq!(dispatches(sum), dispatches(row), "{tier}: {stdout}");
        assert_eq!(parts.iter().map(|r| dispatches(r)).sum::<u64>(), dispatches(row), "{tier}: {stdout}");
    }
    let products: Vec<&Vec<String>> = rows.iter().filter(|r| r[0].contains(" block: linear ")).collect();
    assert!(!products.is_empty(), "{stdout}");
    let read = if half_path { "(f16 " } else { "(f32 in" };
    assert!(products.iter().all(|r| r[0].contains(read)), "{tier}: every product reads {read}: {stdout}");
    assert!(rows.iter().any(|r| r[0].starts_with("VAE decode: convolution (")), "{stdout}");
}

#[test]
fn ops_prepare_what_their_whole_prepares_on_f32() {
    ops_prepare_what_their_whole_prepares("f32", false);
}

/// Run again on Mesa 26, where the matrix tier is (CI's filter `matrix`):
/// its f16 tiles take the half-precision data path.
#[test]
fn ops_prepare_what_their_whole_prepares_on_the_matrix_tier() {
    let flux_lite = env!("CARGO_BIN_EXE_flux-lite");
    if flux_lite_tests::tier_here(flux_lite, "matrix") {
        let f16_tiles = flux_lite_tests::tier_line(flux_lite, "matrix").contains(" f16 tiles");
        ops_prepare_what_their_whole_prepares("matrix", f16_tiles);
    }
}

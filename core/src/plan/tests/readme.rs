//! The figures README.md and docs/memory.md quote, held to the planner's.

use super::*;

/// A byte count as docs/memory.md's tables write it: GiB to two decimals
/// (rounded up, as [`Bytes`]), below that whole MiB.
fn readme(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.2} GiB", libm::ceil(bytes as f64 / GIB as f64 * 100.0) / 100.0)
    } else {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// docs/memory.md's text with every run of whitespace one space (its sentences wrap).
fn readme_text() -> String {
    include_str!("../../../../docs/memory.md").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The figures docs/memory.md must quote, checked all at once so that one
/// run lists every disagreement.
struct Quotes {
    text: String,
    missing: Vec<String>,
}

impl Quotes {
    fn check(&mut self, figure: &str) {
        if !self.text.contains(figure) {
            self.missing.push(figure.to_string());
        }
    }
}

impl Drop for Quotes {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(self.missing.is_empty(), "docs/memory.md does not say these (the planner and the page disagree):\n{}", self.missing.join("\n"));
        }
    }
}

#[test]
fn the_readme_figures_are_the_planners() {
    let mut q = Quotes { text: readme_text(), missing: Vec::new() };
    let mut quoted = |figure: &str| q.check(figure);
    // The 4B transformer at 1024², one row per weight strategy (DF11 sizes estimated).
    let model = Model::klein_4b(true);
    let input = model.input(1024, None);
    let options: Vec<PhasePlan> = denoise_options(&input).unwrap().collect();
    let names = [
        (WeightStrategy::ResidentBf16, "resident bf16"),
        (WeightStrategy::ResidentDf11 { slots: 2 }, "DF11 resident, 2 slots"),
        (WeightStrategy::ResidentDf11 { slots: 1 }, "DF11 resident, 1 slot"),
        (WeightStrategy::Streamed { slots: 2 }, "streamed, 2 slots"),
        (WeightStrategy::Streamed { slots: 1 }, "streamed, 1 slot"),
    ];
    for (strategy, name) in names {
        let whole = options.iter().find(|p| p.weights == strategy && p.chunk.is_none()).unwrap();
        let chunked = options.iter().find(|p| p.weights == strategy && p.chunk.is_some() && !p.half_kv).unwrap();
        let half_kv = options.iter().find(|p| p.weights == strategy && p.half_kv).unwrap();
        let mut row = format!(
            "| {name} | {} | {} | {} | {} | {}",
            readme(whole.peak()),
            readme(whole.weight_bytes),
            readme(whole.arena_bytes),
            readme(whole.host_bytes),
            readme(chunked.peak())
        );
        if strategy == WeightStrategy::ResidentBf16 {
            row += &format!(" ({})", readme(chunked.arena_bytes));
        }
        row += &format!(" | {}", readme(half_kv.peak()));
        if strategy == WeightStrategy::ResidentBf16 {
            row += &format!(" ({})", readme(half_kv.arena_bytes));
        }
        quoted(&(row + " |"));
    }
    // The text encoder's phase.
    let te: Vec<PhasePlan> = encode_options(&input).unwrap().collect();
    let te_peak = |s| readme(te.iter().find(|p| p.weights == s).unwrap().peak());
    quoted(&format!("| resident bf16 | {} |", te_peak(WeightStrategy::ResidentBf16)));
    let (d2, d1) = (te_peak(WeightStrategy::ResidentDf11 { slots: 2 }), te_peak(WeightStrategy::ResidentDf11 { slots: 1 }));
    quoted(&format!("| DF11 resident, 2 / 1 slots | {} / {} |", d2.trim_end_matches(" GiB"), d1));
    quoted(&format!("| streamed, 2 / 1 slots | {} / {} |", te_peak(WeightStrategy::Streamed { slots: 2 }), te_peak(WeightStrategy::Streamed { slots: 1 })));
    // The VAE decoder at 1024²: smallest tile, the largest under 128 MiB bindings, untiled.
    let decode: Vec<VaePlan> = decode_options(&input).unwrap().collect();
    let smallest = decode[decode.len() - 1];
    quoted(&format!("needs {} in its smallest tile at 1024² ({} pixels", readme(smallest.peak()), smallest.tile.unwrap()));
    quoted(&format!("against {} untiled", readme(decode[0].peak())));
    let lavapipe = DeviceLimits { max_buffer: 2 * GIB, max_binding: 128 << 20, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE };
    let bound = PlanInput { limits: lavapipe, ..input };
    let largest = decode_options(&bound).unwrap().find(|p| p.tile.is_some() && !p.on_device).unwrap();
    quoted(&format!("{} in the largest tile lavapipe's 128 MiB bindings allow ({} px)", readme(largest.peak()), largest.tile.unwrap()));
    // The VAE encoder on a 1024² reference.
    let refs = [(1024, 1024)];
    let roomy: Vec<VaePlan> = reference_options(&PlanInput { references: &refs, ..input }).unwrap().collect();
    let webgpu: Vec<VaePlan> = reference_options(&PlanInput { references: &refs, limits: DeviceLimits::WEBGPU_DEFAULT, ..input }).unwrap().collect();
    let last = webgpu[webgpu.len() - 1];
    quoted(&format!("needs {} untiled, {} in {}-pixel tiles under WebGPU's default", readme(roomy[0].peak()), readme(webgpu[0].peak()), webgpu[0].tile.unwrap()));
    quoted(&format!("and {} in its smallest tile ({} px)", readme(last.peak()), last.tile.unwrap()));
    // Whole runs: the 4B's smallest budget and its unchunked streamed peak, the 9B, and 4096².
    quoted(&format!("the smallest budget for a whole 1024² run is {}", readme(minimum_budget(&input).unwrap())));
    let streamed_1 = options.iter().find(|p| p.weights == WeightStrategy::Streamed { slots: 1 } && p.chunk.is_none()).unwrap();
    quoted(&format!("by streaming ({} unchunked)", readme(streamed_1.peak())));
    let nine = Model::klein_9b(true);
    let nine_resident = plan(&Model::klein_9b(false).input(1024, None)).unwrap();
    quoted(&format!("needs at least {} at 1024²", readme(minimum_budget(&nine.input(1024, None)).unwrap())));
    quoted(&format!("{} with everything resident", readme(nine_resident.peak())));
    let four_k = |m: &Model| readme(minimum_budget(&m.input(4096, None)).unwrap());
    quoted(&format!("budgets are {} (4B) and {} (9B)", four_k(&model), four_k(&nine)));
    // The whole-process table: each side of the smallest budget and of everything resident.
    for (name, m) in [("4B", &model), ("9B", &nine)] {
        for size in [1024, 4096] {
            let input = m.input(size, None);
            let need = minimum_need(&input).unwrap();
            let resident = plan(&input).unwrap();
            let row = format!(
                "| {name} | {size}² | {} | {} | {} | {} | {} | {} |",
                readme(need.total()),
                readme(need.device),
                readme(need.host),
                readme(resident.peak()),
                readme(resident.device_peak()),
                readme(resident.host_peak())
            );
            quoted(&row);
        }
    }
}

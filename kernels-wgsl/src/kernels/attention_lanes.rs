//! The source of the CPU adapters' attention with keys and values shared
//! across a subgroup (`attention_lanes`).
//!
//! A CPU driver (lavapipe) fetches a storage load lane by lane even where
//! every lane reads the same address, which is what the CPU kernel of
//! `attention_cpu.wgsl` does for every key and value (each lane owns
//! queries; all of them read the same key row). Here the lanes of a
//! subgroup read a key row together, lane `l` its vec4s `l, l + S, …`, and
//! each vec4 reaches every lane by `subgroupBroadcast` from the lane that
//! holds it: a shuffle in registers. So a row costs `head_dim / 4S` loads a
//! lane instead of `head_dim / 4`.
//!
//! `subgroupBroadcast` takes a constant lane, so the loops over a row's
//! vec4s are written out here, one module per head width (guards on an
//! override were not folded away by lavapipe: 1.5× slower). Nothing is
//! indexed at run time (such private arrays live in scratch memory on a
//! CPU driver), so the queries' rows and output rows are named registers
//! and the keys are taken two at a time, the running maximum raised by a
//! subgroup-uniform branch ([`PRELUDE`]), in place of `attention_cpu`'s
//! blocks of eight. The
//! interface, masks, causality, grouped heads and the
//! half-K/V accessors are `attention_cpu.wgsl`'s and `attention_io.wgsl`'s.

use super::lanes::{emit, LANE_COUNTS};


/// The entry's source after the shared parts (`attention_cpu.wgsl` and
/// what it reads), for subgroups of `lanes` invocations and heads of
/// `head_vec4` vec4s.
///
/// Every head width takes four queries an invocation, 256 a workgroup (as
/// `attention_cpu`). A wide head's query and output rows do not fit a CPU's
/// registers (the VAE's 512-wide head: 2 × 128 vec4s a query) and spill to
/// the stack either way; what four queries buy there is each broadcast of a
/// key or value vec4 feeding four queries' products instead of one (about
/// 2× on lavapipe over one query an invocation, the same bits: each query's
/// sums are its own; docs/history/performance-2026-11.md).
pub fn source(lanes: u32, head_vec4: u32) -> String {
    assert!(LANE_COUNTS.contains(&lanes), "no attention_lanes for subgroups of {lanes}");
    assert!((1..=MAX_VEC4).contains(&head_vec4), "no attention_lanes for heads of {head_vec4} vec4s");
    let mut s = String::from(PRELUDE);
    entry(&mut s, lanes, head_vec4);
    s
}

/// The widest head (in vec4s) the entry takes (`CPU_WIDE_VEC4` in attention_cpu.wgsl).
pub const MAX_VEC4: u32 = 128;

/// The online softmax's running maximum is raised where a score passes it
/// (a branch the whole subgroup takes or skips: `subgroupAny`), so every
/// weight is `exp` of at most 0, where WGSL's `exp` is most exact. Raising
/// it only when passed by a margin (8) saved no measurable time on
/// lavapipe and moved 3 bytes of 4608 of a tiny-model image by one level
/// against diffusers' (`exp`'s error grows with its argument).
/// A key's mask word is read once for all of an invocation's queries.
const PRELUDE: &str = r#"
fn key_kept(kj: u32) -> bool {
    var kept = true;
    if (p.use_mask != 0u) {
        kept = key_keep[p.mask_offset + min(kj, p.kv_len - 1u)] != 0u;
    }
    return kept;
}

// `visible` with the key's mask word already read.
fn visible_kept(qi: u32, kj: u32, kept: bool) -> bool {
    let in_range = (qi < p.q_len) & (kj < p.kv_len);
    let causal_ok = (p.causal == 0u) | (kj <= qi + p.q_position);
    return in_range & causal_ok & kept;
}
"#;

/// `{name}{i}` for each of the row's lane-held vec4s (lane `l` holds vec4s
/// `l`, `l + lanes`, …; past the row's end, its last), `load(index)` the
/// row's reader.
fn row_loads(s: &mut String, name: &str, load: &str, base: &str, lanes: u32, head_vec4: u32, indent: &str) {
    for i in 0..head_vec4.div_ceil(lanes) {
        let first = i * lanes;
        emit!(s, "{indent}let {name}{i} = {load}({base} + min(lane + {first}u, {}u));", head_vec4 - 1);
    }
}

/// The held vec4 `c` of a row, broadcast from the lane that loaded it.
fn held(name: &str, c: u32, lanes: u32) -> String {
    format!("subgroupBroadcast({name}{}, {}u)", c / lanes, c % lanes)
}

const QUERIES: [&str; 4] = ["a", "b", "c", "d"];
/// Keys a step of the key loop: each output row is read and written once a step.
const STEP: u32 = 2;

/// `body` once for each vec4 `c` of the head.
fn each_vec4(s: &mut String, head_vec4: u32, ind: &str, body: impl Fn(u32) -> String) {
    for c in 0..head_vec4 {
        emit!(s, "{ind}{}", body(c));
    }
}

/// The entry for subgroups of `lanes` and heads of `max` vec4s.
fn entry(s: &mut String, lanes: u32, max: u32) {
    let qs = &QUERIES;
    let ind = "    ";
    emit!(s, "\n@compute @workgroup_size(64)");
    emit!(s, "fn attention_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {{");
    emit!(s, "{ind}let h = wid.y;");
    emit!(s, "{ind}let kvh = h / (p.q_heads / p.kv_heads);");
    emit!(s, "{ind}let q0 = wid.x * CPU_QUERIES;");
    for (i, q) in qs.iter().enumerate() {
        emit!(s, "{ind}let qi{q} = q0 + lid.x + {}u * CPU_INVOCATIONS;", i);
        emit!(s, "{ind}let qb{q} = (p.q_offset + min(qi{q}, p.q_len - 1u) * p.q_stride + h * p.head_dim) / 4u;");
        emit!(s, "{ind}var m{q} = MASKED;");
        emit!(s, "{ind}var l{q} = 0.0;");
        for c in 0..max {
            emit!(s, "{ind}var qv{q}_{c} = vec4<f32>(0.0);");
            emit!(s, "{ind}var acc{q}_{c} = vec4<f32>(0.0);");
        }
        each_vec4(s, max, ind, |c| format!("qv{q}_{c} = q4[qb{q} + {c}u];"));
    }
    emit!(s, "{ind}var k_end = p.kv_len;");
    emit!(s, "{ind}if (p.causal != 0u) {{ k_end = min(p.kv_len, q0 + CPU_QUERIES + p.q_position); }}");
    emit!(s, "{ind}for (var k0 = 0u; k0 < k_end; k0 += {STEP}u) {{");
    let ind = "        ";
    let keys: Vec<u32> = (0..STEP).collect();
    // The step's key rows, read by the subgroup (a key past the end reads
    // the last row and is masked); each query's score against each.
    for t in &keys {
        emit!(s, "{ind}let kj{t} = k0 + {t}u;");
        emit!(s, "{ind}let kr{t} = min(kj{t}, p.kv_len - 1u);");
        emit!(s, "{ind}let kb{t} = (p.k_offset + kr{t} * p.k_stride + kvh * p.head_dim) / 4u;");
        row_loads(s, &format!("kl{t}_"), "key4_at", &format!("kb{t}"), lanes, max, ind);
        for q in qs {
            emit!(s, "{ind}var s{q}{t} = 0.0;");
        }
    }
    for c in 0..max {
        emit!(s, "{ind}{{");
        for t in &keys {
            emit!(s, "{ind}    let kc{t} = {};", held(&format!("kl{t}_"), c, lanes));
        }
        for q in qs {
            let qc = format!("qv{q}_{c}");
            for t in &keys {
                emit!(s, "{ind}    s{q}{t} = fma({qc}.w, kc{t}.w, fma({qc}.z, kc{t}.z, fma({qc}.y, kc{t}.y, fma({qc}.x, kc{t}.x, s{q}{t}))));");
            }
        }
        emit!(s, "{ind}}}");
    }
    for t in &keys {
        emit!(s, "{ind}let ks{t} = key_scale(kr{t}, kvh);");
        emit!(s, "{ind}let kept{t} = key_kept(kr{t});");
        for q in qs {
            emit!(s, "{ind}s{q}{t} = select(MASKED, s{q}{t} * ks{t} * p.scale, visible_kept(qi{q}, kj{t}, kept{t}));");
        }
    }
    // The running maximum, raised (and the rows rescaled) where a score
    // passes it; one branch for the subgroup.
    let best = |q: &str| keys.iter().skip(1).fold(format!("s{q}0"), |acc, t| format!("max({acc}, s{q}{t})"));
    for q in qs {
        emit!(s, "{ind}let b{q} = {};", best(q));
    }
    let passes: Vec<String> = qs.iter().map(|q| format!("(b{q} > m{q})")).collect();
    emit!(s, "{ind}if (subgroupAny({})) {{", passes.join(" | "));
    for q in qs {
        emit!(s, "{ind}    let n{q} = max(m{q}, b{q});");
        emit!(s, "{ind}    let r{q} = exp(m{q} - n{q});");
        emit!(s, "{ind}    m{q} = n{q};");
        emit!(s, "{ind}    l{q} *= r{q};");
        each_vec4(s, max, &format!("{ind}    "), |c| format!("acc{q}_{c} *= r{q};"));
    }
    emit!(s, "{ind}}}");
    for t in &keys {
        for q in qs {
            emit!(s, "{ind}let w{q}{t} = select(0.0, exp(s{q}{t} - m{q}), s{q}{t} > MASKED);");
            emit!(s, "{ind}l{q} += w{q}{t};");
            emit!(s, "{ind}let wv{q}{t} = vec4<f32>(w{q}{t});");
        }
        // The value rows, read by the subgroup.
        emit!(s, "{ind}let vb{t} = (p.v_offset + kr{t} * p.v_stride + kvh * p.head_dim) / 4u;");
        emit!(s, "{ind}let vs{t} = value_scale(kr{t}, kvh);");
        row_loads(s, &format!("vl{t}_"), "value4_at", &format!("vb{t}"), lanes, max, ind);
    }
    // Added into each query's output row, the step's keys in order.
    for c in 0..max {
        emit!(s, "{ind}{{");
        for t in &keys {
            emit!(s, "{ind}    let vc{t} = {} * vs{t};", held(&format!("vl{t}_"), c, lanes));
        }
        for q in qs {
            let sum = keys.iter().fold(format!("acc{q}_{c}"), |acc, t| format!("fma(wv{q}{t}, vc{t}, {acc})"));
            emit!(s, "{ind}    acc{q}_{c} = {sum};");
        }
        emit!(s, "{ind}}}");
    }
    emit!(s, "    }}");
    // Each query's row, normalised.
    let ind = "    ";
    for q in qs {
        emit!(s, "{ind}if (qi{q} < p.q_len) {{");
        emit!(s, "{ind}    let inv{q} = finish_row(l{q});");
        each_vec4(s, max, &format!("{ind}    "), |c| format!("store_out(qi{q}, h, {c}u, acc{q}_{c} * inv{q});"));
        emit!(s, "{ind}}}");
    }
    emit!(s, "}}");
}

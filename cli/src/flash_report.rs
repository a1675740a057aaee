//! `flux-lite gpu --flash-report DIR`: the matrix tier's flash attention on
//! this adapter, run on its start-up check and each of the check's
//! variations twice, one line a case (what is not finite and where, how far
//! the rest is from the exact answer, whether the second run repeated the
//! first bit for bit). Each case's outputs and exact answers go into DIR
//! (`<case>.got.f32`, `<case>.want.f64`, little-endian; `cases.tsv` lists
//! the shapes) for a closer look: `python3 ci/flash_analyse.py DIR`.

use crate::stdout::say;
use flux_lite_platform::flash_cases::{self, Case, Finding, Output, VARIATIONS};
use flux_lite_platform::{Gpu, GpuOptions, Precision};
use std::path::Path;

pub fn run(dir: &Path) -> Result<(), String> {
    let gpu = Gpu::new(&GpuOptions { precision: Precision::Matrix, ..crate::env_gpu_options()? }).map_err(|e| e.to_string())?;
    if !flash_cases::runs_on(&gpu) {
        return Err(format!("{} has no matrix tier of f16 tiles, so no flash attention to report on (matrix tier: {})", gpu.info.name, crate::tier::describe(&gpu)));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    say!("flash attention on {}, {}: each case run twice", gpu.info.name, crate::tier::describe(&gpu));
    let mut index = String::from("name\tq_len\tkv_len\tq_heads\tkv_heads\thead_dim\tcausal\tv_scale\tpieces\tnon_finite\tfinite_rel_l2\trepeats\n");
    for case in VARIATIONS {
        let first = flash_cases::run(&gpu, &case).map_err(|e| format!("flash case {}: {e}", case.name))?;
        let again = flash_cases::run(&gpu, &case).map_err(|e| format!("flash case {} (second run): {e}", case.name))?;
        let repeats = first.got.iter().zip(&again.got).all(|(a, b)| a.to_bits() == b.to_bits());
        let finding = first.finding(case.layout());
        say!("{}", line(&case, &finding, repeats));
        write(dir, &format!("{}.got.f32", case.name), first.got.iter().flat_map(|v| v.to_le_bytes()).collect())?;
        write(dir, &format!("{}.want.f64", case.name), first.want.iter().flat_map(|v| v.to_le_bytes()).collect())?;
        let c = &case;
        index += &format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:e}\t{}\n",
            c.name, c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim, c.causal as u8, c.v_scale, c.pieces as u8, finding.non_finite, finding.finite_rel_l2, repeats as u8
        );
    }
    write(dir, "cases.tsv", index.into_bytes())?;
    say!("outputs and exact answers in {}", dir.display());
    Ok(())
}

fn write(dir: &Path, name: &str, bytes: Vec<u8>) -> Result<(), String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `name: … not finite …; the rest … from the answer …; repeats …: what`.
fn line(case: &Case, f: &Finding, repeats: bool) -> String {
    let total = case.q_len * case.q_heads * case.head_dim;
    let broken = match (f.first_non_finite, f.non_finite_rows.first(), f.non_finite_rows.last()) {
        (Some(o), Some(low), Some(high)) => {
            format!("{} of {total} not finite in {} rows ({low}–{high}), heads {:?}, first {}", f.non_finite, f.non_finite_rows.len(), f.non_finite_heads, place(&o))
        }
        _ => format!("all {total} finite"),
    };
    let rest = match f.farthest {
        Some(o) => format!("{:.2e} from the answer (relative L2), farthest {}", f.finite_rel_l2, place(&o)),
        None => "none finite".to_string(),
    };
    format!("{}: {broken}; the finite {rest}; repeats bit for bit: {} ({})", case.name, if repeats { "yes" } else { "no" }, case.what)
}

fn place(o: &Output) -> String {
    format!("row {} head {} dim {} = {} (want {:.6})", o.row, o.head, o.dim, o.got, o.want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flux_lite_platform::flash_cases::{Layout, Outcome, CHECK_ROWS};

    #[test]
    fn a_line_says_what_is_not_finite_where_and_how_far_the_rest_is() {
        let case = Case { q_len: 2, q_heads: 1, kv_heads: 1, head_dim: 2, ..CHECK_ROWS };
        let f = Outcome { got: vec![1.0, f32::NEG_INFINITY, 3.5, 4.0], want: vec![1.0, 2.0, 3.0, 4.0] }.finding(Layout { heads: 1, head_dim: 2 });
        let text = line(&case, &f, false);
        assert!(text.starts_with("check-rows: 1 of 4 not finite in 1 rows (0–0), heads [0], first row 0 head 0 dim 1 = -inf (want 2.000000); the finite "), "{text}");
        assert!(text.ends_with("farthest row 1 head 0 dim 0 = 3.5 (want 3.000000); repeats bit for bit: no (the start-up check over f32 rows)"), "{text}");
        let clean = Outcome { got: vec![1.0, 2.0, 3.0, 4.0], want: vec![1.0, 2.0, 3.0, 4.0] }.finding(Layout { heads: 1, head_dim: 2 });
        assert!(line(&case, &clean, true).starts_with("check-rows: all 4 finite; the finite 0.00e0 from the answer"), "{}", line(&case, &clean, true));
    }
}

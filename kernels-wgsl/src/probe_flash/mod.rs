//! The flash attention's start-up check: on a device whose tier is the
//! matrix tier's f16 tiles, `attention_flash.wgsl` runs two small attentions
//! against the exact f64 attention before any run takes it: over f32 rows
//! ([`cases::CHECK_ROWS`]: every tile edge cut, grouped heads, a causal
//! mask, values far from 1) and the transformer's path
//! ([`cases::CHECK_PIECES`]: f16 queries, keys and values in pieces into f16
//! pieces). Each proves its own path: a driver that computes one wrongly (an
//! H200 returned -inf over f32 rows) leaves that path on
//! `attention_matrix.wgsl`, with a notice saying why, and the other on the
//! flash kernel where its check passed. `flux-lite gpu --flash-report` runs the checks'
//! variations ([`cases::VARIATIONS`]) to say what a failure follows.

pub mod cases;

use crate::device::Gpu;
use crate::probe::ProbeError;
use cases::{Case, Finding, CHECK_PIECES, CHECK_ROWS};
use flux_lite_core::tolerance::kernels::MATRIX_ATTENTION;

/// The two checks, one a path: over f32 rows, then over f16 pieces.
pub const CHECKS: [Case; 2] = [CHECK_ROWS, CHECK_PIECES];

/// Runs check `case` on `gpu` (a matrix-tier device with f16 tiles).
pub fn flash_known_answer(gpu: &Gpu, case: &Case) -> Result<(), ProbeError> {
    let outcome = cases::run(gpu, case)?;
    check(case, &outcome.finding(case.layout()))
}

/// Every output finite, and the relative L2 error within the matrix tier's
/// attention bound. A refusal says where: the first output not finite, its
/// query row, head and dim, and how many outputs and query rows are not finite.
fn check(case: &Case, f: &Finding) -> Result<(), ProbeError> {
    let what = if case.pieces { "over f16 pieces" } else { "over f32 rows" };
    if let Some(o) = f.first_non_finite {
        let rows = &f.non_finite_rows;
        let detail = format!(
            "{} of {} outputs not finite, in {} query rows ({}–{}), heads {:?}",
            f.non_finite,
            case.q_len * case.q_heads * case.head_dim,
            rows.len(),
            rows[0],
            rows[rows.len() - 1],
            f.non_finite_heads
        );
        return Err(ProbeError::Wrong(format!("flash attention {what}: output {} (query row {}, head {}, dim {}) is {}; {detail}", o.index, o.row, o.head, o.dim, o.got)));
    }
    match f.finite_rel_l2 <= MATRIX_ATTENTION {
        true => Ok(()),
        false => Err(ProbeError::Wrong(format!("flash attention {what} is {:.2e} from the exact answer (relative L2; the bound is {MATRIX_ATTENTION:.0e})", f.finite_rel_l2))),
    }
}

#[cfg(test)]
mod tests {
    use super::cases::{Layout, Outcome};
    use super::*;

    fn finding(got: &[f32]) -> Finding {
        Outcome { got: got.to_vec(), want: vec![1.0, -2.0, 3.0] }.finding(Layout { heads: 1, head_dim: 3 })
    }

    #[test]
    fn the_check_refuses_nan_and_far_answers_and_takes_close_ones() {
        let case = Case { q_len: 1, q_heads: 1, kv_heads: 1, head_dim: 3, ..CHECK_ROWS };
        assert!(check(&case, &finding(&[1.0, -2.0, 3.0])).is_ok());
        assert!(
            matches!(check(&case, &finding(&[1.0, f32::NAN, 3.0])), Err(ProbeError::Wrong(w)) if w.contains("over f32 rows: output 1 (query row 0, head 0, dim 1) is NaN; 1 of 3 outputs not finite, in 1 query rows (0–0), heads [0]"))
        );
        assert!(matches!(check(&case, &finding(&[1.5, -2.0, 3.0])), Err(ProbeError::Wrong(w)) if w.contains("from the exact answer")));
    }

    #[test]
    fn the_values_pass_f16s_range() {
        for case in [CHECK_ROWS, CHECK_PIECES] {
            let [_, _, v] = case.inputs();
            assert!(v.iter().any(|x| x.abs() > 65504.0));
        }
    }
}

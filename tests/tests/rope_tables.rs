//! Host-side RoPE tables against the ones diffusers and transformers built
//! for the golden runs.

#![allow(clippy::unwrap_used)]

use flux_lite_core::numerics::rope;
use flux_lite_platform::model::ModelFolder;
use flux_lite_tests::{max_abs_diff, model_dir, Goldens, CASES};

#[test]
fn flux_tables_match_diffusers_exactly() {
    for case in CASES {
        let g = Goldens::load(case);
        let model = g.case_json()["model"].as_str().unwrap().to_string();
        let cfg = ModelFolder::open(&model_dir(&model)).unwrap().transformer;
        let hd = cfg.attention_head_dim;
        let (img_ids, shape) = g.i64("img_ids");
        let tokens = shape[0];
        for (which, ids, n) in [("txt", None, 512usize), ("img", Some(&img_ids), tokens)] {
            let (want_cos, _) = g.f32(&format!("{which}_rope_cos"));
            let (want_sin, _) = g.f32(&format!("{which}_rope_sin"));
            let (mut cos, mut sin) = (vec![0f32; n * hd], vec![0f32; n * hd]);
            for t in 0..n {
                let pos = match ids {
                    None => rope::text_position(t),
                    Some(ids) => {
                        let id = &ids[t * 4..t * 4 + 4];
                        rope::image_position(id[0] as usize, id[1] as usize, id[2] as usize)
                    }
                };
                rope::flux_row(pos, &cfg.axes_dims_rope, cfg.rope_theta, &mut cos[t * hd..][..hd], &mut sin[t * hd..][..hd]);
            }
            // diffusers builds these in float64 and rounds once: we match bit for bit.
            assert_eq!(max_abs_diff(&cos, &want_cos).0, 0.0, "{case} {which} cos");
            assert_eq!(max_abs_diff(&sin, &want_sin).0, 0.0, "{case} {which} sin");
        }
    }
}

#[test]
fn qwen_tables_match_transformers() {
    for case in ["tiny-a/one-step", "tiny-b/three-step"] {
        let g = Goldens::load(case);
        let model = g.case_json()["model"].as_str().unwrap().to_string();
        let cfg = ModelFolder::open(&model_dir(&model)).unwrap().text_encoder;
        let hd = cfg.head_dim;
        let (want_cos, _) = g.f32("qwen_rope_cos");
        let (want_sin, _) = g.f32("qwen_rope_sin");
        let (mut cos, mut sin) = (vec![0f32; 512 * hd], vec![0f32; 512 * hd]);
        for t in 0..512 {
            rope::qwen_row(t, hd, cfg.rope_theta, &mut cos[t * hd..][..hd], &mut sin[t * hd..][..hd]);
        }
        // transformers evaluates cos/sin in float32; with the angle rounded as it rounds
        // it, what remains is float32 cos/sin's own error (a few ulp).
        let (dc, at_c) = max_abs_diff(&cos, &want_cos);
        let (ds, at_s) = max_abs_diff(&sin, &want_sin);
        assert!(dc <= 2e-7, "{case} cos off by {dc} at {at_c}");
        assert!(ds <= 2e-7, "{case} sin off by {ds} at {at_s}");
    }
}

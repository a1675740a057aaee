//! The FLUX.2 transformer on the GPU against the diffusers goldens: the
//! timestep sinusoid, every step's velocity, and the latents after our own
//! Euler steps (so state carried across steps is checked too).

#![allow(clippy::unwrap_used)]

use flux_lite_core::models::transformer::{model_timestep, timestep_sinusoid};
use flux_lite_tests::{assert_rel_l2, gpu, max_abs_diff, Goldens, TransformerCase, CASES};

/// Per-step tolerance of the issue: relative L2 ≤ 1e-4.
const STEP_TOL: f64 = flux_lite_tests::tolerance::f32::STEP;

#[test]
fn timestep_sinusoid_matches_diffusers() {
    for case in CASES {
        let g = Goldens::load(case);
        let (t, _) = g.f32("timesteps");
        for (i, &t) in t.iter().enumerate() {
            let (want, _) = g.f32(&format!("timestep_sinusoid.{i}"));
            let mut got = vec![0f32; want.len()];
            timestep_sinusoid(model_timestep(t), &mut got);
            // Where our f32 angle equals torch's, only float32 cos/sin's own
            // rounding remains (≤ 3e-7). torch's float32 exp is not correctly
            // rounded for a few frequencies (2 of 128 here); those angles then
            // differ by one ulp (6.1e-5 at t ≈ 1000), and so may cos/sin.
            let off: Vec<usize> = (0..got.len()).filter(|&j| (got[j] - want[j]).abs() > 3e-7).collect();
            let (d, at) = max_abs_diff(&got, &want);
            assert!(off.len() <= 2 * 2, "{case} step {i}: {} entries off, e.g. {off:?}", off.len());
            assert!(d <= 6.2e-5 * t.max(1.0) / 1000.0 + 3e-7, "{case} step {i}: off by {d} at {at}");
        }
    }
}

#[test]
fn velocities_and_latents_follow_diffusers_step_by_step() {
    for name in CASES {
        let c = TransformerCase::load(name);
        let g = &c.goldens;
        let gpu = gpu();
        c.transformer.set_prompt(gpu, &g.f32("prompt_embeds").0).unwrap();
        c.transformer.set_latents(gpu, &g.f32("noise").0).unwrap();
        let (sigmas, _) = g.f32("sigmas");
        let (timesteps, _) = g.f32("timesteps");
        for i in 0..c.steps {
            if c.cfg && i > 0 {
                // CFG mixes in an unconditional pass; step from diffusers' latents instead.
                c.transformer.set_latents(gpu, &g.f32(&format!("latents.{}", i - 1)).0).unwrap();
            }
            c.transformer.forward(gpu, timesteps[i], &mut |_| {}).unwrap();
            let velocity_name = if c.cfg { format!("velocity_pos.{i}") } else { format!("velocity.{i}") };
            let got = c.transformer.velocity(gpu).unwrap();
            assert_rel_l2(&format!("{name} {velocity_name}"), &got, &g.f32(&velocity_name).0, STEP_TOL);
            if !c.cfg {
                c.transformer.euler_step(gpu, sigmas[i], sigmas[i + 1]).unwrap();
                let got = c.transformer.latents(gpu).unwrap();
                assert_rel_l2(&format!("{name} latents.{i}"), &got, &g.f32(&format!("latents.{i}")).0, STEP_TOL);
            }
        }
    }
}

#[test]
fn denoising_reproduces_diffusers_latents_with_and_without_guidance() {
    use flux_lite_platform::pipeline::denoise::{denoise, Conditioning, StepProgress};
    use flux_lite_platform::model::ModelFolder;
    for name in ["tiny-a/four-step-wide", "tiny-b/cfg"] {
        let c = TransformerCase::load(name);
        let g = &c.goldens;
        let model = ModelFolder::open(&flux_lite_tests::model_dir(g.case_json()["model"].as_str().unwrap())).unwrap();
        let positive = g.f32("prompt_embeds").0;
        let negative = if c.cfg { g.f32("negative_prompt_embeds").0 } else { Vec::new() };
        let conditioning = if c.cfg {
            let scale = g.case_json()["guidance"].as_f64().unwrap() as f32;
            Conditioning::Guided { positive: &positive, negative: &negative, scale }
        } else {
            Conditioning::Prompt(&positive)
        };
        let mut blocks_seen = 0;
        let got = denoise(gpu(), &c.transformer, &model.scheduler, c.steps, &g.f32("noise").0, None, conditioning, &mut |p: StepProgress| {
            blocks_seen = blocks_seen.max(p.block.total);
        })
        .unwrap();
        let passes = if c.cfg { 2 } else { 1 };
        assert_eq!(blocks_seen, passes * c.transformer.block_count());
        assert_rel_l2(&format!("{name} final latents"), &got, &g.f32(&format!("latents.{}", c.steps - 1)).0, STEP_TOL);
    }
}

//! Each piece of the FLUX.2 transformer alone against diffusers' captured
//! inputs and outputs, so a failure points at one block: the prologue
//! (timestep MLP, modulations, embedders), every double and single block,
//! and the epilogue (final AdaLN and projection).

#![allow(clippy::unwrap_used)]

use flux_lite_platform::components::transformer::Transformer;
use flux_lite_tests::{assert_rel_l2, gpu, Goldens, TransformerCase, CASES};

const BLOCK_TOL: f64 = flux_lite_tests::tolerance::f32::BLOCK;

fn for_each_case(check: impl Fn(&str, &Goldens, &Transformer, usize)) {
    for name in CASES {
        let c = TransformerCase::load(name);
        // Step 0 and the last step see the most different inputs.
        for step in [0, c.steps - 1] {
            check(name, &c.goldens, &c.transformer, step);
        }
    }
}

fn write_modulations(g: &Goldens, t: &Transformer, step: usize) {
    let l = &t.layout;
    for (span, golden) in [(l.mod_img, "tr.mod_img"), (l.mod_txt, "tr.mod_txt"), (l.mod_single, "tr.mod_single")] {
        t.runner().write(gpu(), span, &g.f32(&format!("{golden}.{step}")).0);
    }
}

#[test]
fn prologue_matches_embedders_and_modulations() {
    for_each_case(|name, g, t, step| {
        let (gpu, l) = (gpu(), &t.layout);
        t.set_prompt(gpu, &g.f32("prompt_embeds").0).unwrap();
        let latents = if step == 0 { g.f32("noise").0 } else { g.f32(&format!("latents.{}", step - 1)).0 };
        t.set_latents(gpu, &latents).unwrap();
        let mut sinusoid = vec![0f32; l.sinusoid_dim as usize];
        let t_in = flux_lite_core::models::transformer::model_timestep(g.f32("timesteps").0[step]);
        flux_lite_core::models::transformer::timestep_sinusoid(t_in, &mut sinusoid);
        t.runner().write(gpu, l.sinusoid, &sinusoid);
        t.run_ops(gpu, 0, &t.blocks()[0]).unwrap();
        let at = |what: &str| format!("{name} step {step} {what}");
        assert_rel_l2(&at("temb"), &t.runner().read(gpu, l.temb, 1, l.dim).unwrap(), &g.f32(&format!("temb.{step}")).0, BLOCK_TOL);
        for (span, width, golden) in [(l.mod_img, 6, "tr.mod_img"), (l.mod_txt, 6, "tr.mod_txt"), (l.mod_single, 3, "tr.mod_single")] {
            let got = t.runner().read(gpu, span, 1, width * l.dim).unwrap();
            assert_rel_l2(&at(golden), &got, &g.f32(&format!("{golden}.{step}")).0, BLOCK_TOL);
        }
        let txt = t.runner().read(gpu, l.stream, l.text, l.dim).unwrap();
        let img = t.runner().read(gpu, l.stream.rows_from(l.text), l.image, l.dim).unwrap();
        assert_rel_l2(&at("context_embed"), &txt, &g.f32(&format!("tr.context_embed.{step}")).0, BLOCK_TOL);
        assert_rel_l2(&at("x_embed"), &img, &g.f32(&format!("tr.x_embed.{step}")).0, BLOCK_TOL);
    });
}

#[test]
fn each_double_block_matches() {
    for_each_case(|name, g, t, step| {
        let (gpu, l) = (gpu(), &t.layout);
        write_modulations(g, t, step);
        for b in 0..t.config.num_layers {
            t.runner().write(gpu, l.stream, &g.f32(&format!("tr.double.{b}.in_txt.{step}")).0);
            t.runner().write(gpu, l.stream.rows_from(l.text), &g.f32(&format!("tr.double.{b}.in_img.{step}")).0);
            t.run_ops(gpu, 1 + b, &t.blocks()[1 + b]).unwrap();
            let txt = t.runner().read(gpu, l.stream, l.text, l.dim).unwrap();
            let img = t.runner().read(gpu, l.stream.rows_from(l.text), l.image, l.dim).unwrap();
            let at = |s: &str| format!("{name} step {step} double block {b} {s}");
            assert_rel_l2(&at("txt"), &txt, &g.f32(&format!("tr.double.{b}.out_txt.{step}")).0, BLOCK_TOL);
            assert_rel_l2(&at("img"), &img, &g.f32(&format!("tr.double.{b}.out_img.{step}")).0, BLOCK_TOL);
        }
    });
}

#[test]
fn each_single_block_matches() {
    for_each_case(|name, g, t, step| {
        let (gpu, l) = (gpu(), &t.layout);
        write_modulations(g, t, step);
        let first_single = 1 + t.config.num_layers;
        for b in 0..t.config.num_single_layers {
            t.runner().write(gpu, l.stream, &g.f32(&format!("tr.single.{b}.in.{step}")).0);
            t.run_ops(gpu, first_single + b, &t.blocks()[first_single + b]).unwrap();
            let got = t.runner().read(gpu, l.stream, l.text + l.image, l.dim).unwrap();
            let want = g.f32(&format!("tr.single.{b}.out.{step}")).0;
            assert_rel_l2(&format!("{name} step {step} single block {b}"), &got, &want, BLOCK_TOL);
        }
    });
}

#[test]
fn epilogue_matches_norm_out_and_velocity() {
    for_each_case(|name, g, t, step| {
        let (gpu, l) = (gpu(), &t.layout);
        let last = t.config.num_single_layers - 1;
        t.runner().write(gpu, l.stream, &g.f32(&format!("tr.single.{last}.out.{step}")).0);
        // The final AdaLN reads temb through its own projection: feed diffusers' temb.
        t.runner().write(gpu, l.temb, &g.f32(&format!("temb.{step}")).0);
        let prologue = &t.blocks()[0];
        // Recompute only SiLU(temb) and norm_out.linear from the prologue (its last modulation step).
        let norm_out_steps: Vec<_> = prologue
            .iter()
            .filter(|op| match op {
                flux_lite_core::ir::Op::Silu { src, .. } => *src == l.temb,
                flux_lite_core::ir::Op::Linear { w, .. } => w.as_str() == "norm_out.linear.weight",
                _ => false,
            })
            .cloned()
            .collect();
        assert_eq!(norm_out_steps.len(), 2);
        t.run_ops(gpu, 0, &norm_out_steps).unwrap();
        t.run_ops(gpu, t.blocks().len() - 1, t.blocks().last().unwrap()).unwrap();
        // The f32 tier's normalised rows are f32.
        assert!(!l.normed.is_half());
        let normed = t.runner().read(gpu, l.normed.data.rows_from(l.text), l.image, l.dim).unwrap();
        assert_rel_l2(&format!("{name} step {step} norm_out"), &normed, &g.f32(&format!("tr.norm_out.{step}")).0, BLOCK_TOL);
        let cfg = g.case_json()["cfg"].as_bool().unwrap();
        let velocity = if cfg { format!("velocity_pos.{step}") } else { format!("velocity.{step}") };
        assert_rel_l2(&format!("{name} step {step} velocity"), &t.velocity(gpu).unwrap(), &g.f32(&velocity).0, BLOCK_TOL);
    });
}

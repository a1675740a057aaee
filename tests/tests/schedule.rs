//! `flux_lite_core::numerics::schedule` against diffusers' `FlowMatchEulerDiscreteScheduler`
//! as `Flux2KleinPipeline` drives it: `goldens/schedule.json` (written by
//! `test_vectors/generate_numerics.py`) and the golden pipeline runs. Sigmas,
//! timesteps and Euler steps are compared bit for bit.

#![allow(clippy::unwrap_used)]

use flux_lite_core::config::{SchedulerConfig, TimeShift};
use flux_lite_core::numerics::schedule;
use flux_lite_platform::model::ModelFolder;
use flux_lite_tests::{model_dir, test_vectors, Goldens, CASES};
use serde_json::Value;

fn config_from_json(c: &Value) -> SchedulerConfig {
    SchedulerConfig {
        num_train_timesteps: c["num_train_timesteps"].as_u64().unwrap() as usize,
        shift: c["shift"].as_f64().unwrap(),
        use_dynamic_shifting: c["use_dynamic_shifting"].as_bool().unwrap(),
        time_shift_type: match c["time_shift_type"].as_str().unwrap() {
            "exponential" => TimeShift::Exponential,
            "linear" => TimeShift::Linear,
            other => panic!("time_shift_type {other}"),
        },
        base_shift: c["base_shift"].as_f64().unwrap_or(0.5),
        max_shift: c["max_shift"].as_f64().unwrap_or(1.15),
        base_image_seq_len: c["base_image_seq_len"].as_u64().unwrap_or(256) as usize,
        max_image_seq_len: c["max_image_seq_len"].as_u64().unwrap_or(4096) as usize,
    }
}

fn bits_of(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u32).collect()
}

#[test]
fn sigmas_and_timesteps_match_diffusers() {
    let path = test_vectors().join("goldens/schedule.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run test_vectors/generate_numerics.py)", path.display()));
    let json: Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (name, entry) in json["configs"].as_object().unwrap() {
        let cfg = config_from_json(&entry["config"]);
        for case in entry["cases"].as_array().unwrap() {
            let seq_len = case["image_seq_len"].as_u64().unwrap() as usize;
            let steps = case["steps"].as_u64().unwrap() as usize;
            let what = format!("{name} S={seq_len} N={steps}");

            // serde_json may misround a decimal by an ulp; mu itself is exact.
            let mu = schedule::compute_empirical_mu(seq_len, steps);
            let want_mu = case["mu"].as_f64().unwrap();
            assert!((mu - want_mu).abs() <= 2.0 * f64::EPSILON * want_mu.abs(), "{what}: mu {mu} vs {want_mu}");

            let mut sigmas = vec![0f32; steps + 1];
            schedule::sigmas(&cfg, seq_len, steps, &mut sigmas).unwrap();
            let got: Vec<u32> = sigmas.iter().map(|s| s.to_bits()).collect();
            assert_eq!(got, bits_of(&case["sigmas_bits"]), "{what}: sigmas {sigmas:?}");

            let timesteps: Vec<u32> =
                sigmas[..steps].iter().map(|&s| schedule::timestep_for(cfg.num_train_timesteps, s).to_bits()).collect();
            assert_eq!(timesteps, bits_of(&case["timesteps_bits"]), "{what}: timesteps");
            if cfg.num_train_timesteps == 1000 {
                assert!(sigmas[..steps].iter().all(|&s| schedule::timestep(s) == schedule::timestep_for(1000, s)));
            }
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} cases");
}

/// The model folders' own scheduler configs reproduce the golden runs'
/// sigmas and timesteps, and the Euler step reproduces their latents.
#[test]
fn pipeline_schedule_and_euler_match_the_goldens() {
    for case in CASES {
        let g = Goldens::load(case);
        let json = g.case_json();
        let model = json["model"].as_str().unwrap().to_string();
        let cfg = ModelFolder::open(&model_dir(&model)).unwrap().scheduler;
        let steps = json["steps"].as_u64().unwrap() as usize;
        let (noise, shape) = g.f32("noise");
        let seq_len = shape[0];

        let mut sigmas = vec![0f32; steps + 1];
        schedule::sigmas(&cfg, seq_len, steps, &mut sigmas).unwrap();
        let (want, _) = g.f32("sigmas");
        assert_eq!(sigmas, want, "{case}: sigmas");
        let (want_t, _) = g.f32("timesteps");
        let timesteps: Vec<f32> = sigmas[..steps].iter().map(|&s| schedule::timestep(s)).collect();
        assert_eq!(timesteps, want_t, "{case}: timesteps");

        let mut latents = noise;
        for i in 0..steps {
            let (velocity, _) = g.f32(&format!("velocity.{i}"));
            schedule::euler_step(&mut latents, &velocity, sigmas[i], sigmas[i + 1]).unwrap();
            let (want, _) = g.f32(&format!("latents.{i}"));
            let mismatch = latents.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(mismatch, None, "{case}: latents.{i}");
        }
    }
}

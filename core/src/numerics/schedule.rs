//! The FLUX.2 flow-matching schedule, computed as diffusers computes it.
//!
//! `Flux2KleinPipeline` builds `sigmas = np.linspace(1, 1/N, N)`, computes
//! `mu = compute_empirical_mu(S, N)` from the number of image tokens `S`, and
//! calls `FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=…, mu=mu)`,
//! which shifts the sigmas in **float32** (numpy, rounding after every
//! operation), sets `timesteps = sigmas·num_train_timesteps` (float32) and
//! appends a terminal 0. Each step is then
//! `latents = latents + (σ_next − σ)·velocity` in float32.
//!
//! Every function here repeats those roundings in the same order, so the
//! results equal diffusers' bit for bit (checked against
//! `test_vectors/goldens/schedule.json`).

use crate::config::{SchedulerConfig, TimeShift};
use core::fmt;

/// Why a schedule could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleError {
    /// `steps` was 0; at least one step is needed.
    NoSteps,
    /// An output or input slice has the wrong length.
    WrongLength { expected: usize, got: usize },
    /// The shift parameters (`mu`, `shift`) are not finite, or they produce a
    /// non-finite sigma (e.g. a linear shift with `mu = 0`).
    NonFinite,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSteps => write!(f, "the number of steps must be at least 1"),
            Self::WrongLength { expected, got } => write!(f, "expected a slice of {expected} values, got {got}"),
            Self::NonFinite => write!(f, "the schedule parameters give a non-finite sigma"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ScheduleError {}

/// `compute_empirical_mu(image_seq_len, num_steps)` of the FLUX.2 pipelines
/// (and of BFL's reference), in f64 exactly as Python evaluates it.
///
/// Above 4300 tokens `mu = a2·S + b2`. Otherwise `mu` is the line through
/// (10 steps, `a1·S + b1`) and (200 steps, `a2·S + b2`), taken at `N`.
pub fn compute_empirical_mu(image_seq_len: usize, num_steps: usize) -> f64 {
    const A1: f64 = 8.73809524e-05;
    const B1: f64 = 1.89833333;
    const A2: f64 = 0.00016927;
    const B2: f64 = 0.45666666;
    let s = image_seq_len as f64;
    if image_seq_len > 4300 {
        return A2 * s + B2;
    }
    let m_200 = A2 * s + B2;
    let m_10 = A1 * s + B1;
    let a = (m_200 - m_10) / 190.0;
    let b = m_200 - 200.0 * a;
    a * num_steps as f64 + b
}

/// Element `i` of `np.linspace(1.0, 1/n, n)` (f64): numpy computes
/// `i·step + 1` with `step = (1/n − 1)/(n − 1)`, rounding after the multiply
/// and after the add, and stores the endpoint `1/n` exactly.
fn linspace_from_one(i: usize, n: usize) -> f64 {
    let stop = 1.0 / n as f64;
    if n == 1 {
        // numpy: `arange(1)·delta + start`.
        return 0.0 * (stop - 1.0) + 1.0;
    }
    if i == n - 1 {
        return stop;
    }
    let step = (stop - 1.0) / (n - 1) as f64;
    i as f64 * step + 1.0
}

/// Shift one float32 sigma as `set_timesteps` does (numpy float32, a Python
/// float is rounded to f32 before it meets the array).
fn shift_sigma(cfg: &SchedulerConfig, mu: f64, sigma: f32) -> f32 {
    if cfg.use_dynamic_shifting {
        // `(1 / t − 1) ** 1.0` with t float32; the power 1.0 is exact.
        let x = 1.0 / sigma - 1.0;
        // exponential: `exp(mu) / (exp(mu) + x)`; linear: `mu / (mu + x)`.
        let m = match cfg.time_shift_type {
            TimeShift::Exponential => libm::exp(mu) as f32,
            TimeShift::Linear => mu as f32,
        };
        m / (m + x)
    } else {
        // `shift * sigmas / (1 + (shift - 1) * sigmas)`; `shift - 1` is a
        // Python (f64) subtraction before the rounding to f32.
        let shift = cfg.shift as f32;
        let shift_minus_one = (cfg.shift - 1.0) as f32;
        (shift * sigma) / (1.0 + shift_minus_one * sigma)
    }
}

/// The `steps + 1` sigmas of `Flux2KleinPipeline` for `image_seq_len` image
/// tokens: `linspace(1, 1/N, N)` rounded to f32, shifted (dynamically with
/// `mu = compute_empirical_mu(S, N)` when `use_dynamic_shifting`, else by
/// the static `shift`), then the terminal 0. `out` must hold `steps + 1`
/// values.
pub fn sigmas(cfg: &SchedulerConfig, image_seq_len: usize, steps: usize, out: &mut [f32]) -> Result<(), ScheduleError> {
    sigmas_with_mu(cfg, compute_empirical_mu(image_seq_len, steps), steps, out)
}

/// [`sigmas`] with an explicit `mu` (`set_timesteps(sigmas=linspace, mu=mu)`).
/// `mu` is ignored when the config has no dynamic shifting.
pub fn sigmas_with_mu(cfg: &SchedulerConfig, mu: f64, steps: usize, out: &mut [f32]) -> Result<(), ScheduleError> {
    if steps == 0 {
        return Err(ScheduleError::NoSteps);
    }
    let expected = steps.checked_add(1).ok_or(ScheduleError::WrongLength { expected: usize::MAX, got: out.len() })?;
    if out.len() != expected {
        return Err(ScheduleError::WrongLength { expected, got: out.len() });
    }
    let params_finite = if cfg.use_dynamic_shifting { mu.is_finite() } else { cfg.shift.is_finite() };
    if !params_finite {
        return Err(ScheduleError::NonFinite);
    }
    let (shifted, terminal) = out.split_at_mut(steps);
    for (i, s) in shifted.iter_mut().enumerate() {
        // `np.array(sigmas).astype(np.float32)`.
        let sigma = linspace_from_one(i, steps) as f32;
        *s = shift_sigma(cfg, mu, sigma);
        if !s.is_finite() {
            return Err(ScheduleError::NonFinite);
        }
    }
    terminal[0] = 0.0;
    Ok(())
}

/// The scheduler's timestep for a sigma, `sigma · 1000` in float32 (FLUX.2's
/// `num_train_timesteps` is 1000). This is `scheduler.timesteps[i]`; the
/// pipeline feeds `timestep / 1000` to the transformer, which multiplies by
/// 1000 again.
pub fn timestep(sigma: f32) -> f32 {
    timestep_for(1000, sigma)
}

/// `sigma · num_train_timesteps` in float32, for configs other than 1000.
pub fn timestep_for(num_train_timesteps: usize, sigma: f32) -> f32 {
    sigma * num_train_timesteps as f32
}

/// One Euler step of `FlowMatchEulerDiscreteScheduler.step` in float32:
/// `dt = σ_next − σ`, then `latents = latents + dt·velocity`, rounding the
/// product and the sum separately (two torch ops), as diffusers does.
pub fn euler_step(latents: &mut [f32], velocity: &[f32], sigma: f32, sigma_next: f32) -> Result<(), ScheduleError> {
    if latents.len() != velocity.len() {
        return Err(ScheduleError::WrongLength { expected: latents.len(), got: velocity.len() });
    }
    let dt = sigma_next - sigma;
    for (x, &v) in latents.iter_mut().zip(velocity) {
        let step = dt * v;
        *x += step;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flux2() -> SchedulerConfig {
        SchedulerConfig {
            num_train_timesteps: 1000,
            shift: 3.0,
            use_dynamic_shifting: true,
            time_shift_type: TimeShift::Exponential,
            base_shift: 0.5,
            max_shift: 1.15,
            base_image_seq_len: 256,
            max_image_seq_len: 4096,
        }
    }

    #[test]
    fn empirical_mu_matches_the_spec_examples() {
        assert!((compute_empirical_mu(4096, 4) - 2.29118).abs() < 1e-5);
        assert!((compute_empirical_mu(4096, 50) - 2.02335).abs() < 1e-5);
        // Above 4300 tokens the step count does not matter.
        assert_eq!(compute_empirical_mu(4608, 4), compute_empirical_mu(4608, 50));
    }

    #[test]
    fn flux2_sigmas_for_1024_squared() {
        let mut s = [0f32; 5];
        sigmas(&flux2(), 4096, 4, &mut s).unwrap();
        let want = [1.0, 0.96738, 0.90814, 0.76720, 0.0];
        for (got, want) in s.iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{s:?}");
        }
        assert_eq!(s[0], 1.0);
        assert_eq!(timestep(s[0]), 1000.0);
    }

    #[test]
    fn default_config_keeps_the_linspace() {
        let cfg = SchedulerConfig { shift: 1.0, use_dynamic_shifting: false, ..flux2() };
        let mut s = [0f32; 5];
        sigmas(&cfg, 64, 4, &mut s).unwrap();
        assert_eq!(s, [1.0, 0.75, 0.5, 0.25, 0.0]);
        let mut one = [0f32; 2];
        sigmas(&cfg, 64, 1, &mut one).unwrap();
        assert_eq!(one, [1.0, 0.0]);
    }

    #[test]
    fn rejects_bad_input() {
        let mut s = [0f32; 4];
        assert_eq!(sigmas(&flux2(), 64, 0, &mut s[..1]), Err(ScheduleError::NoSteps));
        assert_eq!(sigmas(&flux2(), 64, 4, &mut s), Err(ScheduleError::WrongLength { expected: 5, got: 4 }));
        assert_eq!(sigmas_with_mu(&flux2(), f64::NAN, 3, &mut s), Err(ScheduleError::NonFinite));
        let linear = SchedulerConfig { time_shift_type: TimeShift::Linear, ..flux2() };
        assert_eq!(sigmas_with_mu(&linear, 0.0, 3, &mut s), Err(ScheduleError::NonFinite));
        let mut x = [0f32; 3];
        assert_eq!(euler_step(&mut x, &[1.0; 2], 1.0, 0.5), Err(ScheduleError::WrongLength { expected: 3, got: 2 }));
    }

    #[test]
    fn euler_rounds_product_then_sum() {
        let mut x = [1.0f32, -2.0];
        euler_step(&mut x, &[0.5, 4.0], 1.0, 0.75).unwrap();
        assert_eq!(x, [0.875, -3.0]);
    }
}

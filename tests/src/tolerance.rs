//! The project's tolerances ([`flux_lite_platform::tolerance`], where
//! `flux-lite selftest` reads them too) and the suite's image assertion.

pub use flux_lite_platform::tolerance::*;

/// Asserts the f32 image tolerance, naming `what` and both figures on failure.
#[track_caller]
pub fn assert_png_close(what: &str, got: &[u8], want: &[u8]) {
    let (max, mean) = png_gap(got, want);
    assert!(
        max <= f32::PNG_MAX_LEVELS && mean <= f32::PNG_MEAN_LEVELS,
        "{what}: max |Δ| {max} (bound {}), mean |Δ| {mean:.5} (bound {})",
        f32::PNG_MAX_LEVELS,
        f32::PNG_MEAN_LEVELS
    );
}

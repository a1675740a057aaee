//! libFuzzer entry for `flux_lite_tests::fuzz::weights` (see that module).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _accepted = flux_lite_tests::fuzz::weights(data);
});

//! libFuzzer entry for `flux_lite_tests::fuzz::df11` (see that module).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _accepted = flux_lite_tests::fuzz::df11(data);
});

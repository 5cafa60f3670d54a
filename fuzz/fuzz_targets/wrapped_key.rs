//! The `wrapped_key` fuzz target: `ninefold_fuzz::wrapped_key` (input layout and checks
//! there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::wrapped_key::run(data));

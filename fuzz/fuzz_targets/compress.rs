//! The `compress` fuzz target: `ninefold_fuzz::compress` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::compress::run(data));

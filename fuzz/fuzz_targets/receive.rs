//! The `receive` fuzz target: `ninefold_fuzz::receive` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::receive::run(data));

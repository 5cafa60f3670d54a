//! The `ctl` fuzz target: `ninefold_fuzz::ctl` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::ctl::run(data));

//! The `cmdline` fuzz target: `ninefold_fuzz::cmdline` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::cmdline::run(data));

//! The `log_replay` fuzz target: `ninefold_fuzz::log_replay` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::log_replay::run(data));

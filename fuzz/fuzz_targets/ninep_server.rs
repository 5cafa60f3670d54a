//! The `ninep_server` fuzz target: `ninefold_fuzz::ninep_server` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::ninep_server::run(data));

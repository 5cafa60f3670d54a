//! The `ninep_wire` fuzz target: `ninefold_fuzz::ninep_wire` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::ninep_wire::run(data));

//! The `node` fuzz target: `ninefold_fuzz::node` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::node::run(data));

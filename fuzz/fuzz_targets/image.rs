//! The `image` fuzz target: `ninefold_fuzz::image` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::image::run(data));

//! The `superblock` fuzz target: `ninefold_fuzz::superblock` (input layout and checks there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ninefold_fuzz::superblock::run(data));

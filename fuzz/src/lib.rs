//! ninefold's fuzz targets, as a library: each target is a `run(&[u8])` function in its
//! own module, wrapped by a three-line libFuzzer binary in `fuzz_targets/`, and each
//! has a `seeds()` function that makes its seed corpus from valid structures built with
//! the filesystem's own code (`src/bin/seeds.rs` writes them to `corpus/`).
//!
//! Random bytes only test checksums, so every target that decodes checksummed data
//! *reseals* what it is given before decoding it (the crc32c of superblocks, bitmap
//! groups, bset headers and bodies, log blocks, stream records): the fuzzer's mutations
//! reach the fields behind the checksums, as a forger's would. See `docs/testing.md`,
//! "Fuzzing", for each target's input layout.
//!
//! A target checks more than "no panic": decoders round-trip, a hostile 9P session
//! leaves the server's books balanced and the filesystem fsck-clean, and what fsck
//! calls clean mounts and serves. Checks that a known, still open bug of issue 40 would
//! fail are gated by [`known`]: an explicit list the fixes empty.

pub mod envelope;
pub mod images;
pub mod known;
pub mod reseal;
pub mod walk;

pub mod cmdline;
pub mod compress;
pub mod ctl;
pub mod image;
pub mod log_replay;
pub mod ninep_server;
pub mod ninep_wire;
pub mod node;
pub mod receive;
pub mod superblock;
pub mod wrapped_key;

/// Every target: its name (the binary's and the corpus directory's) and its seeds.
pub const TARGETS: &[(&str, fn() -> Vec<(String, Vec<u8>)>)] = &[
    ("node", node::seeds),
    ("superblock", superblock::seeds),
    ("image", image::seeds),
    ("log_replay", log_replay::seeds),
    ("receive", receive::seeds),
    ("ninep_wire", ninep_wire::seeds),
    ("ninep_server", ninep_server::seeds),
    ("ctl", ctl::seeds),
    ("cmdline", cmdline::seeds),
    ("compress", compress::seeds),
    ("wrapped_key", wrapped_key::seeds),
];

/// Runs target `name` on `data` (the replay of a corpus without libFuzzer).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "node" => node::run(data),
        "superblock" => superblock::run(data),
        "image" => image::run(data),
        "log_replay" => log_replay::run(data),
        "receive" => receive::run(data),
        "ninep_wire" => ninep_wire::run(data),
        "ninep_server" => ninep_server::run(data),
        "ctl" => ctl::run(data),
        "cmdline" => cmdline::run(data),
        "compress" => compress::run(data),
        "wrapped_key" => wrapped_key::run(data),
        _ => panic!("no fuzz target {name}"),
    }
}

/// Runs a future to completion (everything here completes without other threads).
pub fn block_on<F: core::future::Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

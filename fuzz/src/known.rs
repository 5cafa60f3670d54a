//! Known, still open bugs: the explicit list through which a target steps around a bug
//! that is already reported and being fixed, so that fuzzing (and CI's brief runs)
//! keeps looking for new ones instead of stopping at the old one every time.
//!
//! Each entry names a bug of issue 40 (or one this fuzzing found, reported with it).
//! A target asks [`open`] before an input or a check that would hit it: while the bug
//! is listed, the input is skipped or the check is not made. **A fix removes its entry**
//! (and the reproducers under `fuzz/regressions/` then run, and must pass, in CI).
//! `NINEFOLD_FUZZ_STRICT=1` ignores the list: every check is made (to see a fix work
//! before removing its entry, or to reproduce the known crashes).
//!
//! The reproducers of listed bugs are in `fuzz/regressions/TARGET/`, named after the
//! entry (`F1-...`); CI replays them, and they pass only because of the list.

use std::sync::OnceLock;

/// The open entries. Remove one when its fix lands.
pub const OPEN: &[(&str, &str)] = &[
    (
        "F1",
        "bset key count trusted: Vec::with_capacity(nkeys) aborts on a forged count (fs/src/format/bset.rs)",
    ),
    (
        "F2",
        "superblock checkpoint_seq/generation near u64::MAX wraps (an overflow panic with overflow checks)",
    ),
    (
        "F3",
        "log replay applies records a live operation would refuse (cycles, '/' or '..' names, type changes): the image after replay is not what fsck and the mount agree on",
    ),
    (
        "F4",
        "a stream that passes the check but fails while applying leaves the live tree half changed",
    ),
    (
        "F5",
        "next_ino unchecked: inode numbers in the snapshot space or wrapping to 0",
    ),
    (
        "F6",
        "fsck gaps: what fsck calls clean the mount may refuse or serve wrong (sizes, snapshot items, orphans, feature bits)",
    ),
];

fn strict() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(|| std::env::var_os("NINEFOLD_FUZZ_STRICT").is_some_and(|v| v != "0"))
}

/// Whether bug `id` is listed as open (and not overridden by `NINEFOLD_FUZZ_STRICT`).
pub fn open(id: &str) -> bool {
    !strict() && OPEN.iter().any(|(i, _)| *i == id)
}

/// Whether an input showing `condition` should be skipped because it would hit the
/// open bug `id`.
pub fn skip(id: &str, condition: bool) -> bool {
    condition && open(id)
}

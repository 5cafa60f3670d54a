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

/// The open entries. Remove one when its fix lands. Empty: F1..F6, the bugs of issue
/// 40 this list once held (bset key counts, sequence wrap-around, log replay rules,
/// receive rollback, inode numbers, fsck gaps), are fixed on main, and the targets
/// check everything.
pub const OPEN: &[(&str, &str)] = &[];

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

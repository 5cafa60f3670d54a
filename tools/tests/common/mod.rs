//! Shared by the integration tests of the `ninefold` binary: running it, and the check
//! of an image every test that writes one ends with.
//!
//! (The QEMU tests' `FsImage::fsck` in `tests/src` makes the same check of their
//! images; this crate's tests cannot use that crate, which builds the kernel for the
//! host and runs the tool from `target/debug`, not `CARGO_BIN_EXE_ninefold`.)

// Each test file uses a part.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::Command;

/// The `ninefold` binary of this build.
pub fn ninefold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ninefold"))
}

/// Requires `ninefold fsck` to find `image` clean (exit status 0: no error; an image not
/// unmounted cleanly, with a log to replay, is clean too); returns its report (stdout)
/// for further checks.
pub fn fsck_clean(image: impl AsRef<OsStr>) -> String {
    let image = image.as_ref();
    let out = ninefold().arg("fsck").arg(image).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ninefold fsck {}: {}\n{report}{}",
        image.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

/// [`fsck_clean`], and `image` was unmounted cleanly: the report warns of no unclean
/// unmount and of no log for the next mount to replay. Returns the report.
pub fn fsck_unmounted_cleanly(image: impl AsRef<OsStr>) -> String {
    let report = fsck_clean(&image);
    for unclean in ["not unmounted cleanly", "replay"] {
        assert!(
            !report.contains(unclean),
            "ninefold fsck {}: not unmounted cleanly:\n{report}",
            image.as_ref().display()
        );
    }
    report
}

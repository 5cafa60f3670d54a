//! Rules for QEMU's `blkdebug` block driver: device errors injected *outside* the
//! appliance, below its drivers, as a real failing disk would return them (the same
//! policy tests as the appliance's own `fault=`, from the other side).
//!
//! `blkdebug` matches rules on block-layer events. A raw format node over the `blkdebug`
//! node ([`crate::Qemu::nvme_blkdebug`]) raises `read_aio` and `write_aio` before each
//! read and write and `flush_to_disk` before each FLUSH that follows a write (QEMU skips a
//! FLUSH with nothing written since the last one). An `[inject-error]` rule armed by an
//! event fails the requests of its `iotype` (at `sector`, if given) with `errno`; the
//! driver's state number (from 1) counts events through `[set-state]` rules.

use std::fmt::Write as _;
use std::path::Path;

/// EIO on Linux, what a failing disk returns.
const EIO: u32 = 5;

/// A `blkdebug` configuration file being built.
#[derive(Clone, Debug, Default)]
pub struct Blkdebug {
    text: String,
}

impl Blkdebug {
    /// Every FLUSH from the `n`-th on (counting from 0) fails with EIO: `n` `[set-state]`
    /// rules count the FLUSHes, then one `[inject-error]` rule fails each FLUSH in the
    /// last state.
    pub fn flushes_fail_from(mut self, n: u32) -> Self {
        for state in 1..=n {
            writeln!(
                self.text,
                "[set-state]\nevent = \"flush_to_disk\"\nstate = \"{state}\"\nnew_state = \"{}\"\n",
                state + 1
            )
            .unwrap();
        }
        writeln!(
            self.text,
            "[inject-error]\nevent = \"flush_to_disk\"\nstate = \"{}\"\niotype = \"flush\"\nerrno = \"{EIO}\"\n",
            n + 1
        )
        .unwrap();
        self
    }

    /// Every read covering 512-byte sector `sector` fails with EIO.
    pub fn reads_fail_at(mut self, sector: u64) -> Self {
        writeln!(
            self.text,
            "[inject-error]\nevent = \"read_aio\"\niotype = \"read\"\nsector = \"{sector}\"\nerrno = \"{EIO}\"\n"
        )
        .unwrap();
        self
    }

    /// Writes the configuration to `path`.
    pub fn write_to(&self, path: &Path) {
        std::fs::write(path, &self.text).expect("writing the blkdebug configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flushes_through_states() {
        let b = Blkdebug::default().flushes_fail_from(2);
        assert_eq!(b.text.matches("[set-state]").count(), 2);
        assert!(b.text.contains("state = \"2\"\nnew_state = \"3\""));
        assert!(b.text.contains("state = \"3\"\niotype = \"flush\""));
    }
}

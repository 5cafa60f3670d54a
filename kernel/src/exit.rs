//! How the appliance tells a test harness how it ended.
//!
//! With QEMU's `isa-debug-exit` device at port 0xf4, writing a code `c` makes QEMU exit
//! with status `(c << 1) | 1`. Each ending has its own code, so a harness can tell a clean
//! self-test run from a panic from a fault. The values are part of the test interface.

/// Why the machine stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ExitCode {
    /// Boot (and the self-test, if requested) completed. QEMU status 33.
    Success = 0x10,
    /// A Rust panic. QEMU status 35.
    Panic = 0x11,
    /// A CPU exception other than a stack overflow. QEMU status 37.
    Exception = 0x12,
    /// A kernel stack ran into its guard page. QEMU status 39.
    StackOverflow = 0x13,
    /// A self-check failed. QEMU status 41.
    SelftestFailed = 0x14,
}

impl ExitCode {
    /// Every code.
    pub const ALL: [ExitCode; 5] = [
        ExitCode::Success,
        ExitCode::Panic,
        ExitCode::Exception,
        ExitCode::StackOverflow,
        ExitCode::SelftestFailed,
    ];

    /// The exit status QEMU reports for this code.
    pub const fn qemu_status(self) -> i32 {
        ((self as i32) << 1) | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_distinct_and_never_qemu_own() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ExitCode::ALL {
            let s = c.qemu_status();
            // 0: QEMU quit normally; 1: QEMU error; 124/137: timeout(1).
            assert!(![0, 1, 124, 137].contains(&s));
            assert!(seen.insert(s));
        }
        assert_eq!(ExitCode::Success.qemu_status(), 33);
    }
}

//! The `log` backend: timestamped lines on the serial console, for people (programs read
//! the structured events, `crate::event`, on their own channel).
//!
//! `[    1.234567] INFO  pci: 00:04.0 1b36:0010 class 01.08 NVMe controller (QEMU)`
//!
//! Kernel messages start with their subsystem; messages from other crates are prefixed
//! with the crate (`acpi: ...`).
//!
//! The timestamp is the monotonic clock (zero until the TSC is calibrated). Each line is
//! written under the console lock in one piece, with interrupts disabled.

use log::{LevelFilter, Log, Metadata, Record};

use crate::hal::console;

struct SerialLogger;

static LOGGER: SerialLogger = SerialLogger;

/// Crates whose `info` lines are details for `log=debug` (virtio-drivers' feature
/// negotiation, say): the console's `info` is the kernel's own.
const CHATTY: &[&str] = &["virtio_drivers"];

impl Log for SerialLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let level = if metadata.level() == log::Level::Info
            && CHATTY.iter().any(|c| metadata.target().starts_with(c))
        {
            log::Level::Debug
        } else {
            metadata.level()
        };
        level <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Kernel messages carry their subsystem ("pci: ..."); other crates' get their name.
        let target = record.target();
        let (sep, target) = if target == "kernel" || target.starts_with("kernel::") {
            ("", "")
        } else {
            (": ", target)
        };
        let micros = crate::clock::now().as_nanos() / 1_000;
        console::write_fmt(format_args!(
            "[{:>5}.{:06}] {:<5} {target}{sep}{}\n",
            micros / 1_000_000,
            micros % 1_000_000,
            record.level(),
            record.args()
        ));
    }

    fn flush(&self) {}
}

/// Installs the logger at `level`.
pub fn init(level: LevelFilter) {
    // Only fails if a logger is already installed, which would be ours.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

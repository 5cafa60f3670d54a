//! Wall-clock time: the CMOS real-time clock, read once at boot, advanced by the
//! monotonic clock.
//!
//! Filesystems need "now" for timestamps ([`vfs::Clock`]). The RTC has one-second
//! resolution and is slow to read, so [`WallClock`] reads it once and adds the TSC-based
//! uptime since then.

use core::time::Duration;

use vfs::{Clock, Timespec};

use crate::hal::io_port::IoPort;
use crate::sync::IrqLock;

const INDEX: IoPort<u8> = IoPort::new(0x70);
const DATA: IoPort<u8> = IoPort::new(0x71);
/// Keep NMIs disabled while selecting a register (bit 7 of the index).
const NMI_OFF: u8 = 0x80;

/// The index/data pair must not be split by another access.
static LOCK: IrqLock<()> = IrqLock::new(());

fn read(reg: u8) -> u8 {
    LOCK.lock(|_| {
        INDEX.write(NMI_OFF | reg);
        DATA.read()
    })
}

/// The RTC's date and time, in seconds since the Unix epoch (UTC assumed, as QEMU's
/// default `-rtc base=utc`).
pub fn read_epoch_seconds() -> i64 {
    // Read until two consecutive reads agree, outside an update cycle.
    let snapshot = || {
        while read(0x0a) & 0x80 != 0 {
            core::hint::spin_loop();
        }
        [0x00, 0x02, 0x04, 0x07, 0x08, 0x09, 0x32, 0x0b].map(read)
    };
    let mut r = snapshot();
    loop {
        let again = snapshot();
        if again == r {
            break;
        }
        r = again;
    }
    let [sec, min, hour, day, month, year, century, status_b] = r;
    let bcd = status_b & 0x04 == 0;
    let dec = |v: u8| if bcd { (v & 0x0f) + (v >> 4) * 10 } else { v };
    let pm = hour & 0x80 != 0;
    let mut hour = dec(hour & 0x7f);
    if status_b & 0x02 == 0 {
        // 12-hour mode.
        hour = hour % 12 + if pm { 12 } else { 0 };
    }
    let century = match dec(century) {
        19..=21 => i64::from(dec(century)),
        _ => 20,
    };
    let year = century * 100 + i64::from(dec(year));
    days_from_civil(year, u32::from(dec(month)), u32::from(dec(day))) * 86_400
        + i64::from(hour) * 3_600
        + i64::from(dec(min)) * 60
        + i64::from(dec(sec))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Wall-clock time for filesystems: the RTC at creation plus uptime since.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    epoch_at: i64,
    uptime_at: Duration,
}

impl WallClock {
    /// Reads the RTC.
    pub fn new() -> WallClock {
        WallClock {
            epoch_at: read_epoch_seconds(),
            uptime_at: super::uptime(),
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Timespec {
        let since = super::uptime().saturating_sub(self.uptime_at);
        Timespec {
            sec: self.epoch_at + since.as_secs() as i64,
            nsec: since.subsec_nanos(),
        }
    }
}

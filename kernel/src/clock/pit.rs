//! The 8254 programmable interval timer: a fixed 1.193182 MHz reference for calibrating
//! the TSC, and a one-shot interrupt source (IRQ 0) for testing IOAPIC routing.

use core::time::Duration;

use crate::hal::cpu;
use crate::hal::io_port::IoPort;

/// The PIT's input clock.
pub const PIT_HZ: u64 = 1_193_182;

const CHANNEL0: IoPort<u8> = IoPort::new(0x40);
const CHANNEL2: IoPort<u8> = IoPort::new(0x42);
const COMMAND: IoPort<u8> = IoPort::new(0x43);
/// NMI status and control: bit 0 gates channel 2, bit 1 drives the speaker, bit 5 reads
/// channel 2's output.
const PORT_B: IoPort<u8> = IoPort::new(0x61);

fn pit_ticks(ms: u64) -> u16 {
    (PIT_HZ * ms / 1000).clamp(1, 0xffff) as u16
}

/// Counts TSC ticks while PIT channel 2 counts down `ms` milliseconds (at most 54).
/// Returns the TSC delta and the exact window length.
pub fn measure_tsc(ms: u64) -> (u64, Duration) {
    let count = pit_ticks(ms);
    // Gate high, speaker off.
    PORT_B.write((PORT_B.read() & !0x02) | 0x01);
    // Channel 2, lobyte/hibyte, mode 0 (interrupt on terminal count), binary.
    COMMAND.write(0b1011_0000);
    CHANNEL2.write(count as u8);
    CHANNEL2.write((count >> 8) as u8);
    let start = cpu::rdtsc();
    while PORT_B.read() & 0x20 == 0 {
        core::hint::spin_loop();
    }
    let end = cpu::rdtsc();
    let window = Duration::from_nanos(u64::from(count) * 1_000_000_000 / PIT_HZ);
    (end - start, window)
}

/// Programs channel 0 to raise IRQ 0 once, after about `ms` milliseconds (at most 54).
pub fn oneshot_irq0(ms: u64) {
    let count = pit_ticks(ms);
    // Channel 0, lobyte/hibyte, mode 0, binary.
    COMMAND.write(0b0011_0000);
    CHANNEL0.write(count as u8);
    CHANNEL0.write((count >> 8) as u8);
}

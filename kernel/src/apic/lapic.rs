//! The local APIC (xAPIC, memory-mapped): end-of-interrupt, identity, and the timer the
//! executor uses as a one-shot wake-up.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use crate::hal::mmio::MmioRegion;
use crate::hal::paging::{self, MapError};
use crate::irq::{ERROR_VECTOR, SPURIOUS_VECTOR, TIMER_VECTOR};

const ID: usize = 0x20;
const TPR: usize = 0x80;
const EOI: usize = 0xb0;
const SVR: usize = 0xf0;
const ESR: usize = 0x280;
const ICR_LOW: usize = 0x300;
const ICR_HIGH: usize = 0x310;
const LVT_TIMER: usize = 0x320;
const LVT_LINT0: usize = 0x350;
const LVT_LINT1: usize = 0x360;
const LVT_ERROR: usize = 0x370;
const TIMER_INITIAL: usize = 0x380;
const TIMER_CURRENT: usize = 0x390;
const TIMER_DIVIDE: usize = 0x3e0;

const MASKED: u32 = 1 << 16;
const SVR_ENABLE: u32 = 1 << 8;
/// Divide configuration 0b0011: divide by 16.
const DIVIDE_BY_16: u32 = 0x3;

static LAPIC: spin::Once<MmioRegion> = spin::Once::new();
/// Timer ticks per millisecond (after the divider); 0 until calibrated.
static TICKS_PER_MS: AtomicU64 = AtomicU64::new(0);

fn regs() -> &'static MmioRegion {
    LAPIC.get().expect("local APIC not initialised")
}

/// Maps the local APIC at `phys` (from the MADT; every CPU sees its own APIC there) and
/// sets up the boot CPU's ([`init_this_cpu`]).
pub fn init(phys: u64) -> Result<(), MapError> {
    let mapped = paging::map_mmio(phys, 0x1000)?;
    LAPIC.call_once(|| mapped);
    init_this_cpu();
    Ok(())
}

/// Enables this CPU's local APIC with the spurious vector, masks LINT0/1 and the timer,
/// and routes APIC errors to [`ERROR_VECTOR`]. Each application processor calls it for
/// its own APIC after the boot CPU's [`init`].
pub fn init_this_cpu() {
    let regs = regs();
    regs.write32(TPR, 0);
    regs.write32(LVT_TIMER, MASKED | u32::from(TIMER_VECTOR));
    regs.write32(LVT_LINT0, MASKED);
    regs.write32(LVT_LINT1, MASKED);
    regs.write32(LVT_ERROR, u32::from(ERROR_VECTOR));
    regs.write32(ESR, 0);
    regs.write32(SVR, SVR_ENABLE | u32::from(SPURIOUS_VECTOR));
    regs.write32(TIMER_DIVIDE, DIVIDE_BY_16);
}

/// Signals end of interrupt.
pub fn eoi() {
    if let Some(r) = LAPIC.get() {
        r.write32(EOI, 0);
    }
}

/// This CPU's local APIC id (0 before initialisation).
pub fn id() -> u8 {
    LAPIC.get().map_or(0, |r| (r.read32(ID) >> 24) as u8)
}

/// Interrupt command register bits.
mod icr {
    /// Delivery mode INIT.
    pub const INIT: u32 = 0b101 << 8;
    /// Delivery mode Start-up (the vector names the start page).
    pub const STARTUP: u32 = 0b110 << 8;
    /// The previous IPI is still being sent.
    pub const PENDING: u32 = 1 << 12;
    /// Level assert (required for INIT and start-up IPIs).
    pub const ASSERT: u32 = 1 << 14;
}

/// Sends an inter-processor interrupt (`low` is ICR bits 0..32) to the CPU with local APIC
/// id `apic_id`, waiting until the previous one has left. Interrupts stay off while the
/// two halves are written, so a handler's IPI cannot interleave with ours.
fn send_ipi(apic_id: u8, low: u32) {
    let regs = regs();
    crate::hal::cpu::without_interrupts(|| {
        while regs.read32(ICR_LOW) & icr::PENDING != 0 {
            core::hint::spin_loop();
        }
        regs.write32(ICR_HIGH, u32::from(apic_id) << 24);
        regs.write32(ICR_LOW, low);
    });
}

/// Sends INIT to `apic_id`: the CPU resets and waits for a start-up IPI.
pub fn send_init(apic_id: u8) {
    send_ipi(apic_id, icr::INIT | icr::ASSERT);
}

/// Sends a start-up IPI to `apic_id`: the CPU starts in real mode at `page * 4096`.
pub fn send_startup(apic_id: u8, page: u8) {
    send_ipi(apic_id, icr::STARTUP | icr::ASSERT | u32::from(page));
}

/// Sends a fixed interrupt with `vector` to `apic_id`.
pub fn send_fixed(apic_id: u8, vector: u8) {
    send_ipi(apic_id, icr::ASSERT | u32::from(vector));
}

/// Measures the timer's rate against `now` (a calibrated clock): five rounds of counting
/// down for about 10 ms each; the median wins, so one round stretched by the host
/// descheduling us does not skew it. Returns ticks per millisecond.
pub fn calibrate_timer(now: impl Fn() -> Duration) -> u64 {
    let regs = regs();
    regs.write32(LVT_TIMER, MASKED | u32::from(TIMER_VECTOR));
    let mut rounds = [0u64; 5];
    for r in &mut rounds {
        let start = now();
        regs.write32(TIMER_INITIAL, u32::MAX);
        while now() - start < Duration::from_millis(10) {
            core::hint::spin_loop();
        }
        let ticks = u64::from(u32::MAX - regs.read32(TIMER_CURRENT));
        let elapsed = now() - start;
        *r = (u128::from(ticks) * 1_000_000 / elapsed.as_nanos().max(1)) as u64;
    }
    regs.write32(TIMER_INITIAL, 0);
    rounds.sort_unstable();
    let per_ms = rounds[rounds.len() / 2].max(1);
    TICKS_PER_MS.store(per_ms, Ordering::Relaxed);
    per_ms
}

/// Sets this CPU's timer to one-shot mode and unmasks it, without starting it: then
/// [`arm`] starts it.
pub fn unmask_oneshot() {
    regs().write32(LVT_TIMER, u32::from(TIMER_VECTOR));
}

/// Starts the timer to interrupt once, `after` from now (clamped to what the counter can
/// hold; the executor re-arms as needed). Zero fires as soon as possible. Needs
/// [`unmask_oneshot`] first on this CPU.
pub fn arm(after: Duration) {
    let per_ms = TICKS_PER_MS.load(Ordering::Relaxed);
    assert!(per_ms != 0, "APIC timer not calibrated");
    let ticks = u128::from(per_ms) * after.as_nanos() / 1_000_000;
    let ticks = ticks.clamp(1, u128::from(u32::MAX)) as u32;
    regs().write32(TIMER_INITIAL, ticks);
}

/// Stops the timer.
pub fn disarm() {
    regs().write32(TIMER_INITIAL, 0);
}

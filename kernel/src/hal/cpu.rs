//! CPU control: the interrupt flag, halting, timestamps, identification.

use core::sync::atomic::{AtomicUsize, Ordering};

use super::percpu::{self, MAX_CPUS};

use x86_64::instructions::interrupts;

use super::io_port::IoPort;
use crate::exit::ExitCode;

/// Interrupts are enabled on this CPU.
pub fn interrupts_enabled() -> bool {
    interrupts::are_enabled()
}

/// Enables interrupts.
pub fn enable_interrupts() {
    interrupts::enable();
}

/// Disables interrupts.
pub fn disable_interrupts() {
    interrupts::disable();
}

/// Disables interrupts and says whether they were enabled (for [`restore_interrupts`]).
pub fn save_and_disable_interrupts() -> bool {
    let was = interrupts_enabled();
    disable_interrupts();
    was
}

/// Enables interrupts again if [`save_and_disable_interrupts`] found them enabled.
pub fn restore_interrupts(were_enabled: bool) {
    if were_enabled {
        enable_interrupts();
    }
}

/// Runs `f` with interrupts disabled on this CPU, then restores their previous state.
pub fn without_interrupts<R>(f: impl FnOnce() -> R) -> R {
    let were_enabled = save_and_disable_interrupts();
    let r = f();
    restore_interrupts(were_enabled);
    r
}

/// Enables interrupts and halts until the next one, atomically (`sti; hlt`: an interrupt
/// that arrives between the two still ends the halt).
pub fn enable_interrupts_and_halt() {
    interrupts::enable_and_hlt();
}

/// Stops this CPU for good.
pub fn halt_forever() -> ! {
    loop {
        interrupts::disable();
        x86_64::instructions::hlt();
    }
}

/// The time-stamp counter.
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads a counter; every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter, read in program order: no earlier instruction (a load that
/// saw another CPU's store) completes after it, and no later one starts before it, as
/// comparing readings across CPUs needs.
pub fn rdtsc_ordered() -> u64 {
    let (low, high): (u32, u32);
    // SAFETY: LFENCE only orders execution; RDTSC only reads a counter. Neither touches
    // memory or the stack.
    unsafe {
        core::arch::asm!(
            "lfence",
            "rdtsc",
            "lfence",
            out("eax") low,
            out("edx") high,
            options(nostack, preserves_flags)
        );
    }
    u64::from(high) << 32 | u64::from(low)
}

/// CPUID leaf `leaf`, subleaf `sub`: `[eax, ebx, ecx, edx]`.
pub fn cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    let r = core::arch::x86_64::__cpuid_count(leaf, sub);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// This CPU's initial local APIC id.
pub fn apic_id() -> u8 {
    (cpuid(1, 0)[1] >> 24) as u8
}

/// The page-fault linear address register.
pub fn cr2() -> u64 {
    x86_64::registers::control::Cr2::read_raw()
}

/// Nesting depth of interrupt handlers, per CPU (0: task context).
static IRQ_DEPTH: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];

/// True inside an interrupt or exception handler on this CPU.
pub fn in_interrupt() -> bool {
    IRQ_DEPTH[percpu::index()].load(Ordering::Relaxed) != 0
}

pub(super) fn enter_interrupt() {
    IRQ_DEPTH[percpu::index()].fetch_add(1, Ordering::Relaxed);
}

pub(super) fn leave_interrupt() {
    IRQ_DEPTH[percpu::index()].fetch_sub(1, Ordering::Relaxed);
}

/// The port of QEMU's `isa-debug-exit` device (`-device isa-debug-exit,iobase=0xf4,iosize=4`).
const DEBUG_EXIT_PORT: IoPort<u32> = IoPort::new(0xf4);

/// Leaves QEMU with status `(code << 1) | 1` when the `isa-debug-exit` device is present;
/// otherwise (real hardware, or QEMU without it) stops the CPU.
pub fn exit(code: ExitCode) -> ! {
    DEBUG_EXIT_PORT.write(code as u32);
    halt_forever()
}

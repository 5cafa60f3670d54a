//! Which CPU is running: each CPU's GS base points at its own [`PerCpu`] area, so finding
//! the current CPU's index is one memory read (`mov %gs:0`), cheaper than reading the
//! local APIC's id register (a trap to the hypervisor) or CPUID.
//!
//! CPU indices are dense, in bring-up order: 0 is the boot CPU, application processors
//! follow (`smp::start`). Everything per CPU in the kernel is an array indexed by them
//! ([`CpuLocal`](super::cpu_local::CpuLocal), the interrupt depth, idle time).

use core::sync::atomic::{AtomicUsize, Ordering};

use x86_64::registers::model_specific::GsBase;
use x86_64::VirtAddr;

pub use crate::config::MAX_CPUS;

/// A CPU's own area, found through its GS base.
#[derive(Debug)]
#[repr(C)]
struct PerCpu {
    /// This CPU's index: read at offset 0 by [`index`].
    index: usize,
}

static AREAS: [PerCpu; MAX_CPUS] = {
    let mut areas = [const { PerCpu { index: 0 } }; MAX_CPUS];
    let mut i = 0;
    while i < MAX_CPUS {
        areas[i].index = i;
        i += 1;
    }
    areas
};

/// CPUs whose area is installed (the boot CPU's first, before anything takes a lock).
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

/// Points this CPU's GS base at area `cpu`. Call first thing on every CPU: [`index`] is
/// meaningless before.
///
/// # Panics
/// If `cpu` is not below [`MAX_CPUS`].
pub fn init(cpu: usize) {
    assert!(
        cpu < MAX_CPUS,
        "CPU index {cpu} beyond MAX_CPUS ({MAX_CPUS})"
    );
    GsBase::write(VirtAddr::from_ptr(&AREAS[cpu]));
    INSTALLED.fetch_add(1, Ordering::Relaxed);
}

/// The running CPU's index (0 = the boot CPU).
#[inline]
pub fn index() -> usize {
    let index: usize;
    // SAFETY: `init` pointed this CPU's GS base at an `AREAS` entry (a static: always
    // mapped, never written after initialisation) whose first field is the index; the
    // read has no other effect. `kmain` and `ap_main` call `init` before any code that
    // could get here.
    unsafe {
        core::arch::asm!(
            "mov {}, gs:[0]",
            out(reg) index,
            options(nostack, preserves_flags, readonly, pure)
        )
    };
    index
}

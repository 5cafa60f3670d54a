//! More than one CPU: bringing up the application processors ([`start`]), knowing which
//! are online, and giving them work ([`remote`]).
//!
//! The boot CPU (index 0) starts the others at boot, one at a time, with the INIT and
//! start-up IPIs; each sets up its own GDT, TSS, IDT and local APIC, creates its own
//! executor and serves its inbox. Where everything runs today, and what full SMP serving
//! still needs, is in docs/kernel.md ("CPUs").

mod remote;
mod start;
mod tsc_check;

pub use remote::{spawn_on, Remote};
pub use start::{ap_main, start_application_processors, start_report, StartReport};

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::clock::skew::TscCheck;
use crate::exec::WakeStats;
pub use crate::hal::percpu::MAX_CPUS;

/// What the kernel knows about one CPU slot.
#[derive(Debug)]
struct CpuSlot {
    /// Its local APIC id (valid once `online`).
    apic_id: AtomicU32,
    /// It runs its executor and takes work.
    online: AtomicBool,
    /// Closures it ran from other CPUs ([`spawn_on`]).
    remote_tasks: AtomicU64,
    /// Its TSC against CPU 0's, checked at its bring-up.
    tsc: spin::Once<TscCheck>,
}

static CPUS: [CpuSlot; MAX_CPUS] = [const {
    CpuSlot {
        apic_id: AtomicU32::new(0),
        online: AtomicBool::new(false),
        remote_tasks: AtomicU64::new(0),
        tsc: spin::Once::new(),
    }
}; MAX_CPUS];

/// Marks `cpu` online with local APIC id `apic_id` (each CPU, for itself).
fn set_online(cpu: usize, apic_id: u8) {
    CPUS[cpu]
        .apic_id
        .store(u32::from(apic_id), Ordering::Relaxed);
    CPUS[cpu].online.store(true, Ordering::Release);
}

/// Whether CPU `cpu` is online.
pub fn is_online(cpu: usize) -> bool {
    cpu < MAX_CPUS && CPUS[cpu].online.load(Ordering::Acquire)
}

/// The local APIC id of CPU `cpu`, if it is online.
pub fn apic_id(cpu: usize) -> Option<u8> {
    is_online(cpu).then(|| CPUS[cpu].apic_id.load(Ordering::Relaxed) as u8)
}

/// How many CPUs are online (they are numbered `0..online()`).
pub fn online() -> usize {
    (0..MAX_CPUS).take_while(|&c| is_online(c)).count()
}

/// One CPU, for the counters document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuState {
    /// Its local APIC id.
    pub apic_id: u8,
    /// Closures it ran for other CPUs.
    pub remote_tasks: u64,
    /// Its TSC against CPU 0's (CPU 0's own: zeros).
    pub tsc: TscCheck,
    /// How wakes from other CPUs reached its executor.
    pub wakes: WakeStats,
}

/// CPU `cpu`'s TSC against CPU 0's, if it was checked (never for CPU 0).
pub fn tsc_check(cpu: usize) -> Option<TscCheck> {
    CPUS.get(cpu).and_then(|c| c.tsc.get().copied())
}

/// Every online CPU, by index.
pub fn states() -> impl Iterator<Item = CpuState> {
    (0..online()).map(|c| CpuState {
        apic_id: CPUS[c].apic_id.load(Ordering::Relaxed) as u8,
        remote_tasks: CPUS[c].remote_tasks.load(Ordering::Relaxed),
        tsc: CPUS[c].tsc.get().copied().unwrap_or_default(),
        wakes: crate::task::wake_stats_of(c),
    })
}

//! Starting the application processors: the boot CPU's INIT-SIPI-SIPI sequence, and the
//! AP's first steps ([`ap_main`]).

use alloc::vec::Vec;
use core::time::Duration;

use log::{debug, warn};

use super::{is_online, remote, set_online, tsc_check, CPUS, MAX_CPUS};
use crate::apic::lapic;
use crate::clock::skew::TscCheck;
use crate::hal::{cpu, gdt, percpu, smp as hw, trap};
use crate::{clock, task};

/// Between INIT and the first start-up IPI (the MP specification's 10 ms).
const INIT_DELAY: Duration = Duration::from_millis(10);
/// Between the two start-up IPIs.
const STARTUP_DELAY: Duration = Duration::from_micros(200);
/// How long an AP has to report online before we give up on it (generous: under TCG a
/// CPU's first instructions are translated while the host is busy).
const ONLINE_TIMEOUT: Duration = Duration::from_millis(1000);

/// What [`start_application_processors`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartReport {
    /// CPUs the firmware reports (the MADT's usable local APICs).
    pub reported: usize,
    /// CPUs online now, the boot CPU included.
    pub online: usize,
    /// Local APIC ids that did not come up in time.
    pub failed: Vec<u8>,
    /// Local APIC ids left halted (beyond `limit` or [`MAX_CPUS`]).
    pub skipped: Vec<u8>,
}

fn spin_for(d: Duration) {
    let until = clock::uptime() + d;
    while clock::uptime() < until {
        core::hint::spin_loop();
    }
}

/// Marks the boot CPU online and starts the other CPUs in `apic_ids` (the MADT's), one at
/// a time, until `limit` CPUs (at most [`MAX_CPUS`]) are online. Needs interrupts set up
/// on the boot CPU (its local APIC, calibrated timer) and the page tables final.
pub fn start_application_processors(apic_ids: &[u8], limit: usize) -> StartReport {
    let me = lapic::id();
    set_online(0, me);
    let limit = limit.clamp(1, MAX_CPUS);
    let mut report = StartReport {
        reported: apic_ids.len().max(1),
        ..StartReport::default()
    };
    let others: Vec<u8> = apic_ids.iter().copied().filter(|&id| id != me).collect();
    if others.is_empty() {
        report.online = 1;
        START.call_once(|| report.clone());
        return report;
    }
    if let Err(e) = hw::install_trampoline() {
        warn!("smp: cannot install the AP trampoline ({e:?}); running on one CPU");
        report.online = 1;
        report.skipped = others;
        START.call_once(|| report.clone());
        return report;
    }
    let mut next = 1;
    for apic_id in others {
        if next >= limit {
            report.skipped.push(apic_id);
            continue;
        }
        hw::prepare_start(next);
        tsc_check::prepare();
        lapic::send_init(apic_id);
        spin_for(INIT_DELAY);
        lapic::send_startup(apic_id, hw::STARTUP_PAGE);
        spin_for(STARTUP_DELAY);
        if !is_online(next) {
            lapic::send_startup(apic_id, hw::STARTUP_PAGE);
        }
        let deadline = clock::uptime() + ONLINE_TIMEOUT;
        while !is_online(next) && clock::uptime() < deadline {
            core::hint::spin_loop();
        }
        if is_online(next) {
            check_tsc(next);
            next += 1;
        } else {
            // It may still wake up later on these parameters; a CPU index is never reused
            // while it could.
            warn!("smp: CPU with local APIC id {apic_id} did not come up");
            report.failed.push(apic_id);
            break;
        }
    }
    report.online = next;
    START.call_once(|| report.clone());
    report
}

static START: spin::Once<StartReport> = spin::Once::new();

/// What [`start_application_processors`] did, once it has run.
pub fn start_report() -> Option<&'static StartReport> {
    START.get()
}

/// Measures CPU `cpu`'s TSC against this one's (it waits for that after reporting
/// online), corrects its clock if they differ, and says so.
fn check_tsc(cpu: usize) {
    let Some(skew) = tsc_check::measure(cpu) else {
        warn!("smp: CPU {cpu} did not answer the TSC check; its clock is not checked");
        return;
    };
    let check = TscCheck::of(&skew, clock::ns_per_tick());
    CPUS[cpu].tsc.call_once(|| check);
    if check.corrected {
        warn!(
            "smp: CPU {cpu}: TSC offset {} ns from CPU 0's (+-{} ns now): corrected in the clock",
            check.offset_ns, check.bound_ns
        );
    } else {
        debug!(
            "smp: CPU {cpu}: TSC agrees with CPU 0's within {} ns",
            check.bound_ns
        );
    }
}

/// An application processor's kernel entry (see `boot::ap_entry_point!`): sets up its
/// per-CPU state, reports online and runs its executor, serving its inbox, forever.
pub fn ap_main(cpu: usize) -> ! {
    percpu::init(cpu);
    gdt::init(cpu);
    trap::init();
    lapic::init_this_cpu();
    let executor = task::init();
    set_online(cpu, lapic::id());
    // CPU 0 checks this CPU's TSC against its own now, and corrects its clock if need be.
    tsc_check::answer();
    debug!("smp: CPU {cpu} online (local APIC id {})", lapic::id());
    cpu::enable_interrupts();
    executor.block_on(remote::serve_inbox(cpu));
    unreachable!("an AP's inbox is served forever")
}

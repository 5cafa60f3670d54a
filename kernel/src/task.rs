//! The kernel's executors: one per CPU, reachable from any task through [`spawn`],
//! [`sleep`], [`sleep_until`], [`timeout`] and [`now`], which act on the running CPU's.

use core::cell::OnceCell;
use core::future::Future;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::task::Context;
use core::time::Duration;

use crate::apic::lapic;
use alloc::sync::Arc;

use crate::exec::{
    Elapsed, Executor, HaltGate, Interrupter, JoinHandle, Kick, Platform, Sleep, Spawner, WakeStats,
};
use crate::hal::cpu;
use crate::hal::cpu_local::CpuLocal;
use crate::hal::percpu::{self, MAX_CPUS};
use crate::time::Instant;
use crate::{irq, smp};

/// Time from the TSC clock; idling arms the local APIC timer for the next deadline and
/// halts with `sti; hlt`; a wake from another CPU sends the owner [`irq::WAKE_VECTOR`]
/// if it is halted or about to halt (the executor's [`HaltGate`] decides).
#[derive(Debug)]
pub struct KernelPlatform {
    /// The CPU whose executor this is.
    cpu: usize,
}

impl Platform for KernelPlatform {
    fn now(&self) -> Instant {
        crate::clock::now()
    }

    fn idle(&self, deadline: Option<Instant>, work_pending: &dyn Fn() -> bool) {
        cpu::disable_interrupts();
        if work_pending() {
            cpu::enable_interrupts();
            return;
        }
        let armed = &TIMER_AT[self.cpu];
        match deadline {
            // Armed for this deadline or an earlier one: it wakes us in time (early at
            // worst, and then the next halt arms it for `d`).
            Some(d) if (1..=d.as_nanos()).contains(&armed.load(Ordering::Relaxed)) => {}
            Some(d) => {
                if !TIMER_ONESHOT[self.cpu].swap(true, Ordering::Relaxed) {
                    lapic::unmask_oneshot();
                }
                lapic::arm(d - self.now());
                armed.store(d.as_nanos().max(1), Ordering::Relaxed);
            }
            None => {
                if armed.swap(0, Ordering::Relaxed) != 0 {
                    lapic::disarm();
                }
            }
        }
        let halted = self.now();
        HALTED_AT[self.cpu].store(halted.as_nanos(), Ordering::Relaxed);
        cpu::enable_interrupts_and_halt();
        HALTED_AT[self.cpu].store(0, Ordering::Relaxed);
        IDLE_NS[self.cpu].fetch_add((self.now() - halted).as_nanos() as u64, Ordering::Relaxed);
    }

    fn kicker(&self) -> Option<Kick> {
        Some(Arc::new(WakeIpi { owner: self.cpu }))
    }
}

/// Wakes the executor of CPU `owner` from other CPUs with [`irq::WAKE_VECTOR`].
#[derive(Debug)]
struct WakeIpi {
    owner: usize,
}

impl Interrupter for WakeIpi {
    fn is_remote(&self) -> bool {
        percpu::index() != self.owner
    }

    fn interrupt(&self) {
        if let Some(apic_id) = smp::apic_id(self.owner) {
            lapic::send_fixed(apic_id, irq::WAKE_VECTOR);
        }
    }
}

/// Each CPU's executor's [`HaltGate`], for its counters.
static HALT_GATES: [spin::Once<Arc<HaltGate>>; MAX_CPUS] = [const { spin::Once::new() }; MAX_CPUS];

/// How wakes from other CPUs reached CPU `cpu`'s executor: IPIs sent, and skipped because
/// it was running (zero before it has an executor).
pub fn wake_stats_of(cpu: usize) -> WakeStats {
    HALT_GATES
        .get(cpu)
        .and_then(spin::Once::get)
        .map_or_else(WakeStats::default, |g| g.stats())
}

/// The clock time (nanoseconds) each CPU's APIC timer is armed for; 0 when it is not
/// (never armed, fired, or stopped). Halting re-arms the timer only for an earlier
/// deadline: each arming is a trapped MMIO write under emulation, and the executor halts
/// between most requests when few connections are busy (docs/benchmarks.md, "The APIC
/// timer").
static TIMER_AT: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Whether each CPU's timer is in one-shot mode and unmasked (from its first arming on).
static TIMER_ONESHOT: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// The local APIC timer's interrupt handler: the timer is no longer armed.
pub fn timer_fired() {
    TIMER_AT[percpu::index()].store(0, Ordering::Relaxed);
}

/// Nanoseconds each CPU spent halted, waiting for work (interrupt handlers that ran
/// during the halt included: they are short).
static IDLE_NS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// When each CPU's current halt began (clock nanoseconds), 0 while it runs: a CPU halted
/// for long is idle now, before its halt ends.
static HALTED_AT: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Time the boot CPU has spent idle (halted) since boot: with the uptime, how busy it is
/// (it runs the network stack and the 9P service).
pub fn idle_time() -> Duration {
    idle_time_of(0)
}

/// Time CPU `cpu` has spent idle (halted) since boot.
pub fn idle_time_of(cpu: usize) -> Duration {
    let done = IDLE_NS[cpu].load(Ordering::Relaxed);
    let halted_at = HALTED_AT[cpu].load(Ordering::Relaxed);
    let now = now().as_nanos();
    // A halt that ended between the two loads is already in `done`: count it once.
    let ongoing = if halted_at != 0 && IDLE_NS[cpu].load(Ordering::Relaxed) == done {
        now.saturating_sub(halted_at)
    } else {
        0
    };
    Duration::from_nanos(done + ongoing)
}

static SPAWNER: CpuLocal<OnceCell<Spawner>> = CpuLocal::new([const { OnceCell::new() }; MAX_CPUS]);

/// Creates this CPU's executor. Run it with [`Executor::block_on`].
///
/// # Panics
/// If called twice on one CPU.
pub fn init() -> Executor {
    let cpu = percpu::index();
    let ex = Executor::new(KernelPlatform { cpu });
    HALT_GATES[cpu].call_once(|| ex.halt_gate());
    assert!(
        SPAWNER.get().set(ex.spawner()).is_ok(),
        "executor initialised twice"
    );
    ex
}

fn spawner() -> &'static Spawner {
    SPAWNER.get().get().expect("executor not initialised")
}

/// Spawns a task on this CPU's executor.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    spawner().spawn(future)
}

/// Gives up the CPU with work left: the running task is polled again after the tasks
/// that events made ready and the tasks deferred before it ([`Spawner::defer_current`]).
/// Wakes `cx`'s task instead (back of the ready queue) when deferring is not possible.
pub fn yield_to_others(cx: &Context<'_>) {
    if !spawner().defer_current() {
        cx.waker().wake_by_ref();
    }
}

/// Completes after `d`.
pub fn sleep(d: Duration) -> Sleep {
    spawner().sleep(d)
}

/// Completes at `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    spawner().sleep_until(deadline)
}

/// Runs `future` for at most `d`.
pub async fn timeout<F: Future>(d: Duration, future: F) -> Result<F::Output, Elapsed> {
    spawner().timeout(d, future).await
}

/// The executor's handle (for its statistics, say).
pub fn current() -> Spawner {
    spawner().clone()
}

/// The monotonic clock.
pub fn now() -> Instant {
    crate::clock::now()
}

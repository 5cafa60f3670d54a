//! The kernel's executor: one per CPU (one CPU for now), reachable from any task through
//! [`spawn`], [`sleep`], [`sleep_until`], [`timeout`] and [`now`].

use core::cell::OnceCell;
use core::future::Future;
use core::sync::atomic::{AtomicU64, Ordering};
use core::task::Context;
use core::time::Duration;

use crate::apic::lapic;
use crate::exec::{Elapsed, Executor, JoinHandle, Platform, Sleep, Spawner};
use crate::hal::cpu;
use crate::hal::cpu_local::CpuLocal;
use crate::time::Instant;

/// Time from the TSC clock; idling arms the local APIC timer for the next deadline and
/// halts with `sti; hlt`.
#[derive(Debug)]
pub struct KernelPlatform;

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
        match deadline {
            Some(d) => lapic::arm_oneshot(d - self.now()),
            None => lapic::disarm(),
        }
        let halted = self.now();
        cpu::enable_interrupts_and_halt();
        IDLE_NS.fetch_add((self.now() - halted).as_nanos() as u64, Ordering::Relaxed);
    }
}

/// Nanoseconds this CPU spent halted, waiting for work (interrupt handlers that ran
/// during the halt included: they are short).
static IDLE_NS: AtomicU64 = AtomicU64::new(0);

/// Time this CPU has spent idle (halted) since boot: with the uptime, how busy it is.
pub fn idle_time() -> Duration {
    Duration::from_nanos(IDLE_NS.load(Ordering::Relaxed))
}

static SPAWNER: CpuLocal<OnceCell<Spawner>> = CpuLocal::new(OnceCell::new());

/// Creates this CPU's executor. Run it with [`Executor::block_on`].
///
/// # Panics
/// If called twice.
pub fn init() -> Executor {
    let ex = Executor::new(KernelPlatform);
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

//! A small cooperative async executor: the kernel's only form of concurrency.
//!
//! Drivers, the network stack and the filesystem run as tasks ([`Spawner::spawn`]) on one
//! [`Executor`] per CPU. A task runs until it returns `Pending`; nothing preempts it, and
//! it never moves to another CPU, so tasks need not be `Send` (work for another CPU goes
//! through `smp::spawn_on`, which sends a `Send` closure).
//!
//! - Wakers are `Send + Sync` and interrupt-safe: waking only marks the task and queues its
//!   id (under an [`IrqLock`](crate::sync::IrqLock), into a queue whose capacity is
//!   reserved at spawn time, so an interrupt handler never allocates), then, when the
//!   wake comes from another CPU and that CPU is halted or about to halt
//!   ([`HaltGate`]), [kicks](Platform::kicker) it. Interrupt handlers usually signal an
//!   [`IrqEvent`], whose `wait()` a driver task awaits.
//! - Timers ([`Spawner::sleep`], [`Spawner::sleep_until`], [`Spawner::timeout`]) live in a
//!   deadline-ordered queue that the executor checks between polls.
//! - When nothing is ready, the executor hands the next timer deadline to
//!   [`Platform::idle`]; on the appliance that arms the local APIC timer and executes
//!   `sti; hlt`.
//!
//! The executor knows no hardware: the platform supplies time and idling, which is how the
//! host tests below drive it with a simulated clock.

mod event;
mod executor;
mod halt;
mod join;
mod timer;

pub use event::{IrqEvent, Wait};
pub use executor::{Executor, Spawner, Stats, TaskId};
pub use halt::{HaltGate, WakeStats};
pub use join::JoinHandle;
pub use timer::{Elapsed, Sleep};

use alloc::sync::Arc;

use crate::time::Instant;

/// Gets a halted executor's attention after a task of it was queued from elsewhere.
pub trait Interrupter: Send + Sync {
    /// Whether the caller runs somewhere other than the executor (another CPU): only
    /// then may the executor be halted while the task is queued.
    fn is_remote(&self) -> bool;

    /// Interrupts the executor's CPU (the appliance's wake-up IPI), ending its halt.
    /// Called after the task's id is in the ready queue, only when the executor's
    /// [`HaltGate`] says it is halted or about to halt.
    fn interrupt(&self);
}

/// An executor's [`Interrupter`], shared by its wakers.
pub type Kick = Arc<dyn Interrupter>;

/// What the executor needs from the machine.
pub trait Platform {
    /// The current monotonic time.
    fn now(&self) -> Instant;

    /// Called when no task is ready: wait until an interrupt (which may have woken a task)
    /// or until `deadline`, if any; returning early is allowed. Implementations must call
    /// `work_pending` with interrupts disabled immediately before sleeping and not sleep if
    /// it returns true; otherwise a wake-up between the executor's check and the sleep would
    /// be lost until the next interrupt. (`work_pending` also tells the executor's
    /// [`HaltGate`] that it is about to halt, so wakes from other CPUs interrupt it.)
    fn idle(&self, deadline: Option<Instant>, work_pending: &dyn Fn() -> bool);

    /// How wakes get the executor's attention ([`Kick`]); `None` (the default) when a
    /// wake needs nothing more than queueing (one CPU, or host threads that poll).
    fn kicker(&self) -> Option<Kick> {
        None
    }
}

#[cfg(test)]
mod tests;

//! A small cooperative async executor: the kernel's only form of concurrency.
//!
//! Drivers, the network stack and the filesystem run as tasks ([`Spawner::spawn`]) on one
//! [`Executor`] per CPU (one CPU for now). A task runs until it returns `Pending`; nothing
//! preempts it. Tasks need not be `Send`.
//!
//! - Wakers are `Send + Sync` and interrupt-safe: waking only marks the task and queues its
//!   id (under an [`IrqLock`](crate::sync::IrqLock), into a queue whose capacity is
//!   reserved at spawn time, so an interrupt handler never allocates). Interrupt handlers
//!   usually signal an [`IrqEvent`], whose `wait()` a driver task awaits.
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
mod join;
mod timer;

pub use event::{IrqEvent, Wait};
pub use executor::{Executor, Spawner, Stats, TaskId};
pub use join::JoinHandle;
pub use timer::{Elapsed, Sleep};

use crate::time::Instant;

/// What the executor needs from the machine.
pub trait Platform {
    /// The current monotonic time.
    fn now(&self) -> Instant;

    /// Called when no task is ready: wait until an interrupt (which may have woken a task)
    /// or until `deadline`, if any; returning early is allowed. Implementations must call
    /// `work_pending` with interrupts disabled immediately before sleeping and not sleep if
    /// it returns true; otherwise a wake-up between the executor's check and the sleep would
    /// be lost until the next interrupt.
    fn idle(&self, deadline: Option<Instant>, work_pending: &dyn Fn() -> bool);
}

#[cfg(test)]
mod tests;

//! Values that belong to one CPU and are used only in task context.

use super::cpu;
use super::percpu::{self, MAX_CPUS};

/// One value per CPU, for state that is not `Sync`, such as each CPU's executor spawner.
/// [`CpuLocal::get`] returns the running CPU's; interrupt handlers must not touch it (it
/// asserts that).
#[derive(Debug)]
pub struct CpuLocal<T>([T; MAX_CPUS]);

// SAFETY: a CPU only ever reaches its own slot (`get` indexes by the running CPU), task
// code is never preempted by other task code, tasks never move between CPUs, and `get`
// refuses interrupt context: at most one execution context uses each slot at a time, and
// a slot's value never leaves its CPU.
unsafe impl<T> Sync for CpuLocal<T> {}

impl<T> CpuLocal<T> {
    /// One value per CPU: `[const { ... }; MAX_CPUS]`.
    pub const fn new(values: [T; MAX_CPUS]) -> Self {
        CpuLocal(values)
    }

    /// The running CPU's value.
    ///
    /// # Panics
    /// In an interrupt handler.
    pub fn get(&self) -> &T {
        assert!(
            !cpu::in_interrupt(),
            "CPU-local task state used in an interrupt handler"
        );
        &self.0[percpu::index()]
    }
}

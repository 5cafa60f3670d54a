//! Values that belong to one CPU and are used only in task context.

use super::cpu;

/// A value owned by the (single) CPU, for state that is not `Sync`, such as the executor's
/// spawner. Interrupt handlers must not touch it ([`CpuLocal::get`] asserts that).
#[derive(Debug)]
pub struct CpuLocal<T>(T);

// SAFETY: the kernel runs on one CPU, task code is never preempted by other task code, and
// `get` refuses interrupt context, so at most one execution context uses the value at a
// time. SMP will make this per-CPU storage.
unsafe impl<T> Sync for CpuLocal<T> {}

impl<T> CpuLocal<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        CpuLocal(value)
    }

    /// The value.
    ///
    /// # Panics
    /// In an interrupt handler.
    pub fn get(&self) -> &T {
        assert!(
            !cpu::in_interrupt(),
            "CPU-local task state used in an interrupt handler"
        );
        &self.0
    }
}

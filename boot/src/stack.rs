//! Kernel stacks with a guard page.
//!
//! Each stack sits directly above a page that the kernel leaves unmapped, so running off
//! the end of a stack faults on the guard page (a page fault handled on its own IST stack,
//! reported as a stack overflow) instead of silently overwriting whatever lies below.

use core::cell::UnsafeCell;
use core::ops::Range;

/// Size of a page, and of the guard.
pub const PAGE_SIZE: usize = 4096;

/// Size of the main kernel stack, on which `kmain` and the executor (every task poll) run.
pub const MAIN_STACK_SIZE: usize = 256 * 1024;

/// A stack of `N` bytes (a multiple of the page size) preceded by one guard page. Place it
/// in a `static`; the kernel unmaps [`GuardedStack::guard`] when it builds its page tables.
#[repr(C, align(4096))]
pub struct GuardedStack<const N: usize> {
    guard: UnsafeCell<[u8; PAGE_SIZE]>,
    stack: UnsafeCell<[u8; N]>,
}

// SAFETY: Rust code never reads or writes the arrays; the memory is only used by the CPU
// as a stack (through RSP), one CPU per stack.
unsafe impl<const N: usize> Sync for GuardedStack<N> {}

impl<const N: usize> GuardedStack<N> {
    /// A zeroed stack (it lands in `.bss`).
    pub const fn new() -> Self {
        assert!(
            N > 0 && N.is_multiple_of(PAGE_SIZE),
            "stack size must be whole pages"
        );
        GuardedStack {
            guard: UnsafeCell::new([0; PAGE_SIZE]),
            stack: UnsafeCell::new([0; N]),
        }
    }

    fn base(&self) -> u64 {
        self as *const Self as u64
    }

    /// The guard page's address range.
    pub fn guard(&self) -> Range<u64> {
        self.base()..self.base() + PAGE_SIZE as u64
    }

    /// The usable stack's address range (above the guard).
    pub fn stack(&self) -> Range<u64> {
        self.guard().end..self.top()
    }

    /// The initial stack pointer (one past the highest byte; 16-byte aligned).
    pub fn top(&self) -> u64 {
        self.base() + (PAGE_SIZE + N) as u64
    }
}

impl<const N: usize> Default for GuardedStack<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> core::fmt::Debug for GuardedStack<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "GuardedStack({:#x}..{:#x})",
            self.stack().start,
            self.top()
        )
    }
}

/// The main kernel stack: the boot code switches to it before calling into Rust.
pub static MAIN_STACK: GuardedStack<MAIN_STACK_SIZE> = GuardedStack::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_is_below_the_stack() {
        let s: Box<GuardedStack<8192>> = Box::default();
        assert_eq!(s.guard().start % PAGE_SIZE as u64, 0);
        assert_eq!(s.guard().end, s.stack().start);
        assert_eq!(s.stack().end - s.stack().start, 8192);
        assert_eq!(s.top() % 16, 0);
    }
}

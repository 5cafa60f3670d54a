//! What starting an application processor needs from the hardware side: the real-mode
//! trampoline in low memory and the parameters the boot code hands the AP (see
//! `boot::ap`). The sequence itself (INIT, start-up IPIs, waiting) is `crate::smp`'s.

use boot::ap::{self, TRAMPOLINE_ADDR};
use x86_64::registers::control::Cr3;

use super::paging;
use super::{gdt, percpu::MAX_CPUS};

/// The start-up IPI vector that starts a CPU at the trampoline.
pub const STARTUP_PAGE: u8 = (TRAMPOLINE_ADDR / 4096) as u8;

/// Why the trampoline could not be installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrampolineError {
    /// Its page is not RAM the kernel maps writable (the firmware's memory map says the
    /// page is something else).
    NotRam,
}

/// Copies the trampoline to its page below 1 MiB. The memory map keeps low memory away
/// from the frame allocator (`mm::memmap::LOW_MEMORY_END`), so nothing else uses it.
pub fn install_trampoline() -> Result<(), TrampolineError> {
    let code = ap::trampoline();
    let mapped =
        paging::translate(TRAMPOLINE_ADDR).is_some_and(|m| m.writable && m.phys == TRAMPOLINE_ADDR);
    if !mapped || code.len() > 4096 {
        return Err(TrampolineError::NotRam);
    }
    // SAFETY: the page is identity-mapped writable RAM (checked above) below 1 MiB, which
    // no allocator hands out and nothing else in the kernel reads or writes; the code is
    // at most one page.
    unsafe {
        core::ptr::copy_nonoverlapping(code.as_ptr(), TRAMPOLINE_ADDR as *mut u8, code.len());
    }
    Ok(())
}

/// Sets the parameters for starting CPU `cpu` (1..MAX_CPUS): this CPU's page tables and
/// the AP's own main stack.
pub fn prepare_start(cpu: usize) {
    assert!((1..MAX_CPUS).contains(&cpu), "cannot start CPU {cpu}");
    let (frame, _) = Cr3::read();
    ap::prepare(frame.start_address().as_u64(), gdt::ap_stack_top(cpu), cpu);
}

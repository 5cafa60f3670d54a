//! Where the linker put the kernel image (see `linker.ld`).

use core::ops::Range;

/// The kernel image's sections, as physical (= virtual) address ranges. Every boundary is
/// page-aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    /// The whole image, from the first section to the end of `.bss`.
    pub image: Range<u64>,
    /// Code: mapped read-only and executable.
    pub text: Range<u64>,
    /// Constants (and the PVH note): read-only, no-execute.
    pub rodata: Range<u64>,
    /// `.data` and `.bss` (stacks included): read-write, no-execute.
    pub data: Range<u64>,
}

#[cfg(target_os = "none")]
unsafe extern "C" {
    static __kernel_start: u8;
    static __text_start: u8;
    static __text_end: u8;
    static __rodata_start: u8;
    static __rodata_end: u8;
    static __data_start: u8;
    static __kernel_end: u8;
}

/// The running image's layout, from the linker script's symbols.
#[cfg(target_os = "none")]
pub fn kernel_layout() -> KernelLayout {
    // Only the symbols' addresses are taken; the bytes behind them are never read.
    let addr = |p: *const u8| p as u64;
    KernelLayout {
        image: addr(&raw const __kernel_start)..addr(&raw const __kernel_end),
        text: addr(&raw const __text_start)..addr(&raw const __text_end),
        rodata: addr(&raw const __rodata_start)..addr(&raw const __rodata_end),
        data: addr(&raw const __data_start)..addr(&raw const __kernel_end),
    }
}

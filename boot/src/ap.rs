//! The application processors' way in: from the real mode a startup IPI leaves them in to
//! the kernel's AP entry point, on the stack and page tables the boot CPU chose.
//!
//! A startup IPI starts a CPU in real mode at `vector * 4096`, so the first instructions
//! must live below 1 MiB: [`trampoline`] returns the code the kernel copies to
//! [`TRAMPOLINE_ADDR`]. It loads a flat GDT, switches straight from real mode to long mode
//! on the boot code's early page tables (they identity-map the first 4 GiB, the
//! trampoline and the kernel image included, and sit below 4 GiB so a 32-bit CR3 load
//! reaches them), and jumps into the image, where `ap_long_mode` loads the CR3, stack
//! pointer and CPU index from [`ApStart`] and calls the kernel's AP entry point
//! ([`crate::ap_entry_point!`]). One AP starts at a time: [`ApStart`] holds one
//! CPU's parameters.

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::pvh::EARLY_TABLES;

/// Where the kernel must copy the trampoline: a page below 1 MiB (startup IPI vector 8)
/// that the firmware leaves as usable RAM on PCs and QEMU.
pub const TRAMPOLINE_ADDR: u64 = 0x8000;

/// What the next application processor to start needs, written by the boot CPU before
/// it sends the startup IPIs.
#[derive(Debug)]
#[repr(C)]
pub struct ApStart {
    /// The kernel's page tables (CR3).
    cr3: AtomicU64,
    /// The AP's initial stack pointer.
    stack_top: AtomicU64,
    /// The AP's CPU index, passed to the entry point.
    cpu: AtomicU64,
}

static AP_START: ApStart = ApStart {
    cr3: AtomicU64::new(0),
    stack_top: AtomicU64::new(0),
    cpu: AtomicU64::new(0),
};

/// Sets the parameters of the next AP to start: CPU `cpu` will run on page tables `cr3`
/// with its stack pointer at `stack_top` (16-byte aligned, the top of a mapped stack).
pub fn prepare(cr3: u64, stack_top: u64, cpu: usize) {
    AP_START.cr3.store(cr3, Ordering::Relaxed);
    AP_START.stack_top.store(stack_top, Ordering::Relaxed);
    // Release: the AP reads the three after seeing the startup IPI, which follows this.
    AP_START.cpu.store(cpu as u64, Ordering::Release);
}

unsafe extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
}

/// The trampoline's code, to be copied to [`TRAMPOLINE_ADDR`] (it is assembled for that
/// address and runs nowhere else).
pub fn trampoline() -> &'static [u8] {
    let start = &raw const ap_trampoline_start;
    let end = &raw const ap_trampoline_end;
    // SAFETY: the two symbols delimit the trampoline's bytes in `.rodata` (assembled
    // below, in one section), which are never written.
    unsafe { core::slice::from_raw_parts(start, end as usize - start as usize) }
}

global_asm!(
    r#"
    .pushsection .rodata.ap_trampoline, "a"
    .code16
    .global ap_trampoline_start
ap_trampoline_start:
    cli
    cld
    xor %ax, %ax
    mov %ax, %ds
    lgdtl (ap_gdt_ptr - ap_trampoline_start + {base})
    movl (ap_early_cr3 - ap_trampoline_start + {base}), %eax
    mov %eax, %cr3
"#,
    enable_long_mode!(),
    r#"
    ljmpl $0x08, $(ap_trampoline_64 - ap_trampoline_start + {base})

    .code64
ap_trampoline_64:
    movabs $ap_long_mode, %rax
    jmp *%rax

    .p2align 3
ap_gdt:
"#,
    flat_gdt_entries!(),
    r#"
ap_gdt_ptr:
    .word ap_gdt_ptr - ap_gdt - 1
    .long ap_gdt - ap_trampoline_start + {base}
ap_early_cr3:
    .long {early_tables}
    .global ap_trampoline_end
ap_trampoline_end:
    .popsection

    .pushsection .text.ap, "ax"
    .code64
ap_long_mode:
"#,
    load_flat_data_segments!(),
    r#"
    lea {start}(%rip), %rbx
    mov 0(%rbx), %rax
    mov %rax, %cr3
    mov 8(%rbx), %rsp
    mov 16(%rbx), %rdi
    xor %ebp, %ebp              /* terminates frame-pointer walks */
    call {entry}
    ud2
    .popsection
    "#,
    base = const TRAMPOLINE_ADDR,
    early_tables = sym EARLY_TABLES,
    start = sym AP_START,
    entry = sym ap_rust_entry,
    options(att_syntax)
);

unsafe extern "Rust" {
    /// Defined by the kernel with [`crate::ap_entry_point!`].
    fn ninefold_kernel_ap_main(cpu: usize) -> !;
}

/// First Rust code on an application processor: in long mode on the kernel's page tables
/// and its own stack, interrupts disabled.
extern "C" fn ap_rust_entry(cpu: u64) -> ! {
    // SAFETY: the kernel defines this symbol through `ap_entry_point!`, which checks its
    // signature.
    unsafe { ninefold_kernel_ap_main(cpu as usize) }
}

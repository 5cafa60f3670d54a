//! PVH entry: from the loader's 32-bit protected mode to the kernel's Rust entry point.
//!
//! The loader (QEMU `-kernel`, Xen, Firecracker...) finds the `XEN_ELFNOTE_PHYS32_ENTRY`
//! note, loads the image at its physical addresses and jumps to [`_start32`] with paging
//! off, flat 32-bit segments, interrupts disabled and `%ebx` holding the physical address
//! of the `hvm_start_info`. The entry code:
//! 1. zeroes `.bss` (the loader zero-fills too, but the protocol does not promise it);
//! 2. checks that the CPU has long mode and NX (printing a message on COM1 if not);
//! 3. identity-maps the first 4 GiB with 2 MiB pages (read-write-execute, cached): just
//!    enough to run Rust until the kernel builds its real page tables from the memory map;
//! 4. enables PAE, long mode, NX and write protection, loads a 64-bit GDT and jumps to
//!    64-bit code, which switches to the main kernel stack and calls [`rust_entry`].

use core::arch::{asm, global_asm};

use crate::info::{BootInfo, RawMemmapEntry, RawStartInfo, MAX_CMDLINE, PVH_MAGIC};
use crate::stack::{MAIN_STACK, MAIN_STACK_SIZE, PAGE_SIZE};

/// The early page tables: one PML4, one PDPT, four page directories of 2 MiB pages.
#[repr(C, align(4096))]
pub(crate) struct EarlyTables {
    pml4: [u64; 512],
    pdpt: [u64; 512],
    pd: [[u64; 512]; 4],
}

/// Written only by the 32-bit entry code, before any Rust code runs; Rust never touches it.
/// The application processors' trampoline starts on them too ([`crate::ap`]).
pub(crate) static mut EARLY_TABLES: EarlyTables = EarlyTables {
    pml4: [0; 512],
    pdpt: [0; 512],
    pd: [[0; 512]; 4],
};

global_asm!(
    r#"
    .pushsection .note.Xen, "a", @note
    .p2align 2
    .long 4                     /* name size: "Xen\0" */
    .long 4                     /* descriptor size */
    .long 18                    /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .p2align 2
    .long _start32
    .popsection

    .pushsection .rodata.boot, "a"
    .p2align 3
boot_gdt:
"#,
    flat_gdt_entries!(),
    r#"
boot_gdt_end:
boot_gdt_ptr:
    .word boot_gdt_end - boot_gdt - 1
    .long boot_gdt
boot_no_long_mode:
    .asciz "ninefold: this CPU lacks long mode or NX; cannot boot\r\n"
    .popsection

    .pushsection .text.boot, "ax"
    .code32
    .global _start32
_start32:
    cli
    cld
    /* Keep the start info address in %ebp: cpuid clobbers %ebx. */
    mov %ebx, %ebp

    /* Zero .bss. */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    rep stosb

    /* Long mode (bit 29) and NX (bit 20) in CPUID 0x80000001:EDX. */
    mov $0x80000000, %eax
    cpuid
    cmp $0x80000001, %eax
    jb 90f
    mov $0x80000001, %eax
    cpuid
    test $(1 << 29), %edx
    jz 90f
    test $(1 << 20), %edx
    jz 90f

    /* PML4[0] -> PDPT; PDPT[0..4] -> PD[0..4]; PD entries: 2 MiB pages over 0..4 GiB. */
    mov ${tables}, %esi
    lea 0x1003(%esi), %eax      /* &pdpt | present | writable */
    mov %eax, (%esi)
    lea 0x2003(%esi), %eax      /* &pd[0] | present | writable */
    xor %ecx, %ecx
1:
    mov %eax, 0x1000(%esi,%ecx,8)
    add $0x1000, %eax
    inc %ecx
    cmp $4, %ecx
    jb 1b
    xor %ecx, %ecx
2:
    mov %ecx, %eax
    shl $21, %eax
    or $0x83, %eax              /* present | writable | 2 MiB page */
    mov %eax, 0x2000(%esi,%ecx,8)
    inc %ecx
    cmp $2048, %ecx
    jb 2b

    mov %esi, %cr3
"#,
    enable_long_mode!(),
    r#"
    lgdt boot_gdt_ptr
    ljmp $0x08, $3f

90: /* No long mode: say so on COM1 and stop. */
    mov $boot_no_long_mode, %esi
    mov $0x3f8, %dx
91:
    lodsb
    test %al, %al
    jz 92f
    out %al, %dx
    jmp 91b
92:
    hlt
    jmp 92b

    .code64
3:
"#,
    load_flat_data_segments!(),
    r#"
    mov ${stack} + {stack_offset}, %rsp
    mov %ebp, %edi              /* zero-extends: the start info address */
    xor %ebp, %ebp              /* terminates frame-pointer walks */
    call {entry}
    ud2
    .popsection
    "#,
    tables = sym EARLY_TABLES,
    stack = sym MAIN_STACK,
    stack_offset = const PAGE_SIZE + MAIN_STACK_SIZE,
    entry = sym rust_entry,
    options(att_syntax)
);

unsafe extern "Rust" {
    /// Defined by the kernel with [`crate::entry_point!`].
    fn ninefold_kernel_main(info: &'static BootInfo) -> !;
}

static BOOT_INFO: spin::Once<BootInfo> = spin::Once::new();

/// A sanity bound on the loader's entry count, so a corrupt start info cannot make us read
/// unbounded memory.
const MAX_RAW_ENTRIES: usize = 1024;

/// First Rust code: copies the start info, then enters the kernel. Runs on the main stack,
/// identity-mapped, interrupts disabled.
extern "C" fn rust_entry(start_info_paddr: u64) -> ! {
    // SAFETY: the PVH protocol puts a `hvm_start_info` at this physical address, and the
    // early page tables identity-map the first 4 GiB where loaders place it. The memory
    // map and command line it points to are read within the same guarantee; we bound both.
    let (raw, memmap, cmdline) = unsafe {
        let raw = (start_info_paddr as *const RawStartInfo).read_unaligned();
        // Follow no pointer of a structure that is not a start info.
        let valid = raw.magic == PVH_MAGIC;
        let memmap: &[RawMemmapEntry] = if valid && raw.version >= 1 && raw.memmap_paddr != 0 {
            let n = (raw.memmap_entries as usize).min(MAX_RAW_ENTRIES);
            core::slice::from_raw_parts(raw.memmap_paddr as *const RawMemmapEntry, n)
        } else {
            &[]
        };
        let cmdline: &[u8] = if valid && raw.cmdline_paddr != 0 {
            let p = raw.cmdline_paddr as *const u8;
            let mut len = 0;
            while len <= MAX_CMDLINE && p.add(len).read() != 0 {
                len += 1;
            }
            core::slice::from_raw_parts(p, len)
        } else {
            &[]
        };
        (raw, memmap, cmdline)
    };
    match BootInfo::from_pvh(start_info_paddr, &raw, memmap, cmdline) {
        Ok(info) => {
            let info = BOOT_INFO.call_once(|| info);
            // SAFETY: the kernel defines this symbol through `entry_point!`, which checks
            // its signature.
            unsafe { ninefold_kernel_main(info) }
        }
        Err(e) => {
            early_print("ninefold: cannot boot: ");
            let mut buf = [0u8; 64];
            early_print(format_into(&mut buf, format_args!("{e}")));
            early_print("\r\n");
            halt_forever()
        }
    }
}

/// Writes to COM1 without initialising it (QEMU does not need it), for the one message we
/// can print before the kernel's console exists.
fn early_print(msg: &str) {
    for b in msg.bytes() {
        // SAFETY: writing a byte to the COM1 data port has no memory effects.
        unsafe { asm!("out dx, al", in("dx") 0x3f8u16, in("al") b, options(nomem, nostack)) };
    }
}

fn format_into<'a>(buf: &'a mut [u8], args: core::fmt::Arguments<'_>) -> &'a str {
    struct Cursor<'b>(&'b mut [u8], usize);
    impl core::fmt::Write for Cursor<'_> {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let n = s.len().min(self.0.len() - self.1);
            self.0[self.1..self.1 + n].copy_from_slice(&s.as_bytes()[..n]);
            self.1 += n;
            Ok(())
        }
    }
    let mut c = Cursor(buf, 0);
    let _ = core::fmt::write(&mut c, args);
    let n = c.1;
    core::str::from_utf8(&c.0[..n]).unwrap_or("?")
}

fn halt_forever() -> ! {
    loop {
        // SAFETY: interrupts are disabled; `hlt` just stops the CPU.
        unsafe { asm!("cli; hlt", options(nomem, nostack)) };
    }
}

//! The switch to long mode, shared by the boot CPU's 32-bit entry ([`pvh`](crate::pvh)) and
//! the application processors' real-mode trampoline ([`ap`](crate::ap)): the same
//! instructions assemble for both (GAS adds the operand-size prefixes under `.code16`).

/// Assembly (AT&T) that enables PAE, then long mode and NX in `IA32_EFER`, then paging,
/// write protection and protected mode in CR0. `%cr3` must already hold the page tables;
/// clobbers `%eax`, `%ecx`, `%edx`. The next instruction must be a far jump to a 64-bit
/// code segment.
macro_rules! enable_long_mode {
    () => {
        r#"
    mov %cr4, %eax
    or $(1 << 5), %eax          /* PAE */
    mov %eax, %cr4
    mov $0xc0000080, %ecx       /* IA32_EFER */
    rdmsr
    or $((1 << 8) | (1 << 11)), %eax /* LME | NXE */
    wrmsr
    mov %cr0, %eax
    or $((1 << 31) | (1 << 16) | 1), %eax /* PG | WP | PE */
    mov %eax, %cr0
"#
    };
}

/// The flat segments of 64-bit code, as GDT entries (AT&T `.quad` lines): null, 0x08 a
/// 64-bit DPL 0 code segment, 0x10 a DPL 0 data segment. The accessed bits are preset, so
/// loading a selector never writes to the table (the trampoline's copy is in a page the
/// kernel may map read-only).
macro_rules! flat_gdt_entries {
    () => {
        r#"
    .quad 0                     /* null */
    .quad 0x00af9b000000ffff    /* 0x08: 64-bit code, DPL 0, accessed */
    .quad 0x00cf93000000ffff    /* 0x10: data, DPL 0, accessed */
"#
    };
}

/// Assembly that loads the flat data segment (0x10) into `%ds`, `%es`, `%ss` and clears
/// `%fs` and `%gs`; clobbers `%eax`.
macro_rules! load_flat_data_segments {
    () => {
        r#"
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    xor %eax, %eax
    mov %ax, %fs
    mov %ax, %gs
"#
    };
}

//! The IDT and the entry path of every exception and interrupt.
//!
//! Each of the 256 vectors has a 16-byte stub that pushes a zero error code (unless the CPU
//! pushed one), then the vector number, then jumps to a common path that saves the general
//! registers into a [`TrapFrame`] and calls [`trap_dispatch`]. Exceptions (vectors 0-31)
//! go to `fault::exception`, which reports and stops the machine; everything else goes to
//! `irq::dispatch`. Hand-written stubs (rather than `extern "x86-interrupt"`, unstable)
//! also give fault reports every register. The target is soft-float, so there is no
//! FPU/SSE state to save.

use core::arch::global_asm;

use x86_64::structures::idt::InterruptDescriptorTable;
use x86_64::VirtAddr;

use super::{cpu, gdt};

/// The registers saved on entry, lowest address first.
#[repr(C)]
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    /// The vector (pushed by the stub).
    pub vector: u64,
    /// The CPU's error code, or 0 for vectors without one.
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// Vectors for which the CPU pushes an error code.
const fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

global_asm!(
    r#"
    .pushsection .text.trap, "ax"
    .p2align 4
    .global ninefold_trap_stubs
ninefold_trap_stubs:
    .set vector, 0
    .rept 256
        .p2align 4
        .if (vector == 8) || ((vector >= 10) && (vector <= 14)) || (vector == 17) || (vector == 21) || (vector == 29) || (vector == 30)
        .else
            pushq $0
        .endif
        pushq $vector
        jmp ninefold_trap_common
        .set vector, vector + 1
    .endr

ninefold_trap_common:
    pushq %rax
    pushq %rcx
    pushq %rdx
    pushq %rbx
    pushq %rbp
    pushq %rsi
    pushq %rdi
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    mov %rsp, %rdi
    cld
    call {dispatch}
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rdi
    popq %rsi
    popq %rbp
    popq %rbx
    popq %rdx
    popq %rcx
    popq %rax
    add $16, %rsp
    iretq
    .popsection
    "#,
    dispatch = sym trap_dispatch,
    options(att_syntax)
);

unsafe extern "C" {
    /// The first of 256 stubs, 16 bytes apart.
    static ninefold_trap_stubs: u8;
}

const STUB_SIZE: u64 = 16;

/// Called by the common entry path with interrupts disabled (all gates are interrupt
/// gates).
extern "C" fn trap_dispatch(frame: &mut TrapFrame) {
    cpu::enter_interrupt();
    let vector = frame.vector as u8;
    if vector < 32 {
        crate::fault::exception(frame);
    }
    crate::irq::dispatch(vector);
    cpu::leave_interrupt();
}

static IDT: spin::Once<InterruptDescriptorTable> = spin::Once::new();

/// Builds the IDT (once: every CPU shares it) and loads it on this CPU: every vector
/// points at its stub; double faults, page faults, NMIs and machine checks switch to their
/// IST stacks (each CPU's own, through its TSS).
pub fn init() {
    let idt = IDT.call_once(|| {
        let base = (&raw const ninefold_trap_stubs) as u64;
        let stub = |v: u8| VirtAddr::new(base + u64::from(v) * STUB_SIZE);
        let mut idt = InterruptDescriptorTable::new();
        // SAFETY: each address is the stub for that vector, which saves state, handles the
        // trap and returns with `iretq` (or stops); `set_stack_index` names IST slots that
        // `gdt::init` filled.
        unsafe {
            idt.divide_error.set_handler_addr(stub(0));
            idt.debug.set_handler_addr(stub(1));
            idt.non_maskable_interrupt
                .set_handler_addr(stub(2))
                .set_stack_index(gdt::IST_NMI);
            idt.breakpoint.set_handler_addr(stub(3));
            idt.overflow.set_handler_addr(stub(4));
            idt.bound_range_exceeded.set_handler_addr(stub(5));
            idt.invalid_opcode.set_handler_addr(stub(6));
            idt.device_not_available.set_handler_addr(stub(7));
            idt.double_fault
                .set_handler_addr(stub(8))
                .set_stack_index(gdt::IST_DOUBLE_FAULT);
            idt.invalid_tss.set_handler_addr(stub(10));
            idt.segment_not_present.set_handler_addr(stub(11));
            idt.stack_segment_fault.set_handler_addr(stub(12));
            idt.general_protection_fault.set_handler_addr(stub(13));
            idt.page_fault
                .set_handler_addr(stub(14))
                .set_stack_index(gdt::IST_PAGE_FAULT);
            idt.x87_floating_point.set_handler_addr(stub(16));
            idt.alignment_check.set_handler_addr(stub(17));
            idt.machine_check
                .set_handler_addr(stub(18))
                .set_stack_index(gdt::IST_NMI);
            idt.simd_floating_point.set_handler_addr(stub(19));
            idt.virtualization.set_handler_addr(stub(20));
            idt.cp_protection_exception.set_handler_addr(stub(21));
            idt.hv_injection_exception.set_handler_addr(stub(28));
            idt.vmm_communication_exception.set_handler_addr(stub(29));
            idt.security_exception.set_handler_addr(stub(30));
            for v in 32..=255u8 {
                idt[v].set_handler_addr(stub(v));
            }
        }
        debug_assert!(has_error_code(14) && !has_error_code(3));
        idt
    });
    idt.load();
}

/// Raises a breakpoint exception (`int3`), for testing the exception path.
pub fn breakpoint() {
    x86_64::instructions::interrupts::int3();
}

/// Reads the byte at `addr`, for the deliberate page fault of `crash=pagefault`. On a
/// mapped address this is a harmless read; on an unmapped one the fault handler reports
/// and stops the machine.
pub fn touch(addr: u64) -> ! {
    // SAFETY: a volatile byte read; any address is either readable (no effect) or faults
    // into the exception path, which never returns here.
    let byte = unsafe { (addr as *const u8).read_volatile() };
    panic!("read {byte:#x} at {addr:#x}: expected a page fault")
}

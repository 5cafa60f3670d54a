//! What happens when the kernel cannot go on: CPU exceptions and panics.
//!
//! Both print a report on the console (through [`EmergencyConsole`], which works even if
//! the fault hit while the console was locked) and stop the machine with a distinct
//! [`ExitCode`]. A page fault on a stack's guard page is reported as a stack overflow.

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::exit::ExitCode;
use crate::hal::console::EmergencyConsole;
use crate::hal::trap::TrapFrame;
use crate::hal::{cpu, gdt};

/// Set by the first fault; a fault while reporting must not report again.
static DYING: AtomicBool = AtomicBool::new(false);

/// The mnemonic and name of exception `vector`.
pub fn exception_name(vector: u8) -> (&'static str, &'static str) {
    match vector {
        0 => ("#DE", "divide error"),
        1 => ("#DB", "debug"),
        2 => ("NMI", "non-maskable interrupt"),
        3 => ("#BP", "breakpoint"),
        4 => ("#OF", "overflow"),
        5 => ("#BR", "bound range exceeded"),
        6 => ("#UD", "invalid opcode"),
        7 => ("#NM", "device not available"),
        8 => ("#DF", "double fault"),
        10 => ("#TS", "invalid TSS"),
        11 => ("#NP", "segment not present"),
        12 => ("#SS", "stack-segment fault"),
        13 => ("#GP", "general protection fault"),
        14 => ("#PF", "page fault"),
        16 => ("#MF", "x87 floating-point error"),
        17 => ("#AC", "alignment check"),
        18 => ("#MC", "machine check"),
        19 => ("#XM", "SIMD floating-point exception"),
        20 => ("#VE", "virtualization exception"),
        21 => ("#CP", "control protection exception"),
        28 => ("#HV", "hypervisor injection exception"),
        29 => ("#VC", "VMM communication exception"),
        30 => ("#SX", "security exception"),
        _ => ("#??", "reserved exception"),
    }
}

/// Decodes a page-fault error code: `present|write|user|reserved-bit|instruction-fetch`.
fn page_fault_cause(code: u64) -> (&'static str, &'static str, &'static str) {
    let what = if code & 0x10 != 0 {
        "instruction fetch"
    } else if code & 0x2 != 0 {
        "write"
    } else {
        "read"
    };
    let why = if code & 0x8 != 0 {
        "reserved bit set in page table"
    } else if code & 0x1 != 0 {
        "protection violation"
    } else {
        "page not present"
    };
    let mode = if code & 0x4 != 0 { "user" } else { "kernel" };
    (what, why, mode)
}

/// Reports exception `frame.vector` and stops. Called from the trap entry path.
pub fn exception(frame: &TrapFrame) -> ! {
    if DYING.swap(true, Ordering::SeqCst) {
        cpu::exit(ExitCode::Exception);
    }
    let vector = frame.vector as u8;
    let (mnemonic, name) = exception_name(vector);
    let Some(mut out) = EmergencyConsole::take() else {
        cpu::exit(ExitCode::Exception)
    };
    let cr2 = cpu::cr2();
    let overflow = (vector == 14 || vector == 8)
        .then(|| gdt::stacks().find(|s| s.guard.contains(&cr2) || s.guard.contains(&frame.rsp)))
        .flatten();
    let _ = writeln!(
        out,
        "\n!!! CPU EXCEPTION: vector {vector} ({mnemonic} {name}), error code {:#x}",
        frame.error_code
    );
    let _ = writeln!(
        out,
        "!!! RIP {:#018x}  CS {:#x}  RFLAGS {:#x}",
        frame.rip, frame.cs, frame.rflags
    );
    let _ = writeln!(out, "!!! RSP {:#018x}  SS {:#x}", frame.rsp, frame.ss);
    if vector == 14 {
        let (what, why, mode) = page_fault_cause(frame.error_code);
        let _ = writeln!(out, "!!! CR2 {cr2:#018x}: {mode} {what}, {why}");
    }
    let _ = writeln!(
        out,
        "!!! RAX {:#018x} RBX {:#018x} RCX {:#018x} RDX {:#018x}",
        frame.rax, frame.rbx, frame.rcx, frame.rdx
    );
    let _ = writeln!(
        out,
        "!!! RSI {:#018x} RDI {:#018x} RBP {:#018x} R8  {:#018x}",
        frame.rsi, frame.rdi, frame.rbp, frame.r8
    );
    let _ = writeln!(
        out,
        "!!! R9  {:#018x} R10 {:#018x} R11 {:#018x} R12 {:#018x}",
        frame.r9, frame.r10, frame.r11, frame.r12
    );
    let _ = writeln!(
        out,
        "!!! R13 {:#018x} R14 {:#018x} R15 {:#018x}",
        frame.r13, frame.r14, frame.r15
    );
    let code = match overflow {
        Some(stack) => {
            let _ = writeln!(
                out,
                "!!! KERNEL STACK OVERFLOW: the {stack} ({:#x}..{:#x}) ran into its guard page",
                stack.stack.start, stack.stack.end
            );
            ExitCode::StackOverflow
        }
        None => ExitCode::Exception,
    };
    let _ = writeln!(out, "!!! machine stopped (exit code {:#x})", code as u32);
    cpu::exit(code)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    cpu::disable_interrupts();
    if DYING.swap(true, Ordering::SeqCst) {
        cpu::exit(ExitCode::Panic);
    }
    if let Some(mut out) = EmergencyConsole::take() {
        let _ = write!(out, "\n!!! KERNEL PANIC");
        if let Some(loc) = info.location() {
            let _ = write!(out, " at {}:{}:{}", loc.file(), loc.line(), loc.column());
        }
        let _ = writeln!(out, ": {}", info.message());
        let _ = writeln!(
            out,
            "!!! machine stopped (exit code {:#x})",
            ExitCode::Panic as u32
        );
    }
    cpu::exit(ExitCode::Panic)
}

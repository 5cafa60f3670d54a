//! The GDT, the TSS and its interrupt stacks.
//!
//! Long mode ignores segmentation except for privilege and the TSS, whose interrupt stack
//! table (IST) gives double faults, page faults, NMIs and machine checks stacks of their
//! own: a page fault caused by a kernel stack overflow (hitting the guard page) can then
//! still run its handler and report, instead of escalating to a triple fault.

use core::ops::Range;

use boot::stack::{GuardedStack, MAIN_STACK};
use x86_64::instructions::segmentation::{Segment, CS, DS, ES, SS};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;
use x86_64::VirtAddr;

/// IST slot (0-based, as in the TSS) for double faults.
pub const IST_DOUBLE_FAULT: u16 = 0;
/// IST slot for page faults.
pub const IST_PAGE_FAULT: u16 = 1;
/// IST slot for NMIs and machine checks.
pub const IST_NMI: u16 = 2;

const IST_STACK_SIZE: usize = 16 * 1024;

static DOUBLE_FAULT_STACK: GuardedStack<IST_STACK_SIZE> = GuardedStack::new();
static PAGE_FAULT_STACK: GuardedStack<IST_STACK_SIZE> = GuardedStack::new();
static NMI_STACK: GuardedStack<IST_STACK_SIZE> = GuardedStack::new();

/// A kernel stack: its name, the usable range and its guard page.
#[derive(Clone, Debug)]
pub struct StackInfo {
    /// Which stack.
    pub name: &'static str,
    /// The usable range.
    pub stack: Range<u64>,
    /// The unmapped page below it.
    pub guard: Range<u64>,
}

/// Every kernel stack, for the page tables (guards stay unmapped) and fault reports.
pub fn stacks() -> [StackInfo; 4] {
    fn info<const N: usize>(name: &'static str, s: &GuardedStack<N>) -> StackInfo {
        StackInfo {
            name,
            stack: s.stack(),
            guard: s.guard(),
        }
    }
    [
        info("main", &MAIN_STACK),
        info("double-fault IST", &DOUBLE_FAULT_STACK),
        info("page-fault IST", &PAGE_FAULT_STACK),
        info("NMI IST", &NMI_STACK),
    ]
}

struct Tables {
    gdt: GlobalDescriptorTable,
    code: SegmentSelector,
    data: SegmentSelector,
    tss: SegmentSelector,
}

static TSS: spin::Once<TaskStateSegment> = spin::Once::new();
static GDT: spin::Once<Tables> = spin::Once::new();

/// Loads the GDT and the TSS and reloads the segment registers.
pub fn init() {
    let tss = TSS.call_once(|| {
        let mut tss = TaskStateSegment::new();
        let top = |s: &GuardedStack<IST_STACK_SIZE>| VirtAddr::new(s.top());
        tss.interrupt_stack_table[usize::from(IST_DOUBLE_FAULT)] = top(&DOUBLE_FAULT_STACK);
        tss.interrupt_stack_table[usize::from(IST_PAGE_FAULT)] = top(&PAGE_FAULT_STACK);
        tss.interrupt_stack_table[usize::from(IST_NMI)] = top(&NMI_STACK);
        tss
    });
    let tables = GDT.call_once(|| {
        let mut gdt = GlobalDescriptorTable::new();
        let code = gdt.append(Descriptor::kernel_code_segment());
        let data = gdt.append(Descriptor::kernel_data_segment());
        let tss = gdt.append(Descriptor::tss_segment(tss));
        Tables {
            gdt,
            code,
            data,
            tss,
        }
    });
    tables.gdt.load();
    // SAFETY: the selectors index the GDT just loaded, which lives in a static; the code
    // segment is a 64-bit kernel code segment and the data segment a writable one.
    unsafe {
        CS::set_reg(tables.code);
        SS::set_reg(tables.data);
        DS::set_reg(tables.data);
        ES::set_reg(tables.data);
        load_tss(tables.tss);
    }
}

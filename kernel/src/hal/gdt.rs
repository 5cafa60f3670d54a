//! Each CPU's GDT, TSS and interrupt stacks, and the application processors' main stacks.
//!
//! Long mode ignores segmentation except for privilege and the TSS, whose interrupt stack
//! table (IST) gives double faults, page faults, NMIs and machine checks stacks of their
//! own: a page fault caused by a kernel stack overflow (hitting the guard page) can then
//! still run its handler and report, instead of escalating to a triple fault. A TSS
//! belongs to one CPU (loading it marks its descriptor busy), so every CPU has its own
//! GDT, TSS and IST stacks.

use core::fmt;
use core::ops::Range;

use boot::stack::{GuardedStack, MAIN_STACK, MAIN_STACK_SIZE};
use x86_64::instructions::segmentation::{Segment, CS, DS, ES, SS};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;
use x86_64::VirtAddr;

use super::percpu::MAX_CPUS;

/// IST slot (0-based, as in the TSS) for double faults.
pub const IST_DOUBLE_FAULT: u16 = 0;
/// IST slot for page faults.
pub const IST_PAGE_FAULT: u16 = 1;
/// IST slot for NMIs and machine checks.
pub const IST_NMI: u16 = 2;

const IST_STACK_SIZE: usize = 16 * 1024;
/// The IST stacks' names, by slot.
const IST_NAMES: [&str; 3] = ["double-fault IST", "page-fault IST", "NMI IST"];

/// Every CPU's IST stacks, by slot.
static IST_STACKS: [[GuardedStack<IST_STACK_SIZE>; 3]; MAX_CPUS] =
    [const { [const { GuardedStack::new() }; 3] }; MAX_CPUS];
/// The application processors' main stacks (CPU `i` uses entry `i - 1`; the boot CPU runs
/// on the boot crate's [`MAIN_STACK`]).
static AP_MAIN_STACKS: [GuardedStack<MAIN_STACK_SIZE>; MAX_CPUS - 1] =
    [const { GuardedStack::new() }; MAX_CPUS - 1];

/// How many kernel stacks there are: each CPU's main stack and IST stacks.
pub const STACK_COUNT: usize = MAX_CPUS * 4;

/// A kernel stack: whose it is, the usable range and its guard page.
#[derive(Clone, Debug)]
pub struct StackInfo {
    /// Which stack of its CPU ("main", "page-fault IST"...).
    pub name: &'static str,
    /// The CPU it belongs to.
    pub cpu: usize,
    /// The usable range.
    pub stack: Range<u64>,
    /// The unmapped page below it.
    pub guard: Range<u64>,
}

impl fmt::Display for StackInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} stack of CPU {}", self.name, self.cpu)
    }
}

/// Every kernel stack, for the page tables (guards stay unmapped) and fault reports.
pub fn stacks() -> impl Iterator<Item = StackInfo> {
    fn info<const N: usize>(name: &'static str, cpu: usize, s: &GuardedStack<N>) -> StackInfo {
        StackInfo {
            name,
            cpu,
            stack: s.stack(),
            guard: s.guard(),
        }
    }
    let main = (0..MAX_CPUS).map(|cpu| match cpu {
        0 => info("main", 0, &MAIN_STACK),
        _ => info("main", cpu, &AP_MAIN_STACKS[cpu - 1]),
    });
    let ist = (0..MAX_CPUS)
        .flat_map(|cpu| (0..3).map(move |slot| info(IST_NAMES[slot], cpu, &IST_STACKS[cpu][slot])));
    main.chain(ist)
}

/// The initial stack pointer of application processor `cpu`'s main stack.
///
/// # Panics
/// For the boot CPU (0), which runs on the boot crate's stack, or beyond [`MAX_CPUS`].
pub fn ap_stack_top(cpu: usize) -> u64 {
    assert!(
        (1..MAX_CPUS).contains(&cpu),
        "no AP main stack for CPU {cpu}"
    );
    AP_MAIN_STACKS[cpu - 1].top()
}

struct Tables {
    gdt: GlobalDescriptorTable,
    code: SegmentSelector,
    data: SegmentSelector,
    tss: SegmentSelector,
}

static TSS: [spin::Once<TaskStateSegment>; MAX_CPUS] = [const { spin::Once::new() }; MAX_CPUS];
static GDT: [spin::Once<Tables>; MAX_CPUS] = [const { spin::Once::new() }; MAX_CPUS];

/// Loads CPU `cpu`'s GDT and TSS (building them on first use) and reloads the segment
/// registers. Each CPU calls it once, for its own index.
pub fn init(cpu: usize) {
    let tss = TSS[cpu].call_once(|| {
        let mut tss = TaskStateSegment::new();
        for (slot, stack) in IST_STACKS[cpu].iter().enumerate() {
            tss.interrupt_stack_table[slot] = VirtAddr::new(stack.top());
        }
        tss
    });
    let tables = GDT[cpu].call_once(|| {
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
    // segment is a 64-bit kernel code segment, the data segment a writable one, and the
    // TSS is this CPU's alone (no other CPU loads it, so its busy bit is ours to set).
    unsafe {
        CS::set_reg(tables.code);
        SS::set_reg(tables.data);
        DS::set_reg(tables.data);
        ES::set_reg(tables.data);
        load_tss(tables.tss);
    }
}

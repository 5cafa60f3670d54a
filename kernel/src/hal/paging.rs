//! The kernel's page tables.
//!
//! Built once at boot from the memory map, replacing the boot code's 4 GiB identity map:
//! - every RAM region (ACPI regions included) is identity-mapped read-write, no-execute,
//!   cached, with 2 MiB pages where alignment allows;
//! - the kernel image is mapped with 4 KiB pages by section: text read-only + executable,
//!   rodata read-only + no-execute, data/bss read-write + no-execute;
//! - every stack's guard page and page 0 stay unmapped (overflows and null pointers fault);
//! - device MMIO is mapped on demand, uncached ([`map_mmio`]); firmware tables read-only
//!   ([`map_firmware`]). Both are identity mappings too and are never removed.

use core::ops::Range;

use boot::layout::KernelLayout;
use x86_64::registers::control::{Cr3, Cr3Flags};
use x86_64::structures::paging::mapper::{MapToError, TranslateResult};
use x86_64::structures::paging::{
    FrameAllocator, Mapper, OffsetPageTable, Page, PageSize, PageTable, PageTableFlags as Flags,
    PhysFrame, Size2MiB, Size4KiB, Translate,
};
use x86_64::{PhysAddr, VirtAddr};

use super::memory;
use super::mmio::MmioRegion;
use crate::mm::memmap::PhysRanges;
use crate::mm::PAGE_SIZE;
use crate::sync::IrqLock;

const HUGE: u64 = 2 * 1024 * 1024;

const RAM: Flags = Flags::PRESENT
    .union(Flags::WRITABLE)
    .union(Flags::NO_EXECUTE);
const TEXT: Flags = Flags::PRESENT;
const RODATA: Flags = Flags::PRESENT.union(Flags::NO_EXECUTE);
const MMIO: Flags = RAM.union(Flags::NO_CACHE).union(Flags::WRITE_THROUGH);
const FIRMWARE: Flags = Flags::PRESENT.union(Flags::NO_EXECUTE);

struct Tables {
    mapper: OffsetPageTable<'static>,
    /// All RAM: device mappings must not overlap it (no uncached aliases of RAM).
    ram: PhysRanges,
}

static TABLES: IrqLock<Option<Tables>> = IrqLock::new(None);

/// Page-table frames come from the global frame allocator.
struct Frames;

// SAFETY: `memory::alloc_frames` returns unused, identity-mapped frames that it will not
// hand out again until freed (page tables are never freed).
unsafe impl FrameAllocator<Size4KiB> for Frames {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        let addr = memory::alloc_frames(1, 1).ok()?;
        Some(PhysFrame::containing_address(PhysAddr::new(addr)))
    }
}

/// Why a mapping failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The range overlaps RAM (an uncached alias of RAM is never made).
    OverlapsRam,
    /// No frames for page tables.
    OutOfMemory,
    /// Part of the range is already mapped differently.
    Conflict,
    /// The range is empty, wraps, or is not a canonical lower-half address.
    BadRange,
}

/// What [`init`] mapped, for the boot log.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapSummary {
    /// RAM bytes mapped with 2 MiB pages.
    pub huge_bytes: u64,
    /// RAM and image bytes mapped with 4 KiB pages.
    pub small_bytes: u64,
    /// Guard pages left unmapped.
    pub guards: usize,
}

/// Identity-maps the page of size `S` at `addr`.
fn map_one<S: PageSize>(
    mapper: &mut OffsetPageTable<'static>,
    addr: u64,
    flags: Flags,
) -> Result<(), MapError>
where
    OffsetPageTable<'static>: Mapper<S>,
{
    let page = Page::<S>::containing_address(VirtAddr::new(addr));
    let frame = PhysFrame::<S>::containing_address(PhysAddr::new(addr));
    // SAFETY: an identity mapping of memory whose use the caller's flags describe; it
    // aliases nothing (each physical page has exactly this one mapping).
    match unsafe { mapper.map_to(page, frame, flags, &mut Frames) } {
        Ok(flush) => {
            flush.flush();
            Ok(())
        }
        Err(MapToError::FrameAllocationFailed) => Err(MapError::OutOfMemory),
        Err(_) => Err(MapError::Conflict),
    }
}

fn map_page(
    mapper: &mut OffsetPageTable<'static>,
    addr: u64,
    flags: Flags,
) -> Result<(), MapError> {
    map_one::<Size4KiB>(mapper, addr, flags)
}

/// Identity-maps `range` (page-aligned) with the largest pages alignment allows.
fn map_range(
    mapper: &mut OffsetPageTable<'static>,
    range: Range<u64>,
    flags: Flags,
    summary: &mut MapSummary,
) -> Result<(), MapError> {
    let mut addr = range.start;
    while addr < range.end {
        if addr.is_multiple_of(HUGE) && range.end - addr >= HUGE {
            map_one::<Size2MiB>(mapper, addr, flags)?;
            summary.huge_bytes += HUGE;
            addr += HUGE;
        } else {
            map_page(mapper, addr, flags)?;
            summary.small_bytes += PAGE_SIZE;
            addr += PAGE_SIZE;
        }
    }
    Ok(())
}

/// Builds the kernel's page tables and switches to them.
///
/// # Panics
/// If page-table frames run out (the frame allocator holds nearly all RAM at this point).
pub fn init(ram: &PhysRanges, layout: &KernelLayout, guards: &[Range<u64>]) -> MapSummary {
    let l4_addr = memory::alloc_zeroed_frames(1, 1).expect("no frame for the PML4");
    // SAFETY: the frame is ours, zeroed (a valid empty table), identity-mapped by the boot
    // tables and by the tables we are building, and used only as this PML4 from now on.
    let l4: &'static mut PageTable = unsafe { &mut *(l4_addr as *mut PageTable) };
    // SAFETY: physical memory is identity-mapped (offset 0) in the boot tables, for the
    // frames page tables come from, and in the new tables once we switch.
    let mut mapper = unsafe { OffsetPageTable::new(l4, VirtAddr::zero()) };
    let mut summary = MapSummary::default();

    let mut plain_ram = ram.clone();
    plain_ram.remove(0..PAGE_SIZE); // page 0: null pointers fault
    plain_ram.remove(layout.image.clone());
    for r in plain_ram.as_slice() {
        map_range(&mut mapper, r.clone(), RAM, &mut summary).expect("mapping RAM");
    }
    let mut data = PhysRanges::new();
    data.insert(layout.data.clone());
    for g in guards {
        data.remove(g.clone());
    }
    summary.guards = guards.len();
    let sections = [(layout.text.clone(), TEXT), (layout.rodata.clone(), RODATA)];
    for (range, flags) in sections
        .into_iter()
        .chain(data.as_slice().iter().map(|r| (r.clone(), RAM)))
    {
        let mut addr = range.start;
        while addr < range.end {
            map_page(&mut mapper, addr, flags).expect("mapping the kernel image");
            summary.small_bytes += PAGE_SIZE;
            addr += PAGE_SIZE;
        }
    }
    let frame = PhysFrame::containing_address(PhysAddr::new(l4_addr));
    // SAFETY: the new tables map everything the kernel uses from here on: its image (the
    // code running now, its data and the stack we are on), all RAM (heap, frames, tables)
    // and nothing that was not mapped before except with stricter permissions.
    unsafe { Cr3::write(frame, Cr3Flags::empty()) };
    TABLES.lock(|t| {
        *t = Some(Tables {
            mapper,
            ram: ram.clone(),
        })
    });
    summary
}

fn page_range(phys: u64, len: u64) -> Result<Range<u64>, MapError> {
    let end = phys.checked_add(len).ok_or(MapError::BadRange)?;
    if len == 0 || end > 1 << 47 {
        return Err(MapError::BadRange);
    }
    Ok(phys / PAGE_SIZE * PAGE_SIZE..end.div_ceil(PAGE_SIZE) * PAGE_SIZE)
}

/// Maps `pages` with `flags` unless already mapped; an existing mapping is accepted if
/// `accept` says its flags are compatible.
fn ensure_mapped(
    pages: Range<u64>,
    flags: Flags,
    accept: impl Fn(Flags) -> bool,
    refuse_ram: bool,
) -> Result<(), MapError> {
    TABLES.lock(|t| {
        let t = t.as_mut().expect("paging not initialised");
        if refuse_ram
            && t.ram
                .as_slice()
                .iter()
                .any(|r| r.start < pages.end && pages.start < r.end)
        {
            return Err(MapError::OverlapsRam);
        }
        let mut addr = pages.start;
        while addr < pages.end {
            match t.mapper.translate(VirtAddr::new(addr)) {
                TranslateResult::Mapped {
                    frame,
                    offset,
                    flags: have,
                } => {
                    // Everything is identity-mapped; anything else is not ours to reuse.
                    if frame.start_address().as_u64() + offset != addr || !accept(have) {
                        return Err(MapError::Conflict);
                    }
                }
                TranslateResult::NotMapped => map_page(&mut t.mapper, addr, flags)?,
                TranslateResult::InvalidFrameAddress(_) => return Err(MapError::Conflict),
            }
            addr += PAGE_SIZE;
        }
        Ok(())
    })
}

/// Maps device registers at `phys..phys + len` uncached (identity) and returns them.
/// Mapping the same registers again returns another handle on the same mapping.
pub fn map_mmio(phys: u64, len: u64) -> Result<MmioRegion, MapError> {
    let pages = page_range(phys, len)?;
    ensure_mapped(pages, MMIO, |f| f.contains(Flags::NO_CACHE), true)?;
    Ok(MmioRegion::new(phys, len as usize))
}

/// Makes firmware data at `phys..phys + len` (ACPI tables, the BIOS area) readable: maps
/// what is not mapped yet read-only; RAM is already mapped.
pub fn map_firmware(phys: u64, len: u64) -> Result<(), MapError> {
    let pages = page_range(phys, len)?;
    ensure_mapped(pages, FIRMWARE, |_| true, false)
}

/// How an address is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The physical address it translates to.
    pub phys: u64,
    /// Writable.
    pub writable: bool,
    /// Executable.
    pub executable: bool,
    /// Uncached.
    pub uncached: bool,
}

/// How `addr` is mapped now, if at all.
pub fn translate(addr: u64) -> Option<Mapping> {
    if addr >= 1 << 47 {
        return None;
    }
    TABLES.lock(|t| {
        let t = t.as_ref()?;
        match t.mapper.translate(VirtAddr::new(addr)) {
            TranslateResult::Mapped {
                frame,
                offset,
                flags,
            } => Some(Mapping {
                phys: frame.start_address().as_u64() + offset,
                writable: flags.contains(Flags::WRITABLE),
                executable: !flags.contains(Flags::NO_EXECUTE),
                uncached: flags.contains(Flags::NO_CACHE),
            }),
            _ => None,
        }
    })
}

//! The `acpi` crate's window onto physical memory, and the DSDT's bytes.

use core::ptr::NonNull;

use acpi::{AcpiHandler, AcpiTables, PhysicalMapping};

use super::paging;

/// Maps ACPI tables by identity: tables in RAM are mapped already; others (the BIOS area,
/// firmware-reserved regions) are mapped read-only on first use and stay mapped.
#[derive(Clone, Copy, Debug)]
pub struct IdentityHandler;

impl AcpiHandler for IdentityHandler {
    unsafe fn map_physical_region<T>(&self, phys: usize, size: usize) -> PhysicalMapping<Self, T> {
        let mapped = paging::map_firmware(phys as u64, size as u64);
        assert!(
            mapped.is_ok(),
            "cannot map ACPI table at {phys:#x}+{size:#x}: {mapped:?}"
        );
        let ptr = NonNull::new(phys as *mut T).expect("ACPI table at address 0");
        // SAFETY: `phys..phys + size` is now mapped at the same virtual address, and the
        // caller (the acpi crate) guarantees a `T` lives there.
        unsafe { PhysicalMapping::new(phys, ptr, size, size, *self) }
    }

    fn unmap_physical_region<T>(_region: &PhysicalMapping<Self, T>) {}
}

/// The ACPI tables reachable from the RSDP at `rsdp` (from the PVH start info).
pub fn tables(rsdp: u64) -> Result<AcpiTables<IdentityHandler>, acpi::AcpiError> {
    // SAFETY: `rsdp` comes from the loader's start info, which promises an RSDP there; the
    // crate validates its signature and checksum before following any pointer.
    unsafe { AcpiTables::from_rsdp(IdentityHandler, rsdp as usize) }
}

/// Why the DSDT could not be read.
#[derive(Debug)]
pub enum DsdtError {
    /// The FADT or the DSDT's header is missing or invalid.
    Acpi(acpi::AcpiError),
    /// Its bytes could not be mapped.
    Map(paging::MapError),
}

/// Runs `f` on the DSDT's AML (the table after its header).
pub fn with_dsdt<R>(
    tables: &AcpiTables<IdentityHandler>,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, DsdtError> {
    let aml = tables.dsdt().map_err(DsdtError::Acpi)?;
    let (addr, len) = (aml.address as u64, u64::from(aml.length));
    paging::map_firmware(addr, len).map_err(DsdtError::Map)?;
    // SAFETY: `addr..addr + len` is mapped read-only at the same virtual address (just
    // above) and is firmware memory (reserved or ACPI in the loader's map: never given
    // to the frame allocator, never written); the length is the table's own, from its
    // header. The slice does not outlive this call.
    let bytes = unsafe { core::slice::from_raw_parts(addr as *const u8, len as usize) };
    Ok(f(bytes))
}

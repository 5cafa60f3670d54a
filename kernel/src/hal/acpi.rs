//! The `acpi` crate's window onto physical memory.

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

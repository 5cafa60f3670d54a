//! What ACPI tells us about the machine: interrupt controllers and the HPET.

use alloc::vec::Vec;

use acpi::madt::{Madt, MadtEntry};
use acpi::HpetInfo;

use crate::hal;

/// An IOAPIC from the MADT.
#[derive(Clone, Copy, Debug)]
pub struct IoApicInfo {
    /// Its APIC id.
    pub id: u8,
    /// MMIO base.
    pub addr: u64,
    /// First GSI it serves.
    pub gsi_base: u32,
}

/// An ISA interrupt source override (e.g. IRQ 0 arrives on GSI 2).
#[derive(Clone, Copy, Debug)]
pub struct InterruptOverride {
    /// ISA IRQ.
    pub isa_irq: u8,
    /// The GSI it is wired to.
    pub gsi: u32,
    /// Active low.
    pub active_low: bool,
    /// Level triggered.
    pub level_triggered: bool,
}

/// The machine's interrupt and timer hardware.
#[derive(Clone, Debug)]
pub struct PlatformInfo {
    /// Local APIC MMIO base.
    pub lapic_addr: u64,
    /// Local APIC ids of the CPUs (enabled ones).
    pub cpus: Vec<u8>,
    /// IOAPICs.
    pub ioapics: Vec<IoApicInfo>,
    /// ISA overrides.
    pub overrides: Vec<InterruptOverride>,
    /// HPET MMIO base, if there is one.
    pub hpet: Option<u64>,
}

/// Why ACPI could not be used.
#[derive(Debug)]
pub enum PlatformError {
    /// The loader passed no RSDP.
    NoRsdp,
    /// The tables are unreadable or lack a MADT.
    Acpi(acpi::AcpiError),
}

static INFO: spin::Once<PlatformInfo> = spin::Once::new();

/// What [`init`] found, if it succeeded.
pub fn info() -> Option<&'static PlatformInfo> {
    INFO.get()
}

/// Reads the ACPI tables once and keeps the result for [`info`].
pub fn init(rsdp: Option<u64>) -> Result<&'static PlatformInfo, PlatformError> {
    let found = discover(rsdp)?;
    Ok(INFO.call_once(|| found))
}

/// Reads the MADT (and HPET table) reachable from `rsdp`.
fn discover(rsdp: Option<u64>) -> Result<PlatformInfo, PlatformError> {
    let tables =
        hal::acpi::tables(rsdp.ok_or(PlatformError::NoRsdp)?).map_err(PlatformError::Acpi)?;
    let madt = tables.find_table::<Madt>().map_err(PlatformError::Acpi)?;
    let mut info = PlatformInfo {
        lapic_addr: u64::from(madt.get().local_apic_address),
        cpus: Vec::new(),
        ioapics: Vec::new(),
        overrides: Vec::new(),
        hpet: None,
    };
    for entry in madt.get().entries() {
        match entry {
            MadtEntry::LocalApic(e) => {
                let flags = e.flags;
                if flags & 1 != 0 {
                    info.cpus.push(e.apic_id);
                }
            }
            MadtEntry::IoApic(e) => info.ioapics.push(IoApicInfo {
                id: e.io_apic_id,
                addr: u64::from(e.io_apic_address),
                gsi_base: e.global_system_interrupt_base,
            }),
            MadtEntry::InterruptSourceOverride(e) if e.bus == 0 => {
                let flags = e.flags;
                info.overrides.push(InterruptOverride {
                    isa_irq: e.irq,
                    gsi: e.global_system_interrupt,
                    active_low: flags & 0x3 == 0x3,
                    level_triggered: (flags >> 2) & 0x3 == 0x3,
                });
            }
            MadtEntry::LocalApicAddressOverride(e) => info.lapic_addr = e.local_apic_address,
            _ => {}
        }
    }
    info.hpet = HpetInfo::new(&tables).ok().map(|h| h.base_address as u64);
    Ok(info)
}

//! What ACPI tells us about the machine: interrupt controllers, the HPET, and the fixed
//! hardware of the power button and soft-off (FADT, and `\_S5_` from the DSDT).

use alloc::vec::Vec;

use acpi::address::{AddressSpace, GenericAddress};
use acpi::fadt::Fadt;
use acpi::madt::{Madt, MadtEntry};
use acpi::{AcpiTables, HpetInfo};

use crate::hal;
use crate::hal::acpi::IdentityHandler;
use crate::power::sleep_type::find_s5;
use crate::power::FixedHardware;

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
    /// The MPS INTI flags as the MADT gives them (polarity and trigger mode, where
    /// "conforms to the bus" depends on the interrupt: see `power::sci`).
    pub flags: u16,
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
    /// The power button's and soft-off's registers, or why there are none.
    pub fixed_hardware: Result<FixedHardware, &'static str>,
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
        fixed_hardware: Err("not read yet"),
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
                    flags,
                });
            }
            MadtEntry::LocalApicAddressOverride(e) => info.lapic_addr = e.local_apic_address,
            _ => {}
        }
    }
    info.hpet = HpetInfo::new(&tables).ok().map(|h| h.base_address as u64);
    info.fixed_hardware = fixed_hardware(&tables);
    Ok(info)
}

/// The PM1 and GPE0 registers, the SCI and SMI command from the FADT, and the S5 sleep
/// types from the DSDT.
fn fixed_hardware(tables: &AcpiTables<IdentityHandler>) -> Result<FixedHardware, &'static str> {
    let fadt = tables.find_table::<Fadt>().map_err(|_| "no valid FADT")?;
    if { fadt.flags }.system_is_hw_reduced_acpi() {
        return Err("hardware-reduced ACPI: no PM1 registers");
    }
    let unreadable = "a PM1 register block the FADT describes badly";
    let event = fadt.pm1a_event_block().map_err(|_| unreadable)?;
    let pm1b_event = fadt.pm1b_event_block().map_err(|_| unreadable)?;
    let pm1b_control = fadt.pm1b_control_block().map_err(|_| unreadable)?;
    let gpe0 = fadt.gpe0_block().map_err(|_| unreadable)?;
    // Without a readable DSDT there is still a power button, only no soft-off.
    let s5 = hal::acpi::with_dsdt(tables, find_s5).ok().flatten();
    Ok(FixedHardware {
        sci_int: fadt.sci_interrupt,
        smi_cmd: u16::try_from(fadt.smi_cmd_port).map_err(|_| "SMI_CMD beyond the I/O space")?,
        acpi_enable: fadt.acpi_enable,
        pm1a_event: io_port(&event)?,
        pm1b_event: pm1b_event.as_ref().map(io_port).transpose()?,
        pm1_event_len: event.bit_width / 8,
        pm1a_control: io_port(&fadt.pm1a_control_block().map_err(|_| unreadable)?)?,
        pm1b_control: pm1b_control.as_ref().map(io_port).transpose()?,
        gpe0: match gpe0 {
            Some(g) => Some((io_port(&g)?, g.bit_width / 8)),
            None => None,
        },
        s5,
    })
}

/// The I/O port of a fixed-hardware register (the only address space driven here).
fn io_port(register: &GenericAddress) -> Result<u16, &'static str> {
    if register.address_space != AddressSpace::SystemIo {
        return Err("fixed-hardware registers outside the I/O space (not supported)");
    }
    u16::try_from(register.address).map_err(|_| "a fixed-hardware register beyond the I/O space")
}

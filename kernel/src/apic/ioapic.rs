//! IOAPICs: route global system interrupts (GSIs) to vectors.

use alloc::vec::Vec;

use crate::hal::mmio::MmioRegion;
use crate::hal::paging;
use crate::platform::{InterruptOverride, PlatformInfo};
use crate::sync::IrqLock;

const IOREGSEL: usize = 0x00;
const IOWIN: usize = 0x10;
const REG_VERSION: u32 = 0x01;
const REG_REDIRECT: u32 = 0x10;

const MASKED: u64 = 1 << 16;
const LEVEL: u64 = 1 << 15;
const ACTIVE_LOW: u64 = 1 << 13;

struct IoApic {
    regs: MmioRegion,
    gsi_base: u32,
    lines: u32,
}

impl IoApic {
    // The index/data pair must not be split by another access: callers hold `IOAPICS`.
    fn read(&self, reg: u32) -> u32 {
        self.regs.write32(IOREGSEL, reg);
        self.regs.read32(IOWIN)
    }

    fn write(&self, reg: u32, value: u32) {
        self.regs.write32(IOREGSEL, reg);
        self.regs.write32(IOWIN, value);
    }

    fn set_entry(&self, line: u32, entry: u64) {
        // Mask first, then write high, then low (which carries the mask bit).
        self.write(REG_REDIRECT + 2 * line, MASKED as u32);
        self.write(REG_REDIRECT + 2 * line + 1, (entry >> 32) as u32);
        self.write(REG_REDIRECT + 2 * line, entry as u32);
    }
}

static IOAPICS: IrqLock<Vec<IoApic>> = IrqLock::new(Vec::new());
static OVERRIDES: spin::Once<Vec<InterruptOverride>> = spin::Once::new();

/// Maps every IOAPIC from the MADT and masks all their lines. Returns the line count.
pub fn init(info: &PlatformInfo) -> u32 {
    OVERRIDES.call_once(|| info.overrides.clone());
    let mut total = 0;
    for a in &info.ioapics {
        let regs = match paging::map_mmio(a.addr, 0x20) {
            Ok(r) => r,
            Err(e) => {
                log::error!("IOAPIC {} at {:#x}: cannot map: {e:?}", a.id, a.addr);
                continue;
            }
        };
        let mut apic = IoApic {
            regs,
            gsi_base: a.gsi_base,
            lines: 0,
        };
        apic.lines = ((apic.read(REG_VERSION) >> 16) & 0xff) + 1;
        for line in 0..apic.lines {
            apic.set_entry(line, MASKED);
        }
        total += apic.lines;
        IOAPICS.lock(|v| v.push(apic));
    }
    total
}

/// An ISA IRQ's GSI and polarity/trigger (edge, active-high unless overridden).
pub fn isa_irq(irq: u8) -> (u32, bool, bool) {
    isa_override(irq).map_or((u32::from(irq), false, false), |o| {
        (o.gsi, o.active_low, o.level_triggered)
    })
}

/// The MADT's override of ISA IRQ `irq`, if it has one.
pub fn isa_override(irq: u8) -> Option<InterruptOverride> {
    OVERRIDES.get()?.iter().find(|o| o.isa_irq == irq).copied()
}

/// The GSI is not on any IOAPIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoSuchGsi(pub u32);

/// Routes `gsi` to `vector` on the CPU with local APIC id `dest`, unmasked.
pub fn route(
    gsi: u32,
    vector: u8,
    dest: u8,
    active_low: bool,
    level_triggered: bool,
) -> Result<(), NoSuchGsi> {
    let mut entry = u64::from(vector) | (u64::from(dest) << 56);
    if active_low {
        entry |= ACTIVE_LOW;
    }
    if level_triggered {
        entry |= LEVEL;
    }
    with_line(gsi, |apic, line| apic.set_entry(line, entry))
}

/// Masks `gsi`.
pub fn mask(gsi: u32) -> Result<(), NoSuchGsi> {
    with_line(gsi, |apic, line| apic.set_entry(line, MASKED))
}

fn with_line(gsi: u32, f: impl FnOnce(&IoApic, u32)) -> Result<(), NoSuchGsi> {
    IOAPICS.lock(|v| {
        let apic = v
            .iter()
            .find(|a| (a.gsi_base..a.gsi_base + a.lines).contains(&gsi))
            .ok_or(NoSuchGsi(gsi))?;
        f(apic, gsi - apic.gsi_base);
        Ok(())
    })
}

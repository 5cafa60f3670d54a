//! How the SCI (the ACPI System Control Interrupt) is wired to the IOAPIC.
//!
//! The FADT names the SCI's ISA IRQ (`SCI_INT`, 9 on QEMU and most PCs). ACPI defines
//! it as a shareable, level-triggered, active-low interrupt; the MADT may override that
//! with an interrupt source override for the IRQ (its GSI, polarity and trigger mode).
//! QEMU's `pc` and `q35` machines both say "IRQ 9 is GSI 9, level-triggered, active
//! high". The override's flags are MPS INTI flags, whose "conforms to the bus" values
//! mean, for the SCI, ACPI's own default.

/// Where and how the SCI arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SciLine {
    /// Its global system interrupt (IOAPIC input).
    pub gsi: u32,
    /// Asserted low.
    pub active_low: bool,
    /// Level-triggered.
    pub level_triggered: bool,
}

/// MPS INTI flags: polarity in bits 0-1, trigger mode in bits 2-3.
const POLARITY_HIGH: u16 = 0b01;
const TRIGGER_EDGE: u16 = 0b01;

/// The SCI's line for `SCI_INT` `sci_int` and the MADT's override of that IRQ, if
/// any (`(gsi, flags)`).
pub fn sci_line(sci_int: u16, override_: Option<(u32, u16)>) -> SciLine {
    let (gsi, flags) = override_.unwrap_or((u32::from(sci_int), 0));
    SciLine {
        gsi,
        // Anything but "active high" (conforming, active low) is ACPI's active low.
        active_low: flags & 0b11 != POLARITY_HIGH,
        level_triggered: (flags >> 2) & 0b11 != TRIGGER_EDGE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_override_the_sci_is_level_active_low_on_its_irq() {
        let line = sci_line(9, None);
        assert_eq!(
            line,
            SciLine {
                gsi: 9,
                active_low: true,
                level_triggered: true
            }
        );
        // "Conforms to the bus" means the same for the SCI.
        assert_eq!(sci_line(9, Some((9, 0))), line);
    }

    #[test]
    fn the_override_decides() {
        // QEMU: IRQ 9 -> GSI 9, flags 0xd (level, active high).
        let qemu = sci_line(9, Some((9, 0x0d)));
        assert!(!qemu.active_low && qemu.level_triggered);
        let moved = sci_line(9, Some((20, 0x0f)));
        assert_eq!(
            (moved.gsi, moved.active_low, moved.level_triggered),
            (20, true, true)
        );
        let edge = sci_line(9, Some((9, 0x05)));
        assert!(!edge.active_low && !edge.level_triggered);
    }
}

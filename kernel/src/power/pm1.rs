//! The bits of the ACPI PM1 fixed-hardware registers the appliance uses (ACPI 6.5,
//! 4.8.3.1 and 4.8.3.2): the power button's status and enable bits, `SCI_EN`, and the
//! sleep command. Each PM1 register may be split over an `a` and a `b` block; the
//! status and enable registers share one event block, enable in its second half.

/// PM1 status: the power button was pressed (write 1 to clear).
pub const PWRBTN_STS: u16 = 1 << 8;
/// PM1 status: every fixed event's status bit (timer, bus master, global lock, power
/// and sleep buttons, RTC, PCIe wake, wake): written back at start-up to clear them.
pub const ALL_FIXED_STATUS: u16 = 0xc731;
/// PM1 enable: a power-button press raises the SCI.
pub const PWRBTN_EN: u16 = 1 << 8;
/// PM1 control: ACPI mode is on (events raise the SCI, not an SMI).
pub const SCI_EN: u16 = 1 << 0;
/// PM1 control: enter the sleep state in `SLP_TYP` when written as 1.
pub const SLP_EN: u16 = 1 << 13;
const SLP_TYP_SHIFT: u16 = 10;
const SLP_TYP_MASK: u16 = 0b111 << SLP_TYP_SHIFT;

/// Offset of the enable register in a PM1 event block of `len` bytes (status is the
/// first half, enable the second).
pub fn enable_offset(len: u8) -> u16 {
    u16::from(len / 2)
}

/// The PM1 control value that selects sleep type `typ` (`SLP_EN` clear), from the
/// register's current value: ACPI asks to write `SLP_TYP` first and `SLP_EN` with it
/// in a second write, keeping the other bits.
pub fn sleep_type_selected(control: u16, typ: u8) -> u16 {
    (control & !(SLP_TYP_MASK | SLP_EN)) | ((u16::from(typ) << SLP_TYP_SHIFT) & SLP_TYP_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sleep_command_keeps_other_bits_and_replaces_the_type() {
        // SCI_EN set, an old sleep type 5 selected.
        let control = SCI_EN | (5 << 10);
        assert_eq!(sleep_type_selected(control, 0), SCI_EN);
        assert_eq!(sleep_type_selected(control, 7) | SLP_EN, 0x3c01);
        assert_eq!(sleep_type_selected(SLP_EN, 2), 2 << 10);
    }

    #[test]
    fn the_enable_register_is_the_second_half() {
        assert_eq!(enable_offset(4), 2);
        assert_eq!(enable_offset(8), 4);
        assert_eq!(ALL_FIXED_STATUS & PWRBTN_STS, PWRBTN_STS);
    }
}

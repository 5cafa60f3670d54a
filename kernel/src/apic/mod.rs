//! Interrupt controllers: the local APIC (timer, EOI, MSI destination), the IOAPICs
//! (legacy and pin-based interrupts) and the 8259 PICs, which are remapped and masked.

pub mod ioapic;
pub mod lapic;
pub mod pic;

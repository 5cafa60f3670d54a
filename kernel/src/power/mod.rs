//! The ACPI power button and soft-off: what lets an operator stop the appliance cleanly
//! (QEMU's `system_powerdown`, libvirt's `virsh shutdown`, a real power button) and what
//! turns the machine off at the end.
//!
//! At boot (`platform` reads the tables, [`arm`] drives the hardware): ACPI mode is
//! entered if the firmware left it off (`ACPI_ENABLE` written to `SMI_CMD`, then wait for
//! `SCI_EN`); every fixed event and general-purpose event is disabled and its status
//! cleared, so nothing but the button can raise the SCI; the SCI is routed through the
//! IOAPIC as the MADT says ([`sci`]); and the power button's enable bit is set. The SCI
//! handler clears `PWRBTN_STS` (the SCI is level-triggered: it would fire again) and
//! signals [`pressed`]. The shutdown sequence (`crate::shutdown`) waits for that, and
//! ends with [`off`]: `SLP_TYPa`/`SLP_TYPb` from the DSDT's `\_S5_` ([`sleep_type`]),
//! then `SLP_EN`, into the PM1 control registers.
//!
//! Only PM1 blocks in I/O space are driven (every PC and QEMU machine has them there;
//! hardware-reduced ACPI platforms have none, and get no power button here).
//!
//! | module | what |
//! |---|---|
//! | [`pm1`] | the PM1 register bits (pure) |
//! | [`sleep_type`] | the `\_S5_` scan of the DSDT (pure) |
//! | [`sci`] | how the SCI reaches the IOAPIC (pure) |

pub mod pm1;
pub mod sci;
pub mod sleep_type;

#[cfg(target_os = "none")]
mod hardware;
#[cfg(target_os = "none")]
pub use hardware::{arm, off, pressed, report, ArmError};

use core::fmt;

use sleep_type::SleepType;

/// The ACPI fixed hardware the power button and soft-off use, as the FADT and DSDT
/// describe it (I/O ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedHardware {
    /// `SCI_INT`: the SCI's ISA IRQ.
    pub sci_int: u16,
    /// `SMI_CMD` port (0: the machine has no SMM, ACPI mode is always on).
    pub smi_cmd: u16,
    /// The value written to `SMI_CMD` to enter ACPI mode.
    pub acpi_enable: u8,
    /// PM1a event block (status, then enable).
    pub pm1a_event: u16,
    /// PM1b event block, if the machine splits PM1.
    pub pm1b_event: Option<u16>,
    /// Length of each PM1 event block in bytes (status and enable halves).
    pub pm1_event_len: u8,
    /// PM1a control register.
    pub pm1a_control: u16,
    /// PM1b control register, if any.
    pub pm1b_control: Option<u16>,
    /// GPE0 block and its length in bytes (status half, then enable half), if any.
    pub gpe0: Option<(u16, u8)>,
    /// The sleep types of S5, if the DSDT declares them in a shape the scan knows.
    pub s5: Option<SleepType>,
}

impl fmt::Display for FixedHardware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCI IRQ {}, PM1a event {:#x}+{}, PM1a control {:#x}",
            self.sci_int, self.pm1a_event, self.pm1_event_len, self.pm1a_control
        )?;
        if let Some(b) = self.pm1b_event {
            write!(f, ", PM1b event {b:#x}")?;
        }
        if let Some(b) = self.pm1b_control {
            write!(f, ", PM1b control {b:#x}")?;
        }
        if let Some((port, len)) = self.gpe0 {
            write!(f, ", GPE0 {port:#x}+{len}")?;
        }
        if self.smi_cmd != 0 {
            write!(f, ", SMI_CMD {:#x}", self.smi_cmd)?;
        }
        match self.s5 {
            Some(s) => write!(f, ", S5 sleep type {}/{}", s.a, s.b),
            None => f.write_str(", no \\_S5_ in the DSDT"),
        }
    }
}

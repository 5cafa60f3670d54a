//! Driving the fixed hardware: ACPI mode, the SCI and its handler, the power button,
//! soft-off. See the module documentation of `power`.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use super::sci::{sci_line, SciLine};
use super::{pm1, FixedHardware};
use crate::apic::{ioapic, lapic};
use crate::clock;
use crate::exec::{IrqEvent, Wait};
use crate::exit::ExitCode;
use crate::hal::cpu;
use crate::hal::io_port::IoPort;
use crate::irq::{self, IrqHandle, NoFreeVector};
use crate::report::PowerReport;

/// How long the firmware may take to hand the registers over after `ACPI_ENABLE` (ACPI
/// asks the OS to wait; firmware answers within milliseconds).
const ACPI_ENABLE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long to wait for the machine to turn off after `SLP_EN` before falling back to
/// QEMU's debug-exit device (QEMU stops the CPU within microseconds).
const SOFT_OFF_WAIT: Duration = Duration::from_secs(1);

/// Why the power button could not be armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmError {
    /// ACPI mode is off and the FADT names no way to turn it on.
    NoAcpiMode,
    /// The firmware did not set `SCI_EN` after `ACPI_ENABLE`.
    AcpiModeTimeout,
    /// No interrupt vector for the SCI.
    NoVector,
    /// The SCI's GSI is on no IOAPIC.
    NoSuchGsi(u32),
}

impl fmt::Display for ArmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArmError::NoAcpiMode => {
                f.write_str("ACPI mode is off and there is no SMI_CMD to enable it")
            }
            ArmError::AcpiModeTimeout => write!(
                f,
                "the firmware did not enter ACPI mode within {} ms",
                ACPI_ENABLE_TIMEOUT.as_millis()
            ),
            ArmError::NoVector => f.write_str("no interrupt vector for the SCI"),
            ArmError::NoSuchGsi(gsi) => write!(f, "the SCI's GSI {gsi} is on no IOAPIC"),
        }
    }
}

impl From<NoFreeVector> for ArmError {
    fn from(_: NoFreeVector) -> Self {
        ArmError::NoVector
    }
}

/// A PM1 register split over an `a` and an optional `b` block: reads combine both
/// halves, writes go to both.
#[derive(Clone, Copy, Debug)]
struct Pm1Register {
    a: IoPort<u16>,
    b: Option<IoPort<u16>>,
}

impl Pm1Register {
    fn status(hw: &FixedHardware) -> Pm1Register {
        Pm1Register {
            a: IoPort::new(hw.pm1a_event),
            b: hw.pm1b_event.map(IoPort::new),
        }
    }

    fn enable(hw: &FixedHardware) -> Pm1Register {
        let offset = pm1::enable_offset(hw.pm1_event_len);
        Pm1Register {
            a: IoPort::new(hw.pm1a_event + offset),
            b: hw.pm1b_event.map(|b| IoPort::new(b + offset)),
        }
    }

    fn read(&self) -> u16 {
        self.a.read() | self.b.map_or(0, |b| b.read())
    }

    fn write(&self, value: u16) {
        self.a.write(value);
        if let Some(b) = self.b {
            b.write(value);
        }
    }
}

/// The hardware, once [`arm`] was given it (soft-off needs it even if arming failed).
static HARDWARE: spin::Once<FixedHardware> = spin::Once::new();
/// The SCI's vector, while the button is armed.
static SCI: spin::Once<IrqHandle> = spin::Once::new();
/// Raised by the SCI handler for each press.
static BUTTON: IrqEvent = IrqEvent::new();
static SCI_INTERRUPTS: AtomicU64 = AtomicU64::new(0);
static PRESSES: AtomicU64 = AtomicU64::new(0);

/// Takes the fixed hardware over (once, at boot) and arms the power button: ACPI mode,
/// every other event disabled and cleared, the SCI routed, `PWRBTN_EN` set. Returns the
/// SCI's line. Soft-off ([`off`]) works from here on even if arming fails.
pub fn arm(hw: FixedHardware) -> Result<SciLine, ArmError> {
    let hw = *HARDWARE.call_once(|| hw);
    enter_acpi_mode(&hw)?;
    let (status, enable) = (Pm1Register::status(&hw), Pm1Register::enable(&hw));
    enable.write(0);
    status.write(pm1::ALL_FIXED_STATUS);
    if let Some((port, len)) = hw.gpe0 {
        // Status bytes first (write 1 to clear), enable bytes in the second half.
        let half = u16::from(len / 2);
        for i in 0..half {
            IoPort::<u8>::new(port + half + i).write(0);
            IoPort::<u8>::new(port + i).write(0xff);
        }
    }
    let over = u8::try_from(hw.sci_int)
        .ok()
        .and_then(ioapic::isa_override)
        .map(|o| (o.gsi, o.flags));
    let line = sci_line(hw.sci_int, over);
    let handle = irq::allocate(move || on_sci(status))?;
    ioapic::route(
        line.gsi,
        handle.vector(),
        lapic::id(),
        line.active_low,
        line.level_triggered,
    )
    .map_err(|e| ArmError::NoSuchGsi(e.0))?;
    SCI.call_once(|| handle);
    enable.write(pm1::PWRBTN_EN);
    Ok(line)
}

/// Sets `SCI_EN` through `SMI_CMD` if the firmware left ACPI mode off, and waits for it.
fn enter_acpi_mode(hw: &FixedHardware) -> Result<(), ArmError> {
    let control = IoPort::<u16>::new(hw.pm1a_control);
    if control.read() & pm1::SCI_EN != 0 {
        return Ok(());
    }
    if hw.smi_cmd == 0 || hw.acpi_enable == 0 {
        return Err(ArmError::NoAcpiMode);
    }
    IoPort::<u8>::new(hw.smi_cmd).write(hw.acpi_enable);
    let deadline = clock::now() + ACPI_ENABLE_TIMEOUT;
    while control.read() & pm1::SCI_EN == 0 {
        if clock::now() >= deadline {
            return Err(ArmError::AcpiModeTimeout);
        }
        core::hint::spin_loop();
    }
    log::debug!("power: ACPI mode entered (SMI_CMD {:#x})", hw.smi_cmd);
    Ok(())
}

/// The SCI handler (interrupt context). The SCI is level-triggered: the status bit
/// must be cleared here or the interrupt fires again at once.
fn on_sci(status: Pm1Register) {
    SCI_INTERRUPTS.fetch_add(1, Ordering::Relaxed);
    if status.read() & pm1::PWRBTN_STS != 0 {
        status.write(pm1::PWRBTN_STS);
        PRESSES.fetch_add(1, Ordering::Relaxed);
        BUTTON.signal();
    }
}

/// Completes at the next press of the power button (at once if one is pending: presses
/// coalesce until someone waits).
pub fn pressed() -> Wait<'static> {
    BUTTON.wait()
}

/// The power button's counters (the shutdown fills its own part).
pub fn report() -> PowerReport {
    PowerReport {
        button_armed: SCI.is_completed(),
        sci_interrupts: SCI_INTERRUPTS.load(Ordering::Relaxed),
        button_presses: PRESSES.load(Ordering::Relaxed),
        ..PowerReport::default()
    }
}

/// Turns the machine off: ACPI soft-off (S5) when the DSDT gave its sleep types, else
/// (or if the machine is still running a second later) QEMU's debug-exit device with
/// [`ExitCode::Success`], else a halted CPU.
pub fn off() -> ! {
    log::info!("power: off");
    crate::event::emit(crate::event::Event::PowerOff);
    cpu::disable_interrupts();
    match HARDWARE.get().and_then(|hw| Some((hw, hw.s5?))) {
        Some((hw, s5)) => {
            // ACPI: write SLP_TYP first, then SLP_TYP with SLP_EN, to both blocks.
            let select = |port: IoPort<u16>, typ| {
                let value = pm1::sleep_type_selected(port.read(), typ);
                port.write(value);
                (port, value)
            };
            let a = select(IoPort::new(hw.pm1a_control), s5.a);
            let b = hw.pm1b_control.map(|p| select(IoPort::new(p), s5.b));
            for (port, value) in core::iter::once(a).chain(b) {
                port.write(value | pm1::SLP_EN);
            }
            let deadline = clock::now() + SOFT_OFF_WAIT;
            while clock::now() < deadline {
                core::hint::spin_loop();
            }
            log::error!("power: still running after ACPI soft-off; trying the debug-exit device");
        }
        None => log::warn!(
            "power: no ACPI soft-off (no \\_S5_ sleep type); trying the debug-exit device"
        ),
    }
    cpu::exit(ExitCode::Success)
}

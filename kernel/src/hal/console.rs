//! The serial ports: the console on COM1 (QEMU's first `-serial`), text for people, and
//! the event channel on COM2 (QEMU's second `-serial`), the structured events for
//! programs (`crate::event`). Both are 16550 UARTs at their legacy I/O ports; this module
//! is the only code that drives them.
//!
//! A port that does not answer at boot (no second `-serial`, say) is left alone and its
//! output dropped: [`has_event_channel`] says whether events have somewhere to go.

use core::fmt;

use uart_16550::{backend::PioBackend, BaudRate, Config, Uart16550};

use crate::sync::IrqLock;

/// The console's port.
const COM1: u16 = 0x3f8;
/// The event channel's port.
const COM2: u16 = 0x2f8;

static UART: IrqLock<Option<Uart16550<PioBackend>>> = IrqLock::new(None);
static EVENTS: IrqLock<Option<Uart16550<PioBackend>>> = IrqLock::new(None);

/// The UART at `port`, programmed for 115200 baud, 8N1; `None` if none answers there.
fn open(port: u16) -> Option<Uart16550<PioBackend>> {
    // SAFETY: `port` is COM1 or COM2, legacy UARTs no one else drives; programming them
    // (or probing an absent one's scratch register) has no memory effects.
    let mut uart = unsafe { Uart16550::new_port(port) }.ok()?;
    let config = Config {
        baud_rate: BaudRate::Baud115200,
        ..Config::default()
    };
    uart.init(config).ok()?;
    Some(uart)
}

/// Initialises COM1 (the console) and COM2 (the event channel), those that answer.
/// Output before this is dropped.
pub fn init() {
    if let Some(uart) = open(COM1) {
        UART.lock(|u| *u = Some(uart));
    }
    if let Some(uart) = open(COM2) {
        EVENTS.lock(|u| *u = Some(uart));
    }
}

fn send(uart: &mut Uart16550<PioBackend>, s: &str) {
    for chunk in s.split_inclusive('\n') {
        match chunk.strip_suffix('\n') {
            Some(line) => {
                uart.send_bytes_exact(line.as_bytes());
                uart.send_bytes_exact(b"\r\n");
            }
            None => uart.send_bytes_exact(chunk.as_bytes()),
        }
    }
}

/// Writes `s` (`\n` becomes `\r\n`), holding the console for the whole string so lines
/// from interrupt handlers do not interleave with it.
pub fn write_str(s: &str) {
    UART.lock(|u| {
        if let Some(uart) = u {
            send(uart, s);
        }
    });
}

/// Formats `args` onto `uart` with [`send`].
fn send_fmt(uart: &mut Uart16550<PioBackend>, args: fmt::Arguments<'_>) {
    struct W<'a>(&'a mut Uart16550<PioBackend>);
    impl fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            send(self.0, s);
            Ok(())
        }
    }
    let _ = fmt::write(&mut W(uart), args);
}

/// Writes formatted text as one unit (see [`write_str`]).
pub fn write_fmt(args: fmt::Arguments<'_>) {
    UART.lock(|u| {
        if let Some(uart) = u {
            send_fmt(uart, args);
        }
    });
}

/// Whether the event channel (COM2) answered at boot.
pub fn has_event_channel() -> bool {
    EVENTS.lock(|u| u.is_some())
}

/// Writes formatted text on the event channel as one unit (lines from different CPUs
/// never mix; `\n` becomes `\r\n`, as on the console); `false` if there is no event
/// channel (nothing was written).
pub fn write_event_fmt(args: fmt::Arguments<'_>) -> bool {
    EVENTS.lock(|u| match u {
        Some(uart) => {
            send_fmt(uart, args);
            true
        }
        None => false,
    })
}

/// A writer for fault reports that works even when the console lock is held (say, by the
/// code that faulted): it drives COM1 directly, without the lock.
#[derive(Debug)]
pub struct EmergencyConsole(Uart16550<PioBackend>);

impl EmergencyConsole {
    /// Takes over COM1 for a report. Output may interleave with a line that was being
    /// written when the fault hit; nothing else can go wrong.
    pub fn take() -> Option<EmergencyConsole> {
        // SAFETY: as in `open`; a second handle on the same UART can only interleave bytes.
        unsafe { Uart16550::new_port(COM1) }
            .ok()
            .map(EmergencyConsole)
    }
}

impl fmt::Write for EmergencyConsole {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        send(&mut self.0, s);
        Ok(())
    }
}

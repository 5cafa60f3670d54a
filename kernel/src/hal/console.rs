//! The serial console on COM1 (`-serial stdio` in QEMU).

use core::fmt;

use uart_16550::{backend::PioBackend, BaudRate, Config, Uart16550};

use crate::sync::IrqLock;

const COM1: u16 = 0x3f8;

static UART: IrqLock<Option<Uart16550<PioBackend>>> = IrqLock::new(None);

/// Initialises COM1. Output before this is dropped.
pub fn init() {
    // SAFETY: 0x3f8 is COM1, a legacy UART no one else drives; programming it has no
    // memory effects.
    let Ok(mut uart) = (unsafe { Uart16550::new_port(COM1) }) else {
        return;
    };
    let config = Config {
        baud_rate: BaudRate::Baud115200,
        ..Config::default()
    };
    if uart.init(config).is_ok() {
        UART.lock(|u| *u = Some(uart));
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

/// Writes formatted text as one unit (see [`write_str`]).
pub fn write_fmt(args: fmt::Arguments<'_>) {
    struct W<'a>(&'a mut Uart16550<PioBackend>);
    impl fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            send(self.0, s);
            Ok(())
        }
    }
    UART.lock(|u| {
        if let Some(uart) = u {
            let _ = fmt::write(&mut W(uart), args);
        }
    });
}

/// A writer for fault reports that works even when the console lock is held (say, by the
/// code that faulted): it drives COM1 directly, without the lock.
#[derive(Debug)]
pub struct EmergencyConsole(Uart16550<PioBackend>);

impl EmergencyConsole {
    /// Takes over COM1 for a report. Output may interleave with a line that was being
    /// written when the fault hit; nothing else can go wrong.
    pub fn take() -> Option<EmergencyConsole> {
        // SAFETY: as in `init`; a second handle on the same UART can only interleave bytes.
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

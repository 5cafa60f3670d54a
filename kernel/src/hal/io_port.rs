//! x86 port I/O.
//!
//! Port I/O is treated as safe: the kernel addresses only legacy devices it owns (COM1 and COM2,
//! the PIT and PICs, PCI configuration ports, QEMU's debug-exit port, and the ACPI fixed
//! hardware the FADT names: the PM1 and GPE0 registers and the SMI command port), none
//! of which can write to memory. Devices that can (bus masters) are only set up through PCI, whose
//! handles live in `pci::device`.

use core::marker::PhantomData;

use x86_64::instructions::port::{Port, PortRead, PortWrite};

/// One I/O port of width `T` (`u8`, `u16` or `u32`).
#[derive(Debug)]
pub struct IoPort<T> {
    port: u16,
    _width: PhantomData<T>,
}

impl<T> Clone for IoPort<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for IoPort<T> {}

impl<T: PortRead + PortWrite> IoPort<T> {
    /// The port at `port`.
    pub const fn new(port: u16) -> Self {
        IoPort {
            port,
            _width: PhantomData,
        }
    }

    /// Reads the port.
    pub fn read(&self) -> T {
        // SAFETY: see the module documentation: reading our legacy ports has no memory
        // effects.
        unsafe { Port::new(self.port).read() }
    }

    /// Writes the port.
    pub fn write(&self, value: T) {
        // SAFETY: see the module documentation.
        unsafe { Port::new(self.port).write(value) }
    }
}

//! Configuration-space access and the type-0/type-1 header registers we use.

use super::PciAddress;

/// Reads and writes configuration space. The kernel implements it with ports 0xCF8/0xCFC
/// (`pci::port_io`); host tests with an in-memory fake.
pub trait ConfigAccess {
    /// Reads the dword at `offset` (dword-aligned, < 256) of `addr`'s configuration space.
    /// An absent function reads as all ones.
    fn read32(&self, addr: PciAddress, offset: u16) -> u32;
    /// Writes the dword at `offset` (dword-aligned, < 256).
    fn write32(&self, addr: PciAddress, offset: u16, value: u32);

    /// Reads the 16-bit register at `offset` (2-byte aligned).
    fn read16(&self, addr: PciAddress, offset: u16) -> u16 {
        (self.read32(addr, offset & !3) >> ((offset & 2) * 8)) as u16
    }

    /// Reads the byte at `offset`.
    fn read8(&self, addr: PciAddress, offset: u16) -> u8 {
        (self.read32(addr, offset & !3) >> ((offset & 3) * 8)) as u8
    }

    /// Writes the 16-bit register at `offset` (2-byte aligned) by read-modify-write of its
    /// dword. The status register's write-one-to-clear bits are written as zero (no effect)
    /// when the command register beside it is written.
    fn write16(&self, addr: PciAddress, offset: u16, value: u16) {
        let aligned = offset & !3;
        let shift = (offset & 2) * 8;
        let mut old = self.read32(addr, aligned);
        if aligned == regs::COMMAND {
            old &= 0x0000_ffff;
        }
        let new = (old & !(0xffff << shift)) | (u32::from(value) << shift);
        self.write32(addr, aligned, new);
    }
}

/// Register offsets and bits.
pub mod regs {
    /// Vendor ID (16 bits; 0xffff: no function).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device ID (16 bits).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command register (16 bits).
    pub const COMMAND: u16 = 0x04;
    /// Status register (16 bits).
    pub const STATUS: u16 = 0x06;
    /// Revision ID (8 bits).
    pub const REVISION: u16 = 0x08;
    /// Programming interface (8 bits).
    pub const PROG_IF: u16 = 0x09;
    /// Subclass (8 bits).
    pub const SUBCLASS: u16 = 0x0a;
    /// Base class (8 bits).
    pub const CLASS: u16 = 0x0b;
    /// Header type (8 bits; bit 7: multi-function device).
    pub const HEADER_TYPE: u16 = 0x0e;
    /// First base address register.
    pub const BAR0: u16 = 0x10;
    /// Secondary bus number of a PCI-to-PCI bridge (type-1 header).
    pub const SECONDARY_BUS: u16 = 0x19;
    /// Capabilities pointer (8 bits).
    pub const CAPABILITIES: u16 = 0x34;
    /// Interrupt pin (8 bits; 0: none, 1-4: INTA-INTD).
    pub const INTERRUPT_PIN: u16 = 0x3d;

    /// Command: respond to I/O space accesses.
    pub const CMD_IO: u16 = 1 << 0;
    /// Command: respond to memory space accesses.
    pub const CMD_MEMORY: u16 = 1 << 1;
    /// Command: may master the bus (DMA, MSI writes).
    pub const CMD_BUS_MASTER: u16 = 1 << 2;
    /// Command: legacy INTx interrupts disabled.
    pub const CMD_INTX_DISABLE: u16 = 1 << 10;
    /// Status: a capabilities list exists.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
}

//! PCI devices for drivers: BARs mapped as MMIO, bus mastering, MSI and MSI-X.
//!
//! ```ignore
//! let dev = pci::device::find(0x1b36, 0x0010).next().unwrap(); // an NVMe controller
//! let regs = dev.map_bar(0)?;                                   // uncached MMIO
//! let dma = DmaDevice::new(dev)?;                               // its DMA memory
//! dma.start();                                                  // DMA and MSI writes
//! let event = Arc::new(IrqEvent::new());
//! let e = event.clone();
//! let irq = irq::allocate(move || e.signal())?;                 // vector + handler
//! let msix = dev.msix()?;
//! msix.set(0, &irq);                                            // entry 0 -> vector
//! msix.enable();
//! event.wait().await;                                           // in a task
//! ```

use alloc::vec::Vec;
use core::fmt;

use super::bar::{read_bar, Bar, BarError};
use super::caps::{self, msix_ctl, MsixLayout, CAP_MSI, CAP_MSIX, MSIX_ENTRY_SIZE};
use super::config::{regs, ConfigAccess};
use super::port_io::PortIo;
use super::{enumerate, MsiMessage, PciAddress, PciFunction};
use crate::hal::mmio::MmioRegion;
use crate::hal::paging::{self, MapError};
use crate::irq::IrqHandle;

static DEVICES: spin::Once<Vec<PciFunction>> = spin::Once::new();

/// Enumerates the bus (once) and returns every function found.
pub fn scan() -> &'static [PciFunction] {
    DEVICES.call_once(|| enumerate(&PortIo))
}

/// Every function found by [`scan`] (empty before it).
pub fn functions() -> &'static [PciFunction] {
    DEVICES.get().map_or(&[], |v| v.as_slice())
}

/// The devices with this vendor and device id, in PCI order.
pub fn find(vendor: u16, device: u16) -> impl Iterator<Item = PciDevice> {
    functions()
        .iter()
        .filter(move |f| f.vendor == vendor && f.device == device)
        .map(|f| PciDevice { info: *f })
}

/// The device at `addr`, if there is one.
pub fn at(addr: PciAddress) -> Option<PciDevice> {
    functions()
        .iter()
        .find(|f| f.addr == addr)
        .map(|f| PciDevice { info: *f })
}

/// Why a BAR could not be mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapBarError {
    /// The BAR could not be read.
    Bar(BarError),
    /// It is an I/O-port BAR.
    NotMemory,
    /// The firmware left it unassigned (address 0).
    Unassigned,
    /// The page tables refused.
    Map(MapError),
}

/// Why MSI or MSI-X could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiError {
    /// The device has no such capability.
    NotSupported,
    /// The MSI-X table's BAR could not be mapped.
    Table(MapBarError),
}

/// A handle on one PCI function.
#[derive(Clone, Copy)]
pub struct PciDevice {
    info: PciFunction,
}

impl fmt::Debug for PciDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PciDevice({})", self.info)
    }
}

impl PciDevice {
    /// Identity and class.
    pub fn info(&self) -> &PciFunction {
        &self.info
    }

    /// The address.
    pub fn address(&self) -> PciAddress {
        self.info.addr
    }

    /// Reads a configuration dword.
    pub fn read32(&self, offset: u16) -> u32 {
        PortIo.read32(self.info.addr, offset)
    }

    /// Writes a configuration dword.
    pub fn write32(&self, offset: u16, value: u32) {
        PortIo.write32(self.info.addr, offset, value)
    }

    /// Reads a configuration word.
    pub fn read16(&self, offset: u16) -> u16 {
        PortIo.read16(self.info.addr, offset)
    }

    /// Reads a configuration byte.
    pub fn read8(&self, offset: u16) -> u8 {
        PortIo.read8(self.info.addr, offset)
    }

    /// Decodes and sizes BAR `index`.
    pub fn bar(&self, index: u8) -> Result<Bar, BarError> {
        read_bar(&PortIo, self.info.addr, index, self.info.bar_count())
    }

    /// Every implemented BAR, with its index.
    pub fn bars(&self) -> impl Iterator<Item = (u8, Bar)> + '_ {
        (0..self.info.bar_count()).filter_map(|i| self.bar(i).ok().map(|b| (i, b)))
    }

    /// Maps memory BAR `index` uncached and enables memory decoding.
    pub fn map_bar(&self, index: u8) -> Result<MmioRegion, MapBarError> {
        match self.bar(index).map_err(MapBarError::Bar)? {
            Bar::Io { .. } => Err(MapBarError::NotMemory),
            Bar::Memory { addr: 0, .. } => Err(MapBarError::Unassigned),
            Bar::Memory { addr, size, .. } => {
                let region = paging::map_mmio(addr, size).map_err(MapBarError::Map)?;
                self.set_command(regs::CMD_MEMORY, true);
                Ok(region)
            }
        }
    }

    fn set_command(&self, bits: u16, on: bool) {
        let cmd = PortIo.read16(self.info.addr, regs::COMMAND);
        let new = if on { cmd | bits } else { cmd & !bits };
        if new != cmd {
            PortIo.write16(self.info.addr, regs::COMMAND, new);
        }
    }

    /// Lets the device master the bus (DMA, and the memory writes that deliver MSIs) or
    /// stops it. Only `hal::dma::DmaDevice` calls this, so that it always knows whether
    /// the device can reach memory; drivers go through it. The command register is read
    /// back, so the change has reached the device when this returns.
    pub(crate) fn set_bus_master(&self, on: bool) {
        self.set_command(regs::CMD_BUS_MASTER, on);
        let _ = PortIo.read16(self.info.addr, regs::COMMAND);
    }

    /// `(id, offset)` of each capability.
    pub fn capabilities(&self) -> impl Iterator<Item = (u8, u16)> {
        caps::capabilities(&PortIo, self.info.addr)
    }

    /// Points the device's MSI capability (single message) at `irq`'s vector and enables
    /// it; legacy INTx is disabled. An MSI is a memory write by the device, so it arrives
    /// only while the device masters the bus (`hal::dma::DmaDevice::start`).
    pub fn enable_msi(&self, irq: &IrqHandle) -> Result<(), MsiError> {
        let cap = caps::find_capability(&PortIo, self.info.addr, CAP_MSI)
            .ok_or(MsiError::NotSupported)?;
        caps::enable_msi(&PortIo, self.info.addr, cap, irq.msi_message());
        Ok(())
    }

    /// The device's MSI-X table, mapped, with every entry masked and MSI-X still disabled.
    pub fn msix(&self) -> Result<MsixTable, MsiError> {
        let cap = caps::find_capability(&PortIo, self.info.addr, CAP_MSIX)
            .ok_or(MsiError::NotSupported)?;
        let layout = MsixLayout::read(&PortIo, self.info.addr, cap);
        let bar = self.map_bar(layout.table_bar).map_err(MsiError::Table)?;
        let table = bar.subregion(
            layout.table_offset as usize,
            usize::from(layout.entries) * MSIX_ENTRY_SIZE as usize,
        );
        let t = MsixTable {
            device: *self,
            layout,
            table,
        };
        for i in 0..layout.entries {
            t.mask(i, true);
        }
        Ok(t)
    }
}

/// A device's MSI-X vector table.
#[derive(Debug)]
pub struct MsixTable {
    device: PciDevice,
    layout: MsixLayout,
    table: MmioRegion,
}

impl MsixTable {
    /// Number of entries.
    pub fn len(&self) -> u16 {
        self.layout.entries
    }

    /// Never true: a table has at least one entry.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Points `entry` at `irq`'s vector on this CPU and unmasks it.
    ///
    /// # Panics
    /// If `entry` is out of range.
    pub fn set(&self, entry: u16, irq: &IrqHandle) {
        self.write(entry, irq.msi_message());
    }

    /// Points `entry` at `irq`'s vector on the CPU with local APIC id `apic_id` (where
    /// the work the interrupt announces is done) and unmasks it.
    ///
    /// # Panics
    /// If `entry` is out of range.
    pub fn set_target(&self, entry: u16, irq: &IrqHandle, apic_id: u8) {
        self.write(entry, irq.msi_message_to(apic_id));
    }

    fn write(&self, entry: u16, msg: MsiMessage) {
        assert!(
            entry < self.layout.entries,
            "MSI-X entry {entry} out of range"
        );
        let base = usize::from(entry) * MSIX_ENTRY_SIZE as usize;
        self.mask(entry, true);
        self.table.write32(base, msg.address as u32);
        self.table.write32(base + 4, (msg.address >> 32) as u32);
        self.table.write32(base + 8, msg.data);
        self.mask(entry, false);
    }

    /// Masks or unmasks `entry`.
    pub fn mask(&self, entry: u16, masked: bool) {
        let ctl = usize::from(entry) * MSIX_ENTRY_SIZE as usize + 12;
        self.table.write32(ctl, u32::from(masked));
    }

    /// Enables MSI-X, clears the function mask and disables INTx. The messages arrive
    /// only while the device masters the bus (`hal::dma::DmaDevice::start`).
    pub fn enable(&self) {
        let addr = self.device.info.addr;
        self.device.set_command(regs::CMD_INTX_DISABLE, true);
        let ctl = PortIo.read16(addr, self.layout.cap + 2);
        let ctl = (ctl | msix_ctl::ENABLE) & !msix_ctl::FUNCTION_MASK;
        PortIo.write16(addr, self.layout.cap + 2, ctl);
    }

    /// Disables MSI-X.
    pub fn disable(&self) {
        let addr = self.device.info.addr;
        let ctl = PortIo.read16(addr, self.layout.cap + 2);
        PortIo.write16(addr, self.layout.cap + 2, ctl & !msix_ctl::ENABLE);
    }
}

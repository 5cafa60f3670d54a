//! `virtio-drivers`' modern PCI transport over the kernel's PCI configuration access.

use virtio_drivers::transport::pci::bus::{ConfigurationAccess, DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};

use super::virtio::VirtioHal;
use crate::pci::config::ConfigAccess;
use crate::pci::device::PciDevice;
use crate::pci::port_io::PortIo;
use crate::pci::PciAddress;

/// Configuration space of PCI segment 0 through ports 0xCF8/0xCFC, as `virtio-drivers`
/// wants it.
#[derive(Debug)]
struct PortCam;

fn address(f: DeviceFunction) -> PciAddress {
    PciAddress::new(0, f.bus, f.device, f.function)
}

impl ConfigurationAccess for PortCam {
    fn read_word(&self, f: DeviceFunction, offset: u8) -> u32 {
        PortIo.read32(address(f), u16::from(offset))
    }

    fn write_word(&mut self, f: DeviceFunction, offset: u8, data: u32) {
        PortIo.write32(address(f), u16::from(offset), data)
    }

    unsafe fn unsafe_clone(&self) -> Self {
        // Every access is a locked address/data pair on the same ports: clones are safe.
        PortCam
    }
}

/// The modern (virtio 1.0) PCI transport of `dev`, with its BARs mapped uncached.
pub fn transport(dev: &PciDevice) -> Result<PciTransport, VirtioPciError> {
    let a = dev.address();
    let mut root = PciRoot::new(PortCam);
    let function = DeviceFunction {
        bus: a.bus,
        device: a.device,
        function: a.function,
    };
    PciTransport::new::<VirtioHal, _>(&mut root, function)
}

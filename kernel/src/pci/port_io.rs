//! Configuration access mechanism #1: ports 0xCF8 (address) and 0xCFC (data).

use super::config::ConfigAccess;
use super::PciAddress;
use crate::hal::io_port::IoPort;
use crate::sync::IrqLock;

const ADDRESS: IoPort<u32> = IoPort::new(0xcf8);
const DATA: IoPort<u32> = IoPort::new(0xcfc);

/// The address/data pair must not be split by another access (an interrupt handler's,
/// say), so every access holds this lock.
static LOCK: IrqLock<()> = IrqLock::new(());

/// Configuration space through ports 0xCF8/0xCFC: segment 0, 256 bytes per function.
#[derive(Clone, Copy, Debug, Default)]
pub struct PortIo;

fn address(addr: PciAddress, offset: u16) -> u32 {
    assert!(addr.segment == 0, "port I/O reaches only PCI segment 0");
    assert!(
        offset < 256 && offset.is_multiple_of(4),
        "bad config offset {offset:#x}"
    );
    0x8000_0000
        | (u32::from(addr.bus) << 16)
        | (u32::from(addr.device) << 11)
        | (u32::from(addr.function) << 8)
        | u32::from(offset)
}

impl ConfigAccess for PortIo {
    fn read32(&self, addr: PciAddress, offset: u16) -> u32 {
        let a = address(addr, offset);
        LOCK.lock(|_| {
            ADDRESS.write(a);
            DATA.read()
        })
    }

    fn write32(&self, addr: PciAddress, offset: u16, value: u32) {
        let a = address(addr, offset);
        LOCK.lock(|_| {
            ADDRESS.write(a);
            DATA.write(value);
        });
    }
}

//! Finding every PCI function.

use alloc::vec::Vec;
use core::fmt;

use super::config::{regs, ConfigAccess};
use super::{ids, PciAddress};

/// The identity of one PCI function, read from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Where it is.
    pub addr: PciAddress,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Base class.
    pub class: u8,
    /// Subclass.
    pub subclass: u8,
    /// Programming interface.
    pub prog_if: u8,
    /// Revision.
    pub revision: u8,
    /// Header layout: 0 (device), 1 (PCI-to-PCI bridge), 2 (CardBus bridge).
    pub header_type: u8,
}

impl PciFunction {
    /// Reads the header of `addr`; `None` if no function is there.
    pub fn read(access: &impl ConfigAccess, addr: PciAddress) -> Option<PciFunction> {
        let id = access.read32(addr, regs::VENDOR_ID);
        if id as u16 == 0xffff {
            return None;
        }
        let class = access.read32(addr, regs::REVISION);
        Some(PciFunction {
            addr,
            vendor: id as u16,
            device: (id >> 16) as u16,
            class: (class >> 24) as u8,
            subclass: (class >> 16) as u8,
            prog_if: (class >> 8) as u8,
            revision: class as u8,
            header_type: access.read8(addr, regs::HEADER_TYPE) & 0x7f,
        })
    }

    /// How many BAR registers the header has.
    pub fn bar_count(&self) -> u8 {
        match self.header_type {
            0 => 6,
            1 => 2,
            _ => 0,
        }
    }

    /// A name for well-known devices.
    pub fn name(&self) -> Option<&'static str> {
        ids::device_name(self.vendor, self.device)
    }

    /// A PCI-to-PCI bridge (we scan behind it).
    pub fn is_bridge(&self) -> bool {
        self.class == 0x06 && self.subclass == 0x04 && self.header_type == 1
    }
}

/// `BB:DD.F vvvv:dddd class cc.ss name` (the name is the device's if known, else the
/// class's).
impl fmt::Display for PciFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:04x}:{:04x} class {:02x}.{:02x} {}",
            self.addr,
            self.vendor,
            self.device,
            self.class,
            self.subclass,
            self.name()
                .unwrap_or_else(|| ids::class_name(self.class, self.subclass))
        )
    }
}

/// Every function reachable from bus 0 of segment 0, in bus/device/function order of
/// discovery (depth-first through bridges). Each bus is scanned once, so a misprogrammed
/// bridge cannot make us loop.
pub fn enumerate(access: &impl ConfigAccess) -> Vec<PciFunction> {
    let mut found = Vec::new();
    let mut scanned = [false; 256];
    scan_bus(access, 0, &mut scanned, &mut found);
    found
}

fn scan_bus(
    access: &impl ConfigAccess,
    bus: u8,
    scanned: &mut [bool; 256],
    found: &mut Vec<PciFunction>,
) {
    if core::mem::replace(&mut scanned[usize::from(bus)], true) {
        return;
    }
    for device in 0..32 {
        let Some(first) = PciFunction::read(access, PciAddress::new(0, bus, device, 0)) else {
            continue;
        };
        let multi = access.read8(first.addr, regs::HEADER_TYPE) & 0x80 != 0;
        let functions = if multi { 8 } else { 1 };
        for function in 0..functions {
            let addr = PciAddress::new(0, bus, device, function);
            let Some(f) = PciFunction::read(access, addr) else {
                continue;
            };
            found.push(f);
            if f.is_bridge() {
                let secondary = access.read8(addr, regs::SECONDARY_BUS);
                if secondary != 0 {
                    scan_bus(access, secondary, scanned, found);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{FakeConfig, FakeFunction};
    use super::*;
    use std::string::ToString;

    #[test]
    fn finds_functions_behind_bridges_and_in_multifunction_devices() {
        let a = |b, d, f| PciAddress::new(0, b, d, f);
        let mut bridge = FakeFunction::new(0x1b36, 0x0001, 0x06, 0x04).header_type(1);
        bridge.regs[6] = 0x0000_0200; // secondary bus 2
        let mut looping = FakeFunction::new(0x1b36, 0x0001, 0x06, 0x04).header_type(1);
        looping.regs[6] = 0x0000_0000; // secondary bus 0: already scanned
        let cfg = FakeConfig::with(&[
            (a(0, 0, 0), FakeFunction::new(0x8086, 0x1237, 0x06, 0x00)),
            (
                a(0, 1, 0),
                FakeFunction::new(0x8086, 0x7000, 0x06, 0x01).header_type(0x80),
            ),
            (a(0, 1, 3), FakeFunction::new(0x8086, 0x7113, 0x06, 0x80)),
            // Function 5 of a single-function device is not looked at.
            (a(0, 0, 5), FakeFunction::new(0xdead, 0xbeef, 0, 0)),
            (a(0, 3, 0), bridge),
            (a(2, 0, 0), FakeFunction::new(0x1b36, 0x0010, 0x01, 0x08)),
            (a(2, 1, 0), looping),
        ]);
        let found = enumerate(&cfg);
        let addrs: std::vec::Vec<_> = found.iter().map(|f| f.addr.to_string()).collect();
        assert_eq!(
            addrs,
            ["00:00.0", "00:01.0", "00:01.3", "00:03.0", "02:00.0", "02:01.0"]
        );
        assert_eq!(
            found[4].to_string(),
            "02:00.0 1b36:0010 class 01.08 NVMe controller (QEMU)"
        );
        assert_eq!(
            found[2].to_string(),
            "00:01.3 8086:7113 class 06.80 PIIX4 ACPI"
        );
    }
}

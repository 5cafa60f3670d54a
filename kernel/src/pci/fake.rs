//! An in-memory configuration space for host tests.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::config::ConfigAccess;
use super::PciAddress;

/// One function's 256-byte configuration space, with BARs that size like hardware.
#[derive(Clone, Debug)]
pub struct FakeFunction {
    /// The 64 dwords.
    pub regs: [u32; 64],
    /// Per BAR register: the writable address bits (0: unimplemented).
    bar_masks: [u32; 6],
}

impl FakeFunction {
    /// A type-0 function with no BARs and no capabilities.
    pub fn new(vendor: u16, device: u16, class: u8, subclass: u8) -> FakeFunction {
        let mut regs = [0u32; 64];
        regs[0] = u32::from(vendor) | (u32::from(device) << 16);
        regs[2] = (u32::from(class) << 24) | (u32::from(subclass) << 16);
        FakeFunction {
            regs,
            bar_masks: [0; 6],
        }
    }

    /// Sets the header type byte (bit 7: multi-function; low bits: layout).
    pub fn header_type(mut self, ty: u8) -> Self {
        self.regs[3] = (self.regs[3] & !0x00ff_0000) | (u32::from(ty) << 16);
        self
    }

    /// A 32-bit BAR (memory or I/O by `flags` bit 0).
    pub fn set_bar(&mut self, i: usize, addr: u32, size: u32, flags: u32) {
        self.regs[4 + i] = addr | flags;
        self.bar_masks[i] = !(size - 1);
    }

    /// A 64-bit memory BAR in registers `i` and `i + 1`.
    pub fn set_bar64(&mut self, i: usize, addr: u64, size: u64, flags: u32) {
        self.regs[4 + i] = (addr as u32) | flags | 0x4;
        self.regs[5 + i] = (addr >> 32) as u32;
        let mask = !(size - 1);
        self.bar_masks[i] = mask as u32;
        self.bar_masks[i + 1] = (mask >> 32) as u32;
    }

    /// Writes a capability with `body` (dwords after the id/next byte pair are the
    /// caller's) at `offset`, linking it at the head of the list.
    pub fn add_capability(&mut self, offset: u8, id: u8, first_dword_high: u16, body: &[u32]) {
        let next = (self.regs[0x34 / 4] & 0xff) as u8;
        self.regs[usize::from(offset) / 4] =
            u32::from(id) | (u32::from(next) << 8) | (u32::from(first_dword_high) << 16);
        for (k, v) in body.iter().enumerate() {
            self.regs[usize::from(offset) / 4 + 1 + k] = *v;
        }
        self.regs[0x34 / 4] = u32::from(offset);
        self.regs[1] |= 1 << 20; // status: capabilities list
    }
}

/// A bus full of [`FakeFunction`]s.
#[derive(Debug, Default)]
pub struct FakeConfig {
    functions: RefCell<BTreeMap<PciAddress, FakeFunction>>,
}

impl FakeConfig {
    /// A configuration space with these functions.
    pub fn with(functions: &[(PciAddress, FakeFunction)]) -> FakeConfig {
        FakeConfig {
            functions: RefCell::new(functions.iter().cloned().collect()),
        }
    }

    /// A copy of one function's registers.
    pub fn function(&self, addr: PciAddress) -> FakeFunction {
        self.functions.borrow()[&addr].clone()
    }
}

impl ConfigAccess for FakeConfig {
    fn read32(&self, addr: PciAddress, offset: u16) -> u32 {
        assert_eq!(offset % 4, 0);
        self.functions
            .borrow()
            .get(&addr)
            .map_or(u32::MAX, |f| f.regs[usize::from(offset / 4)])
    }

    fn write32(&self, addr: PciAddress, offset: u16, value: u32) {
        assert_eq!(offset % 4, 0);
        let mut fns = self.functions.borrow_mut();
        let Some(f) = fns.get_mut(&addr) else { return };
        let i = usize::from(offset / 4);
        if (4..10).contains(&i) {
            let mask = f.bar_masks[i - 4];
            let flags = if f.regs[i] & 1 == 1 {
                f.regs[i] & 0x3
            } else {
                f.regs[i] & 0xf
            };
            // The upper half of a 64-bit BAR has no flag bits.
            let upper = i > 4 && f.regs[i - 1] & 0x7 == 0x4;
            f.regs[i] = if mask == 0 {
                0
            } else if upper {
                value & mask
            } else {
                (value & mask) | flags
            };
        } else {
            f.regs[i] = value;
        }
    }
}

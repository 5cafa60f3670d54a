//! The capability list, and the MSI and MSI-X capabilities' layout.

use super::config::{regs, ConfigAccess};
use super::PciAddress;

/// Capability ID of MSI.
pub const CAP_MSI: u8 = 0x05;
/// Capability ID of vendor-specific capabilities (virtio uses these).
pub const CAP_VENDOR: u8 = 0x09;
/// Capability ID of PCI Express.
pub const CAP_PCIE: u8 = 0x10;
/// Capability ID of MSI-X.
pub const CAP_MSIX: u8 = 0x11;

/// At most this many capabilities are followed, so a looped list cannot hang us.
const MAX_CAPS: usize = 48;

/// `(id, offset)` of each capability of `addr`, in list order.
pub fn capabilities<'a>(
    access: &'a impl ConfigAccess,
    addr: PciAddress,
) -> impl Iterator<Item = (u8, u16)> + 'a {
    let has_list = access.read16(addr, regs::STATUS) & regs::STATUS_CAP_LIST != 0;
    let mut next = if has_list {
        u16::from(access.read8(addr, regs::CAPABILITIES) & !3)
    } else {
        0
    };
    let mut seen = 0;
    core::iter::from_fn(move || {
        if next < 0x40 || seen == MAX_CAPS {
            return None;
        }
        seen += 1;
        let offset = next;
        let id = access.read8(addr, offset);
        next = u16::from(access.read8(addr, offset + 1) & !3);
        Some((id, offset))
    })
}

/// The offset of the first capability with this id.
pub fn find_capability(access: &impl ConfigAccess, addr: PciAddress, id: u8) -> Option<u16> {
    capabilities(access, addr)
        .find(|(i, _)| *i == id)
        .map(|(_, o)| o)
}

/// An MSI message: the address/data pair a device writes to interrupt a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsiMessage {
    /// Where the device writes (the local APIC's MSI window).
    pub address: u64,
    /// What it writes.
    pub data: u32,
}

impl MsiMessage {
    /// An edge-triggered, fixed-delivery interrupt on `vector` for the CPU whose local APIC
    /// id is `apic_id` (xAPIC physical destination mode).
    pub fn fixed(apic_id: u8, vector: u8) -> MsiMessage {
        MsiMessage {
            address: 0xfee0_0000 | (u64::from(apic_id) << 12),
            data: u32::from(vector),
        }
    }
}

/// MSI message control register bits.
mod msi_ctl {
    pub const ENABLE: u16 = 1 << 0;
    pub const MULTIPLE_ENABLE: u16 = 0b111 << 4;
    pub const ADDR_64: u16 = 1 << 7;
}

/// Programs the MSI capability at `cap` to send `msg` (one vector), enables it, and
/// disables legacy INTx. Bus mastering must be enabled for the device to send it.
pub fn enable_msi(access: &impl ConfigAccess, addr: PciAddress, cap: u16, msg: MsiMessage) {
    let control = access.read16(addr, cap + 2);
    access.write16(addr, cap + 2, control & !msi_ctl::ENABLE);
    access.write32(addr, cap + 4, msg.address as u32);
    let data_offset = if control & msi_ctl::ADDR_64 != 0 {
        access.write32(addr, cap + 8, (msg.address >> 32) as u32);
        cap + 12
    } else {
        cap + 8
    };
    access.write16(addr, data_offset, msg.data as u16);
    let control = (control & !msi_ctl::MULTIPLE_ENABLE) | msi_ctl::ENABLE;
    access.write16(addr, cap + 2, control);
    let command = access.read16(addr, regs::COMMAND);
    access.write16(addr, regs::COMMAND, command | regs::CMD_INTX_DISABLE);
}

/// Where an MSI-X capability keeps its vector table and pending-bit array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixLayout {
    /// Capability offset in configuration space.
    pub cap: u16,
    /// Number of table entries.
    pub entries: u16,
    /// BAR index holding the table.
    pub table_bar: u8,
    /// Offset of the table within that BAR.
    pub table_offset: u32,
    /// BAR index holding the pending-bit array.
    pub pba_bar: u8,
    /// Offset of the pending-bit array within that BAR.
    pub pba_offset: u32,
}

/// Bytes per MSI-X table entry.
pub const MSIX_ENTRY_SIZE: u32 = 16;

/// MSI-X message control bits.
pub mod msix_ctl {
    /// All vectors masked.
    pub const FUNCTION_MASK: u16 = 1 << 14;
    /// MSI-X enabled.
    pub const ENABLE: u16 = 1 << 15;
}

impl MsixLayout {
    /// Reads the MSI-X capability at `cap`.
    pub fn read(access: &impl ConfigAccess, addr: PciAddress, cap: u16) -> MsixLayout {
        let control = access.read16(addr, cap + 2);
        let table = access.read32(addr, cap + 4);
        let pba = access.read32(addr, cap + 8);
        MsixLayout {
            cap,
            entries: (control & 0x7ff) + 1,
            table_bar: (table & 7) as u8,
            table_offset: table & !7,
            pba_bar: (pba & 7) as u8,
            pba_offset: pba & !7,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{FakeConfig, FakeFunction};
    use super::*;

    fn edu_like() -> (FakeConfig, PciAddress) {
        let addr = PciAddress::new(0, 0, 5, 0);
        let mut f = FakeFunction::new(0x1234, 0x11e8, 0x00, 0xff);
        // MSI, 64-bit capable (control bit 7), at 0x40; a vendor cap at 0x50 links to it.
        f.add_capability(0x40, CAP_MSI, 1 << 7, &[0, 0, 0]);
        f.add_capability(0x50, CAP_VENDOR, 0, &[]);
        (FakeConfig::with(&[(addr, f)]), addr)
    }

    #[test]
    fn walks_the_capability_list() {
        let (cfg, addr) = edu_like();
        let caps: std::vec::Vec<_> = capabilities(&cfg, addr).collect();
        assert_eq!(caps, [(CAP_VENDOR, 0x50), (CAP_MSI, 0x40)]);
        assert_eq!(find_capability(&cfg, addr, CAP_MSI), Some(0x40));
        assert_eq!(find_capability(&cfg, addr, CAP_MSIX), None);
    }

    #[test]
    fn a_looping_capability_list_terminates() {
        let addr = PciAddress::new(0, 0, 1, 0);
        let mut f = FakeFunction::new(1, 2, 3, 4);
        f.add_capability(0x40, CAP_MSI, 0, &[]);
        f.regs[0x40 / 4] |= 0x40 << 8; // next -> itself
        let cfg = FakeConfig::with(&[(addr, f)]);
        assert_eq!(capabilities(&cfg, addr).count(), MAX_CAPS);
    }

    #[test]
    fn programs_a_64_bit_msi_capability() {
        let (cfg, addr) = edu_like();
        enable_msi(&cfg, addr, 0x40, MsiMessage::fixed(0, 0x31));
        let f = cfg.function(addr);
        assert_eq!(f.regs[0x44 / 4], 0xfee0_0000);
        assert_eq!(f.regs[0x48 / 4], 0);
        assert_eq!(f.regs[0x4c / 4] & 0xffff, 0x31);
        let control = (f.regs[0x40 / 4] >> 16) as u16;
        assert_eq!(control & 1, 1, "enabled");
        assert_eq!(control & (1 << 7), 1 << 7, "64-bit bit kept");
        assert_ne!(cfg.read16(addr, regs::COMMAND) & regs::CMD_INTX_DISABLE, 0);
    }

    #[test]
    fn reads_an_msix_layout() {
        let addr = PciAddress::new(0, 0, 4, 0);
        let mut f = FakeFunction::new(0x1b36, 0x0010, 0x01, 0x08);
        f.add_capability(0x80, CAP_MSIX, 64, &[0x2000, 0x3000 | 4]);
        let cfg = FakeConfig::with(&[(addr, f)]);
        let cap = find_capability(&cfg, addr, CAP_MSIX).unwrap();
        assert_eq!(
            MsixLayout::read(&cfg, addr, cap),
            MsixLayout {
                cap: 0x80,
                entries: 65,
                table_bar: 0,
                table_offset: 0x2000,
                pba_bar: 4,
                pba_offset: 0x3000
            }
        );
        assert_eq!(MsiMessage::fixed(3, 0x40).address, 0xfee0_3000);
    }
}

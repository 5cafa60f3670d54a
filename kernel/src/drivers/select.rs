//! Which PCI function is the disk: the `disk=` option applied to the enumerated bus.

use core::fmt;

use crate::config::DiskSelector;
use crate::pci::{PciAddress, PciFunction};

/// The kinds of block device the appliance drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskKind {
    /// An NVMe controller (class 01.08, programming interface 02).
    Nvme,
    /// A virtio block device (1af4:1042 modern, or 1af4:1001 transitional).
    VirtioBlk,
}

impl DiskKind {
    /// The kind of `f`, if it is a disk we drive.
    pub fn of(f: &PciFunction) -> Option<DiskKind> {
        if f.class == 0x01 && f.subclass == 0x08 && f.prog_if == 0x02 {
            Some(DiskKind::Nvme)
        } else if f.vendor == 0x1af4 && matches!(f.device, 0x1042 | 0x1001) {
            Some(DiskKind::VirtioBlk)
        } else {
            None
        }
    }
}

impl fmt::Display for DiskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiskKind::Nvme => "nvme",
            DiskKind::VirtioBlk => "virtio",
        })
    }
}

/// Why no disk was selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectError {
    /// The bus has no NVMe or virtio-blk device at all.
    NoDisks,
    /// `disk=nvmeN` / `disk=virtioN` asked for more devices of that kind than exist.
    NoSuchDevice(DiskSelector),
    /// `disk=BB:DD.F` names a function that is absent or not a disk we drive.
    NotADisk(PciAddress),
}

impl fmt::Display for SelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectError::NoDisks => f.write_str("no NVMe or virtio-blk device found"),
            SelectError::NoSuchDevice(s) => write!(f, "disk={s}: no such device"),
            SelectError::NotADisk(a) => {
                write!(f, "disk={a}: not an NVMe or virtio-blk device")
            }
        }
    }
}

/// Applies `selector` (`None`: the first NVMe controller, else the first virtio-blk
/// device) to the functions found on the bus, in PCI order.
pub fn select(
    functions: &[PciFunction],
    selector: Option<DiskSelector>,
) -> Result<(PciAddress, DiskKind), SelectError> {
    let disks = || {
        functions
            .iter()
            .filter_map(|f| DiskKind::of(f).map(|k| (f.addr, k)))
    };
    let nth = |kind: DiskKind, n: u8| disks().filter(|d| d.1 == kind).nth(usize::from(n));
    match selector {
        None => nth(DiskKind::Nvme, 0)
            .or_else(|| nth(DiskKind::VirtioBlk, 0))
            .ok_or(SelectError::NoDisks),
        Some(s @ DiskSelector::Nvme(n)) => {
            nth(DiskKind::Nvme, n).ok_or(SelectError::NoSuchDevice(s))
        }
        Some(s @ DiskSelector::VirtioBlk(n)) => {
            nth(DiskKind::VirtioBlk, n).ok_or(SelectError::NoSuchDevice(s))
        }
        Some(DiskSelector::Pci(addr)) => disks()
            .find(|d| d.0 == addr)
            .ok_or(SelectError::NotADisk(addr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(device: u8, vendor: u16, id: u16, class: (u8, u8, u8)) -> PciFunction {
        PciFunction {
            addr: PciAddress::new(0, 0, device, 0),
            vendor,
            device: id,
            class: class.0,
            subclass: class.1,
            prog_if: class.2,
            revision: 0,
            header_type: 0,
        }
    }

    fn bus() -> [PciFunction; 5] {
        [
            func(2, 0x1af4, 0x1041, (2, 0, 0)), // virtio-net
            func(3, 0x1af4, 0x1042, (1, 0, 0)), // virtio-blk
            func(4, 0x1b36, 0x0010, (1, 8, 2)), // NVMe
            func(5, 0x1af4, 0x1001, (1, 0, 0)), // transitional virtio-blk
            func(6, 0x8086, 0x5845, (1, 8, 2)), // another NVMe
        ]
    }

    #[test]
    fn auto_prefers_nvme() {
        let b = bus();
        assert_eq!(
            select(&b, None),
            Ok((PciAddress::new(0, 0, 4, 0), DiskKind::Nvme))
        );
        assert_eq!(
            select(&b[..2], None),
            Ok((PciAddress::new(0, 0, 3, 0), DiskKind::VirtioBlk))
        );
        assert_eq!(select(&b[..1], None), Err(SelectError::NoDisks));
    }

    #[test]
    fn numbered_selectors_count_per_kind() {
        let b = bus();
        assert_eq!(
            select(&b, Some(DiskSelector::Nvme(1))).unwrap().0,
            PciAddress::new(0, 0, 6, 0)
        );
        assert_eq!(
            select(&b, Some(DiskSelector::VirtioBlk(1))).unwrap().0,
            PciAddress::new(0, 0, 5, 0)
        );
        assert_eq!(
            select(&b, Some(DiskSelector::Nvme(2))),
            Err(SelectError::NoSuchDevice(DiskSelector::Nvme(2)))
        );
    }

    #[test]
    fn pci_addresses_must_name_a_disk() {
        let b = bus();
        let at = |d| PciAddress::new(0, 0, d, 0);
        assert_eq!(
            select(&b, Some(DiskSelector::Pci(at(3)))),
            Ok((at(3), DiskKind::VirtioBlk))
        );
        assert_eq!(
            select(&b, Some(DiskSelector::Pci(at(2)))),
            Err(SelectError::NotADisk(at(2)))
        );
        assert_eq!(
            select(&b, Some(DiskSelector::Pci(at(9)))),
            Err(SelectError::NotADisk(at(9)))
        );
    }
}

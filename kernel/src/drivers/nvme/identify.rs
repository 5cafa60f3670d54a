//! Identify data structures: the controller and namespace facts the driver needs, parsed
//! from the 4 KiB pages the controller returns. Malformed data gives an error, never a
//! panic.

use alloc::string::String;
use alloc::vec::Vec;
use core::mem::size_of;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, KnownLayout};

/// Size of every Identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;

/// Why Identify data was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentifyError {
    /// Fewer than 4096 bytes.
    Short,
    /// The namespace uses a logical block size below 512 bytes or above 64 KiB.
    BadBlockSize(u8),
    /// The namespace's formatted LBA format has per-block metadata, which we do not use.
    Metadata(u16),
    /// The formatted LBA format index is beyond the namespace's format list.
    BadFormatIndex(u8),
    /// The namespace has no blocks.
    Empty,
}

/// The Identify Controller data structure (CNS 01h), up to the fields we use; the rest
/// of the 4 KiB page follows.
#[derive(FromBytes, KnownLayout, Immutable)]
#[repr(C)]
struct IdentifyController {
    /// PCI Vendor ID.
    vid: U16,
    /// PCI Subsystem Vendor ID.
    ssvid: U16,
    /// Serial Number (ASCII, space padded).
    sn: [u8; 20],
    /// Model Number (ASCII, space padded).
    mn: [u8; 40],
    /// Firmware Revision (ASCII, space padded).
    fr: [u8; 8],
    /// Recommended Arbitration Burst, IEEE OUI, CMIC.
    rab_ieee_cmic: [u8; 5],
    /// Maximum Data Transfer Size.
    mdts: u8,
    /// Bytes 78..256: controller capabilities we do not use.
    _78: [u8; 178],
    /// Optional Admin Command Support.
    oacs: U16,
    /// Abort Command Limit.
    acl: u8,
    /// Bytes 259..516: admin command set attributes we do not use.
    _259: [u8; 257],
    /// Number of Namespaces.
    nn: U32,
    /// Optional NVM Command Support.
    oncs: U16,
    /// Fused Operation Support and Format NVM Attributes.
    fuses_fna: [u8; 3],
    /// Volatile Write Cache (bit 0: present).
    vwc: u8,
}

/// One LBA Format descriptor of Identify Namespace.
#[derive(Clone, Copy, FromBytes, KnownLayout, Immutable)]
#[repr(C)]
struct LbaFormat {
    /// Metadata Size per block.
    ms: U16,
    /// LBA Data Size, as a power of two.
    lbads: u8,
    /// Relative Performance.
    rp: u8,
}

/// The Identify Namespace data structure (CNS 00h), up to the fields we use.
#[derive(FromBytes, KnownLayout, Immutable)]
#[repr(C)]
struct IdentifyNamespace {
    /// Namespace Size, in logical blocks.
    nsze: U64,
    /// Namespace Capacity and Utilisation.
    ncap_nuse: [U64; 2],
    /// Namespace Features.
    nsfeat: u8,
    /// Number of LBA Formats (0-based).
    nlbaf: u8,
    /// Formatted LBA Size: the format in use (bits 3:0, and 6:5 as bits 5:4 of the index).
    flbas: u8,
    /// Bytes 27..128: namespace attributes we do not use.
    _27: [u8; 101],
    /// LBA Format 0-63.
    lbaf: [LbaFormat; 64],
}

const _: () = assert!(size_of::<IdentifyController>() <= IDENTIFY_SIZE);
const _: () = assert!(size_of::<IdentifyNamespace>() <= IDENTIFY_SIZE);

/// The start of an Identify page as `T`; short pages are refused.
fn page<T: FromBytes + KnownLayout + Immutable>(b: &[u8]) -> Result<&T, IdentifyError> {
    if b.len() < IDENTIFY_SIZE {
        return Err(IdentifyError::Short);
    }
    T::ref_from_prefix(b)
        .map(|(t, _)| t)
        .map_err(|_| IdentifyError::Short)
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_matches(|c: char| c.is_whitespace() || c == '\0')
        .into()
}

/// Optional NVM commands (ONCS bits).
pub mod oncs {
    /// Dataset Management (deallocate).
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// Optional admin commands (OACS bits).
pub mod oacs {
    /// Doorbell Buffer Config.
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
}

/// Identify Controller (CNS 01h), the parts we use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI vendor id.
    pub vendor: u16,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Firmware revision.
    pub firmware: String,
    /// Maximum Data Transfer Size as a power of two of the minimum page size; 0 means
    /// no limit.
    pub mdts: u8,
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (0-based).
    pub abort_limit: u8,
    /// Number of namespaces (highest valid NSID).
    pub namespaces: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// A volatile write cache is present (so Flush does real work).
    pub volatile_write_cache: bool,
}

impl ControllerInfo {
    /// Parses the Identify Controller data.
    pub fn parse(b: &[u8]) -> Result<ControllerInfo, IdentifyError> {
        let c: &IdentifyController = page(b)?;
        Ok(ControllerInfo {
            vendor: c.vid.get(),
            serial: ascii(&c.sn),
            model: ascii(&c.mn),
            firmware: ascii(&c.fr),
            mdts: c.mdts,
            oacs: c.oacs.get(),
            abort_limit: c.acl,
            namespaces: c.nn.get(),
            oncs: c.oncs.get(),
            volatile_write_cache: c.vwc & 1 == 1,
        })
    }

    /// The largest transfer in bytes, given the controller's minimum page size; `None`
    /// when unlimited.
    pub fn max_transfer(&self, min_page_size: usize) -> Option<usize> {
        match self.mdts {
            0 => None,
            n => min_page_size.checked_shl(u32::from(n)),
        }
    }
}

/// Identify Namespace (CNS 00h), the parts we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Size in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size.
    pub block_shift: u8,
}

impl NamespaceInfo {
    /// Parses the Identify Namespace data.
    pub fn parse(b: &[u8]) -> Result<NamespaceInfo, IdentifyError> {
        let ns: &IdentifyNamespace = page(b)?;
        let blocks = ns.nsze.get();
        if blocks == 0 {
            return Err(IdentifyError::Empty);
        }
        let formats = usize::from(ns.nlbaf) + 1;
        let index = (ns.flbas & 0xf) | ((ns.flbas >> 5) & 0x3) << 4;
        let format = ns
            .lbaf
            .get(usize::from(index))
            .filter(|_| usize::from(index) < formats)
            .ok_or(IdentifyError::BadFormatIndex(index))?;
        let metadata = format.ms.get();
        let shift = format.lbads;
        if !(9..=16).contains(&shift) {
            return Err(IdentifyError::BadBlockSize(shift));
        }
        // Extended-LBA metadata (FLBAS bit 4) or separate metadata both change what a
        // block transfer means; we format without metadata.
        if metadata != 0 {
            return Err(IdentifyError::Metadata(metadata));
        }
        Ok(NamespaceInfo {
            blocks,
            block_shift: shift,
        })
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift
    }
}

/// Parses an active namespace ID list (CNS 02h): NSIDs in increasing order, ended by 0.
pub fn active_namespaces(b: &[u8]) -> Vec<u32> {
    let whole = b.len() / size_of::<U32>();
    <[U32]>::ref_from_prefix_with_elems(b, whole).map_or(Vec::new(), |(ids, _)| {
        ids.iter()
            .map(|id| id.get())
            .take_while(|&id| id != 0)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn controller_page() -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        b[4..24].copy_from_slice(b"nf-serial           ");
        b[24..64].copy_from_slice(b"QEMU NVMe Ctrl                          ");
        b[64..72].copy_from_slice(b"7.2.0   ");
        b[77] = 7;
        b[256..258].copy_from_slice(&0x10au16.to_le_bytes());
        b[258] = 3;
        b[516..520].copy_from_slice(&256u32.to_le_bytes());
        b[520..522].copy_from_slice(&0x15du16.to_le_bytes());
        b[525] = 1;
        b
    }

    #[test]
    fn controller_parses() {
        let c = ControllerInfo::parse(&controller_page()).unwrap();
        assert_eq!(c.vendor, 0x1b36);
        assert_eq!(c.serial, "nf-serial");
        assert_eq!(c.model, "QEMU NVMe Ctrl");
        assert_eq!(c.firmware, "7.2.0");
        assert_eq!(c.max_transfer(4096), Some(512 * 1024));
        assert!(c.oncs & oncs::DSM != 0 && c.oacs & oacs::DOORBELL_BUFFER_CONFIG != 0);
        assert!(c.volatile_write_cache);
        assert_eq!((c.namespaces, c.abort_limit), (256, 3));
        let unlimited = ControllerInfo { mdts: 0, ..c };
        assert_eq!(unlimited.max_transfer(4096), None);
        assert_eq!(ControllerInfo::parse(&[0; 100]), Err(IdentifyError::Short));
    }

    fn namespace_page(flbas: u8, formats: &[(u16, u8)]) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..8].copy_from_slice(&131072u64.to_le_bytes());
        b[25] = formats.len() as u8 - 1;
        b[26] = flbas;
        for (i, (ms, lbads)) in formats.iter().enumerate() {
            b[128 + 4 * i..130 + 4 * i].copy_from_slice(&ms.to_le_bytes());
            b[130 + 4 * i] = *lbads;
        }
        b
    }

    #[test]
    fn namespace_parses_the_formatted_lba_format() {
        let formats = [(0, 9), (8, 9), (0, 12)];
        let ns = NamespaceInfo::parse(&namespace_page(2, &formats)).unwrap();
        assert_eq!((ns.blocks, ns.block_size()), (131072, 4096));
        let ns = NamespaceInfo::parse(&namespace_page(0, &formats)).unwrap();
        assert_eq!(ns.block_size(), 512);
        assert_eq!(
            NamespaceInfo::parse(&namespace_page(1, &formats)),
            Err(IdentifyError::Metadata(8))
        );
        assert_eq!(
            NamespaceInfo::parse(&namespace_page(3, &formats)),
            Err(IdentifyError::BadFormatIndex(3))
        );
        assert_eq!(
            NamespaceInfo::parse(&namespace_page(0, &[(0, 5)])),
            Err(IdentifyError::BadBlockSize(5))
        );
        let mut empty = namespace_page(0, &formats);
        empty[..8].fill(0);
        assert_eq!(NamespaceInfo::parse(&empty), Err(IdentifyError::Empty));
    }

    #[test]
    fn namespace_lists_end_at_zero() {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..4].copy_from_slice(&1u32.to_le_bytes());
        b[4..8].copy_from_slice(&3u32.to_le_bytes());
        b[12..16].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(active_namespaces(&b), [1, 3]);
    }
}

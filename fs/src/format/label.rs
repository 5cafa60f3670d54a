//! The device label: block 0 of each device of a mirrored volume, naming the volume
//! (its superblock's `uuid`) and the device's place in it, so the host tools (and
//! later the appliance) put the legs in order whatever order they are given in. Written
//! by mkfs (and, later, by a replacement); a single device's block 0 stays zero.
//!
//! Whether a leg is current is not the label's business: the superblocks' generations
//! and leg table decide that (`features::redundancy::legs`).

use alloc::vec::Vec;
use core::mem::size_of;

use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{Corrupt, BLOCK_SIZE};
use crate::util::crc::{crc32c, crc32c_parts};

/// Magic at the start of a device label.
pub const MAGIC: [u8; 8] = *b"NINELEG1";
/// The block that holds it.
pub const LABEL_BLOCK: u64 = 0;

/// A device's place in a mirrored volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLabel {
    /// The volume's identity (its superblock's `uuid`).
    pub uuid: [u8; 16],
    /// This device's place (0-based; its entry in the superblock's leg table).
    pub place: u32,
    /// How many devices the volume has.
    pub legs: u32,
}

/// The label's on-disk layout, at the start of block 0; the rest of the block is zero
/// and covered by the checksum.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct LabelDisk {
    magic: [u8; 8],
    /// crc32c of the block from `uuid` to its end.
    crc: U32,
    uuid: [u8; 16],
    place: U32,
    legs: U32,
}

const CRC_START: usize = 12;
const _: () = assert!(size_of::<LabelDisk>() <= BLOCK_SIZE);

impl DeviceLabel {
    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; BLOCK_SIZE];
        let (disk, rest) = LabelDisk::mut_from_prefix(&mut b).expect("fits a block");
        *disk = LabelDisk {
            magic: MAGIC,
            crc: U32::ZERO,
            uuid: self.uuid,
            place: self.place.into(),
            legs: self.legs.into(),
        };
        disk.crc = crc32c_parts(&[&disk.as_bytes()[CRC_START..], rest]).into();
        b
    }

    /// Decodes block 0: `Ok(None)` when it holds no label (a single device).
    pub fn decode(b: &[u8]) -> Result<Option<DeviceLabel>, Corrupt> {
        let b = b.get(..BLOCK_SIZE).ok_or(Corrupt::Truncated)?;
        let (disk, _) = LabelDisk::ref_from_prefix(b).map_err(|_| Corrupt::Truncated)?;
        if disk.magic != MAGIC {
            return Ok(None);
        }
        if disk.crc.get() != crc32c(&b[CRC_START..]) {
            return Err(Corrupt::Checksum);
        }
        let label = DeviceLabel {
            uuid: disk.uuid,
            place: disk.place.get(),
            legs: disk.legs.get(),
        };
        let max = super::superblock::MAX_LEGS as u32;
        if !(2..=max).contains(&label.legs) || label.place >= label.legs {
            return Err(Corrupt::Field("place"));
        }
        Ok(Some(label))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let l = DeviceLabel {
            uuid: [3; 16],
            place: 1,
            legs: 2,
        };
        let mut b = l.encode();
        assert_eq!(&b[..8], b"NINELEG1");
        assert_eq!(DeviceLabel::decode(&b), Ok(Some(l)));
        assert_eq!(DeviceLabel::decode(&[0; BLOCK_SIZE]), Ok(None));
        b[20] ^= 1;
        assert_eq!(DeviceLabel::decode(&b), Err(Corrupt::Checksum));
        let bad = DeviceLabel { place: 2, ..l }.encode();
        assert!(DeviceLabel::decode(&bad).is_err());
    }
}

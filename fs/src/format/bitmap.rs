//! Allocation bitmap groups. Each group is one 4 KiB block covering
//! [`BLOCKS_PER_GROUP`] blocks, stored in two slots that are written alternately (the
//! slot not holding the current version), so a torn write never loses the committed
//! version.
//!
//! ```text
//! 0  magic "NFBM"   4  crc32c of bytes 8..4096
//! 8  group u32      12 free u32 (clear bits)
//! 16 seq u64 (checkpoint that wrote it)   24 reserved u64
//! 32 bitmap (bit i set = block group*BLOCKS_PER_GROUP + i allocated)
//! ```

use super::{Corrupt, BLOCK_SIZE};
use crate::util::crc::crc32c;

/// Magic of a bitmap group block.
pub const MAGIC: [u8; 4] = *b"NFBM";
/// Header size.
pub const HEADER_LEN: usize = 32;
/// Blocks covered by one group.
pub const BLOCKS_PER_GROUP: u64 = ((BLOCK_SIZE - HEADER_LEN) * 8) as u64;

/// A decoded group block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupBlock {
    /// Group number.
    pub group: u32,
    /// Checkpoint sequence that wrote this slot.
    pub seq: u64,
    /// Number of clear bits among the blocks the group covers.
    pub free: u32,
    /// The bitmap, `BLOCKS_PER_GROUP` bits.
    pub bits: alloc::vec::Vec<u8>,
}

impl GroupBlock {
    /// Encodes into one block.
    pub fn encode(&self) -> alloc::vec::Vec<u8> {
        let mut b = alloc::vec![0u8; BLOCK_SIZE];
        b[0..4].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.group.to_le_bytes());
        b[12..16].copy_from_slice(&self.free.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[HEADER_LEN..].copy_from_slice(&self.bits);
        let crc = crc32c(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one block, checking magic, checksum, that it belongs to `group` and that
    /// its free count is its clear bits'.
    pub fn decode(b: &[u8], group: u32) -> Result<GroupBlock, Corrupt> {
        if b.len() != BLOCK_SIZE {
            return Err(Corrupt::Truncated);
        }
        if b[0..4] != MAGIC {
            return Err(Corrupt::Magic);
        }
        let crc = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        if crc != crc32c(&b[8..]) {
            return Err(Corrupt::Checksum);
        }
        let g = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if g != group {
            return Err(Corrupt::Field("group"));
        }
        let free = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        // The filesystem writes a group with the count its bits show (`space`): a
        // count that differs was forged, and would take the allocator's books below
        // zero when its blocks are allocated.
        let bits = &b[HEADER_LEN..];
        if free != bits.iter().map(|x| x.count_zeros()).sum::<u32>() {
            return Err(Corrupt::Field("group free count"));
        }
        Ok(GroupBlock {
            group,
            free,
            seq: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            bits: bits.to_vec(),
        })
    }
}

/// Whether bit `i` is set.
pub fn test_bit(bits: &[u8], i: usize) -> bool {
    bits[i / 8] & (1 << (i % 8)) != 0
}

/// Sets or clears bit `i`.
pub fn set_bit(bits: &mut [u8], i: usize, v: bool) {
    if v {
        bits[i / 8] |= 1 << (i % 8);
    } else {
        bits[i / 8] &= !(1 << (i % 8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checksum() {
        let mut bits = alloc::vec![0u8; BLOCK_SIZE - HEADER_LEN];
        set_bit(&mut bits, 77, true);
        let g = GroupBlock {
            group: 3,
            seq: 9,
            free: BLOCKS_PER_GROUP as u32 - 1,
            bits,
        };
        let mut b = g.encode();
        assert_eq!(GroupBlock::decode(&b, 3), Ok(g.clone()));
        assert_eq!(GroupBlock::decode(&b, 4), Err(Corrupt::Field("group")));
        b[100] ^= 1;
        assert_eq!(GroupBlock::decode(&b, 3), Err(Corrupt::Checksum));
        assert!(test_bit(&g.bits, 77) && !test_bit(&g.bits, 76));
        // A free count its bits do not show (resealed, as a forger would).
        let forged = GroupBlock {
            free: BLOCKS_PER_GROUP as u32,
            ..g
        }
        .encode();
        assert_eq!(
            GroupBlock::decode(&forged, 3),
            Err(Corrupt::Field("group free count"))
        );
    }
}

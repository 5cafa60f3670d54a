//! virtio-blk on the wire (virtio 1.2, section 5.2): feature bits, the configuration
//! fields we read, request headers, discard segments and status bytes. Pure; the
//! geometry derivation is host-tested.

use core::mem::{offset_of, size_of};

use bitflags::bitflags;
use block::{Geometry, IoError};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// virtio-blk addresses the disk in 512-byte sectors whatever its block size.
pub const SECTOR: u64 = 512;

/// Our cap on one transfer (the data is one contiguous descriptor).
pub const MAX_TRANSFER: u32 = 1 << 20;

bitflags! {
    /// The feature bits this driver knows.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Features: u64 {
        /// `size_max` limits one data segment.
        const SIZE_MAX = 1 << 1;
        /// `seg_max` limits the segments of a request.
        const SEG_MAX = 1 << 2;
        /// The device is read-only.
        const RO = 1 << 5;
        /// `blk_size` gives the logical block size.
        const BLK_SIZE = 1 << 6;
        /// The device has a volatile cache and takes FLUSH requests.
        const FLUSH = 1 << 9;
        /// DISCARD requests, with limits in the configuration.
        const DISCARD = 1 << 13;
        /// The device is virtio 1.0+ (modern).
        const VERSION_1 = 1 << 32;
    }
}

impl Features {
    /// What we ask for. No indirect descriptors (each request takes three descriptors;
    /// a 256-entry ring still holds 85 requests) and no event index (the queue then
    /// relies on the simpler, wrap-safe notification flags).
    pub const WANTED: Features = Features::SIZE_MAX
        .union(Features::SEG_MAX)
        .union(Features::RO)
        .union(Features::BLK_SIZE)
        .union(Features::FLUSH)
        .union(Features::DISCARD)
        .union(Features::VERSION_1);
}

/// The device configuration (`struct virtio_blk_config`) up to the fields we read. The
/// driver reads it field by field from configuration space, at these fields' offsets
/// ([`config`]).
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlkConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: U64,
    /// Largest data segment.
    pub size_max: U32,
    /// Most data segments per request.
    pub seg_max: U32,
    /// Cylinders, heads, sectors (legacy geometry).
    pub geometry: [u8; 4],
    /// Logical block size.
    pub blk_size: U32,
    /// Physical block exponent, alignment offset, minimum and optimal I/O size.
    pub topology: [u8; 8],
    /// Write-cache mode, padding, number of queues.
    pub writeback_queues: [u8; 4],
    /// Largest discard, in sectors.
    pub max_discard_sectors: U32,
    /// Most discard segments per request.
    pub max_discard_seg: U32,
}

/// Byte offsets of the configuration fields the driver reads.
pub mod config {
    use super::{offset_of, BlkConfig};

    /// Capacity in sectors, low 32 bits (the high half follows).
    pub const CAPACITY: usize = offset_of!(BlkConfig, capacity);
    /// Largest data segment.
    pub const SIZE_MAX: usize = offset_of!(BlkConfig, size_max);
    /// Most data segments per request.
    pub const SEG_MAX: usize = offset_of!(BlkConfig, seg_max);
    /// Logical block size.
    pub const BLK_SIZE: usize = offset_of!(BlkConfig, blk_size);
    /// Largest discard, in sectors.
    pub const MAX_DISCARD_SECTORS: usize = offset_of!(BlkConfig, max_discard_sectors);
    /// Most discard segments per request.
    pub const MAX_DISCARD_SEG: usize = offset_of!(BlkConfig, max_discard_seg);
}

/// Request types.
pub mod kind {
    /// Read.
    pub const IN: u32 = 0;
    /// Write.
    pub const OUT: u32 = 1;
    /// Flush the volatile cache.
    pub const FLUSH: u32 = 4;
    /// Discard.
    pub const DISCARD: u32 = 11;
}

/// The configuration fields we use, as read from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// `size_max`.
    pub size_max: u32,
    /// `blk_size`.
    pub blk_size: u32,
    /// `max_discard_sectors`.
    pub max_discard_sectors: u32,
    /// `max_discard_seg`.
    pub max_discard_seg: u32,
}

/// Why a device's configuration was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Not a modern (virtio 1.0) device.
    NotModern,
    /// The block size is not a power of two in 512..=65536.
    BadBlockSize(u32),
    /// The device is smaller than one block.
    Empty,
}

/// The geometry of a device with `features` negotiated and configuration `c`.
pub fn geometry(features: Features, c: &DeviceConfig) -> Result<Geometry, ConfigError> {
    if !features.contains(Features::VERSION_1) {
        return Err(ConfigError::NotModern);
    }
    let block_size = if features.contains(Features::BLK_SIZE) {
        c.blk_size
    } else {
        SECTOR as u32
    };
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(ConfigError::BadBlockSize(block_size));
    }
    let num_blocks = c.capacity * SECTOR / u64::from(block_size);
    if num_blocks == 0 {
        return Err(ConfigError::Empty);
    }
    let mut max_transfer = MAX_TRANSFER;
    if features.contains(Features::SIZE_MAX) && c.size_max > 0 {
        max_transfer = max_transfer.min(c.size_max);
    }
    let max_transfer = (max_transfer / block_size * block_size).max(block_size);
    Ok(Geometry {
        block_size,
        num_blocks,
        max_transfer,
        native_fua: false,
        volatile_cache: features.contains(Features::FLUSH),
        discard: features.contains(Features::DISCARD)
            && c.max_discard_sectors > 0
            && c.max_discard_seg > 0,
    })
}

/// A request header (`virtio_blk_req` up to the data), which the device reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RequestHeader {
    /// The request type ([`kind`]).
    pub kind: U32,
    /// Reserved (was the request priority).
    pub reserved: U32,
    /// First sector (512 bytes) of the transfer.
    pub sector: U64,
}

impl RequestHeader {
    /// A request of `kind` at `sector`.
    pub fn new(kind: u32, sector: u64) -> RequestHeader {
        RequestHeader {
            kind: kind.into(),
            reserved: U32::ZERO,
            sector: sector.into(),
        }
    }
}

/// One discard range (`virtio_blk_discard_write_zeroes`), which the device reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DiscardSegment {
    /// First sector.
    pub sector: U64,
    /// Number of sectors.
    pub sectors: U32,
    /// Flags (bit 0: unmap, for write-zeroes only): zero.
    pub flags: U32,
}

impl DiscardSegment {
    /// A discard of `sectors` sectors at `sector`.
    pub fn new(sector: u64, sectors: u32) -> DiscardSegment {
        DiscardSegment {
            sector: sector.into(),
            sectors: sectors.into(),
            flags: U32::ZERO,
        }
    }
}

/// Bytes of a request header.
pub const HEADER_LEN: usize = size_of::<RequestHeader>();
/// Bytes of a discard segment.
pub const SEGMENT_LEN: usize = size_of::<DiscardSegment>();

/// What a status byte means for the request.
pub fn result(status: u8) -> Result<(), IoError> {
    match status {
        0 => Ok(()),
        2 => Err(IoError::Unsupported),
        s => Err(IoError::Device(u16::from(s))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DeviceConfig {
        DeviceConfig {
            capacity: 131072,
            size_max: 0,
            blk_size: 4096,
            max_discard_sectors: 0x3fff_ffff,
            max_discard_seg: 1,
        }
    }

    #[test]
    fn qemu_like_geometry() {
        let f = Features::VERSION_1 | Features::FLUSH | Features::SEG_MAX | Features::DISCARD;
        let g = geometry(f, &config()).unwrap();
        assert_eq!((g.block_size, g.num_blocks), (512, 131072));
        assert_eq!(g.max_transfer, MAX_TRANSFER);
        assert!(g.volatile_cache && g.discard && !g.native_fua);
        let g = geometry(
            f | Features::BLK_SIZE | Features::SIZE_MAX,
            &DeviceConfig {
                size_max: 65536 + 100,
                ..config()
            },
        )
        .unwrap();
        assert_eq!(
            (g.block_size, g.num_blocks, g.max_transfer),
            (4096, 16384, 65536)
        );
        let g = geometry(Features::VERSION_1, &config()).unwrap();
        assert!(!g.volatile_cache && !g.discard);
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(
            geometry(Features::FLUSH, &config()),
            Err(ConfigError::NotModern)
        );
        let f = Features::VERSION_1 | Features::BLK_SIZE;
        let c = |blk_size| DeviceConfig {
            blk_size,
            ..config()
        };
        assert_eq!(geometry(f, &c(1000)), Err(ConfigError::BadBlockSize(1000)));
        assert_eq!(geometry(f, &c(256)), Err(ConfigError::BadBlockSize(256)));
        let tiny = DeviceConfig {
            capacity: 7,
            ..config()
        };
        assert_eq!(geometry(f, &tiny), Err(ConfigError::Empty));
    }

    #[test]
    fn encodings() {
        let header = RequestHeader::new(kind::OUT, 0x0102_0304_0506);
        let h = header.as_bytes();
        assert_eq!(h.len(), 16);
        assert_eq!(&h[..4], &[1, 0, 0, 0]);
        assert_eq!(&h[8..], &0x0102_0304_0506u64.to_le_bytes());
        let segment = DiscardSegment::new(9, 8);
        let s = segment.as_bytes();
        assert_eq!((s.len(), s[0], s[8], s[12]), (16, 9, 8, 0));
        assert_eq!(
            [
                config::CAPACITY,
                config::SIZE_MAX,
                config::SEG_MAX,
                config::BLK_SIZE
            ],
            [0, 8, 12, 20]
        );
        assert_eq!(
            [config::MAX_DISCARD_SECTORS, config::MAX_DISCARD_SEG],
            [36, 40]
        );
        assert_eq!(result(0), Ok(()));
        assert_eq!(result(1), Err(IoError::Device(1)));
        assert_eq!(result(2), Err(IoError::Unsupported));
        assert_eq!(result(0xff), Err(IoError::Device(0xff)));
    }
}

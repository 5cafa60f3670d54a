//! The superblock: two copies at fixed blocks ([`super::layout::SUPERBLOCK_BLOCKS`]),
//! written alternately (generation `g` goes to copy `g % 2`). Mount takes the valid copy
//! with the highest generation.
//!
//! The block is [`SuperblockDisk`] followed by zeros; [`Superblock`] is its decoded,
//! validated form.

use alloc::vec::Vec;
use core::mem::{offset_of, size_of};

use zerocopy::little_endian::{I64, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::key::TreeId;
use super::layout::Layout;
use super::{Corrupt, BLOCK_SIZE, FORMAT_VERSION};
use crate::util::crc::{crc32c, crc32c_parts};
use vfs::{Timespec, ROOT_INO};

/// Magic at the start of a superblock.
pub const MAGIC: [u8; 8] = *b"NINEFOLD";

/// Every sequence and counter of the superblock (`generation`, `checkpoint_seq`,
/// `log_tail`, `log_epoch`, `mount_count`) stays below this (2^62): a superblock
/// holding more is refused at mount and by fsck, and a filesystem whose next write
/// would reach it fails that write instead ([`next_seq`]). At a million checkpoints
/// (or log blocks) a second that is 146,000 years, so only a forged or corrupt
/// superblock ever comes near it, and no increment of these can wrap.
pub const MAX_SEQ: u64 = 1 << 62;

/// Live inode numbers are below this (2^48): `next_ino` is at most it, and inode
/// numbers with bits 48 and up belong to the snapshots (`features::snapshots::snapdir`). A create
/// once it is reached fails with `ENOSPC`.
pub const MAX_INO: u64 = 1 << 48;

/// The room a writable mount needs left below [`MAX_SEQ`] in every sequence and
/// counter of the superblock (2^32: a few thousand years of checkpoints, so it never
/// runs out while mounted). A superblock with less is refused writable by the mount and
/// reported by fsck ([`Superblock::exhausted`]); only a forged or corrupt one has less,
/// and mounted it would fail at its first checkpoint or its unmount instead.
pub const SEQ_HEADROOM: u64 = 1 << 32;

/// `n + 1` for a sequence or counter of the superblock, while that stays below
/// [`MAX_SEQ`]; `None` past it.
pub fn next_seq(n: u64) -> Option<u64> {
    n.checked_add(1).filter(|&m| m < MAX_SEQ)
}
/// Length of the label field.
pub const LABEL_LEN: usize = 64;

/// Superblock state flags.
pub mod state {
    /// Unmounted cleanly: no checkpoint was in flight, nothing needs recovery.
    pub const CLEAN: u32 = 1;
}

/// The most legs a mirrored volume has.
pub const MAX_LEGS: usize = 8;

/// States of a mirrored volume's legs in the superblock's leg table
/// ([`Superblock::legs`]); a single-device filesystem has an all-zero table.
pub mod leg {
    /// No such leg (the table ends here).
    pub const NONE: u8 = 0;
    /// In service: holds every block of the checkpoint.
    pub const ACTIVE: u8 = 1;
    /// Being rebuilt from the others (a replacement): written, not yet to be read;
    /// [`Superblock::rebuild_cursor`](super::Superblock::rebuild_cursor) says how far
    /// the copy has come. At most one leg is.
    pub const REBUILDING: u8 = 2;
    /// Out of service: failed, missing or stale since this superblock's generation or
    /// before; never read again until rebuilt.
    pub const FAILED: u8 = 3;
}

/// A pointer to a btree node: where it is, which allocation it must be, and how much of
/// it is committed. Readers read exactly `blocks` blocks; anything a node holds past that
/// (an append of a checkpoint that never committed) is invisible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodePtr {
    /// First block of the node's on-disk extent (0 = none).
    pub addr: u64,
    /// The node's nonce; every bset of the node carries it.
    pub nonce: u64,
    /// Committed length of the node, in blocks: the bsets fill exactly this much.
    pub blocks: u32,
}

impl NodePtr {
    /// Encoded size.
    pub const ENCODED_LEN: usize = size_of::<NodePtrDisk>();

    /// Encodes into a fresh vector (the value of an interior node entry).
    pub fn to_bytes(&self) -> Vec<u8> {
        NodePtrDisk::from(*self).as_bytes().to_vec()
    }

    /// Decodes an interior node entry's value (exactly [`Self::ENCODED_LEN`] bytes).
    pub fn from_bytes(b: &[u8]) -> Option<NodePtr> {
        NodePtrDisk::ref_from_bytes(b).ok().map(NodePtr::from)
    }

    /// Whether this can point to a node of a filesystem of `layout` with nodes of
    /// `node_size` bytes: its whole extent in the data area
    /// ([`Layout::is_data_area`]), and 1 to `node_size` blocks committed. Every pointer read from
    /// disk is checked so before it is read through.
    pub fn is_valid(&self, layout: &Layout, node_size: u32) -> bool {
        let node_blocks = u64::from(node_size) / BLOCK_SIZE as u64;
        self.blocks > 0
            && u64::from(self.blocks) <= node_blocks
            && self
                .addr
                .checked_add(node_blocks)
                .is_some_and(|end| layout.is_data_area(self.addr, end))
    }
}

/// A [`NodePtr`] on disk (24 bytes): in the superblock's roots and as the value of every
/// interior node entry.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct NodePtrDisk {
    addr: U64,
    nonce: U64,
    blocks: U32,
    reserved: U32,
}

impl From<NodePtr> for NodePtrDisk {
    fn from(p: NodePtr) -> NodePtrDisk {
        NodePtrDisk {
            addr: p.addr.into(),
            nonce: p.nonce.into(),
            blocks: p.blocks.into(),
            reserved: U32::ZERO,
        }
    }
}

impl From<&NodePtrDisk> for NodePtr {
    fn from(d: &NodePtrDisk) -> NodePtr {
        NodePtr {
            addr: d.addr.get(),
            nonce: d.nonce.get(),
            blocks: d.blocks.get(),
        }
    }
}

/// A tree's root: its node and the tree's height (level of the root; 0 = leaf).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Root {
    /// The root node (`addr == 0`: the tree does not exist).
    pub ptr: NodePtr,
    /// Level of the root node.
    pub level: u8,
}

/// The superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version.
    pub version: u32,
    /// Compatible feature bits.
    pub compat: u64,
    /// Read-only compatible feature bits.
    pub ro_compat: u64,
    /// Incompatible feature bits.
    pub incompat: u64,
    /// Filesystem identity.
    pub uuid: [u8; 16],
    /// Secret key for name hashes and node nonces (never shown to clients).
    pub secret: u64,
    /// Label (NUL-padded).
    pub label: [u8; LABEL_LEN],
    /// Btree node size in bytes.
    pub node_size: u32,
    /// Size and fixed regions.
    pub layout: Layout,
    /// Incremented on every superblock write; picks the newer copy.
    pub generation: u64,
    /// The last committed checkpoint sequence.
    pub checkpoint_seq: u64,
    /// [`state`] flags.
    pub state: u32,
    /// Roots, indexed by [`TreeId`].
    pub roots: [Root; TreeId::COUNT],
    /// Next inode number to hand out.
    pub next_ino: u64,
    /// Free blocks, as of the committed checkpoint.
    pub free_blocks: u64,
    /// Number of inodes, as of the committed checkpoint.
    pub inode_count: u64,
    /// When the filesystem was made.
    pub created: Timespec,
    /// Number of mounts.
    pub mount_count: u64,
    /// Sequence number of the first log block to replay (the log head when this
    /// checkpoint was prepared).
    pub log_tail: u64,
    /// The log epoch: log blocks carry it, and blocks of another epoch are stale. Each
    /// mount picks a new one before writing to the log.
    pub log_epoch: u64,
    /// A mirrored volume's legs by place: a [`leg`] state each (all [`leg::NONE`] on a
    /// single device).
    pub legs: [u8; MAX_LEGS],
    /// While a leg is [`leg::REBUILDING`]: every block below it that was allocated
    /// when the copy passed it is on that leg, durably (0 when no leg is).
    pub rebuild_cursor: u64,
}

/// The superblock's on-disk layout (little-endian, no padding), at the start of its
/// block; the rest of the block is zero and covered by the checksum.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct SuperblockDisk {
    magic: [u8; 8],
    /// crc32c of the block from `version` to its end.
    crc: U32,
    version: U32,
    compat: U64,
    ro_compat: U64,
    incompat: U64,
    uuid: [u8; 16],
    secret: U64,
    label: [u8; LABEL_LEN],
    block_size: U32,
    node_size: U32,
    total_blocks: U64,
    groups: U32,
    log_start: U64,
    log_blocks: U64,
    generation: U64,
    checkpoint_seq: U64,
    state: U32,
    roots: [RootDisk; TreeId::COUNT],
    next_ino: U64,
    free_blocks: U64,
    inode_count: U64,
    created: TimespecDisk,
    mount_count: U64,
    log_tail: U64,
    log_epoch: U64,
    legs: [u8; MAX_LEGS],
    rebuild_cursor: U64,
}

/// Where the superblock's checksum starts: everything after the magic and the checksum.
const CRC_START: usize = offset_of!(SuperblockDisk, version);

const _: () = assert!(size_of::<SuperblockDisk>() <= BLOCK_SIZE);

/// A [`Root`] on disk (25 bytes, packed).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RootDisk {
    ptr: NodePtrDisk,
    level: u8,
}

/// A [`Timespec`] on disk.
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct TimespecDisk {
    sec: I64,
    nsec: U32,
}

impl Superblock {
    /// The root of `tree`.
    pub fn root(&self, tree: TreeId) -> Root {
        self.roots[tree as usize]
    }

    /// How many legs the volume has (0: a single device, not a mirror).
    pub fn leg_count(&self) -> usize {
        self.legs
            .iter()
            .position(|&l| l == leg::NONE)
            .unwrap_or(MAX_LEGS)
    }

    /// The label as bytes, without padding.
    pub fn label_bytes(&self) -> &[u8] {
        let end = self.label.iter().position(|&b| b == 0).unwrap_or(LABEL_LEN);
        &self.label[..end]
    }

    /// The first sequence or counter (its name and value) with less than
    /// [`SEQ_HEADROOM`] left below [`MAX_SEQ`]: a writable mount refuses the
    /// filesystem then (it can still be mounted read-only).
    pub fn exhausted(&self) -> Option<(&'static str, u64)> {
        [
            ("generation", self.generation),
            ("checkpoint_seq", self.checkpoint_seq),
            ("log_tail", self.log_tail),
            ("log_epoch", self.log_epoch),
            ("mount_count", self.mount_count),
        ]
        .into_iter()
        .find(|&(_, v)| v >= MAX_SEQ - SEQ_HEADROOM)
    }

    /// Moves to the next generation (every superblock write is one); `Err` when that
    /// would reach [`MAX_SEQ`], and then nothing changes: the superblock must not be
    /// written.
    pub fn next_generation(&mut self) -> Result<u64, Corrupt> {
        self.generation = next_seq(self.generation).ok_or(Corrupt::Field("generation"))?;
        Ok(self.generation)
    }

    /// The block this superblock is written to: copy `generation % 2`, so a torn write
    /// leaves the previous generation whole in the other.
    pub fn slot(&self) -> u64 {
        super::layout::SUPERBLOCK_BLOCKS[(self.generation % 2) as usize]
    }

    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; BLOCK_SIZE];
        let (disk, rest) = SuperblockDisk::mut_from_prefix(&mut b).expect("fits a block");
        *disk = self.to_disk();
        disk.crc = crc32c_parts(&[&disk.as_bytes()[CRC_START..], rest]).into();
        b
    }

    fn to_disk(&self) -> SuperblockDisk {
        SuperblockDisk {
            magic: MAGIC,
            crc: U32::ZERO,
            version: self.version.into(),
            compat: self.compat.into(),
            ro_compat: self.ro_compat.into(),
            incompat: self.incompat.into(),
            uuid: self.uuid,
            secret: self.secret.into(),
            label: self.label,
            block_size: U32::new(BLOCK_SIZE as u32),
            node_size: self.node_size.into(),
            total_blocks: self.layout.total_blocks.into(),
            groups: self.layout.groups.into(),
            log_start: self.layout.log_start.into(),
            log_blocks: self.layout.log_blocks.into(),
            generation: self.generation.into(),
            checkpoint_seq: self.checkpoint_seq.into(),
            state: self.state.into(),
            roots: self.roots.map(|r| RootDisk {
                ptr: r.ptr.into(),
                level: r.level,
            }),
            next_ino: self.next_ino.into(),
            free_blocks: self.free_blocks.into(),
            inode_count: self.inode_count.into(),
            created: TimespecDisk {
                sec: self.created.sec.into(),
                nsec: self.created.nsec.into(),
            },
            mount_count: self.mount_count.into(),
            log_tail: self.log_tail.into(),
            log_epoch: self.log_epoch.into(),
            legs: self.legs,
            rebuild_cursor: self.rebuild_cursor.into(),
        }
    }

    /// Decodes one block, checking magic, checksum and field sanity.
    pub fn decode(b: &[u8]) -> Result<Superblock, Corrupt> {
        let b = b.get(..BLOCK_SIZE).ok_or(Corrupt::Truncated)?;
        let (disk, _) = SuperblockDisk::ref_from_prefix(b).map_err(|_| Corrupt::Truncated)?;
        if disk.magic != MAGIC {
            return Err(Corrupt::Magic);
        }
        if disk.crc.get() != crc32c(&b[CRC_START..]) {
            return Err(Corrupt::Checksum);
        }
        Self::from_disk(disk).validate(disk.block_size.get())
    }

    fn from_disk(d: &SuperblockDisk) -> Superblock {
        Superblock {
            version: d.version.get(),
            compat: d.compat.get(),
            ro_compat: d.ro_compat.get(),
            incompat: d.incompat.get(),
            uuid: d.uuid,
            secret: d.secret.get(),
            label: d.label,
            node_size: d.node_size.get(),
            layout: Layout {
                total_blocks: d.total_blocks.get(),
                groups: d.groups.get(),
                log_start: d.log_start.get(),
                log_blocks: d.log_blocks.get(),
            },
            generation: d.generation.get(),
            checkpoint_seq: d.checkpoint_seq.get(),
            state: d.state.get(),
            roots: d.roots.map(|r| Root {
                ptr: NodePtr::from(&r.ptr),
                level: r.level,
            }),
            next_ino: d.next_ino.get(),
            free_blocks: d.free_blocks.get(),
            inode_count: d.inode_count.get(),
            created: Timespec {
                sec: d.created.sec.get(),
                nsec: d.created.nsec.get(),
            },
            mount_count: d.mount_count.get(),
            log_tail: d.log_tail.get(),
            log_epoch: d.log_epoch.get(),
            legs: d.legs,
            rebuild_cursor: d.rebuild_cursor.get(),
        }
    }

    fn validate(self, block_size: u32) -> Result<Superblock, Corrupt> {
        if block_size as usize != BLOCK_SIZE {
            return Err(Corrupt::Field("block_size"));
        }
        self.check()?;
        Ok(self)
    }

    /// The checks [`Superblock::decode`] makes of every field: what a mount and fsck
    /// accept. The filesystem checks each superblock it writes the same way
    /// (`core::checks`), so it never writes one the next mount would refuse.
    pub fn check(&self) -> Result<(), Corrupt> {
        if self.version != FORMAT_VERSION {
            return Err(Corrupt::Field("version"));
        }
        if !self.node_size.is_power_of_two()
            || !(super::MIN_NODE_SIZE..=super::MAX_NODE_SIZE).contains(&self.node_size)
        {
            return Err(Corrupt::Field("node_size"));
        }
        // Consistent first: `fixed_groups` trusts `log_start`.
        if !self.layout.is_consistent()
            || self.layout.groups > self.layout.fixed_groups()
                && self.incompat & super::features::INCOMPAT_GROWN == 0
        {
            return Err(Corrupt::Field("layout"));
        }
        if self
            .roots
            .iter()
            .any(|root| root.ptr.addr != 0 && !root.ptr.is_valid(&self.layout, self.node_size))
        {
            return Err(Corrupt::Field("root"));
        }
        let counters = [
            ("generation", self.generation),
            ("checkpoint_seq", self.checkpoint_seq),
            ("log_tail", self.log_tail),
            ("log_epoch", self.log_epoch),
            ("mount_count", self.mount_count),
        ];
        if let Some((name, _)) = counters.iter().find(|(_, v)| *v >= MAX_SEQ) {
            return Err(Corrupt::Field(name));
        }
        // The epoch is the generation of a superblock its mount wrote.
        if self.log_epoch > self.generation {
            return Err(Corrupt::Field("log_epoch"));
        }
        if !(ROOT_INO + 1..=MAX_INO).contains(&self.next_ino) {
            return Err(Corrupt::Field("next_ino"));
        }
        // The root exists, and every inode has a number below `next_ino`.
        if self.inode_count == 0 || self.inode_count >= self.next_ino {
            return Err(Corrupt::Field("inode_count"));
        }
        if self.free_blocks > self.layout.data_blocks() {
            return Err(Corrupt::Field("free_blocks"));
        }
        if self.created.nsec >= 1_000_000_000 {
            return Err(Corrupt::Field("created"));
        }
        let count = self.leg_count();
        let mirrored = self.incompat & super::features::INCOMPAT_MIRROR != 0;
        if self.legs[count..].iter().any(|&l| l != leg::NONE)
            || self.legs.iter().any(|&l| l > leg::FAILED)
            || mirrored != (count > 0)
        {
            return Err(Corrupt::Field("legs"));
        }
        let rebuilding = self.legs.iter().filter(|&&l| l == leg::REBUILDING).count();
        if rebuilding > 1
            || rebuilding == 0 && self.rebuild_cursor != 0
            || self.rebuild_cursor > self.layout.total_blocks
        {
            return Err(Corrupt::Field("rebuild_cursor"));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        let mut label = [0u8; LABEL_LEN];
        label[..4].copy_from_slice(b"test");
        Superblock {
            version: FORMAT_VERSION,
            compat: 0,
            ro_compat: 0,
            incompat: 0,
            uuid: [7; 16],
            secret: 0x1234,
            label,
            node_size: 65536,
            layout: Layout::for_size(262_144),
            generation: 5,
            checkpoint_seq: 4,
            state: state::CLEAN,
            roots: [Root {
                ptr: NodePtr {
                    addr: 9000,
                    nonce: 1,
                    blocks: 2,
                },
                level: 1,
            }; TreeId::COUNT],
            next_ino: 100,
            free_blocks: 1000,
            inode_count: 3,
            created: Timespec { sec: 1, nsec: 2 },
            mount_count: 2,
            log_tail: 77,
            log_epoch: 3,
            legs: [0; MAX_LEGS],
            rebuild_cursor: 0,
        }
    }

    const GOLDEN_SUPERBLOCK_CRC: u32 = 2_202_086_992;

    #[test]
    fn round_trip() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb.clone()));
        assert_eq!(sb.label_bytes(), b"test");
    }

    #[test]
    fn leg_table() {
        let mut sb = sample();
        assert_eq!(sb.leg_count(), 0);
        sb.legs[..2].copy_from_slice(&[leg::ACTIVE, leg::FAILED]);
        assert!(
            Superblock::decode(&sb.encode()).is_err(),
            "legs without the feature"
        );
        sb.incompat |= crate::format::features::INCOMPAT_MIRROR;
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb.clone()));
        assert_eq!(sb.leg_count(), 2);
        sb.legs[3] = leg::ACTIVE;
        assert!(
            Superblock::decode(&sb.encode()).is_err(),
            "a gap in the table"
        );
        sb.legs[3] = leg::NONE;
        sb.rebuild_cursor = 5;
        assert!(
            Superblock::decode(&sb.encode()).is_err(),
            "a cursor with no leg being rebuilt"
        );
        sb.legs[1] = leg::REBUILDING;
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb.clone()));
        sb.legs[2] = leg::REBUILDING;
        assert!(
            Superblock::decode(&sb.encode()).is_err(),
            "two legs being rebuilt"
        );
        sb.legs[2] = leg::NONE;
        sb.rebuild_cursor = sb.layout.total_blocks + 1;
        assert!(Superblock::decode(&sb.encode()).is_err(), "past the end");
    }

    #[test]
    fn corruption_detected() {
        let b = sample().encode();
        for i in [0usize, 9, 20, 200, 4000] {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(Superblock::decode(&c).is_err(), "flip at {i} undetected");
        }
    }

    /// The encoding is the on-disk format: this pins every byte of the sample's block
    /// (a change here is a format change, `FORMAT_VERSION` and docs/format.md with it).
    #[test]
    fn encoding_is_pinned() {
        let b = sample().encode();
        assert_eq!(b.len(), BLOCK_SIZE);
        assert_eq!(&b[..8], b"NINEFOLD");
        assert_eq!(&b[12..16], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(
            crc32c(&b),
            GOLDEN_SUPERBLOCK_CRC,
            "superblock bytes changed"
        );
        let ptr = NodePtr {
            addr: 0x0102_0304_0506_0708,
            nonce: 0x1112_1314_1516_1718,
            blocks: 0x2122_2324,
        };
        let bytes = ptr.to_bytes();
        assert_eq!(bytes[..8], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[8..16], 0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(bytes[16..], [0x24, 0x23, 0x22, 0x21, 0, 0, 0, 0]);
        assert_eq!(NodePtr::from_bytes(&bytes), Some(ptr));
        assert_eq!(NodePtr::from_bytes(&bytes[1..]), None);
    }
}

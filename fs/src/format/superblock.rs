//! The superblock: two copies at fixed blocks ([`super::layout::SUPERBLOCK_BLOCKS`]),
//! written alternately (generation `g` goes to copy `g % 2`). Mount takes the valid copy
//! with the highest generation.

use alloc::vec::Vec;

use super::key::TreeId;
use super::layout::Layout;
use super::{Corrupt, BLOCK_SIZE, FORMAT_VERSION};
use crate::util::bytes::{Reader, Writer};
use crate::util::crc::crc32c;
use vfs::Timespec;

/// Magic at the start of a superblock.
pub const MAGIC: [u8; 8] = *b"NINEFOLD";
/// Length of the label field.
pub const LABEL_LEN: usize = 64;

/// Superblock state flags.
pub mod state {
    /// Unmounted cleanly: no checkpoint was in flight, nothing needs recovery.
    pub const CLEAN: u32 = 1;
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
    pub const ENCODED_LEN: usize = 24;

    /// Encodes.
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.addr).u64(self.nonce).u32(self.blocks).u32(0);
    }

    /// Encodes into a fresh vector (the value of an interior node entry).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(Self::ENCODED_LEN);
        self.encode(&mut w);
        w.finish()
    }

    /// Decodes.
    pub fn decode(r: &mut Reader<'_>) -> Option<NodePtr> {
        let p = NodePtr {
            addr: r.u64()?,
            nonce: r.u64()?,
            blocks: r.u32()?,
        };
        r.u32()?;
        Some(p)
    }

    /// Decodes an interior node entry's value (exactly [`Self::ENCODED_LEN`] bytes).
    pub fn from_bytes(b: &[u8]) -> Option<NodePtr> {
        if b.len() != Self::ENCODED_LEN {
            return None;
        }
        Self::decode(&mut Reader::new(b))
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
}

fn encode_time(w: &mut Writer, t: Timespec) {
    w.i64(t.sec).u32(t.nsec);
}

fn decode_time(r: &mut Reader<'_>) -> Option<Timespec> {
    let t = Timespec {
        sec: r.i64()?,
        nsec: r.u32()?,
    };
    (t.nsec < 1_000_000_000).then_some(t)
}

impl Superblock {
    /// The root of `tree`.
    pub fn root(&self, tree: TreeId) -> Root {
        self.roots[tree as usize]
    }

    /// The label as bytes, without padding.
    pub fn label_bytes(&self) -> &[u8] {
        let end = self.label.iter().position(|&b| b == 0).unwrap_or(LABEL_LEN);
        &self.label[..end]
    }

    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(BLOCK_SIZE);
        w.bytes(&MAGIC).u32(0).u32(self.version);
        w.u64(self.compat).u64(self.ro_compat).u64(self.incompat);
        w.bytes(&self.uuid).u64(self.secret).bytes(&self.label);
        w.u32(BLOCK_SIZE as u32).u32(self.node_size);
        w.u64(self.layout.total_blocks).u32(self.layout.groups);
        w.u64(self.layout.log_start).u64(self.layout.log_blocks);
        w.u64(self.generation)
            .u64(self.checkpoint_seq)
            .u32(self.state);
        for root in &self.roots {
            root.ptr.encode(&mut w);
            w.u8(root.level);
        }
        w.u64(self.next_ino)
            .u64(self.free_blocks)
            .u64(self.inode_count);
        encode_time(&mut w, self.created);
        w.u64(self.mount_count);
        w.u64(self.log_tail).u64(self.log_epoch);
        let mut b = w.finish();
        assert!(b.len() <= BLOCK_SIZE, "superblock fields overflow a block");
        b.resize(BLOCK_SIZE, 0);
        let crc = crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one block, checking magic, checksum and field sanity.
    pub fn decode(b: &[u8]) -> Result<Superblock, Corrupt> {
        if b.len() < BLOCK_SIZE {
            return Err(Corrupt::Truncated);
        }
        let b = &b[..BLOCK_SIZE];
        if b[..8] != MAGIC {
            return Err(Corrupt::Magic);
        }
        let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if crc != crc32c(&b[12..]) {
            return Err(Corrupt::Checksum);
        }
        Self::decode_fields(&mut Reader::new(&b[12..])).ok_or(Corrupt::Truncated)?
    }

    fn decode_fields(r: &mut Reader<'_>) -> Option<Result<Superblock, Corrupt>> {
        let version = r.u32()?;
        let (compat, ro_compat, incompat) = (r.u64()?, r.u64()?, r.u64()?);
        let uuid = r.array()?;
        let secret = r.u64()?;
        let label = r.array()?;
        let block_size = r.u32()?;
        let node_size = r.u32()?;
        let total_blocks = r.u64()?;
        let groups = r.u32()?;
        let log_start = r.u64()?;
        let log_blocks = r.u64()?;
        let generation = r.u64()?;
        let checkpoint_seq = r.u64()?;
        let state = r.u32()?;
        let mut roots = [Root::default(); TreeId::COUNT];
        for root in &mut roots {
            root.ptr = NodePtr::decode(r)?;
            root.level = r.u8()?;
        }
        let next_ino = r.u64()?;
        let free_blocks = r.u64()?;
        let inode_count = r.u64()?;
        let created = decode_time(r)?;
        let mount_count = r.u64()?;
        let log_tail = r.u64()?;
        let log_epoch = r.u64()?;
        let layout = Layout {
            total_blocks,
            groups,
            log_start,
            log_blocks,
        };
        let sb = Superblock {
            version,
            compat,
            ro_compat,
            incompat,
            uuid,
            secret,
            label,
            node_size,
            layout,
            generation,
            checkpoint_seq,
            state,
            roots,
            next_ino,
            free_blocks,
            inode_count,
            created,
            mount_count,
            log_tail,
            log_epoch,
        };
        Some(sb.validate(block_size))
    }

    fn validate(self, block_size: u32) -> Result<Superblock, Corrupt> {
        if self.version != FORMAT_VERSION {
            return Err(Corrupt::Field("version"));
        }
        if block_size as usize != BLOCK_SIZE {
            return Err(Corrupt::Field("block_size"));
        }
        if !self.node_size.is_power_of_two()
            || !(super::MIN_NODE_SIZE..=super::MAX_NODE_SIZE).contains(&self.node_size)
        {
            return Err(Corrupt::Field("node_size"));
        }
        if Layout::for_size(self.layout.total_blocks).groups != self.layout.groups
            || self.layout.log_start
                != super::layout::BITMAP_START + 2 * u64::from(self.layout.groups)
            || self.layout.data_start() >= self.layout.total_blocks
        {
            return Err(Corrupt::Field("layout"));
        }
        for root in &self.roots {
            let node_blocks = u64::from(self.node_size) / BLOCK_SIZE as u64;
            if root.ptr.addr != 0
                && (root.ptr.addr < self.layout.data_start()
                    || root.ptr.addr + node_blocks > self.layout.total_blocks
                    || root.ptr.blocks == 0
                    || u64::from(root.ptr.blocks) > node_blocks)
            {
                return Err(Corrupt::Field("root"));
            }
        }
        if self.free_blocks > self.layout.total_blocks {
            return Err(Corrupt::Field("free_blocks"));
        }
        Ok(self)
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

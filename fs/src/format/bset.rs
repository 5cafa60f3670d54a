//! Bsets: the unit a btree node is written in. A node's on-disk extent
//! (`node_size` bytes) holds a sequence of bsets, each starting on a block boundary.
//! The first is written when the node is created (copy-on-write to a fresh location);
//! each later checkpoint that changes the node appends one bset holding only the changed
//! keys and whiteouts. The parent's pointer ([`NodePtr::blocks`]) records how many blocks
//! are committed; readers read exactly those.
//!
//! ```text
//! header (64 bytes)
//! 0  magic "NFBS"            4  crc32c of header bytes 8..64
//! 8  crc32c of everything after the header (payload and padding)
//! 12 flags u16   14 tree u8   15 level u8
//! 16 node nonce u64          24 checkpoint seq u64
//! 32 payload_len u32         36 nkeys u32
//! 40 offset_blocks u32 (where this bset starts in the node)   44..64 reserved
//! payload: nkeys entries, strictly increasing keys
//!   objectid u64, kind u8, offset u64, flags u8 (1 = whiteout), len u16, value[len]
//! zero padding to the next block boundary
//! ```
//!
//! [`NodePtr::blocks`]: super::superblock::NodePtr::blocks

use alloc::vec::Vec;

use super::key::{Key, TreeId};
use super::{Corrupt, BLOCK_SIZE, MAX_VALUE_LEN};
use crate::util::bytes::{Reader, Writer};
use crate::util::crc::crc32c;

/// Magic of a bset header.
pub const MAGIC: [u8; 4] = *b"NFBS";
/// Size of a bset header.
pub const HEADER_LEN: usize = 64;
/// Encoded size of an entry, excluding its value.
pub const ENTRY_OVERHEAD: usize = Key::ENCODED_LEN + 3;
/// Entry flag: the entry is a whiteout (the key is deleted).
pub const FLAG_WHITEOUT: u8 = 1;

/// Encoded size of an entry with a value of `val_len` bytes.
pub const fn entry_len(val_len: usize) -> usize {
    ENTRY_OVERHEAD + val_len
}

/// Which node a bset belongs to. A bset is accepted only by the node it was written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeId {
    /// The tree.
    pub tree: TreeId,
    /// The node's level (0 = leaf).
    pub level: u8,
    /// The node's per-allocation nonce.
    pub nonce: u64,
}

/// A decoded bset header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BsetHeader {
    /// Owner.
    pub id: NodeId,
    /// The checkpoint sequence it was written in.
    pub seq: u64,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// Number of entries.
    pub nkeys: u32,
    /// Start of this bset within the node, in blocks.
    pub offset_blocks: u32,
}

impl BsetHeader {
    /// Blocks this bset occupies (header, payload, padding).
    pub fn blocks(&self) -> u32 {
        (HEADER_LEN + self.payload_len as usize).div_ceil(BLOCK_SIZE) as u32
    }
}

/// One decoded entry; `val` is `None` for a whiteout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEntry<'a> {
    /// The key.
    pub key: Key,
    /// The value, or `None` for a whiteout.
    pub val: Option<&'a [u8]>,
}

/// A decoded bset.
#[derive(Clone, Debug)]
pub struct ParsedBset<'a> {
    /// Its header.
    pub header: BsetHeader,
    /// Its entries, in key order.
    pub entries: Vec<RawEntry<'a>>,
}

/// Where and why a node failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCorrupt {
    /// Block offset within the node of the bad bset.
    pub offset_blocks: u32,
    /// What is wrong.
    pub what: Corrupt,
}

/// Encodes one bset. Entries must be in strictly increasing key order. The result is
/// padded to whole blocks.
pub fn encode<'a>(
    id: NodeId,
    seq: u64,
    offset_blocks: u32,
    entries: impl IntoIterator<Item = (Key, Option<&'a [u8]>)>,
) -> Vec<u8> {
    UnsealedBset::new(id, seq, offset_blocks, 0, entries).seal()
}

/// A bset with its entries in place but its header not yet written: what a checkpoint
/// copies out of a node while it holds the filesystem's core lock. The copy is one
/// pass into a buffer of the final size; [`UnsealedBset::seal`] writes the header and
/// both checksums — the rest of encoding — later, with no lock held, while the node may
/// already be changing again.
#[derive(Debug)]
pub struct UnsealedBset {
    /// Room for the header, the payload, zero padding to whole blocks.
    buf: Vec<u8>,
    id: NodeId,
    seq: u64,
    offset_blocks: u32,
    payload_len: u32,
    nkeys: u32,
}

impl UnsealedBset {
    /// Copies `entries` (strictly increasing keys) into a new bset of node `id` for
    /// checkpoint `seq`, starting `offset_blocks` into the node. `payload_len` is the
    /// entries' encoded size if known (it sizes the buffer; 0: grow as needed).
    pub fn new<'a>(
        id: NodeId,
        seq: u64,
        offset_blocks: u32,
        payload_len: usize,
        entries: impl IntoIterator<Item = (Key, Option<&'a [u8]>)>,
    ) -> UnsealedBset {
        let mut buf = Vec::with_capacity(padded(payload_len));
        buf.resize(HEADER_LEN, 0);
        let mut nkeys = 0u32;
        let mut last: Option<Key> = None;
        for (key, val) in entries {
            assert!(last.is_none_or(|l| l < key), "bset keys out of order");
            last = Some(key);
            let v = val.unwrap_or(&[]);
            assert!(v.len() <= MAX_VALUE_LEN, "item value too large");
            // The fixed part of the entry in one copy: this runs under the core lock.
            let mut head = [0u8; ENTRY_OVERHEAD];
            head[..Key::ENCODED_LEN].copy_from_slice(&key.to_bytes());
            head[Key::ENCODED_LEN] = if val.is_none() { FLAG_WHITEOUT } else { 0 };
            head[Key::ENCODED_LEN + 1..].copy_from_slice(&(v.len() as u16).to_le_bytes());
            buf.extend_from_slice(&head);
            buf.extend_from_slice(v);
            nkeys += 1;
        }
        let written = buf.len() - HEADER_LEN;
        debug_assert!(
            payload_len == 0 || written == payload_len,
            "bset payload of {written} bytes, {payload_len} expected"
        );
        buf.resize(padded(written), 0);
        UnsealedBset {
            buf,
            id,
            seq,
            offset_blocks,
            payload_len: written as u32,
            nkeys,
        }
    }

    /// Its size in bytes (whole blocks, as it will be written).
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// The bset, ready to write: the header and both checksums filled in.
    pub fn seal(self) -> Vec<u8> {
        let UnsealedBset {
            mut buf,
            id,
            seq,
            offset_blocks,
            payload_len,
            nkeys,
        } = self;
        let mut w = Writer::with_capacity(HEADER_LEN);
        w.bytes(&MAGIC).u32(0).u32(0).u16(0);
        w.u8(id.tree as u8).u8(id.level).u64(id.nonce).u64(seq);
        w.u32(payload_len).u32(nkeys).u32(offset_blocks);
        w.zeros(HEADER_LEN - 44);
        buf[..HEADER_LEN].copy_from_slice(&w.buf);
        // The body checksum covers the padding too, so every byte of a committed bset is
        // checked.
        let body_crc = crc32c(&buf[HEADER_LEN..]);
        buf[8..12].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32c(&buf[8..HEADER_LEN]);
        buf[4..8].copy_from_slice(&header_crc.to_le_bytes());
        buf
    }
}

/// Bytes of header and `payload_len` bytes of payload take, padded to whole blocks.
fn padded(payload_len: usize) -> usize {
    (HEADER_LEN + payload_len).div_ceil(BLOCK_SIZE) * BLOCK_SIZE
}

/// Decodes a bset header from the start of `b`, checking magic and header checksum.
pub fn decode_header(b: &[u8]) -> Result<BsetHeader, Corrupt> {
    if b.len() < HEADER_LEN {
        return Err(Corrupt::Truncated);
    }
    if b[..4] != MAGIC {
        return Err(Corrupt::Magic);
    }
    let crc = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    if crc != crc32c(&b[8..HEADER_LEN]) {
        return Err(Corrupt::Checksum);
    }
    let mut r = Reader::new(&b[12..HEADER_LEN]);
    let _flags = r.u16().ok_or(Corrupt::Truncated)?;
    let tree = TreeId::from_u8(r.u8().ok_or(Corrupt::Truncated)?).ok_or(Corrupt::Field("tree"))?;
    let level = r.u8().ok_or(Corrupt::Truncated)?;
    let nonce = r.u64().ok_or(Corrupt::Truncated)?;
    let seq = r.u64().ok_or(Corrupt::Truncated)?;
    let payload_len = r.u32().ok_or(Corrupt::Truncated)?;
    let nkeys = r.u32().ok_or(Corrupt::Truncated)?;
    let offset_blocks = r.u32().ok_or(Corrupt::Truncated)?;
    Ok(BsetHeader {
        id: NodeId { tree, level, nonce },
        seq,
        payload_len,
        nkeys,
        offset_blocks,
    })
}

fn decode_entries(payload: &[u8], nkeys: u32) -> Result<Vec<RawEntry<'_>>, Corrupt> {
    // Every entry takes at least its fixed part: a count the payload cannot hold is
    // corrupt, and nothing is allocated for it.
    if nkeys as usize > payload.len() / ENTRY_OVERHEAD {
        return Err(Corrupt::Field("key count"));
    }
    let mut r = Reader::new(payload);
    let mut out = Vec::with_capacity(nkeys as usize);
    let mut last: Option<Key> = None;
    for _ in 0..nkeys {
        let key = Key::decode(&mut r).ok_or(Corrupt::Truncated)?;
        if last.is_some_and(|l| l >= key) {
            return Err(Corrupt::Field("key order"));
        }
        last = Some(key);
        let flags = r.u8().ok_or(Corrupt::Truncated)?;
        let len = r.u16().ok_or(Corrupt::Truncated)? as usize;
        if len > MAX_VALUE_LEN || flags & !FLAG_WHITEOUT != 0 {
            return Err(Corrupt::Field("entry"));
        }
        let v = r.bytes(len).ok_or(Corrupt::Truncated)?;
        let val = if flags & FLAG_WHITEOUT != 0 {
            if len != 0 {
                return Err(Corrupt::Field("whiteout"));
            }
            None
        } else {
            Some(v)
        };
        out.push(RawEntry { key, val });
    }
    if r.remaining() != 0 {
        return Err(Corrupt::Field("payload length"));
    }
    Ok(out)
}

/// Decodes the committed bsets of a node: `buf` holds (at least) its first `blocks`
/// blocks. Every bset must belong to `id`, start where the previous one ended, carry
/// valid checksums and sorted keys, and together they must fill exactly `blocks`
/// blocks. Sequences must not decrease.
pub fn parse_node(buf: &[u8], id: NodeId, blocks: u32) -> Result<Vec<ParsedBset<'_>>, NodeCorrupt> {
    let mut out = Vec::new();
    let mut at = 0u32;
    let mut last_seq = 0u64;
    let bad = |offset_blocks, what| NodeCorrupt {
        offset_blocks,
        what,
    };
    if blocks == 0 || buf.len() < blocks as usize * BLOCK_SIZE {
        return Err(bad(0, Corrupt::Truncated));
    }
    while at < blocks {
        let start = at as usize * BLOCK_SIZE;
        let header = decode_header(&buf[start..]).map_err(|e| bad(at, e))?;
        if header.id != id {
            return Err(bad(at, Corrupt::Field("node identity")));
        }
        if header.offset_blocks != at {
            return Err(bad(at, Corrupt::Field("bset offset")));
        }
        if header.seq < last_seq {
            return Err(bad(at, Corrupt::Field("bset sequence")));
        }
        let end = at.checked_add(header.blocks()).filter(|&e| e <= blocks);
        let Some(end) = end else {
            return Err(bad(at, Corrupt::Field("bset length")));
        };
        let body = &buf[start + HEADER_LEN..end as usize * BLOCK_SIZE];
        let crc = u32::from_le_bytes(buf[start + 8..start + 12].try_into().expect("4 bytes"));
        if crc != crc32c(body) {
            return Err(bad(at, Corrupt::Checksum));
        }
        let payload = &body[..header.payload_len as usize];
        let entries = decode_entries(payload, header.nkeys).map_err(|e| bad(at, e))?;
        last_seq = header.seq;
        out.push(ParsedBset { header, entries });
        at = end;
    }
    Ok(out)
}

/// Checks that no bset of a parsed node was written after checkpoint `last_seq`, the
/// latest one written (committed, or being written): a later sequence is forged or
/// damaged, and the next append to the node (sequence `last_seq + 1`) would follow a
/// higher one, which [`parse_node`] then refuses.
pub fn check_written_by(bsets: &[ParsedBset<'_>], last_seq: u64) -> Result<(), NodeCorrupt> {
    match bsets.iter().find(|b| b.header.seq > last_seq) {
        Some(b) => Err(NodeCorrupt {
            offset_blocks: b.header.offset_blocks,
            what: Corrupt::Field("bset sequence after the last checkpoint"),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: NodeId = NodeId {
        tree: TreeId::Fs,
        level: 0,
        nonce: 42,
    };

    fn two_bsets() -> Vec<u8> {
        let mut node = encode(
            ID,
            3,
            0,
            [
                (Key::new(1, 1, 0), Some(&b"one"[..])),
                (Key::new(2, 1, 0), Some(&[7u8; 5000][..2000])),
            ],
        );
        assert_eq!(node.len(), BLOCK_SIZE);
        let blocks = (node.len() / BLOCK_SIZE) as u32;
        node.extend(encode(ID, 4, blocks, [(Key::new(1, 1, 0), None)]));
        node
    }

    #[test]
    fn round_trip() {
        let node = two_bsets();
        let sets = parse_node(&node, ID, 2).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].entries[0].val, Some(&b"one"[..]));
        assert_eq!(sets[0].entries[1].val.unwrap().len(), 2000);
        assert_eq!(
            sets[1].entries,
            [RawEntry {
                key: Key::new(1, 1, 0),
                val: None
            }]
        );
        assert_eq!(sets[1].header.seq, 4);
        // Reading only the first committed block ignores the append.
        assert_eq!(parse_node(&node, ID, 1).unwrap().len(), 1);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let node = two_bsets();
        let used = [
            HEADER_LEN + 2 * ENTRY_OVERHEAD + 3 + 2000,
            BLOCK_SIZE + HEADER_LEN + ENTRY_OVERHEAD,
        ];
        for (i, byte) in node.iter().enumerate() {
            let in_bset0 = i < used[0];
            let in_bset1 = (BLOCK_SIZE..used[1]).contains(&i);
            if !(in_bset0 || in_bset1) {
                continue; // padding is not covered, and need not be
            }
            let mut c = node.clone();
            c[i] = byte ^ 0x01;
            assert!(parse_node(&c, ID, 2).is_err(), "flip at {i} undetected");
        }
    }

    #[test]
    fn identity_and_length_checked() {
        let node = two_bsets();
        let other = NodeId { nonce: 43, ..ID };
        assert_eq!(
            parse_node(&node, other, 2).unwrap_err().what,
            Corrupt::Field("node identity")
        );
        let leveled = NodeId { level: 1, ..ID };
        assert!(parse_node(&node, leveled, 2).is_err());
        // Claiming more blocks than were written hits the unwritten (zero) block.
        let mut longer = node.clone();
        longer.resize(3 * BLOCK_SIZE, 0);
        assert_eq!(
            parse_node(&longer, ID, 3).unwrap_err(),
            NodeCorrupt {
                offset_blocks: 2,
                what: Corrupt::Magic
            }
        );
        assert!(parse_node(&node, ID, 0).is_err());
    }

    /// A header that claims more keys than its payload can hold (resealed, as a
    /// forger would) is corrupt, before anything is allocated for them.
    #[test]
    fn key_count_is_bounded_by_the_payload() {
        let node = two_bsets();
        for nkeys in [u32::MAX, 3, (BLOCK_SIZE / ENTRY_OVERHEAD) as u32] {
            let mut c = node.clone();
            c[36..40].copy_from_slice(&nkeys.to_le_bytes());
            let crc = crc32c(&c[8..HEADER_LEN]);
            c[4..8].copy_from_slice(&crc.to_le_bytes());
            let what = parse_node(&c, ID, 2).unwrap_err().what;
            assert!(
                matches!(what, Corrupt::Field("key count") | Corrupt::Truncated),
                "{nkeys} keys: {what:?}"
            );
        }
        // Fewer keys than the payload holds leave bytes over.
        let mut c = node.clone();
        c[36..40].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c(&c[8..HEADER_LEN]);
        c[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            parse_node(&c, ID, 2).unwrap_err().what,
            Corrupt::Field("payload length")
        );
    }
}

//! `node`: the btree node decoder (`format::bset::parse_node`), the node built from it
//! (`btree::Node::from_disk`) and the item decoders of `format::items`.
//!
//! Input: a flags byte, then the node's bsets *without their padding*: each a 64-byte
//! header and the `payload_len` bytes its header names (cut at the end of the input).
//! The target lays them out as on disk — each from a block boundary, zero-padded — and,
//! unless flags bit 0 is set, reseals both checksums of each; flag bit 1 leaves the
//! `offset_blocks` fields as given (else each is set to where its bset lands); bits
//! 2..3 claim 0..3 more blocks than the bsets fill; bit 4 expects another nonce than
//! the first header's. The node is expected to belong to the tree, level and nonce of
//! the first header.
//!
//! Checked: no panic; a node that decodes keeps its invariants, its entries are what
//! the bsets say (later bsets win, whiteouts delete), and re-encoded whole it decodes
//! to the same entries.

use std::collections::BTreeMap;

use ninefs::btree::Node;
use ninefs::format::bset::{self, parse_node, NodeId};
use ninefs::format::key::{kind, Key, TreeId};
use ninefs::format::{items, BLOCK_SIZE};

use crate::envelope::Envelope;
use crate::reseal;

/// Most blocks a node may have (256 KiB nodes).
const MAX_BLOCKS: usize = 64;

/// Lays out compact bsets as a node.
fn layout(mut rest: &[u8], fix_offsets: bool, seal: bool) -> Vec<u8> {
    let mut node = Vec::new();
    while !rest.is_empty() && node.len() < MAX_BLOCKS * BLOCK_SIZE {
        let mut header = [0u8; bset::HEADER_LEN];
        let n = rest.len().min(bset::HEADER_LEN);
        header[..n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
        let payload_len = u32::from_le_bytes(header[32..36].try_into().expect("4 bytes")) as usize;
        let take = payload_len.min(rest.len()).min(MAX_BLOCKS * BLOCK_SIZE);
        let start = node.len();
        if fix_offsets {
            let at = (start / BLOCK_SIZE) as u32;
            header[40..44].copy_from_slice(&at.to_le_bytes());
        }
        node.extend_from_slice(&header);
        node.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        // Pad to the blocks the header claims (as a writer would), or at least to a
        // block boundary when the payload was cut short.
        let claimed = (bset::HEADER_LEN + payload_len)
            .div_ceil(BLOCK_SIZE)
            .min(MAX_BLOCKS);
        let end = (start + claimed * BLOCK_SIZE).max(node.len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE);
        node.resize(end, 0);
        if seal {
            reseal::bset(&mut node, start);
        }
    }
    node
}

/// Decodes an item's value with the decoder of its kind (results are thrown away: the
/// point is that none panics on any value).
fn decode_value(tree: TreeId, key: &Key, val: &[u8]) {
    match (tree, key.kind) {
        (TreeId::Fs, kind::INODE) => _ = std::hint::black_box(items::InodeItem::decode(val)),
        (TreeId::Fs, kind::INODE_REF) => _ = std::hint::black_box(items::decode_inode_refs(val)),
        (TreeId::Fs, kind::XATTR) => _ = std::hint::black_box(items::decode_xattrs(val)),
        (TreeId::Fs, kind::DIR_ENTRY) => _ = std::hint::black_box(items::decode_dir_entries(val)),
        (TreeId::Fs, kind::DIR_INDEX) => _ = std::hint::black_box(items::DirIndexRec::decode(val)),
        (TreeId::Fs, kind::EXTENT_DATA) => _ = std::hint::black_box(items::FileExtent::decode(val)),
        (TreeId::Fs, kind::SNAPSHOT) => _ = std::hint::black_box(items::SnapshotItem::decode(val)),
        (TreeId::Fs, kind::QUOTA) => _ = std::hint::black_box(items::QuotaItem::decode(val)),
        (TreeId::Extent, _) => _ = std::hint::black_box(items::ExtentItem::decode(val)),
        (TreeId::Csum, _) => _ = std::hint::black_box(items::decode_csums(val)),
        _ => {}
    }
    // Any value may be any kind's in a forged node: try the others too.
    std::hint::black_box(items::InodeItem::decode(val));
    std::hint::black_box(items::decode_dir_entries(val));
    std::hint::black_box(items::decode_inode_refs(val));
    std::hint::black_box(items::decode_xattrs(val));
    std::hint::black_box(items::SnapshotItem::decode(val));
    std::hint::black_box(items::QuotaItem::decode(val));
    std::hint::black_box(items::FileExtent::decode(val));
}

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let f = env.flags;
    let mut node = layout(env.rest(), f & 2 == 0, f & 1 == 0);
    if node.is_empty() {
        return;
    }
    let tree = TreeId::from_u8(node[14]).unwrap_or(TreeId::Fs);
    let nonce = u64::from_le_bytes(node[16..24].try_into().expect("8 bytes"));
    let id = NodeId {
        tree,
        level: node[15],
        nonce: if f & 16 != 0 { nonce ^ 1 } else { nonce },
    };
    let blocks = node.len() / BLOCK_SIZE + ((f >> 2) & 3) as usize;
    node.resize(blocks * BLOCK_SIZE, 0);
    let Ok(sets) = parse_node(&node, id, blocks as u32) else {
        return;
    };
    // What the bsets say, merged by hand.
    let mut expect: BTreeMap<Key, Option<Vec<u8>>> = BTreeMap::new();
    for s in &sets {
        for e in &s.entries {
            if let Some(v) = e.val {
                decode_value(tree, &e.key, v);
            }
            expect.insert(e.key, e.val.map(<[u8]>::to_vec));
        }
    }
    let expect: Vec<(Key, Vec<u8>)> = expect
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
    let n = Node::from_disk(id, 1000, blocks as u32, &sets);
    n.check_invariants()
        .expect("a decoded node keeps its invariants");
    let got: Vec<(Key, Vec<u8>)> = entries(&n);
    assert_eq!(got, expect, "the node holds what its bsets say");
    for (k, v) in &expect {
        assert_eq!(n.get(k), Some(&v[..]), "lookup of {k:?}");
    }
    // Re-encoded whole, it decodes to the same entries.
    let seq = sets.iter().map(|s| s.header.seq).max().unwrap_or(0);
    let again = n.encode_full(seq).seal();
    let b = (again.len() / BLOCK_SIZE) as u32;
    let sets2 = parse_node(&again, id, b).expect("a re-encoded node decodes");
    let n2 = Node::from_disk(id, 1000, b, &sets2);
    assert_eq!(entries(&n2), expect, "re-encoded node");
}

fn entries(n: &Node) -> Vec<(Key, Vec<u8>)> {
    let mut out = Vec::new();
    for (k, v) in n.iter_from(&Key::MIN) {
        out.push((k, v.to_vec()));
    }
    out
}

/// Seeds: nodes of every tree of the rich image, as the filesystem wrote them (its
/// root nodes and their children, with their appended bsets), in the compact layout.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, img) in [
        ("rich", crate::images::rich_image()),
        ("crashed", crate::images::crashed_image()),
    ] {
        let report = crate::images::check(&img).expect("fsck runs");
        let mut n = 0;
        for &(start, len) in &report.metadata_blocks {
            let mut b = start as usize;
            let end = (start + len) as usize;
            while b < end {
                let at = b * BLOCK_SIZE;
                if img[at..at + 4] != bset::MAGIC {
                    b += 1;
                    continue;
                }
                // A node: its bsets, consecutive, while they follow on.
                let mut compact = vec![0u8];
                let mut blk = b;
                let first = bset::decode_header(&img[at..]).ok();
                while blk < end {
                    let Ok(h) = bset::decode_header(&img[blk * BLOCK_SIZE..]) else {
                        break;
                    };
                    if Some(h.id) != first.map(|f| f.id) {
                        break;
                    }
                    let s = blk * BLOCK_SIZE;
                    compact
                        .extend_from_slice(&img[s..s + bset::HEADER_LEN + h.payload_len as usize]);
                    blk += h.blocks() as usize;
                }
                b = blk.max(b + 1);
                if compact.len() > 1 && n < 12 {
                    out.push((format!("{name}-node-{n}"), compact));
                    n += 1;
                }
            }
        }
    }
    // Hand-made ones: two bsets with a whiteout, an interior node, an empty bset.
    let id = NodeId {
        tree: TreeId::Fs,
        level: 0,
        nonce: 42,
    };
    let mut node = bset::encode(
        id,
        3,
        0,
        [
            (Key::new(1, kind::INODE, 0), Some(&[0u8; 128][..])),
            (Key::new(2, kind::XATTR, 7), Some(&b"xattr"[..])),
        ],
    );
    node.extend(bset::encode(
        id,
        4,
        1,
        [(Key::new(1, kind::INODE, 0), None)],
    ));
    out.push(("whiteout".into(), compact(&node)));
    let interior = NodeId { level: 1, ..id };
    out.push((
        "interior".into(),
        compact(&bset::encode(
            interior,
            9,
            0,
            [(Key::MIN, Some(&[1u8; 24][..]))],
        )),
    ));
    out.push((
        "empty".into(),
        compact(&bset::encode(id, 1, 0, std::iter::empty())),
    ));
    out
}

/// A laid-out node back in the compact layout, behind a zero flags byte.
fn compact(node: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    let mut at = 0;
    while at + bset::HEADER_LEN <= node.len() {
        let Ok(h) = bset::decode_header(&node[at..]) else {
            break;
        };
        out.extend_from_slice(&node[at..at + bset::HEADER_LEN + h.payload_len as usize]);
        at += h.blocks() as usize * BLOCK_SIZE;
    }
    out
}

//! Reading one btree node from the device, for the node cache and for the walks that go
//! around it (snapshot walks, tree differences): a copy that cannot be read or fails its
//! checks is read from another leg of a mirror, and the bad copies are mended.

use alloc::vec;

use crate::btree::Node;
use crate::format::bset::{check_written_by, parse_node, NodeCorrupt, NodeId};
use crate::format::superblock::NodePtr;
use crate::format::{TreeId, BLOCK_SIZE};
use crate::io::Dev;
use block::{BlockDevice, IoError};
use vfs::{Errno, FsResult};

/// Why a node could not be read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NodeReadError {
    /// Every copy failed to read.
    Io(IoError),
    /// No copy passed the node's checks (this is the first copy's fault).
    Corrupt(NodeCorrupt),
}

/// Reads node `id` at `ptr` (its pointer already checked for size) and decodes it; a
/// bset written after checkpoint `last_seq` (the latest one written) is corrupt
/// ([`check_written_by`]). Another copy (of a mirror) is asked for only when the first
/// fails, so a single device reads and parses once.
pub(crate) async fn read_node<D: BlockDevice>(
    dev: &Dev<D>,
    id: NodeId,
    ptr: NodePtr,
    last_seq: u64,
) -> Result<Node, NodeReadError> {
    let parse = |b: &[u8]| -> Result<(), NodeCorrupt> {
        check_written_by(&parse_node(b, id, ptr.blocks)?, last_seq)
    };
    let mut buf = vec![0u8; ptr.blocks as usize * BLOCK_SIZE];
    let mut read = dev.read(ptr.addr, &mut buf).await;
    let mut other_copies = dev.copies() > 1;
    loop {
        let corrupt = match read {
            Err(e) if !other_copies => return Err(NodeReadError::Io(e)),
            Err(_) => None,
            Ok(()) => match parse_node(&buf, id, ptr.blocks) {
                Ok(sets) => match check_written_by(&sets, last_seq) {
                    Ok(()) => return Ok(Node::from_disk(id, ptr.addr, ptr.blocks, &sets)),
                    Err(c) => Some(c),
                },
                Err(c) => Some(c),
            },
        };
        if !::core::mem::take(&mut other_copies) {
            // Only a parse failure reaches here with every copy tried.
            return Err(NodeReadError::Corrupt(
                corrupt.expect("a read error returned above"),
            ));
        }
        let good = |b: &[u8]| parse(b).is_ok();
        read = dev.check_copies(ptr.addr, &mut buf, good).await.map(drop);
    }
}

/// Reads and checks the node `ptr` points to (level `level` of `tree`), for the walks
/// around the cache (snapshots' blocks, tree differences), which only read: a bset's
/// sequence is not bounded here, as the node is never appended to from such a read
/// (the cache's loads bound it, and fsck reports it).
pub async fn read_checked<D: BlockDevice>(
    dev: &Dev<D>,
    node_size: u32,
    tree: TreeId,
    level: u8,
    ptr: NodePtr,
) -> FsResult<Node> {
    let node_blocks = u64::from(node_size) / BLOCK_SIZE as u64;
    if ptr.blocks == 0 || u64::from(ptr.blocks) > node_blocks {
        log::error!("{} tree: invalid node pointer {ptr:?}", tree.name());
        return Err(Errno::EIO);
    }
    let id = NodeId {
        tree,
        level,
        nonce: ptr.nonce,
    };
    read_node(dev, id, ptr, u64::MAX).await.map_err(|e| {
        match e {
            NodeReadError::Io(e) => {
                log::error!("{} tree: reading node at {}: {e}", tree.name(), ptr.addr)
            }
            NodeReadError::Corrupt(c) => log::error!(
                "{} tree: corrupt node at {}: {}",
                tree.name(),
                ptr.addr,
                c.what
            ),
        }
        Errno::EIO
    })
}

//! The difference between two committed versions of one btree (two snapshots, or a
//! snapshot and the live tree after a checkpoint), found by walking both from their
//! roots and skipping every subtree they share.
//!
//! Copy-on-write makes sharing cheap to see: a node is never changed in place past its
//! committed length, so two equal pointers (address, nonce, committed length) are the
//! same subtree. Both trees are expanded level by level from the top; at each level the
//! pointers both frontiers hold are dropped from both, so only the nodes on the paths to
//! a change are read: the cost grows with the change, not with the tree.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use crate::format::superblock::{NodePtr, Root};
use crate::format::{Key, TreeId};
use crate::io::Dev;
use block::BlockDevice;
use vfs::{Errno, FsResult};

pub use crate::io::node_read::read_checked as read_node;

/// A key whose value differs between the two trees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The value in the old tree (`None`: absent).
    pub old: Option<Vec<u8>>,
    /// The value in the new tree (`None`: absent).
    pub new: Option<Vec<u8>>,
}

/// What [`diff`] found.
#[derive(Clone, Debug, Default)]
pub struct TreeDiff {
    /// Every key whose value differs, in key order.
    pub changes: BTreeMap<Key, Change>,
    /// Nodes read (both trees): the cost of the walk.
    pub nodes_read: u64,
}

/// A node in a frontier: level, address, nonce, committed length (the whole pointer:
/// equal entries are the same subtree).
type Entry = (u8, u64, u64, u32);

/// One side's frontier: nodes not yet known to be shared.
type Frontier = BTreeSet<Entry>;

fn entry(level: u8, p: NodePtr) -> Entry {
    (level, p.addr, p.nonce, p.blocks)
}

fn start(root: Option<Root>) -> Frontier {
    root.filter(|r| r.ptr.addr != 0)
        .map(|r| entry(r.level, r.ptr))
        .into_iter()
        .collect()
}

/// The keys whose values differ between `tree` as rooted at `old` (`None`: empty) and
/// at `new`, reading only the nodes the two do not share.
pub async fn diff<D: BlockDevice>(
    dev: &Dev<D>,
    node_size: u32,
    tree: TreeId,
    old: Option<Root>,
    new: Option<Root>,
) -> FsResult<TreeDiff> {
    let mut sides = [start(old), start(new)];
    let mut items: [BTreeMap<Key, Vec<u8>>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut nodes_read = 0;
    loop {
        let shared: Vec<Entry> = sides[0].intersection(&sides[1]).copied().collect();
        for p in &shared {
            sides[0].remove(p);
            sides[1].remove(p);
        }
        // Expand the highest level first, so a subtree is compared with those of the
        // other tree at the same height before either is read further.
        let Some(level) = sides.iter().flat_map(|s| s.iter().map(|e| e.0)).max() else {
            break;
        };
        for (side, out) in sides.iter_mut().zip(items.iter_mut()) {
            let top: Vec<Entry> = side.iter().filter(|e| e.0 == level).copied().collect();
            for e in top {
                side.remove(&e);
                let ptr = NodePtr {
                    addr: e.1,
                    nonce: e.2,
                    blocks: e.3,
                };
                let node = read_node(dev, node_size, tree, level, ptr).await?;
                nodes_read += 1;
                for (k, v) in node.iter_from(&Key::MIN) {
                    if level > 0 {
                        let child = NodePtr::from_bytes(v).ok_or(Errno::EIO)?;
                        side.insert(entry(level - 1, child));
                    } else {
                        out.insert(k, v.to_vec());
                    }
                }
            }
        }
    }
    let [mut old_items, new_items] = items;
    let mut changes = BTreeMap::new();
    for (k, v) in new_items {
        match old_items.remove(&k) {
            Some(o) if o == v => {}
            o => {
                changes.insert(
                    k,
                    Change {
                        old: o,
                        new: Some(v),
                    },
                );
            }
        }
    }
    for (k, o) in old_items {
        changes.insert(
            k,
            Change {
                old: Some(o),
                new: None,
            },
        );
    }
    Ok(TreeDiff {
        changes,
        nodes_read,
    })
}

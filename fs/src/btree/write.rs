//! Writing dirty nodes: the btree half of a checkpoint.
//!
//! Each tree is walked bottom-up over its cached nodes. A dirty node either appends one
//! bset with its changes at its append position, or — if it has no location yet, or the
//! append would not fit — is rewritten whole (compacted) to a fresh location. Either way
//! its pointer in the parent (or the tree's root) is updated to the new committed
//! length, which dirties the parent, so every ancestor of a written node is written in
//! the same checkpoint. Parents are written after their children.
//!
//! The walk runs under the filesystem's core lock, so it only copies each node's bset
//! out ([`UnsealedBset`]); the writer seals (checksums) it with no lock held.

use alloc::vec::Vec;

use super::cache::is_temp_addr;
use super::node::Node;
use super::tree::Trees;
use crate::format::bset::{UnsealedBset, HEADER_LEN};
use crate::format::superblock::NodePtr;
use crate::format::{Key, TreeId, BLOCK_SIZE};

/// Why a node was written. Counted per cause so that write policies can be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteCause {
    /// The first write of a filesystem's nodes (mkfs).
    Initial,
    /// The first write of a node created by a split or merge.
    Split,
    /// An interior node (written because a child moved or grew).
    Interior,
    /// A leaf written by a checkpoint asked for by `sync`, `fsync` or unmount.
    Sync,
    /// A leaf written because the node cache needed memory.
    CacheReclaim,
    /// A leaf written because the log needed space.
    LogReclaim,
    /// A node written ahead of a checkpoint because the write policy found enough of it
    /// dirty (the "write when 4 KiB is dirty" baseline).
    Dirty,
}

impl WriteCause {
    /// All causes, in counter order.
    pub const ALL: [WriteCause; 7] = [
        WriteCause::Initial,
        WriteCause::Split,
        WriteCause::Interior,
        WriteCause::Sync,
        WriteCause::CacheReclaim,
        WriteCause::LogReclaim,
        WriteCause::Dirty,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            WriteCause::Initial => "initial",
            WriteCause::Split => "split",
            WriteCause::Interior => "interior",
            WriteCause::Sync => "sync",
            WriteCause::CacheReclaim => "cache_reclaim",
            WriteCause::LogReclaim => "log_reclaim",
            WriteCause::Dirty => "dirty",
        }
    }
}

/// Node writes and bytes per cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeWriteCounters {
    /// Writes, indexed like [`WriteCause::ALL`].
    pub writes: [u64; 7],
    /// Bytes, indexed like [`WriteCause::ALL`].
    pub bytes: [u64; 7],
    /// Writes that appended a bset.
    pub appends: u64,
    /// Writes that rewrote a node to a fresh location.
    pub rewrites: u64,
}

/// Serialised as three fields of the enclosing counters: `node_writes` (per cause:
/// `{writes, bytes}`), `node_appends`, `node_rewrites`.
#[cfg(feature = "serde")]
impl serde::Serialize for NodeWriteCounters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;

        #[derive(serde::Serialize)]
        struct PerCause {
            writes: u64,
            bytes: u64,
        }
        struct ByCause<'a>(&'a NodeWriteCounters);
        impl serde::Serialize for ByCause<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let per: Vec<PerCause> = (0..WriteCause::ALL.len())
                    .map(|i| PerCause {
                        writes: self.0.writes[i],
                        bytes: self.0.bytes[i],
                    })
                    .collect();
                crate::util::by_name::map(WriteCause::ALL.iter().map(|c| c.name()), &per, s)
            }
        }
        let mut st = s.serialize_struct("NodeWriteCounters", 3)?;
        st.serialize_field("node_writes", &ByCause(self))?;
        st.serialize_field("node_appends", &self.appends)?;
        st.serialize_field("node_rewrites", &self.rewrites)?;
        st.end()
    }
}

impl NodeWriteCounters {
    /// Counts one write.
    pub fn count(&mut self, w: &NodeWrite) {
        let i = WriteCause::ALL
            .iter()
            .position(|&c| c == w.cause)
            .expect("listed");
        self.writes[i] += 1;
        self.bytes[i] += w.bset.size() as u64;
        if w.relocated {
            self.rewrites += 1;
        } else {
            self.appends += 1;
        }
    }

    /// Total node writes.
    pub fn total_writes(&self) -> u64 {
        self.writes.iter().sum()
    }

    /// Total bytes written to nodes.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// One node write of a checkpoint.
#[derive(Debug)]
pub struct NodeWrite {
    /// Destination block.
    pub block: u64,
    /// The node's location (its first block): the write lies within `node_size` of it.
    pub node: u64,
    /// The bset, whole blocks once sealed.
    pub bset: UnsealedBset,
    /// Why.
    pub cause: WriteCause,
    /// Whether the node moved to a fresh location (else this is an append).
    pub relocated: bool,
    /// The node's tree.
    pub tree: TreeId,
}

/// What the walk did besides producing writes.
#[derive(Debug, Default)]
pub struct FlushResult {
    /// The writes, children before parents.
    pub writes: Vec<NodeWrite>,
    /// Fresh locations that are now referenced (from the pool).
    pub placed: Vec<u64>,
    /// Locations given up by relocated nodes.
    pub freed: Vec<u64>,
}

impl Trees {
    /// Nodes a flush may have to place: dirty nodes and the interior nodes above them.
    pub fn flush_bound(&self) -> usize {
        self.cache
            .nodes()
            .filter(|n| n.is_dirty() || n.level() > 0)
            .count()
            + 1
    }

    /// Current locations of nodes a flush may relocate (their blocks may be freed).
    pub fn relocation_candidates(&self) -> Vec<u64> {
        self.cache
            .nodes()
            .filter(|n| (n.is_dirty() || n.level() > 0) && !is_temp_addr(n.addr))
            .map(|n| n.addr)
            .collect()
    }

    /// Whether any cached node has unwritten changes.
    pub fn any_dirty(&self) -> bool {
        self.cache.nodes().any(Node::is_dirty)
    }

    /// Writes, ahead of checkpoint `seq`, every dirty node for which `due(pending
    /// bytes)` holds: an append if the node has a location and the append fits, else a
    /// rewrite to a fresh location from `pool` (new nodes from splits get their first
    /// location this way; their parent's pointer is updated in memory). The writes stay
    /// invisible until that checkpoint records the nodes' new lengths and locations in
    /// their parents (its walk does so for every cached node that changed). Nodes that
    /// need a location wait if the pool is empty.
    pub fn write_early(
        &mut self,
        seq: u64,
        due: impl Fn(usize) -> bool,
        pool: &mut Vec<u64>,
    ) -> FlushResult {
        let node_blocks = self.node_size / BLOCK_SIZE as u32;
        let ready: Vec<u64> = self
            .cache
            .nodes()
            .filter(|n| n.is_dirty() && due(n.pending_bytes()))
            .map(|n| n.addr)
            .collect();
        let mut out = FlushResult::default();
        for addr in ready {
            let node = self.cache.node(addr).expect("listed");
            let blocks = (HEADER_LEN + node.pending_bytes()).div_ceil(BLOCK_SIZE) as u32;
            let can_append = !is_temp_addr(addr)
                && node.written_blocks > 0
                && node.written_blocks + blocks <= node_blocks;
            let cause = if node.written_blocks == 0 && node.from_split {
                WriteCause::Split
            } else {
                WriteCause::Dirty
            };
            let tree = node.id.tree;
            if can_append {
                let bset = node.encode_append(seq);
                let offset = node.written_blocks;
                let written = offset + (bset.size() / BLOCK_SIZE) as u32;
                out.writes.push(NodeWrite {
                    block: addr + u64::from(offset),
                    node: addr,
                    bset,
                    cause,
                    relocated: false,
                    tree,
                });
                self.cache.modify(addr, |n| n.mark_written(written, seq));
                continue;
            }
            let Some(parent) = self.parent_entry(tree, addr) else {
                continue;
            };
            let Some(new_addr) = pool.pop() else {
                break;
            };
            let id = self.new_id(tree, node.level());
            if !is_temp_addr(addr) {
                out.freed.push(addr);
            }
            out.placed.push(new_addr);
            self.cache.rekey(addr, new_addr);
            self.cache.modify(new_addr, |n| n.relocate(id, new_addr));
            let bset = self.cache.node(new_addr).expect("cached").encode_full(seq);
            let written = (bset.size() / BLOCK_SIZE) as u32;
            out.writes.push(NodeWrite {
                block: new_addr,
                node: new_addr,
                bset,
                cause,
                relocated: true,
                tree,
            });
            self.cache
                .modify(new_addr, |n| n.mark_written(written, seq));
            let ptr = NodePtr {
                addr: new_addr,
                nonce: id.nonce,
                blocks: written,
            };
            match parent {
                Some((paddr, sep)) => {
                    self.cache
                        .modify(paddr, |p| p.insert(sep, ptr.to_bytes().into()));
                }
                None => self.roots[tree as usize].ptr = ptr,
            }
        }
        out
    }

    /// Where the node at `addr` hangs: `Some(Some((parent, separator)))`, or
    /// `Some(None)` for the root; `None` if the path to it is not all cached (or it is
    /// empty). Found from the root through current pointers only, by the node's first
    /// key: the cache may also hold out-of-date copies of interior nodes, which point
    /// where the node once was (see [`NodeCache::get`](super::NodeCache::get)).
    fn parent_entry(&self, tree: TreeId, addr: u64) -> Option<Option<(u64, Key)>> {
        let root = self.roots[tree as usize].ptr;
        if root.addr == addr {
            return Some(None);
        }
        let node = self.cache.node(addr)?;
        let (key, _) = node.iter_from(&Key::MIN).next()?;
        let mut parent = self.cache.get(&root)?;
        while parent.level() > node.level() {
            let (sep, val) = parent.child_entry(&key)?;
            let child = NodePtr::from_bytes(val)?;
            if parent.level() == node.level() + 1 {
                return (child.addr == addr).then_some(Some((parent.addr, sep)));
            }
            parent = self.cache.get(&child)?;
        }
        None
    }

    /// Writes every dirty node of every tree in checkpoint `seq`. New locations come
    /// from `pool` (which must hold at least [`Trees::flush_bound`] entries; unused ones
    /// stay in it). `leaf_cause` is the cause counted for ordinary leaf writes.
    pub fn flush(&mut self, seq: u64, leaf_cause: WriteCause, pool: &mut Vec<u64>) -> FlushResult {
        let mut out = FlushResult::default();
        for tree in TreeId::ALL {
            let root = self.roots[tree as usize];
            if root.ptr.addr == 0 || !self.cache.contains(&root.ptr) {
                continue;
            }
            let ptr = self.flush_node(root.ptr.addr, seq, leaf_cause, pool, &mut out);
            self.roots[tree as usize].ptr = ptr;
        }
        out
    }

    fn flush_node(
        &mut self,
        addr: u64,
        seq: u64,
        leaf_cause: WriteCause,
        pool: &mut Vec<u64>,
        out: &mut FlushResult,
    ) -> NodePtr {
        let node = self.cache.node(addr).expect("flushed node is cached");
        if node.level() > 0 {
            let children: Vec<(Key, NodePtr)> = node
                .iter_from(&Key::MIN)
                .filter_map(|(k, v)| NodePtr::from_bytes(v).map(|p| (k, p)))
                .collect();
            for (sep, child) in children {
                if !self.cache.contains(&child) {
                    continue;
                }
                let now = self.flush_node(child.addr, seq, leaf_cause, pool, out);
                if now != child {
                    self.cache
                        .modify(addr, |n| n.insert(sep, now.to_bytes().into()));
                }
            }
        }
        let node = self.cache.node(addr).expect("cached");
        if !node.is_dirty() {
            return NodePtr {
                addr,
                nonce: node.id.nonce,
                blocks: node.written_blocks,
            };
        }
        let node_blocks = self.node_size / BLOCK_SIZE as u32;
        let append_blocks = (HEADER_LEN + node.pending_bytes()).div_ceil(BLOCK_SIZE) as u32;
        let cause = if node.written_blocks == 0 && node.from_split {
            WriteCause::Split
        } else if node.level() > 0 {
            WriteCause::Interior
        } else {
            leaf_cause
        };
        let tree = node.id.tree;
        let can_append = !is_temp_addr(addr)
            && node.written_blocks > 0
            && node.written_blocks + append_blocks <= node_blocks;
        let (addr, bset, relocated) = if can_append {
            (addr, node.encode_append(seq), false)
        } else {
            let new_addr = pool.pop().expect("node pool sized by flush_bound");
            let id = self.new_id(tree, node.level());
            if !is_temp_addr(addr) {
                out.freed.push(addr);
            }
            out.placed.push(new_addr);
            self.cache.rekey(addr, new_addr);
            self.cache.modify(new_addr, |n| n.relocate(id, new_addr));
            let bset = self.cache.node(new_addr).expect("cached").encode_full(seq);
            (new_addr, bset, true)
        };
        let node = self.cache.node(addr).expect("cached");
        let offset = if relocated { 0 } else { node.written_blocks };
        let written = offset + (bset.size() / BLOCK_SIZE) as u32;
        // That it fits (`written <= node_blocks`) is checked with the checkpoint's other
        // writes before any is made (`core::checks::node_write`).
        out.writes.push(NodeWrite {
            block: addr + u64::from(offset),
            node: addr,
            bset,
            cause,
            relocated,
            tree,
        });
        self.cache.modify(addr, |n| n.mark_written(written, seq));
        let node = self.cache.node(addr).expect("cached");
        NodePtr {
            addr,
            nonce: node.id.nonce,
            blocks: written,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bset::{parse_node, NodeId};
    use crate::format::superblock::Root;
    use alloc::collections::BTreeMap;

    /// A flat "disk" for the test: block -> content.
    struct Disk(BTreeMap<u64, Vec<u8>>);

    impl Disk {
        fn apply(&mut self, writes: Vec<NodeWrite>) {
            for w in writes {
                for (i, chunk) in w.bset.seal().chunks(BLOCK_SIZE).enumerate() {
                    self.0.insert(w.block + i as u64, chunk.to_vec());
                }
            }
        }

        fn read(&self, addr: u64, blocks: u32) -> Vec<u8> {
            (0..u64::from(blocks))
                .flat_map(|i| {
                    self.0
                        .get(&(addr + i))
                        .cloned()
                        .unwrap_or(alloc::vec![0; BLOCK_SIZE])
                })
                .collect()
        }

        /// Reads a whole tree back through committed pointers only.
        fn load(&self, ptr: NodePtr, level: u8, tree: TreeId, out: &mut Vec<(Key, Vec<u8>)>) {
            let buf = self.read(ptr.addr, ptr.blocks);
            let id = NodeId {
                tree,
                level,
                nonce: ptr.nonce,
            };
            let sets = parse_node(&buf, id, ptr.blocks).expect("committed node parses");
            let node = Node::from_disk(id, ptr.addr, ptr.blocks, &sets);
            for (k, v) in node.iter_from(&Key::MIN) {
                if level == 0 {
                    out.push((k, v.to_vec()));
                } else {
                    self.load(NodePtr::from_bytes(v).unwrap(), level - 1, tree, out);
                }
            }
        }
    }

    fn pool(start: u64) -> Vec<u64> {
        (0..400).map(|i| start + i * 4).collect()
    }

    #[test]
    fn checkpoints_append_then_relocate() {
        let mut t = Trees::new([Root::default(); TreeId::COUNT], 16 * 1024, 3, 1);
        t.create_tree(TreeId::Fs);
        let mut disk = Disk(BTreeMap::new());
        let mut model = BTreeMap::new();
        let mut pool = pool(1000);
        let mut counters = NodeWriteCounters::default();
        for round in 0..30u64 {
            for i in 0..200u64 {
                let k = Key::new((i * 7919 + round) % 1500, 1, 0);
                if (i + round) % 5 == 0 {
                    t.remove(TreeId::Fs, &k).unwrap();
                    model.remove(&k);
                } else {
                    let v = alloc::vec![(i + round) as u8; (i % 40) as usize];
                    t.insert(TreeId::Fs, k, v.clone()).unwrap();
                    model.insert(k, v);
                }
            }
            assert!(pool.len() >= t.flush_bound());
            let res = t.flush(round + 1, WriteCause::Sync, &mut pool);
            for w in &res.writes {
                counters.count(w);
            }
            disk.apply(res.writes);
            assert!(!t.any_dirty());
            let root = t.roots[0];
            let mut back = Vec::new();
            disk.load(root.ptr, root.level, TreeId::Fs, &mut back);
            let want: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(back, want, "round {round}");
            // Freed locations are reusable in the next round (their checkpoint committed).
            pool.extend(res.freed);
        }
        assert!(counters.appends > 0 && counters.rewrites > 0);
        assert!(counters.writes[2] > 0, "interior nodes written");
        // A checkpoint with nothing dirty writes nothing.
        assert!(t.flush(99, WriteCause::Sync, &mut pool).writes.is_empty());
    }
}

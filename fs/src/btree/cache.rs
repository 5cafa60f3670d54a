//! The node cache: every btree node in memory, keyed by address, with memory
//! accounting and LRU eviction of clean nodes.
//!
//! Nodes created by splits live here before they have a disk location; they get a
//! temporary address ([`is_temp_addr`]) until the checkpoint that first writes them.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use hashbrown::HashMap;

use super::node::Node;
use crate::format::superblock::NodePtr;

/// Temporary addresses have this bit set; no real block number does.
const TEMP_BIT: u64 = 1 << 63;

/// Whether `addr` is a temporary address of a node that has no disk location yet.
pub fn is_temp_addr(addr: u64) -> bool {
    addr & TEMP_BIT != 0
}

struct Slot {
    node: Node,
    last_used: u64,
}

/// The cache. See the module documentation.
pub struct NodeCache {
    slots: HashMap<u64, Slot>,
    mem: usize,
    dirty: usize,
    tick: u64,
    next_temp: u64,
    /// Where its memory use is published (shared by every node cache of a device, so
    /// the data cache can borrow what they leave unused: `cache::data`).
    gauge: Option<Arc<AtomicUsize>>,
}

impl core::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NodeCache")
            .field("nodes", &self.slots.len())
            .field("mem", &self.mem)
            .field("dirty", &self.dirty)
            .finish()
    }
}

impl Drop for NodeCache {
    fn drop(&mut self) {
        self.set_mem(0);
    }
}

impl Default for NodeCache {
    fn default() -> Self {
        NodeCache::new()
    }
}

impl NodeCache {
    /// An empty cache.
    pub fn new() -> NodeCache {
        NodeCache {
            slots: HashMap::new(),
            mem: 0,
            dirty: 0,
            tick: 0,
            next_temp: TEMP_BIT | 1,
            gauge: None,
        }
    }

    /// Publishes the cache's memory use in `gauge` from now on (adding to what others
    /// publish there).
    pub fn publish_to(&mut self, gauge: Arc<AtomicUsize>) {
        if let Some(old) = self.gauge.take() {
            old.fetch_sub(self.mem, Relaxed);
        }
        gauge.fetch_add(self.mem, Relaxed);
        self.gauge = Some(gauge);
    }

    /// Sets the memory in use, publishing the change.
    fn set_mem(&mut self, mem: usize) {
        if let Some(g) = &self.gauge {
            if mem >= self.mem {
                g.fetch_add(mem - self.mem, Relaxed);
            } else {
                g.fetch_sub(self.mem - mem, Relaxed);
            }
        }
        self.mem = mem;
    }

    /// A fresh temporary address.
    pub fn temp_addr(&mut self) -> u64 {
        let a = self.next_temp;
        self.next_temp += 1;
        a
    }

    /// Memory used by cached nodes.
    pub fn mem(&self) -> usize {
        self.mem
    }

    /// Number of cached nodes with unwritten changes.
    pub fn dirty_count(&self) -> usize {
        self.dirty
    }

    /// Number of cached nodes.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The node `ptr` points to, if cached: really that node (nonces match) and that
    /// version of it or a later one (it holds at least the blocks `ptr` commits). An
    /// older version can be cached: a read that started before the node was appended to
    /// and evicted ends after that (see [`NodeCache::insert_loaded`]).
    pub fn get(&self, ptr: &NodePtr) -> Option<&Node> {
        self.slots
            .get(&ptr.addr)
            .map(|s| &s.node)
            .filter(|n| n.id.nonce == ptr.nonce && n.written_blocks >= ptr.blocks)
    }

    /// Whether the node `ptr` points to is cached.
    pub fn contains(&self, ptr: &NodePtr) -> bool {
        self.get(ptr).is_some()
    }

    /// The node at `addr`.
    pub fn node(&self, addr: u64) -> Option<&Node> {
        self.slots.get(&addr).map(|s| &s.node)
    }

    /// Marks the node at `addr` as just used.
    pub fn touch(&mut self, addr: u64) {
        self.tick += 1;
        if let Some(s) = self.slots.get_mut(&addr) {
            s.last_used = self.tick;
        }
    }

    /// Runs `f` on the node at `addr`, keeping the memory accounting right.
    pub fn modify<R>(&mut self, addr: u64, f: impl FnOnce(&mut Node) -> R) -> Option<R> {
        let slot = self.slots.get_mut(&addr)?;
        let (before, was_dirty) = (slot.node.mem_bytes(), slot.node.is_dirty());
        let r = f(&mut slot.node);
        let mem = self.mem + slot.node.mem_bytes() - before;
        self.dirty = self.dirty + usize::from(slot.node.is_dirty()) - usize::from(was_dirty);
        self.set_mem(mem);
        Some(r)
    }

    /// Adds a node made in memory (split, new tree): it has a temporary address, where
    /// nothing else can be.
    pub fn insert(&mut self, node: Node) {
        debug_assert!(is_temp_addr(node.addr) && !self.slots.contains_key(&node.addr));
        self.put(node);
    }

    /// Adds a node just read from disk, unless what is cached at its address must stay;
    /// returns whether it was added. The read may have started long ago (other CPUs
    /// run meanwhile, checkpoints commit), so either may be out of date:
    /// - a node with unwritten changes stays: it is live;
    /// - the same node (nonce) stays if it holds as many blocks or more, else the read
    ///   is a later version of it and replaces it;
    /// - another node stays unless its last write is committed (`committed_seq`): a
    ///   node written since may still be on its way to the disk, so it could not be
    ///   read back if it were live; a committed one can, so a read that is current
    ///   replaces a stale one and one that is stale costs at most a read again.
    pub fn insert_loaded(&mut self, node: Node, committed_seq: u64) -> bool {
        if let Some(old) = self.slots.get(&node.addr).map(|s| &s.node) {
            let keep = old.is_dirty()
                || if old.id.nonce == node.id.nonce {
                    old.written_blocks >= node.written_blocks
                } else {
                    old.written_seq > committed_seq
                };
            if keep {
                return false;
            }
            let old = self.slots.remove(&node.addr).expect("present");
            self.set_mem(self.mem - old.node.mem_bytes());
        }
        self.put(node);
        true
    }

    fn put(&mut self, node: Node) {
        self.tick += 1;
        self.set_mem(self.mem + node.mem_bytes());
        self.dirty += usize::from(node.is_dirty());
        self.slots.insert(
            node.addr,
            Slot {
                node,
                last_used: self.tick,
            },
        );
    }

    /// Removes and returns the node at `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<Node> {
        let s = self.slots.remove(&addr)?;
        self.set_mem(self.mem - s.node.mem_bytes());
        self.dirty -= usize::from(s.node.is_dirty());
        Some(s.node)
    }

    /// Moves the node at `from` to address `to`.
    pub fn rekey(&mut self, from: u64, to: u64) {
        if from == to {
            return;
        }
        let mut s = self.slots.remove(&from).expect("rekeyed node is cached");
        s.node.addr = to;
        if let Some(stale) = self.slots.remove(&to) {
            assert!(!stale.node.is_dirty(), "relocated over a live node");
            self.set_mem(self.mem - stale.node.mem_bytes());
        }
        self.slots.insert(to, s);
    }

    /// Addresses of all cached nodes.
    pub fn addrs(&self) -> Vec<u64> {
        self.slots.keys().copied().collect()
    }

    /// All cached nodes.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.slots.values().map(|s| &s.node)
    }

    /// Evicts least-recently-used nodes accepted by `evictable` until memory use is at
    /// most `target`; returns the number evicted.
    pub fn evict(&mut self, target: usize, evictable: impl Fn(&Node, &NodeCache) -> bool) -> usize {
        if self.mem <= target {
            return 0;
        }
        let mut candidates: Vec<(u64, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| evictable(&s.node, self))
            .map(|(&a, s)| (s.last_used, a))
            .collect();
        candidates.sort_unstable();
        let mut n = 0;
        for (_, addr) in candidates {
            if self.mem <= target {
                break;
            }
            // Evicting a leaf may make its parent evictable only on a later pass; that
            // is fine: interior nodes are few.
            if let Some(s) = self.slots.get(&addr) {
                if evictable(&s.node, self) {
                    self.remove(addr);
                    n += 1;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bset::NodeId;
    use crate::format::{Key, TreeId};

    const ID: NodeId = NodeId {
        tree: TreeId::Fs,
        level: 0,
        nonce: 7,
    };

    /// A clean node at block 100 holding `blocks` blocks, last written in `seq`.
    fn written(id: NodeId, blocks: u32, seq: u64) -> Node {
        let mut n = Node::new(id, 100);
        n.mark_written(blocks, seq);
        n
    }

    #[test]
    fn an_older_version_read_late_is_not_taken_for_the_node() {
        // A read that started before the node's last append (and ended after the node
        // was evicted) brings 2 blocks; its parent now commits 3.
        let mut cache = NodeCache::new();
        assert!(cache.insert_loaded(written(ID, 2, 4), 5));
        let ptr = NodePtr {
            addr: 100,
            nonce: ID.nonce,
            blocks: 3,
        };
        assert!(cache.get(&ptr).is_none());
        // Read again, it replaces the old version; a late read of that one does not.
        assert!(cache.insert_loaded(written(ID, 3, 5), 5));
        assert!(!cache.insert_loaded(written(ID, 2, 4), 5));
        assert_eq!(cache.get(&ptr).map(|n| n.written_blocks), Some(3));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn another_node_at_the_address_stays_until_its_write_is_committed() {
        let other = NodeId { nonce: 8, ..ID };
        let mut cache = NodeCache::new();
        assert!(cache.insert_loaded(written(ID, 3, 6), 5));
        // Written in checkpoint 6, not committed: a read of what was there before
        // does not replace it.
        assert!(!cache.insert_loaded(written(other, 2, 3), 5));
        // Once 6 is committed, it could be read back: a read of another node wins.
        assert!(cache.insert_loaded(written(other, 2, 3), 6));
        assert_eq!(cache.node(100).map(|n| n.id.nonce), Some(8));
        // Nothing replaces changes not written yet.
        cache.modify(100, |n| n.insert(Key::MIN, alloc::vec![1].into()));
        assert!(!cache.insert_loaded(written(ID, 3, 6), 9));
    }
}

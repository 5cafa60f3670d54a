//! The node cache: every btree node in memory, keyed by address, with memory
//! accounting and LRU eviction of clean nodes.
//!
//! Nodes created by splits live here before they have a disk location; they get a
//! temporary address ([`is_temp_addr`]) until the checkpoint that first writes them.

use alloc::vec::Vec;
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
        }
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

    /// The node `ptr` points to, if cached (and really that node: nonces match).
    pub fn get(&self, ptr: &NodePtr) -> Option<&Node> {
        self.slots
            .get(&ptr.addr)
            .map(|s| &s.node)
            .filter(|n| n.id.nonce == ptr.nonce)
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
        self.mem = self.mem + slot.node.mem_bytes() - before;
        self.dirty = self.dirty + usize::from(slot.node.is_dirty()) - usize::from(was_dirty);
        Some(r)
    }

    /// Adds a node. A node already at the same address is replaced only if it is a
    /// stale clean copy (another nonce); returns false if `node` was not inserted.
    pub fn insert(&mut self, node: Node) -> bool {
        self.tick += 1;
        if let Some(old) = self.slots.get(&node.addr) {
            if old.node.id.nonce == node.id.nonce || old.node.is_dirty() {
                return false;
            }
            let old = self.slots.remove(&node.addr).expect("present");
            self.mem -= old.node.mem_bytes();
        }
        self.mem += node.mem_bytes();
        self.dirty += usize::from(node.is_dirty());
        self.slots.insert(
            node.addr,
            Slot {
                node,
                last_used: self.tick,
            },
        );
        true
    }

    /// Removes and returns the node at `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<Node> {
        let s = self.slots.remove(&addr)?;
        self.mem -= s.node.mem_bytes();
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
            self.mem -= stale.node.mem_bytes();
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

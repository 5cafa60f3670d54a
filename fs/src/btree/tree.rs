//! Btree operations over cached nodes: lookup, range iteration, insert, delete, split
//! and merge.
//!
//! Every operation here is synchronous and works only on nodes already in the cache.
//! When it needs a node that is not cached it returns [`Need::Node`] *before changing
//! anything*; the caller loads the node (without holding any lock) and retries. Splits
//! and merges never need I/O: new nodes get temporary addresses until the checkpoint
//! that writes them, and merges only use siblings that are cached.
//!
//! Invariants (checked by [`Trees::check`]):
//! - keys in a node are within its bounds: `[separator in parent, next separator)`;
//! - an interior node's first separator equals its own lower bound (the root's is
//!   [`Key::MIN`]), so a descent always finds a child;
//! - every cached non-root node's ancestors are cached.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::cache::{is_temp_addr, NodeCache};
use super::node::Node;
use crate::format::bset::NodeId;
use crate::format::superblock::{NodePtr, Root};
use crate::format::{Key, TreeId};
use crate::util::hash::node_nonce;

/// What an operation needs before it can proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// This node must be read into the cache.
    Node {
        /// Its tree.
        tree: TreeId,
        /// Its level.
        level: u8,
        /// Where it is.
        ptr: NodePtr,
    },
    /// The tree is inconsistent (a corrupt node got past its checksums, or a bug).
    Corrupt(&'static str),
}

/// Counters of structural changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Node splits.
    pub splits: u64,
    /// Node merges.
    pub merges: u64,
    /// Empty nodes removed.
    pub empties_removed: u64,
    /// Root splits (tree grew).
    pub root_splits: u64,
    /// Root collapses (tree shrank).
    pub root_collapses: u64,
}

/// A path from the root to a leaf.
#[derive(Debug)]
struct Path {
    /// Node addresses, root first.
    nodes: Vec<u64>,
    /// `seps[i]` is the separator (lower bound) of `nodes[i + 1]` in `nodes[i]`.
    seps: Vec<Key>,
    /// Exclusive upper bound of the leaf's key range, if any.
    upper: Option<Key>,
}

/// All trees and their node cache.
pub struct Trees {
    /// The node cache.
    pub cache: NodeCache,
    /// Current roots (in memory; committed by checkpoints).
    pub roots: [Root; TreeId::COUNT],
    /// Node size in bytes.
    pub node_size: u32,
    /// Placed node locations no longer referenced; the allocator frees them.
    pub freed_nodes: Vec<u64>,
    /// Structural counters.
    pub stats: TreeStats,
    secret: u64,
    birth_seq: u64,
    nonce_counter: u64,
}

impl core::fmt::Debug for Trees {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Trees")
            .field("cache", &self.cache)
            .field("roots", &self.roots)
            .finish()
    }
}

impl Trees {
    /// Trees with the given roots; `secret` keys node nonces and `birth_seq` is the
    /// checkpoint interval in progress.
    pub fn new(roots: [Root; TreeId::COUNT], node_size: u32, secret: u64, birth_seq: u64) -> Trees {
        Trees {
            cache: NodeCache::new(),
            roots,
            node_size,
            freed_nodes: Vec::new(),
            stats: TreeStats::default(),
            secret,
            birth_seq,
            nonce_counter: 0,
        }
    }

    /// Starts checkpoint interval `seq` (nonces of nodes allocated from now on derive
    /// from it).
    pub fn set_birth_seq(&mut self, seq: u64) {
        self.birth_seq = seq;
        self.nonce_counter = 0;
    }

    /// A fresh identity for a node of `tree` at `level`.
    pub fn new_id(&mut self, tree: TreeId, level: u8) -> NodeId {
        self.nonce_counter += 1;
        NodeId {
            tree,
            level,
            nonce: node_nonce(self.secret, self.birth_seq, self.nonce_counter),
        }
    }

    /// Live bytes above which a node splits.
    pub fn split_threshold(&self) -> usize {
        self.node_size as usize * 3 / 4
    }

    fn underfull(&self) -> usize {
        self.node_size as usize / 8
    }

    fn merge_limit(&self) -> usize {
        self.node_size as usize / 2
    }

    /// Creates an empty tree (a single empty leaf) for `tree`.
    pub fn create_tree(&mut self, tree: TreeId) {
        let id = self.new_id(tree, 0);
        let addr = self.cache.temp_addr();
        self.cache.insert(Node::new(id, addr));
        self.roots[tree as usize] = Root {
            ptr: NodePtr {
                addr,
                nonce: id.nonce,
                blocks: 0,
            },
            level: 0,
        };
    }

    fn node(&self, addr: u64) -> Result<&Node, Need> {
        self.cache
            .node(addr)
            .ok_or(Need::Corrupt("node vanished from cache"))
    }

    fn child_ptr(val: &[u8]) -> Result<NodePtr, Need> {
        NodePtr::from_bytes(val).ok_or(Need::Corrupt("bad child pointer"))
    }

    fn descend(&mut self, tree: TreeId, key: &Key) -> Result<Path, Need> {
        let root = self.roots[tree as usize];
        if root.ptr.addr == 0 {
            return Err(Need::Corrupt("tree has no root"));
        }
        let mut node = self.cache.get(&root.ptr).ok_or(Need::Node {
            tree,
            level: root.level,
            ptr: root.ptr,
        })?;
        if node.level() != root.level || node.id.tree != tree {
            return Err(Need::Corrupt("root level"));
        }
        // One node per level and a separator per level below the root: sized once.
        let depth = usize::from(root.level);
        let mut nodes = Vec::with_capacity(depth + 1);
        nodes.push(root.ptr.addr);
        let mut path = Path {
            nodes,
            seps: Vec::with_capacity(depth),
            upper: None,
        };
        while node.level() > 0 {
            let (sep, val) = node
                .child_entry(key)
                .ok_or(Need::Corrupt("empty interior node"))?;
            let child = Self::child_ptr(val)?;
            if let Some(next) = sep.successor().and_then(|s| node.iter_from(&s).next()) {
                if path.upper.is_none_or(|u| next.0 < u) {
                    path.upper = Some(next.0);
                }
            }
            let level = node.level() - 1;
            let child_node = self.cache.get(&child).ok_or(Need::Node {
                tree,
                level,
                ptr: child,
            })?;
            if child_node.level() != level || child_node.id.tree != tree {
                return Err(Need::Corrupt("child level"));
            }
            if !child_node.placed {
                // Read from the disk: its keys must lie where the separators above put
                // them (as every change keeps them), or lookups miss them and the next
                // change breaks the tree. Checked once, at the first descent.
                let first = child_node.iter_from(&Key::MIN).next().map(|e| e.0);
                let last = child_node.get_le(&Key::MAX).map(|e| e.0);
                if first.is_some_and(|k| k < sep)
                    || last.zip(path.upper).is_some_and(|(k, u)| k >= u)
                    || (level > 0 && first != Some(sep))
                {
                    return Err(Need::Corrupt("node keys outside its parent's bounds"));
                }
                self.cache.modify(child.addr, |n| n.placed = true);
            }
            let child_node = self.node(child.addr)?;
            path.seps.push(sep);
            path.nodes.push(child.addr);
            node = child_node;
        }
        for &a in &path.nodes {
            self.cache.touch(a);
        }
        Ok(path)
    }

    /// Makes sure the path to `key` is cached (returns what to load otherwise).
    pub fn ensure(&mut self, tree: TreeId, key: &Key) -> Result<(), Need> {
        self.descend(tree, key).map(|_| ())
    }

    /// The value of `key`.
    pub fn get(&mut self, tree: TreeId, key: &Key) -> Result<Option<Vec<u8>>, Need> {
        let path = self.descend(tree, key)?;
        let leaf = self.node(*path.nodes.last().expect("path has a leaf"))?;
        Ok(leaf.get(key).map(<[u8]>::to_vec))
    }

    /// The entry with the greatest key `<= key`.
    pub fn get_le(&mut self, tree: TreeId, key: &Key) -> Result<Option<(Key, Vec<u8>)>, Need> {
        let mut k = *key;
        loop {
            let path = self.descend(tree, &k)?;
            let leaf = self.node(*path.nodes.last().expect("path has a leaf"))?;
            if let Some((found, v)) = leaf.get_le(&k) {
                return Ok(Some((found, v.to_vec())));
            }
            // Nothing here: the answer is in an earlier leaf, if any.
            match path.seps.last().and_then(|lower| lower.predecessor()) {
                Some(p) => k = p,
                None => return Ok(None),
            }
        }
    }

    /// Calls `f` on every entry with `from <= key <= to`, in order, until it returns
    /// false. On `Err` the caller retries the whole operation, so `f` may see a prefix
    /// of the range again.
    pub fn range(
        &mut self,
        tree: TreeId,
        from: Key,
        to: Key,
        mut f: impl FnMut(Key, &[u8]) -> bool,
    ) -> Result<(), Need> {
        let mut cur = from;
        loop {
            let path = self.descend(tree, &cur)?;
            let leaf = self.node(*path.nodes.last().expect("path has a leaf"))?;
            for (k, v) in leaf.iter_from(&cur) {
                if k > to || !f(k, v) {
                    return Ok(());
                }
            }
            match path.upper {
                Some(u) if u <= to => cur = u,
                _ => return Ok(()),
            }
        }
    }

    /// Inserts or overwrites `key` (the path must be cached: call [`Trees::ensure`]
    /// first when changing several keys atomically).
    pub fn insert(&mut self, tree: TreeId, key: Key, val: Vec<u8>) -> Result<(), Need> {
        debug_assert!(val.len() <= crate::format::MAX_VALUE_LEN);
        let path = self.descend(tree, &key)?;
        let leaf = *path.nodes.last().expect("path has a leaf");
        let val: Box<[u8]> = val.into();
        self.cache.modify(leaf, |n| n.insert(key, val));
        self.split_up(tree, &path);
        Ok(())
    }

    /// Deletes `key`; returns whether it existed.
    pub fn remove(&mut self, tree: TreeId, key: &Key) -> Result<bool, Need> {
        let path = self.descend(tree, key)?;
        let leaf = *path.nodes.last().expect("path has a leaf");
        let removed = self.cache.modify(leaf, |n| n.remove(key)).unwrap_or(false);
        if removed {
            self.shrink_up(tree, &path);
        }
        Ok(removed)
    }

    fn ptr_of(&self, addr: u64) -> NodePtr {
        let n = self.cache.node(addr).expect("node is cached");
        NodePtr {
            addr,
            nonce: n.id.nonce,
            blocks: n.written_blocks,
        }
    }

    /// Splits overfull nodes on `path`, bottom up.
    fn split_up(&mut self, tree: TreeId, path: &Path) {
        for i in (0..path.nodes.len()).rev() {
            let addr = path.nodes[i];
            let node = self.cache.node(addr).expect("path node cached");
            if node.live_bytes() <= self.split_threshold() {
                return;
            }
            let level = node.level();
            let moved = self.cache.modify(addr, Node::split_upper).expect("cached");
            let right_sep = moved[0].0;
            let id = self.new_id(tree, level);
            let right_addr = self.cache.temp_addr();
            let mut right = Node::from_entries(id, right_addr, moved);
            right.from_split = true;
            self.cache.insert(right);
            self.stats.splits += 1;
            let right_ptr = self.ptr_of(right_addr);
            if i == 0 {
                // The root split: the tree grows a level.
                let old_root = self.roots[tree as usize];
                let id = self.new_id(tree, level + 1);
                let root_addr = self.cache.temp_addr();
                let mut root = Node::from_entries(
                    id,
                    root_addr,
                    alloc::vec![
                        (Key::MIN, old_root.ptr.to_bytes().into()),
                        (right_sep, right_ptr.to_bytes().into()),
                    ],
                );
                root.from_split = true;
                self.cache.insert(root);
                self.roots[tree as usize] = Root {
                    ptr: NodePtr {
                        addr: root_addr,
                        nonce: id.nonce,
                        blocks: 0,
                    },
                    level: level + 1,
                };
                self.stats.root_splits += 1;
                return;
            }
            let parent = path.nodes[i - 1];
            self.cache
                .modify(parent, |p| p.insert(right_sep, right_ptr.to_bytes().into()));
        }
    }

    /// Frees a node that is no longer referenced.
    fn free_node(&mut self, addr: u64) {
        self.cache.remove(addr);
        if !is_temp_addr(addr) {
            self.freed_nodes.push(addr);
        }
    }

    /// Removes empty nodes and merges underfull ones on `path`, bottom up; collapses a
    /// root with a single child.
    fn shrink_up(&mut self, tree: TreeId, path: &Path) {
        for i in (1..path.nodes.len()).rev() {
            let addr = path.nodes[i];
            let parent = path.nodes[i - 1];
            let sep = path.seps[i - 1];
            let Some(node) = self.cache.node(addr) else {
                break;
            };
            let live = node.live_bytes();
            if live == 0 {
                self.unlink_child(parent, sep);
                self.free_node(addr);
                self.stats.empties_removed += 1;
                continue;
            }
            if live >= self.underfull() || !self.try_merge(parent, addr, sep) {
                break;
            }
        }
        self.collapse_root(tree);
    }

    /// Removes the entry `sep` from interior node `parent`, keeping its first separator
    /// equal to its lower bound.
    fn unlink_child(&mut self, parent: u64, sep: Key) {
        self.cache.modify(parent, |p| {
            p.remove(&sep);
            if let Some((first, val)) = p.iter_from(&Key::MIN).next() {
                if first > sep {
                    // The first child went: its successor inherits the lower bound.
                    let val: Box<[u8]> = val.into();
                    p.remove(&first);
                    p.insert(sep, val);
                }
            }
        });
    }

    /// Merges `addr` with a cached sibling under `parent` if they fit in one node.
    fn try_merge(&mut self, parent: u64, addr: u64, sep: Key) -> bool {
        let p = self.cache.node(parent).expect("parent cached");
        let right = sep
            .successor()
            .and_then(|s| p.iter_from(&s).next())
            .map(|(k, v)| (k, NodePtr::from_bytes(v)));
        let left = sep
            .predecessor()
            .and_then(|s| p.get_le(&s))
            .map(|(k, v)| (k, NodePtr::from_bytes(v)));
        let live = self.cache.node(addr).expect("cached").live_bytes();
        let fits = |n: &Node| live + n.live_bytes() <= self.merge_limit();
        // Prefer absorbing the right sibling into this node; else be absorbed by the left.
        if let Some((rsep, Some(rptr))) = right {
            if self.cache.get(&rptr).is_some_and(fits) {
                self.absorb(parent, addr, rptr.addr, rsep);
                return true;
            }
        }
        if let Some((_, Some(lptr))) = left {
            if self.cache.get(&lptr).is_some_and(fits) {
                self.absorb(parent, lptr.addr, addr, sep);
                return true;
            }
        }
        false
    }

    /// Moves every entry of `right` (separator `rsep` in `parent`) into `left`.
    fn absorb(&mut self, parent: u64, left: u64, right: u64, rsep: Key) {
        let entries = self.cache.modify(right, Node::take_live).expect("cached");
        self.cache.modify(left, |l| {
            for (k, v) in entries {
                l.insert(k, v);
            }
        });
        self.unlink_child(parent, rsep);
        self.free_node(right);
        self.stats.merges += 1;
    }

    fn collapse_root(&mut self, tree: TreeId) {
        loop {
            let root = self.roots[tree as usize];
            if root.level == 0 {
                return;
            }
            let Some(node) = self.cache.get(&root.ptr) else {
                return;
            };
            let mut it = node.iter_from(&Key::MIN);
            let first = it.next().map(|(_, v)| NodePtr::from_bytes(v));
            let more = it.next().is_some();
            match (first, more) {
                (Some(Some(child)), false) => {
                    self.free_node(root.ptr.addr);
                    self.roots[tree as usize] = Root {
                        ptr: child,
                        level: root.level - 1,
                    };
                    self.stats.root_collapses += 1;
                }
                (None, _) => {
                    // Every child went: start over with an empty leaf.
                    self.free_node(root.ptr.addr);
                    self.create_tree(tree);
                    self.stats.root_collapses += 1;
                    return;
                }
                _ => return,
            }
        }
    }

    /// Checks the invariants of every cached part of `tree`: each node's own (key order,
    /// counters: [`Node::check_invariants`]) and its place in the tree ([`Trees::check_paths`]'s
    /// checks).
    pub fn check(&self, tree: TreeId) -> Result<(), &'static str> {
        let root = self.roots[tree as usize];
        let Some(node) = self.cache.get(&root.ptr) else {
            return Ok(());
        };
        self.check_subtree(node, root.level, Key::MIN, None)
    }

    /// Checks the cached nodes on the paths to `keys` in `tree`, each once and against
    /// the bounds its parent gives it: its level, its fill, its first and last keys
    /// within the bounds, an interior node's first separator. The part of the tree a
    /// change of those keys went through, at a cost that does not grow with node size.
    pub fn check_paths<'k>(
        &self,
        tree: TreeId,
        keys: impl IntoIterator<Item = &'k Key>,
    ) -> Result<(), &'static str> {
        let root = self.roots[tree as usize];
        let mut checked: Vec<u64> = Vec::new();
        for key in keys {
            let (mut ptr, mut level) = (root.ptr, root.level);
            let (mut lower, mut upper) = (Key::MIN, None);
            while let Some(node) = self.cache.get(&ptr) {
                if !checked.contains(&ptr.addr) {
                    checked.push(ptr.addr);
                    self.check_place(node, level, lower, upper)?;
                }
                if level == 0 {
                    break;
                }
                // The child `descend` takes, and its bounds.
                let (sep, val) = node
                    .get_le(key)
                    .or_else(|| node.iter_from(&Key::MIN).next())
                    .ok_or("empty interior node")?;
                ptr = NodePtr::from_bytes(val).ok_or("bad child pointer")?;
                let next = sep.successor().and_then(|s| node.iter_from(&s).next());
                upper = next.map(|e| e.0).or(upper);
                lower = sep;
                level -= 1;
            }
        }
        Ok(())
    }

    fn check_subtree(
        &self,
        node: &Node,
        level: u8,
        lower: Key,
        upper: Option<Key>,
    ) -> Result<(), &'static str> {
        node.check_invariants()?;
        self.check_place(node, level, lower, upper)?;
        if level == 0 {
            return Ok(());
        }
        let children: Vec<(Key, &[u8])> = node.iter_from(&Key::MIN).collect();
        for (i, (sep, val)) in children.iter().enumerate() {
            let ptr = NodePtr::from_bytes(val).ok_or("bad child pointer")?;
            let next = children.get(i + 1).map(|e| e.0).or(upper);
            if let Some(child) = self.cache.get(&ptr) {
                self.check_subtree(child, level - 1, *sep, next)?;
            }
        }
        Ok(())
    }

    /// Checks a node's place in its tree: at `level`, not overfull, its keys (sorted, as
    /// [`Node::check_invariants`] checks) within `[lower, upper)`, an interior node's
    /// first separator equal to `lower`.
    fn check_place(
        &self,
        node: &Node,
        level: u8,
        lower: Key,
        upper: Option<Key>,
    ) -> Result<(), &'static str> {
        if node.level() != level {
            return Err("level");
        }
        if node.live_bytes() + crate::format::bset::HEADER_LEN > self.node_size as usize {
            return Err("overfull node");
        }
        let first = node.iter_from(&Key::MIN).next().map(|e| e.0);
        let last = node.get_le(&Key::MAX).map(|e| e.0);
        if first.is_some_and(|k| k < lower) || last.zip(upper).is_some_and(|(k, u)| k >= u) {
            return Err("key out of node bounds");
        }
        if level > 0 && first != Some(lower) {
            return Err("first separator is not the lower bound");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use proptest::prelude::*;

    fn trees() -> Trees {
        let mut t = Trees::new([Root::default(); TreeId::COUNT], 16 * 1024, 99, 1);
        t.create_tree(TreeId::Fs);
        t
    }

    fn key(i: u64) -> Key {
        Key::new(i / 7, (i % 7) as u8, i)
    }

    fn val(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i as usize + j) as u8).collect()
    }

    fn all(t: &mut Trees) -> Vec<(Key, Vec<u8>)> {
        let mut out = Vec::new();
        t.range(TreeId::Fs, Key::MIN, Key::MAX, |k, v| {
            out.push((k, v.to_vec()));
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn grows_and_shrinks() {
        let mut t = trees();
        const N: u64 = 40_000;
        for i in 0..N {
            t.insert(TreeId::Fs, key(i), val(i, 50)).unwrap();
        }
        assert!(
            t.roots[0].level >= 2,
            "2.8 MB of entries in 16 KiB nodes need 3 levels"
        );
        assert!(t.stats.splits > 300);
        t.check(TreeId::Fs).unwrap();
        assert_eq!(all(&mut t).len(), N as usize);
        for i in 0..N {
            assert!(t.remove(TreeId::Fs, &key(i)).unwrap());
        }
        t.check(TreeId::Fs).unwrap();
        assert_eq!(t.roots[0].level, 0);
        assert!(all(&mut t).is_empty());
        assert_eq!(t.cache.len(), 1);
        assert!(t.stats.merges + t.stats.empties_removed > 10);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        RemoveRange(u64, u64),
        Get(u64),
        GetLe(u64),
        Range(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u64..2000, 0usize..300).prop_map(|(k, l)| Op::Insert(k, l)),
            3 => (0u64..2000).prop_map(Op::Remove),
            1 => (0u64..2000, 1u64..400).prop_map(|(a, n)| Op::RemoveRange(a, n)),
            2 => (0u64..2000).prop_map(Op::Get),
            2 => (0u64..2000).prop_map(Op::GetLe),
            1 => (0u64..2000, 0u64..100).prop_map(|(a, n)| Op::Range(a, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Random inserts, deletes, lookups and iteration against a BTreeMap.
        #[test]
        fn matches_btreemap(ops in proptest::collection::vec(op(), 1..1500)) {
            let mut t = trees();
            let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(i, l) => {
                        t.insert(TreeId::Fs, key(i), val(i, l)).unwrap();
                        model.insert(key(i), val(i, l));
                    }
                    Op::Remove(i) => {
                        prop_assert_eq!(t.remove(TreeId::Fs, &key(i)).unwrap(), model.remove(&key(i)).is_some());
                    }
                    Op::RemoveRange(a, n) => {
                        for i in a..a + n {
                            prop_assert_eq!(t.remove(TreeId::Fs, &key(i)).unwrap(), model.remove(&key(i)).is_some());
                        }
                    }
                    Op::Get(i) => {
                        prop_assert_eq!(t.get(TreeId::Fs, &key(i)).unwrap(), model.get(&key(i)).cloned());
                    }
                    Op::GetLe(i) => {
                        let want = model.range(..=key(i)).next_back().map(|(k, v)| (*k, v.clone()));
                        prop_assert_eq!(t.get_le(TreeId::Fs, &key(i)).unwrap(), want);
                    }
                    Op::Range(a, n) => {
                        let (from, to) = (key(a), key(a + n));
                        let mut got = Vec::new();
                        t.range(TreeId::Fs, from, to, |k, v| { got.push((k, v.to_vec())); true }).unwrap();
                        let want: Vec<_> = model.range(from..=to).map(|(k, v)| (*k, v.clone())).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            t.check(TreeId::Fs).map_err(TestCaseError::fail)?;
            let want: Vec<_> = model.into_iter().collect();
            prop_assert_eq!(all(&mut t), want);
        }
    }

    #[test]
    fn path_checks_follow_the_keys_and_fail_on_a_wrong_level() {
        let mut t = trees();
        for i in 0..5_000 {
            t.insert(TreeId::Fs, key(i), val(i, 50)).unwrap();
        }
        assert!(t.roots[0].level >= 1);
        for i in (0..5_000).step_by(97) {
            assert_eq!(t.check_paths(TreeId::Fs, [&key(i), &key(i + 1)]), Ok(()));
        }
        t.roots[0].level += 1;
        assert_eq!(t.check_paths(TreeId::Fs, [&key(1)]), Err("level"));
        assert_eq!(t.check(TreeId::Fs), Err("level"));
    }
}

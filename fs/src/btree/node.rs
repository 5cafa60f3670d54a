//! An in-memory btree node: a few sorted key sets (bsets), as in bcachefs.
//!
//! - At most [`MAX_SETS`] sets; only the newest is modified. Older sets are immutable
//!   sorted arrays; a newer set's entry for a key shadows older ones.
//! - Each entry knows whether its version is written (`dirty`) and whether *some* version
//!   of its key is in the node's on-disk bsets (`needs_whiteout`). A delete leaves a
//!   whiteout only when needed: when the key (or what it overwrote) is on disk, or to
//!   shadow an unwritten older version in an older in-memory set (a transient whiteout,
//!   never written).
//! - When sets are compacted all the way down, whiteouts that must still be written move
//!   to a separate sorted list, so lookups never wade through them.
//! - Writing the node (a checkpoint) emits either the dirty entries plus pending
//!   whiteouts (an append) or all live entries (a rewrite); afterwards everything is clean
//!   and the node is compacted into one set with no whiteouts.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::mem::size_of;

use crate::format::bset::{entry_len, NodeId, ParsedBset, UnsealedBset};
use crate::format::Key;

/// Most sets a node holds in memory.
pub const MAX_SETS: usize = 3;
/// The newest set is frozen (a new one started) once it holds this many entries, so an
/// insert never moves more than this many entries.
pub const NEWEST_MAX: usize = 128;
/// Fixed memory cost of a node, for cache accounting.
const NODE_OVERHEAD: usize = 256;
/// Memory cost of an entry besides its value.
const ENTRY_MEM: usize = size_of::<Entry>();

/// One key in one set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Key,
    /// The value; `None` is a whiteout.
    pub val: Option<Box<[u8]>>,
    /// This version is not yet in the node's on-disk bsets.
    pub dirty: bool,
    /// Some version of this key is in the node's on-disk bsets, so deleting it must
    /// write a whiteout.
    pub needs_whiteout: bool,
}

impl Entry {
    fn live_len(&self) -> usize {
        self.val.as_ref().map_or(0, |v| entry_len(v.len()))
    }

    /// Bytes this entry adds to the next append.
    fn pending_len(&self) -> usize {
        match (&self.val, self.dirty, self.needs_whiteout) {
            (_, false, _) => 0,
            (Some(v), true, _) => entry_len(v.len()),
            (None, true, true) => entry_len(0),
            (None, true, false) => 0,
        }
    }

    fn mem(&self) -> usize {
        ENTRY_MEM + self.val.as_ref().map_or(0, |v| v.len())
    }
}

/// An in-memory btree node.
#[derive(Debug)]
pub struct Node {
    /// Tree, level and nonce.
    pub id: NodeId,
    /// First block of the node's on-disk extent.
    pub addr: u64,
    /// Blocks of the extent already holding bsets (committed or in flight): where the
    /// next append goes.
    pub written_blocks: u32,
    /// Checkpoint sequence of the last write of this node (0 = never written).
    pub written_seq: u64,
    /// Nodes created by a split or merge: counted as such when first written.
    pub from_split: bool,
    /// Whether its keys are known to lie within the bounds its parent gives it: a node
    /// made in memory is built so; one read from the disk is checked by the first
    /// descent through it ([`crate::btree::Trees`]).
    pub placed: bool,
    sets: Vec<Vec<Entry>>,
    whiteouts: Vec<Key>,
    live_bytes: usize,
    pending_bytes: usize,
    mem_bytes: usize,
}

/// A position in each set (only the first `sets.len()` are used): cursors and lookups
/// keep them on the stack, as a node never holds more than [`MAX_SETS`] sets.
type Positions = [usize; MAX_SETS];

/// Where a key's visible entry is.
#[derive(Clone, Copy)]
struct Found {
    set: usize,
    pos: usize,
}

impl Node {
    /// An empty node that has never been written.
    pub fn new(id: NodeId, addr: u64) -> Node {
        Node {
            id,
            addr,
            written_blocks: 0,
            written_seq: 0,
            from_split: false,
            placed: true,
            sets: alloc::vec![Vec::new()],
            whiteouts: Vec::new(),
            live_bytes: 0,
            pending_bytes: 0,
            mem_bytes: NODE_OVERHEAD,
        }
    }

    /// A never-written node holding `entries` (sorted, unique keys).
    pub fn from_entries(id: NodeId, addr: u64, entries: Vec<(Key, Box<[u8]>)>) -> Node {
        let mut n = Node::new(id, addr);
        let set: Vec<Entry> = entries
            .into_iter()
            .map(|(key, val)| Entry {
                key,
                val: Some(val),
                dirty: true,
                needs_whiteout: false,
            })
            .collect();
        debug_assert!(set.windows(2).all(|w| w[0].key < w[1].key));
        n.live_bytes = set.iter().map(Entry::live_len).sum();
        n.pending_bytes = n.live_bytes;
        n.mem_bytes += set.iter().map(Entry::mem).sum::<usize>();
        n.sets = alloc::vec![set, Vec::new()];
        n
    }

    /// A node read from disk: its committed bsets, oldest first, merged into one clean
    /// set (later bsets win; whiteouts drop what they delete).
    pub fn from_disk(id: NodeId, addr: u64, blocks: u32, bsets: &[ParsedBset<'_>]) -> Node {
        let mut merged: BTreeMap<Key, Option<&[u8]>> = BTreeMap::new();
        let mut seq = 0;
        for b in bsets {
            seq = seq.max(b.header.seq);
            for e in &b.entries {
                merged.insert(e.key, e.val);
            }
        }
        let set: Vec<Entry> = merged
            .into_iter()
            .filter_map(|(key, val)| {
                val.map(|v| Entry {
                    key,
                    val: Some(v.into()),
                    dirty: false,
                    needs_whiteout: true,
                })
            })
            .collect();
        let mut n = Node::new(id, addr);
        n.written_blocks = blocks;
        n.written_seq = seq;
        n.placed = false;
        n.live_bytes = set.iter().map(Entry::live_len).sum();
        n.mem_bytes += set.iter().map(Entry::mem).sum::<usize>();
        n.sets = alloc::vec![set, Vec::new()];
        n
    }

    /// The node's level.
    pub fn level(&self) -> u8 {
        self.id.level
    }

    /// Whether the node is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.id.level == 0
    }

    /// Encoded size of all live entries: the payload of a full rewrite.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes
    }

    /// Encoded size of what the next append would write.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Memory the node uses (approximately), for the cache limit.
    pub fn mem_bytes(&self) -> usize {
        self.mem_bytes
    }

    /// Whether anything is unwritten: dirty entries or pending whiteouts, or the node
    /// has never been written.
    pub fn is_dirty(&self) -> bool {
        self.written_blocks == 0 || self.pending_bytes > 0
    }

    /// Number of in-memory sets.
    pub fn set_count(&self) -> usize {
        self.sets.len()
    }

    /// Number of whiteouts kept apart from the live keys.
    pub fn separate_whiteouts(&self) -> usize {
        self.whiteouts.len()
    }

    fn find(&self, key: &Key) -> Option<Found> {
        (0..self.sets.len()).rev().find_map(|set| {
            self.sets[set]
                .binary_search_by(|e| e.key.cmp(key))
                .ok()
                .map(|pos| Found { set, pos })
        })
    }

    fn entry(&self, f: Found) -> &Entry {
        &self.sets[f.set][f.pos]
    }

    /// The live value of `key`.
    pub fn get(&self, key: &Key) -> Option<&[u8]> {
        self.find(key).and_then(|f| self.entry(f).val.as_deref())
    }

    /// Live entries with keys `>= from`, in order.
    pub fn iter_from(&self, from: &Key) -> Cursor<'_> {
        let mut pos: Positions = [0; MAX_SETS];
        for (p, set) in pos.iter_mut().zip(&self.sets) {
            *p = set.partition_point(|e| e.key < *from);
        }
        Cursor(AllCursor { node: self, pos })
    }

    /// In an interior node, the entry whose child covers `key`: the greatest separator
    /// `<= key`, or the first one (the leftmost child also takes keys below it).
    pub fn child_entry(&self, key: &Key) -> Option<(Key, &[u8])> {
        self.get_le(key)
            .or_else(|| self.iter_from(&Key::MIN).next())
    }

    /// The live entry with the greatest key `<= key`.
    pub fn get_le(&self, key: &Key) -> Option<(Key, &[u8])> {
        let mut ends: Positions = [0; MAX_SETS];
        for (end, set) in ends.iter_mut().zip(&self.sets) {
            *end = set.partition_point(|e| e.key <= *key);
        }
        let ends = &mut ends[..self.sets.len()];
        loop {
            // The greatest head among the sets; the newest set holding it decides.
            let mut best: Option<(Key, usize)> = None;
            for (s, &end) in ends.iter().enumerate() {
                if end > 0 {
                    let k = self.sets[s][end - 1].key;
                    if best.is_none_or(|(bk, _)| k >= bk) {
                        best = Some((k, s));
                    }
                }
            }
            let (k, s) = best?;
            let val = self.sets[s][ends[s] - 1].val.as_deref();
            for (set, end) in ends.iter_mut().enumerate() {
                if *end > 0 && self.sets[set][*end - 1].key == k {
                    *end -= 1;
                }
            }
            if let Some(v) = val {
                return Some((k, v));
            }
        }
    }

    /// The smallest live key.
    pub fn first_key(&self) -> Option<Key> {
        self.iter_from(&Key::MIN).next().map(|(k, _)| k)
    }

    /// Number of live entries (walks the node).
    pub fn live_count(&self) -> usize {
        self.iter_from(&Key::MIN).count()
    }

    fn forget(&mut self, e: &Entry) {
        self.live_bytes -= e.live_len();
        self.pending_bytes -= e.pending_len();
    }

    fn account(&mut self, e: &Entry) {
        self.live_bytes += e.live_len();
        self.pending_bytes += e.pending_len();
    }

    /// Puts `e` into the newest set (replacing an entry with the same key there).
    fn put_newest(&mut self, e: Entry) {
        self.account(&e);
        self.mem_bytes += e.mem();
        let newest = self.sets.len() - 1;
        let set = &mut self.sets[newest];
        match set.binary_search_by(|x| x.key.cmp(&e.key)) {
            Ok(i) => {
                let old = core::mem::replace(&mut set[i], e);
                self.mem_bytes -= old.mem();
            }
            Err(i) => set.insert(i, e),
        }
        if self.sets[newest].len() >= NEWEST_MAX {
            self.start_new_set();
        }
    }

    /// Inserts or overwrites `key`.
    pub fn insert(&mut self, key: Key, val: Box<[u8]>) {
        let mut needs_whiteout = false;
        if let Some(f) = self.find(&key) {
            let old = self.entry(f).clone();
            needs_whiteout = old.needs_whiteout;
            self.forget(&old);
        }
        if let Ok(i) = self.whiteouts.binary_search(&key) {
            // The key was deleted and its deletion not yet written: the new version
            // shadows the on-disk one, so the separate whiteout is no longer needed.
            self.whiteouts.remove(i);
            self.pending_bytes -= entry_len(0);
            self.mem_bytes -= size_of::<Key>();
            needs_whiteout = true;
        }
        self.put_newest(Entry {
            key,
            val: Some(val),
            dirty: true,
            needs_whiteout,
        });
    }

    /// Deletes `key`; returns whether it was present.
    pub fn remove(&mut self, key: &Key) -> bool {
        let Some(f) = self.find(key) else {
            return false;
        };
        let old = self.entry(f).clone();
        if old.val.is_none() {
            return false;
        }
        self.forget(&old);
        let newest = self.sets.len() - 1;
        let older_has_key = self.sets[..newest]
            .iter()
            .any(|s| s.binary_search_by(|e| e.key.cmp(key)).is_ok());
        if f.set == newest && !older_has_key && !old.needs_whiteout {
            // Never written and shadows nothing: it simply goes.
            self.sets[newest].remove(f.pos);
            self.mem_bytes -= old.mem();
            return true;
        }
        self.put_newest(Entry {
            key: *key,
            val: None,
            dirty: true,
            needs_whiteout: old.needs_whiteout,
        });
        true
    }

    /// Freezes the newest set and starts a new one, compacting if that would exceed
    /// [`MAX_SETS`].
    fn start_new_set(&mut self) {
        if self.sets.len() == MAX_SETS {
            let tail: usize = self.sets[1..].iter().map(Vec::len).sum();
            // Merge only the small newer sets while they are small against the big one,
            // so the big set is not rebuilt on every freeze.
            let from = if tail * 2 < self.sets[0].len() { 1 } else { 0 };
            self.merge_sets(from);
        }
        self.sets.push(Vec::new());
    }

    /// Merges `sets[from..]` into one set. Merging everything (`from == 0`) drops
    /// whiteouts, moving those that must be written to the separate list.
    fn merge_sets(&mut self, from: usize) {
        // One set with entries has nothing to merge with: it is kept as it is (merging
        // everything still drops its whiteouts) instead of rebuilt entry by entry. A
        // checkpoint merges every node it writes, twice: this is most of them.
        if self.sets[from..].iter().filter(|s| !s.is_empty()).count() <= 1 {
            let mut set = self
                .sets
                .drain(from..)
                .find(|s| !s.is_empty())
                .unwrap_or_default();
            if from == 0 {
                let mut moved_whiteouts = Vec::new();
                let mem = &mut self.mem_bytes;
                set.retain(|e| {
                    if e.val.is_none() {
                        *mem -= e.mem();
                        if e.needs_whiteout {
                            moved_whiteouts.push(e.key);
                        }
                    }
                    e.val.is_some()
                });
                self.keep_whiteouts(moved_whiteouts);
            }
            self.sets.push(set);
            return;
        }
        // Entries are moved, not cloned: the merged sets are consumed.
        let mut parts: Vec<core::iter::Peekable<alloc::vec::IntoIter<Entry>>> = self
            .sets
            .drain(from..)
            .map(|set| set.into_iter().peekable())
            .collect();
        let mut merged: Vec<Entry> = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut moved_whiteouts = Vec::new();
        loop {
            let mut best: Option<(Key, usize)> = None;
            for (s, part) in parts.iter_mut().enumerate() {
                if let Some(e) = part.peek() {
                    if best.is_none_or(|(bk, _)| e.key <= bk) {
                        best = Some((e.key, s));
                    }
                }
            }
            let Some((k, s)) = best else { break };
            let winner = parts[s].next().expect("peeked");
            for part in &mut parts {
                if let Some(shadowed) = part.next_if(|e| e.key == k) {
                    self.mem_bytes -= shadowed.mem();
                }
            }
            if winner.val.is_none() && from == 0 {
                self.mem_bytes -= winner.mem();
                if winner.needs_whiteout {
                    moved_whiteouts.push(k);
                }
                continue;
            }
            merged.push(winner);
        }
        self.keep_whiteouts(moved_whiteouts);
        self.sets.push(merged);
    }

    /// Adds whiteouts dropped from the sets that must still be written (sorted keys) to
    /// the separate list.
    fn keep_whiteouts(&mut self, moved: Vec<Key>) {
        if !moved.is_empty() {
            self.mem_bytes += moved.len() * size_of::<Key>();
            let old = core::mem::take(&mut self.whiteouts);
            self.whiteouts = merge_sorted_keys(old, moved);
        }
    }

    /// Compacts into a single set (plus an empty newest one).
    pub fn compact(&mut self) {
        self.merge_sets(0);
        self.sets.push(Vec::new());
    }

    /// The entries of the next append: dirty live entries and whiteouts that must be
    /// written, in key order.
    pub fn pending_entries(&self) -> Vec<(Key, Option<&[u8]>)> {
        let mut out = Vec::new();
        let mut cur = self.iter_all();
        let mut wo = self.whiteouts.iter().peekable();
        while let Some(e) = cur.next_entry() {
            while let Some(&&w) = wo.peek().filter(|&&&w| w < e.key) {
                out.push((w, None));
                wo.next();
            }
            if e.pending_len() > 0 {
                out.push((e.key, e.val.as_deref()));
            }
        }
        out.extend(wo.map(|&w| (w, None)));
        out
    }

    /// The bset that appends this node's changes after its written blocks (sealed,
    /// that is checksummed, later: see [`UnsealedBset`]).
    pub fn encode_append(&self, seq: u64) -> UnsealedBset {
        let entries = self.pending_entries();
        UnsealedBset::new(
            self.id,
            seq,
            self.written_blocks,
            self.pending_bytes,
            entries,
        )
    }

    /// The bset of a full rewrite (the first bset of a fresh location).
    pub fn encode_full(&self, seq: u64) -> UnsealedBset {
        let entries = self.iter_from(&Key::MIN).map(|(k, v)| (k, Some(v)));
        UnsealedBset::new(self.id, seq, 0, self.live_bytes, entries)
    }

    /// Records that the node's content is now on disk (after `encode_append` or
    /// `encode_full` was queued for writing): everything clean, whiteouts dropped,
    /// compacted into one set.
    pub fn mark_written(&mut self, written_blocks: u32, seq: u64) {
        self.merge_sets(0);
        self.drop_whiteouts();
        for e in &mut self.sets[0] {
            e.dirty = false;
            e.needs_whiteout = true;
        }
        self.sets.push(Vec::new());
        self.pending_bytes = 0;
        self.written_blocks = written_blocks;
        self.written_seq = seq;
        self.from_split = false;
    }

    /// Moves the node to a fresh location: nothing of it is on disk there, so every
    /// live entry must be written and no whiteout is needed.
    pub fn relocate(&mut self, id: NodeId, addr: u64) {
        self.merge_sets(0);
        self.drop_whiteouts();
        for e in &mut self.sets[0] {
            e.dirty = true;
            e.needs_whiteout = false;
        }
        self.sets.push(Vec::new());
        self.pending_bytes = self.live_bytes;
        self.id = id;
        self.addr = addr;
        self.written_blocks = 0;
    }

    fn drop_whiteouts(&mut self) {
        self.mem_bytes -= self.whiteouts.len() * size_of::<Key>();
        self.whiteouts.clear();
    }

    /// Moves the upper half (by bytes) of the live entries out, for a split. Moved keys
    /// that are on disk here leave whiteouts behind, so the node can still be appended
    /// to. Leaves at least one entry on each side.
    pub fn split_upper(&mut self) -> Vec<(Key, Box<[u8]>)> {
        self.merge_sets(0);
        let set = &mut self.sets[0];
        assert!(
            set.len() >= 2,
            "splitting a node with fewer than two entries"
        );
        let half = self.live_bytes / 2;
        let mut acc = 0;
        let mut at = set.len() - 1;
        for (i, e) in set.iter().enumerate() {
            acc += e.live_len();
            if acc >= half {
                at = (i + 1).clamp(1, set.len() - 1);
                break;
            }
        }
        let moved = set.split_off(at);
        let mut left_behind = Vec::new();
        for e in &moved {
            self.live_bytes -= e.live_len();
            self.pending_bytes -= e.pending_len();
            self.mem_bytes -= e.mem();
            if e.needs_whiteout {
                left_behind.push(e.key);
            }
        }
        self.pending_bytes += left_behind.len() * entry_len(0);
        self.mem_bytes += left_behind.len() * size_of::<Key>();
        let old = core::mem::take(&mut self.whiteouts);
        self.whiteouts = merge_sorted_keys(old, left_behind);
        self.sets.push(Vec::new());
        moved
            .into_iter()
            .map(|e| (e.key, e.val.expect("compacted sets hold no whiteouts")))
            .collect()
    }

    /// Takes every live entry out (for a split or merge), leaving the node empty.
    pub fn take_live(&mut self) -> Vec<(Key, Box<[u8]>)> {
        self.compact();
        let set = core::mem::take(&mut self.sets[0]);
        self.sets = alloc::vec![Vec::new()];
        self.whiteouts.clear();
        self.live_bytes = 0;
        self.pending_bytes = 0;
        self.mem_bytes = NODE_OVERHEAD;
        set.into_iter()
            .map(|e| (e.key, e.val.expect("compacted sets hold no whiteouts")))
            .collect()
    }

    fn iter_all(&self) -> AllCursor<'_> {
        AllCursor {
            node: self,
            pos: [0; MAX_SETS],
        }
    }

    /// Recomputes every counter from scratch and checks the structural invariants.
    /// For tests and debug assertions.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.sets.is_empty() || self.sets.len() > MAX_SETS {
            return Err("set count");
        }
        for s in &self.sets {
            if !s.windows(2).all(|w| w[0].key < w[1].key) {
                return Err("set order");
            }
        }
        if !self.whiteouts.windows(2).all(|w| w[0] < w[1]) {
            return Err("whiteout order");
        }
        let mut live = 0;
        let mut pending = 0;
        let mut cur = self.iter_all();
        while let Some(e) = cur.next_entry() {
            live += e.live_len();
            pending += e.pending_len();
            if e.val.is_some() && self.whiteouts.binary_search(&e.key).is_ok() {
                return Err("live key also in separate whiteouts");
            }
        }
        pending += self.whiteouts.len() * entry_len(0);
        if live != self.live_bytes {
            return Err("live bytes");
        }
        if pending != self.pending_bytes {
            return Err("pending bytes");
        }
        let mem = NODE_OVERHEAD
            + self.sets.iter().flatten().map(Entry::mem).sum::<usize>()
            + self.whiteouts.len() * size_of::<Key>();
        if mem != self.mem_bytes {
            return Err("mem bytes");
        }
        Ok(())
    }
}

fn merge_sorted_keys(a: Vec<Key>, b: Vec<Key>) -> Vec<Key> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if j == b.len() || (i < a.len() && a[i] < b[j]) {
            out.push(a[i]);
            i += 1;
        } else {
            if i < a.len() && a[i] == b[j] {
                i += 1;
            }
            out.push(b[j]);
            j += 1;
        }
    }
    out
}

/// Iterates the visible live entries of a node from some key on.
#[derive(Debug)]
pub struct Cursor<'a>(AllCursor<'a>);

impl<'a> Iterator for Cursor<'a> {
    type Item = (Key, &'a [u8]);

    fn next(&mut self) -> Option<(Key, &'a [u8])> {
        loop {
            let e = self.0.next_entry()?;
            if let Some(v) = e.val.as_deref() {
                return Some((e.key, v));
            }
        }
    }
}

/// Iterates the visible entries (whiteouts included) of a node.
#[derive(Debug)]
struct AllCursor<'a> {
    node: &'a Node,
    pos: Positions,
}

impl<'a> AllCursor<'a> {
    fn next_entry(&mut self) -> Option<&'a Entry> {
        let sets = &self.node.sets;
        let mut best: Option<(Key, usize)> = None;
        for (s, set) in sets.iter().enumerate() {
            if let Some(e) = set.get(self.pos[s]) {
                if best.is_none_or(|(bk, _)| e.key <= bk) {
                    best = Some((e.key, s));
                }
            }
        }
        let (k, s) = best?;
        let winner = &sets[s][self.pos[s]];
        for (set, p) in sets.iter().zip(&mut self.pos) {
            if set.get(*p).is_some_and(|e| e.key == k) {
                *p += 1;
            }
        }
        Some(winner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bset::parse_node;
    use crate::format::{TreeId, BLOCK_SIZE};
    use proptest::prelude::*;

    const ID: NodeId = NodeId {
        tree: TreeId::Fs,
        level: 0,
        nonce: 5,
    };

    fn k(i: u64) -> Key {
        Key::new(i, 1, 0)
    }

    fn v(i: u64, len: usize) -> Box<[u8]> {
        alloc::vec![i as u8; len].into()
    }

    /// Writes the node the way a checkpoint does and reads it back from the bytes.
    fn write_and_reload(node: &mut Node, disk: &mut Vec<u8>, seq: u64) -> Node {
        let bytes = if node.written_blocks == 0 {
            disk.clear();
            node.encode_full(seq)
        } else {
            node.encode_append(seq)
        }
        .seal();
        disk.extend_from_slice(&bytes);
        let blocks = (disk.len() / BLOCK_SIZE) as u32;
        node.mark_written(blocks, seq);
        let parsed = parse_node(disk, node.id, blocks).unwrap();
        Node::from_disk(node.id, node.addr, blocks, &parsed)
    }

    fn contents(n: &Node) -> Vec<(Key, Vec<u8>)> {
        n.iter_from(&Key::MIN)
            .map(|(k, v)| (k, v.to_vec()))
            .collect()
    }

    #[test]
    fn whiteout_only_when_on_disk() {
        let mut n = Node::new(ID, 100);
        n.insert(k(1), v(1, 10));
        // Never written: deleting it leaves nothing to write.
        assert!(n.remove(&k(1)));
        assert_eq!(n.pending_entries(), []);
        n.insert(k(2), v(2, 10));
        let mut disk = Vec::new();
        write_and_reload(&mut n, &mut disk, 1);
        assert!(!n.is_dirty());
        // On disk: deleting it must write a whiteout.
        assert!(n.remove(&k(2)));
        assert_eq!(n.pending_entries(), [(k(2), None)]);
        // Overwriting a written key, then deleting the unwritten version: the delete
        // must still write a whiteout (what it overwrote is on disk).
        n.insert(k(2), v(3, 10));
        assert_eq!(n.pending_entries(), [(k(2), Some(&v(3, 10)[..]))]);
        assert!(n.remove(&k(2)));
        assert_eq!(n.pending_entries(), [(k(2), None)]);
        let back = write_and_reload(&mut n, &mut disk, 2);
        assert_eq!(contents(&back), []);
        assert!(!n.remove(&k(2)));
        n.check_invariants().unwrap();
    }

    #[test]
    fn whiteouts_kept_apart_after_compaction() {
        let mut n = Node::new(ID, 100);
        for i in 0..50 {
            n.insert(k(i), v(i, 8));
        }
        let mut disk = Vec::new();
        write_and_reload(&mut n, &mut disk, 1);
        for i in 0..50 {
            assert!(n.remove(&k(i)));
        }
        // Enough inserts to freeze and compact the sets several times.
        for i in 100..100 + 4 * NEWEST_MAX as u64 {
            n.insert(k(i), v(i, 8));
        }
        assert!(n.set_count() <= MAX_SETS);
        assert_eq!(n.separate_whiteouts(), 50);
        n.check_invariants().unwrap();
        let pending = n.pending_entries();
        assert_eq!(pending.iter().filter(|(_, v)| v.is_none()).count(), 50);
        let back = write_and_reload(&mut n, &mut disk, 2);
        assert_eq!(contents(&back), contents(&n));
        assert_eq!(back.live_count(), 4 * NEWEST_MAX);
        assert_eq!(n.separate_whiteouts(), 0);
    }

    #[test]
    fn reinsert_after_separated_whiteout() {
        let mut n = Node::new(ID, 100);
        n.insert(k(1), v(1, 4));
        let mut disk = Vec::new();
        write_and_reload(&mut n, &mut disk, 1);
        n.remove(&k(1));
        n.compact();
        assert_eq!(n.separate_whiteouts(), 1);
        n.insert(k(1), v(9, 4));
        assert_eq!(n.separate_whiteouts(), 0);
        // Deleting the re-inserted key must bring the whiteout back.
        n.remove(&k(1));
        assert_eq!(n.pending_entries(), [(k(1), None)]);
        n.check_invariants().unwrap();
        let back = write_and_reload(&mut n, &mut disk, 2);
        assert_eq!(contents(&back), []);
    }

    #[test]
    fn split_leaves_whiteouts_for_written_keys() {
        let mut n = Node::new(ID, 1);
        for i in 0..10 {
            n.insert(k(i), v(i, 100));
        }
        let mut disk = Vec::new();
        write_and_reload(&mut n, &mut disk, 1);
        n.insert(k(10), v(10, 100));
        let moved = n.split_upper();
        assert!(!moved.is_empty() && n.live_count() > 0);
        assert_eq!(moved.len() + n.live_count(), 11);
        n.check_invariants().unwrap();
        // The moved keys that were on disk get whiteouts; k(10) was never written.
        let pending = n.pending_entries();
        assert_eq!(pending.len(), moved.len() - 1);
        assert!(pending.iter().all(|(_, v)| v.is_none()));
        let back = write_and_reload(&mut n, &mut disk, 2);
        assert_eq!(contents(&back), contents(&n));
    }

    #[test]
    fn get_le_skips_whiteouts() {
        let mut n = Node::new(ID, 1);
        for i in [10, 20, 30] {
            n.insert(k(i), v(i, 1));
        }
        n.compact();
        n.remove(&k(20));
        assert_eq!(n.get_le(&k(25)).map(|(k, _)| k), Some(k(10)));
        assert_eq!(n.get_le(&k(30)).map(|(k, _)| k), Some(k(30)));
        assert_eq!(n.get_le(&k(9)), None);
        assert_eq!(n.first_key(), Some(k(10)));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        Write,
        Compact,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..200, 0usize..40).prop_map(|(k, l)| Op::Insert(k, l)),
            4 => (0u64..200).prop_map(Op::Remove),
            1 => Just(Op::Write),
            1 => Just(Op::Compact),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The node against a BTreeMap, through writes (appends) and reloads.
        #[test]
        fn matches_btreemap(ops in proptest::collection::vec(op(), 1..600)) {
            let mut n = Node::new(ID, 7);
            let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
            let mut disk = Vec::new();
            let mut seq = 0;
            for o in ops {
                match o {
                    Op::Insert(i, l) => {
                        n.insert(k(i), v(i + l as u64, l));
                        model.insert(k(i), v(i + l as u64, l).to_vec());
                    }
                    Op::Remove(i) => {
                        prop_assert_eq!(n.remove(&k(i)), model.remove(&k(i)).is_some());
                    }
                    Op::Write => {
                        seq += 1;
                        if disk.len() + n.pending_bytes() + 2 * BLOCK_SIZE > 64 * 1024 {
                            n.relocate(ID, 7); // as a checkpoint does when the node is full
                        }
                        let back = write_and_reload(&mut n, &mut disk, seq);
                        prop_assert_eq!(contents(&back), contents(&n));
                        prop_assert_eq!(back.live_bytes(), n.live_bytes());
                    }
                    Op::Compact => n.compact(),
                }
                prop_assert!(n.set_count() <= MAX_SETS);
                n.check_invariants().map_err(TestCaseError::fail)?;
                let got = contents(&n);
                let want: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
                prop_assert_eq!(got, want);
            }
            for i in 0..200 {
                prop_assert_eq!(n.get(&k(i)).map(|v| v.to_vec()), model.get(&k(i)).cloned());
                let le = n.get_le(&k(i)).map(|(k, _)| k);
                prop_assert_eq!(le, model.range(..=k(i)).next_back().map(|(k, _)| *k));
            }
        }
    }
}

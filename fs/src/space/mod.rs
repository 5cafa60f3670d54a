//! Block allocation over the on-disk bitmap groups.
//!
//! The in-memory bitmap of a cached group is the *current* state. Blocks move through
//! these sets, whose rules keep every committed checkpoint self-consistent:
//!
//! - **reserved**: set in memory but not yet referenced by the tree (a data write in
//!   flight, the node pool). A checkpoint writes them as free, so a crash never leaks
//!   them; they become ordinary allocations when the tree references them.
//! - **pending free**: no longer referenced, bits still set. The next checkpoint clears
//!   them (so the state it commits shows them free) and moves them to *pinned*.
//! - **pinned**: clear, but not reusable until the checkpoint that freed them commits:
//!   until then the previous checkpoint, which still references them, is the one a crash
//!   would return to.
//!
//! A move between these sets that breaks their rules (placing blocks that were not
//! reserved, freeing blocks twice, a group's free count that differs from its bits)
//! changes nothing more and is kept as a [`Violation`] for the filesystem to take
//! ([`Allocator::take_violation`]): it fails before its next commit is written, in every
//! build (`core::checks`).

use alloc::vec::Vec;
use core::ops::Range;
use hashbrown::HashMap;

use crate::format::bitmap::{set_bit, test_bit, GroupBlock, BLOCKS_PER_GROUP, HEADER_LEN};
use crate::format::{Layout, BLOCK_SIZE, MAX_EXTENT_BLOCKS};
use crate::util::check::{ensure, Violation};
use crate::util::ranges::RangeSet;

/// Why an allocation cannot proceed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocNeed {
    /// This group's bitmap must be read first.
    Group(u32),
    /// Not enough free space (a checkpoint may release pinned or pending space).
    NoSpace,
}

/// A cached bitmap group.
#[derive(Debug)]
struct Group {
    bits: Vec<u8>,
    free: u32,
    dirty: bool,
    /// The slot holding the newest written version.
    slot: usize,
    /// Checkpoint sequence of the newest written version.
    written_seq: u64,
    last_used: u64,
}

/// One bitmap block to write in a checkpoint.
#[derive(Debug)]
pub struct GroupWrite {
    /// Group number.
    pub group: u32,
    /// Destination block.
    pub block: u64,
    /// The encoded block.
    pub data: Vec<u8>,
}

/// Allocator counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Blocks allocated for data.
    pub data_blocks: u64,
    /// Nodes placed (counted by the checkpoint that places them).
    pub node_allocs: u64,
    /// Blocks freed (committed).
    pub freed_blocks: u64,
    /// Bitmap group reads.
    pub group_loads: u64,
}

/// A piece of a range, and whether a set contains it.
#[derive(Debug)]
pub struct Part {
    /// The blocks.
    pub range: Range<u64>,
    /// Whether the set contains them.
    pub held: bool,
}

/// Splits `r` into maximal pieces inside and outside `set`.
pub fn split_by(set: &RangeSet, r: Range<u64>) -> Vec<Part> {
    let mut out = Vec::new();
    let mut s = r.start;
    while s < r.end {
        let inside = set.contains(s);
        let e = if inside {
            set.next_gap(s)
        } else {
            set.next_start_after(s).unwrap_or(u64::MAX)
        }
        .min(r.end);
        out.push(Part {
            range: s..e,
            held: inside,
        });
        s = e;
    }
    out
}

/// The allocator. See the module documentation.
pub struct Allocator {
    layout: Layout,
    node_blocks: u64,
    groups: HashMap<u32, Group>,
    /// Free count per group, once known.
    group_free: Vec<Option<u32>>,
    free_total: u64,
    reserved: RangeSet,
    pending_free: RangeSet,
    pinned: RangeSet,
    /// Blocks the newest snapshot references: the live filesystem never frees them
    /// (nor any other block a snapshot references: those it references too).
    held: RangeSet,
    /// Blocks of `held` that the live filesystem no longer references (freed while held,
    /// since this mount).
    held_dead: RangeSet,
    cursor: u64,
    node_pool: Vec<u64>,
    tick: u64,
    /// The first rule of the books broken, until the filesystem takes it.
    violation: Option<Violation>,
    /// Counters.
    pub stats: AllocStats,
}

impl core::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Allocator")
            .field("free_total", &self.free_total)
            .field("reserved", &self.reserved.len())
            .field("pending_free", &self.pending_free.len())
            .field("pinned", &self.pinned.len())
            .field("cached_groups", &self.groups.len())
            .finish()
    }
}

impl Allocator {
    /// An allocator for `layout` whose committed state has `free_blocks` free.
    pub fn new(layout: Layout, node_size: u32, free_blocks: u64) -> Allocator {
        Allocator {
            layout,
            node_blocks: u64::from(node_size) / BLOCK_SIZE as u64,
            groups: HashMap::new(),
            group_free: alloc::vec![None; layout.groups as usize],
            free_total: free_blocks,
            reserved: RangeSet::new(),
            pending_free: RangeSet::new(),
            pinned: RangeSet::new(),
            held: RangeSet::new(),
            held_dead: RangeSet::new(),
            cursor: layout.data_start(),
            node_pool: Vec::new(),
            tick: 0,
            violation: None,
            stats: AllocStats::default(),
        }
    }

    /// Grows to `layout` (the same fixed regions, more blocks; see
    /// [`Layout::grown`]): the old last group's blocks past the old end become free (that
    /// group must be cached), and `added` — the new groups' bitmaps, already written to
    /// both of their slots — join the cache. Returns the blocks gained.
    pub fn grow(&mut self, layout: Layout, added: Vec<GroupBlock>) -> Result<u64, AllocNeed> {
        let old = self.layout;
        let last = old.groups - 1;
        if !self.groups.contains_key(&last) {
            return Err(AllocNeed::Group(last));
        }
        let before = self.free_total;
        let last_end = (u64::from(last) + 1) * BLOCKS_PER_GROUP;
        let freed = old.total_blocks..layout.total_blocks.min(last_end);
        if !freed.is_empty() {
            self.set_bits(freed, false);
        }
        self.layout = layout;
        self.group_free.resize(layout.groups as usize, None);
        for block in added {
            self.free_total += u64::from(block.free);
            self.insert_group(block, 0);
        }
        Ok(self.free_total - before)
    }

    /// Whether group `g` is cached.
    pub fn has_group(&self, g: u32) -> bool {
        self.groups.contains_key(&g)
    }

    /// Adds a group read from disk: `slot` is the slot its content came from.
    ///
    /// The free total came from the superblock: the groups' counts, as they are read,
    /// must agree with it (their sum at most the total, and equal to it once every
    /// group's is known). A superblock that disagrees — forged, since both are written
    /// by the same checkpoint — breaks the books: a [`Violation`], so the filesystem
    /// fails before it commits anything on a wrong total (a total below what is free
    /// would otherwise underflow as blocks are allocated).
    pub fn insert_group(&mut self, block: GroupBlock, slot: usize) {
        let g = block.group;
        if self.groups.contains_key(&g) {
            return;
        }
        self.tick += 1;
        self.stats.group_loads += 1;
        self.group_free[g as usize] = Some(block.free);
        let known: u64 = self
            .group_free
            .iter()
            .flatten()
            .map(|&f| u64::from(f))
            .sum();
        let all = self.group_free.iter().all(Option::is_some);
        if known > self.free_total || (all && known != self.free_total) {
            self.broke(Violation {
                what: "free total differs from the groups' counts",
                detail: alloc::format!(
                    "the total says {} free, the groups read so far {known}{}",
                    self.free_total,
                    if all { " (all of them)" } else { "" }
                ),
            });
        }
        self.groups.insert(
            g,
            Group {
                bits: block.bits,
                free: block.free,
                dirty: false,
                slot,
                written_seq: block.seq,
                last_used: self.tick,
            },
        );
    }

    /// Free blocks that may be allocated now (clear and not pinned).
    pub fn available(&self) -> u64 {
        self.free_total - self.pinned.len()
    }

    /// Blocks that will become available once checkpoints commit.
    pub fn reclaimable(&self) -> u64 {
        self.pending_free.len() + self.pinned.len()
    }

    /// Free blocks counting those freed but not reusable yet (pending and pinned): what
    /// `statfs` reports. Making them available takes one committed checkpoint, which an
    /// allocation that finds no space runs before it gives up.
    pub fn free_after_checkpoint(&self) -> u64 {
        self.available() + self.reclaimable()
    }

    /// Free blocks as the next checkpoint will record them.
    pub fn committed_free(&self) -> u64 {
        self.free_total + self.reserved.len()
    }

    /// Blocks in the node pool.
    pub fn pool_len(&self) -> usize {
        self.node_pool.len()
    }

    fn block_range(&self, g: u32) -> Range<u64> {
        let start = u64::from(g) * BLOCKS_PER_GROUP;
        start..start + self.layout.group_len(g)
    }

    /// Finds free runs totalling `n` blocks, each `min_run..=max_run` long, without
    /// changing anything.
    fn find(&self, n: u64, min_run: u64, max_run: u64) -> Result<Vec<Range<u64>>, AllocNeed> {
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut need = n;
        let groups = self.layout.groups;
        let (start_group, _) = Layout::group_of(self.cursor);
        for i in 0..=groups {
            let g = (start_group + i) % groups;
            if self.group_free[g as usize] == Some(0) {
                continue;
            }
            let Some(group) = self.groups.get(&g) else {
                return Err(AllocNeed::Group(g));
            };
            let range = self.block_range(g);
            let mut b = if i == 0 {
                self.cursor.max(range.start)
            } else {
                range.start
            };
            let end = if i == groups {
                self.cursor.min(range.end)
            } else {
                range.end
            };
            while b < end && need > 0 {
                let bit = (b - range.start) as usize;
                if bit.is_multiple_of(8) && b + 8 <= end && group.bits[bit / 8] == 0xFF {
                    b += 8;
                    continue;
                }
                if test_bit(&group.bits, bit) || self.pinned.contains(b) {
                    b += 1;
                    continue;
                }
                // A free run starts at b.
                let want = need.max(min_run).min(max_run);
                let mut e = b;
                while e < end.min(b + want)
                    && !test_bit(&group.bits, (e - range.start) as usize)
                    && !self.pinned.contains(e)
                {
                    e += 1;
                }
                if e - b >= min_run {
                    out.push(b..e);
                    need = need.saturating_sub(e - b);
                }
                b = e;
            }
            if need == 0 {
                return Ok(out);
            }
        }
        Err(AllocNeed::NoSpace)
    }

    fn set_bits(&mut self, r: Range<u64>, v: bool) {
        let (g, first) = Layout::group_of(r.start);
        let group = self.groups.get_mut(&g).expect("group cached");
        let mut n = 0u32;
        let mut already = None;
        for i in 0..(r.end - r.start) as usize {
            if test_bit(&group.bits, first + i) == v {
                already.get_or_insert(r.start + i as u64);
                continue;
            }
            set_bit(&mut group.bits, first + i, v);
            n += 1;
        }
        if let Some(b) = already {
            // Allocating an allocated block, or freeing a free one: it stays as it is.
            let what = if v {
                "allocating an allocated block"
            } else {
                "freeing a free block"
            };
            self.broke(Violation {
                what,
                detail: alloc::format!("block {b} of {}..{}", r.start, r.end),
            });
        }
        let group = self.groups.get_mut(&g).expect("group cached");
        if v {
            group.free -= n;
            self.free_total -= u64::from(n);
        } else {
            group.free += n;
            self.free_total += u64::from(n);
        }
        group.dirty = true;
        self.group_free[g as usize] = Some(group.free);
    }

    fn take(&mut self, runs: &[Range<u64>]) {
        for r in runs {
            self.set_bits(r.clone(), true);
            self.reserved.insert(r.clone());
        }
        if let Some(last) = runs.last() {
            self.cursor = if last.end >= self.layout.total_blocks {
                self.layout.data_start()
            } else {
                last.end
            };
        }
    }

    /// Reserves `n` data blocks (in runs of at most [`MAX_EXTENT_BLOCKS`]), keeping
    /// `keep` blocks available for metadata. All or nothing.
    pub fn alloc_data(&mut self, n: u64, keep: u64) -> Result<Vec<Range<u64>>, AllocNeed> {
        if self.available() < n + keep {
            return Err(AllocNeed::NoSpace);
        }
        let runs = self.find(n, 1, u64::from(MAX_EXTENT_BLOCKS))?;
        self.take(&runs);
        self.stats.data_blocks += n;
        Ok(runs)
    }

    /// Fills the node pool to `n` node-sized runs (may dip into the metadata reserve).
    pub fn fill_pool(&mut self, n: usize) -> Result<(), AllocNeed> {
        while self.node_pool.len() < n {
            if self.available() < self.node_blocks {
                return Err(AllocNeed::NoSpace);
            }
            let runs = self.find(self.node_blocks, self.node_blocks, self.node_blocks)?;
            self.take(&runs);
            self.node_pool.push(runs[0].start);
        }
        Ok(())
    }

    /// Takes a node location from the pool. It stays reserved until
    /// [`Allocator::commit_reserved`] (the node is referenced by a committed parent).
    pub fn take_node(&mut self) -> Option<u64> {
        self.node_pool.pop()
    }

    /// Puts an unused location back into the pool.
    pub fn return_node(&mut self, addr: u64) {
        self.node_pool.push(addr);
    }

    /// The first broken rule of the books since it was last taken (see the module
    /// documentation).
    pub fn take_violation(&mut self) -> Option<Violation> {
        self.violation.take()
    }

    fn broke(&mut self, v: Violation) {
        self.violation.get_or_insert(v);
    }

    fn check(&mut self, checked: Result<(), Violation>) {
        if let Err(v) = checked {
            self.broke(v);
        }
    }

    /// The tree now references `r` (reserved earlier): it is an ordinary allocation.
    pub fn commit_reserved(&mut self, r: Range<u64>) {
        let removed = self.reserved.remove(r.clone());
        self.check(ensure(
            removed == r.end - r.start,
            "placing blocks that were not reserved",
            || alloc::format!("blocks {}..{}: {removed} reserved", r.start, r.end),
        ));
        let (g, _) = Layout::group_of(r.start);
        if let Some(group) = self.groups.get_mut(&g) {
            group.dirty = true;
        }
    }

    /// Fails with the first group of `r` that is not cached.
    pub fn ensure_groups(&self, r: Range<u64>) -> Result<(), AllocNeed> {
        let (first, _) = Layout::group_of(r.start);
        let (last, _) = Layout::group_of(r.end.saturating_sub(1).max(r.start));
        match (first..=last).find(|g| !self.groups.contains_key(g)) {
            Some(g) => Err(AllocNeed::Group(g)),
            None => Ok(()),
        }
    }

    /// Whether log replay may claim `r` for an extent the log references
    /// ([`Allocator::claim_replayed`]): every block free in the checkpoint and not
    /// pinned. Its groups must be cached.
    pub fn replayable(&self, r: Range<u64>) -> bool {
        !r.into_iter()
            .any(|b| self.is_allocated(b) != Some(false) || self.pinned.contains(b))
    }

    /// Log replay: marks `r` allocated and referenced (blocks of an extent the log
    /// references, free in the checkpoint). Its groups must be cached
    /// ([`Allocator::ensure_groups`]). Returns false (changing nothing) if any block is
    /// already allocated.
    pub fn claim_replayed(&mut self, r: Range<u64>) -> bool {
        if !self.replayable(r.clone()) {
            return false;
        }
        let mut s = r.start;
        while s < r.end {
            let (g, _) = Layout::group_of(s);
            let e = r.end.min(self.block_range(g).end);
            self.set_bits(s..e, true);
            s = e;
        }
        true
    }

    /// Gives back reserved blocks that were never referenced.
    pub fn unreserve(&mut self, r: Range<u64>) {
        let removed = self.reserved.remove(r.clone());
        if removed != r.end - r.start {
            // Some of them belong to someone else: their bits stay.
            self.broke(Violation {
                what: "giving back blocks that were not reserved",
                detail: alloc::format!("blocks {}..{}: {removed} reserved", r.start, r.end),
            });
            return;
        }
        self.set_bits(r, false);
    }

    /// Frees `r` at the next checkpoint (it stays allocated until then). Blocks a
    /// snapshot holds stay allocated: they are only noted as dead in the live filesystem.
    pub fn free(&mut self, r: Range<u64>) {
        for part in split_by(&self.held, r) {
            let ok = if part.held {
                self.held_dead.insert(part.range.clone())
            } else {
                self.pending_free.insert(part.range.clone())
            };
            self.check(ensure(ok, "double free", || {
                alloc::format!(
                    "blocks {}..{} already freed",
                    part.range.start,
                    part.range.end
                )
            }));
        }
    }

    /// Holds `blocks`, what the newest snapshot references, in place of what the one
    /// before it referenced (enough: a block the live filesystem frees is referenced by
    /// some snapshot only if it is by the newest, see `features::snapshots`). Blocks already
    /// waiting to be freed stay allocated instead (they belong to the snapshot now).
    pub fn hold_newest(&mut self, blocks: RangeSet) {
        for r in blocks.iter() {
            for part in split_by(&self.pending_free, r) {
                if part.held {
                    self.pending_free.remove(part.range.clone());
                    self.held_dead.insert(part.range);
                }
            }
        }
        self.held = blocks;
    }

    /// Frees `released` (blocks a deleted snapshot alone held that the live filesystem
    /// does not reference) at the next checkpoint; `newest`: the deleted snapshot was
    /// the newest, and this is what the one before it references (held from now on).
    pub fn release(&mut self, newest: Option<RangeSet>, released: &RangeSet) {
        if let Some(held) = newest {
            self.held = held;
        }
        for r in released.iter() {
            self.held_dead.remove(r.clone());
            let ok = self.pending_free.insert(r.clone());
            self.check(ensure(ok, "double free", || {
                alloc::format!("released blocks {}..{} already freed", r.start, r.end)
            }));
        }
    }

    /// Blocks the newest snapshot references.
    pub fn held(&self) -> &RangeSet {
        &self.held
    }

    /// Blocks snapshots hold that the live filesystem freed since this mount.
    pub fn held_dead(&self) -> &RangeSet {
        &self.held_dead
    }

    /// Groups that must be cached before [`Allocator::prepare`] can run, given extra
    /// blocks that the checkpoint may free.
    pub fn groups_needed(&self, extra: impl Iterator<Item = u64>) -> Vec<u32> {
        let mut gs: Vec<u32> = self
            .pending_free
            .iter()
            .flat_map(|r| {
                let (a, _) = Layout::group_of(r.start);
                let (b, _) = Layout::group_of(r.end - 1);
                a..=b
            })
            .chain(extra.map(|b| Layout::group_of(b).0))
            .filter(|g| !self.groups.contains_key(g))
            .collect();
        gs.sort_unstable();
        gs.dedup();
        gs
    }

    /// Checkpoint `seq`: applies pending frees (pinning them until the checkpoint
    /// commits) and encodes every changed group into its other slot.
    pub fn prepare(&mut self, seq: u64) -> Result<Vec<GroupWrite>, AllocNeed> {
        if let Some(&g) = self.groups_needed(core::iter::empty()).first() {
            return Err(AllocNeed::Group(g));
        }
        if !self.pinned.is_empty() {
            self.broke(Violation {
                what: "a checkpoint prepared before the last one committed",
                detail: alloc::format!("{} blocks still pinned", self.pinned.len()),
            });
            return Ok(Vec::new());
        }
        let frees = self.pending_free.take();
        for r in frees.iter() {
            // Split at group boundaries.
            let mut s = r.start;
            while s < r.end {
                let (g, _) = Layout::group_of(s);
                let e = r.end.min(self.block_range(g).end);
                self.set_bits(s..e, false);
                s = e;
            }
            self.stats.freed_blocks += r.end - r.start;
        }
        self.pinned = frees;
        let mut writes = Vec::new();
        let mut dirty: Vec<u32> = self
            .groups
            .iter()
            .filter(|(_, g)| g.dirty)
            .map(|(&n, _)| n)
            .collect();
        dirty.sort_unstable();
        for gnum in dirty {
            let range = self.block_range(gnum);
            let group = self.groups.get(&gnum).expect("cached");
            // Reserved blocks are not referenced by the state being committed.
            let mut bits = group.bits.clone();
            let mut free = group.free;
            for r in self.reserved.iter() {
                let (s, e) = (r.start.max(range.start), r.end.min(range.end));
                for b in s..e.max(s) {
                    set_bit(&mut bits, (b - range.start) as usize, false);
                    free += 1;
                }
            }
            // The count the group is written with is the one its bits show (bits past
            // the device's end stay set).
            let clear: u32 = bits.iter().map(|b| b.count_zeros()).sum();
            if clear != free || u64::from(free) > range.end - range.start {
                self.broke(Violation {
                    what: "bitmap group free count differs from its bits",
                    detail: alloc::format!("group {gnum}: {free} counted, {clear} clear"),
                });
                return Ok(Vec::new());
            }
            let slot = 1 - group.slot;
            let data = GroupBlock {
                group: gnum,
                seq,
                free,
                bits,
            }
            .encode();
            writes.push(GroupWrite {
                group: gnum,
                block: self.layout.bitmap_block(gnum, slot),
                data,
            });
            let group = self.groups.get_mut(&gnum).expect("cached");
            group.slot = slot;
            group.written_seq = seq;
            group.dirty = false;
        }
        Ok(writes)
    }

    /// The blocks the checkpoint prepared last frees, still pinned (for discarding them
    /// before [`Allocator::committed`] makes them reusable).
    pub fn pinned_ranges(&self) -> Vec<Range<u64>> {
        self.pinned.iter().collect()
    }

    /// The checkpoint prepared last has committed: its freed blocks are reusable.
    pub fn committed(&mut self) {
        self.pinned = RangeSet::new();
    }

    /// Drops clean cached groups beyond `max_groups` (least recently used first). Groups
    /// with unwritten changes, reservations or pinned blocks, or whose newest version is
    /// not committed yet, stay.
    pub fn evict(&mut self, max_groups: usize, committed_seq: u64) {
        if self.groups.len() <= max_groups {
            return;
        }
        let mut clean: Vec<(u64, u32)> = self
            .groups
            .iter()
            .filter(|(&g, grp)| {
                let r = self.block_range(g);
                !grp.dirty
                    && grp.written_seq <= committed_seq
                    && !self.reserved.overlaps(r.clone())
                    && !self.pinned.overlaps(r.clone())
                    && !self.pending_free.overlaps(r)
            })
            .map(|(&g, grp)| (grp.last_used, g))
            .collect();
        clean.sort_unstable();
        let excess = self.groups.len() - max_groups;
        for (_, g) in clean.into_iter().take(excess) {
            self.groups.remove(&g);
        }
    }

    /// Checks the allocator's books: every cached group's free count against its bits
    /// (bits past the device's end stay set), the per-group and total free counts,
    /// reserved, pending and pinned blocks disjoint, pinned blocks within the free ones,
    /// the node pool reserved. With `full`, also every block of those sets against the
    /// bitmap: reserved and pending blocks set, pinned ones clear.
    pub fn check_invariants(&self, full: bool) -> Result<(), &'static str> {
        for (&g, group) in &self.groups {
            let clear: u32 = group.bits.iter().map(|b| b.count_zeros()).sum();
            if clear != group.free {
                return Err("group free count differs from its bits");
            }
            if self.group_free[g as usize] != Some(group.free) {
                return Err("group free count differs from the per-group counts");
            }
        }
        let known: Option<u64> = self.group_free.iter().map(|f| f.map(u64::from)).sum();
        if known.is_some_and(|total| total != self.free_total) {
            return Err("free total differs from the groups' counts");
        }
        if self.pinned.len() > self.free_total {
            return Err("more blocks pinned than free");
        }
        if self
            .reserved
            .iter()
            .any(|r| self.pending_free.overlaps(r.clone()) || self.pinned.overlaps(r))
            || self.pending_free.iter().any(|r| self.pinned.overlaps(r))
        {
            return Err("reserved, pending and pinned blocks overlap");
        }
        if self
            .node_pool
            .iter()
            .any(|&a| self.reserved.next_gap(a) < a + self.node_blocks)
        {
            return Err("a node pool location is not reserved");
        }
        if full {
            let set = |b| self.is_allocated(b) != Some(false);
            let clear = |b| self.is_allocated(b) != Some(true);
            if !self.reserved.iter().flatten().all(set)
                || !self.pending_free.iter().flatten().all(set)
            {
                return Err("a reserved or pending block is clear in the bitmap");
            }
            if !self.pinned.iter().flatten().all(clear) {
                return Err("a pinned block is set in the bitmap");
            }
        }
        Ok(())
    }

    /// The blocks of `r` that hold something the committed checkpoint or the current
    /// state may need (allocated, or pinned: freed by a checkpoint not yet committed),
    /// as ranges in order. Its groups must be cached ([`Allocator::ensure_groups`]).
    pub fn in_use(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for b in r {
            if self.is_allocated(b) != Some(false) || self.pinned.contains(b) {
                match out.last_mut() {
                    Some(last) if last.end == b => last.end = b + 1,
                    _ => out.push(b..b + 1),
                }
            }
        }
        out
    }

    /// Whether block `b` is allocated in the current in-memory state (group cached).
    pub fn is_allocated(&self, b: u64) -> Option<bool> {
        let (g, bit) = Layout::group_of(b);
        self.groups.get(&g).map(|grp| test_bit(&grp.bits, bit))
    }
}

/// The bitmap bytes of a freshly made filesystem's group `g`: fixed regions allocated,
/// blocks past the end of the device marked allocated too (never handed out).
pub fn initial_group(layout: &Layout, g: u32, used: &[Range<u64>]) -> GroupBlock {
    let mut bits = alloc::vec![0u8; BLOCK_SIZE - HEADER_LEN];
    let start = u64::from(g) * BLOCKS_PER_GROUP;
    let len = layout.group_len(g);
    let mut free = 0;
    for i in 0..BLOCKS_PER_GROUP {
        let b = start + i;
        let in_use = i >= len
            || b < layout.data_start()
            || layout.is_grown_bitmap_block(b)
            || used.iter().any(|r| r.contains(&b));
        if in_use {
            set_bit(&mut bits, i as usize, true);
        } else {
            free += 1;
        }
    }
    GroupBlock {
        group: g,
        seq: 0,
        free,
        bits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocator() -> Allocator {
        let layout = Layout::for_size(70_000); // three groups
        let groups: Vec<GroupBlock> = (0..layout.groups)
            .map(|g| initial_group(&layout, g, &[]))
            .collect();
        let free = groups.iter().map(|b| u64::from(b.free)).sum();
        let mut a = Allocator::new(layout, 16384, free);
        for blk in groups {
            a.insert_group(blk, 0);
        }
        assert_eq!(a.take_violation(), None);
        a
    }

    /// Found by the `superblock` fuzz target (fuzz/regressions/superblock/): a
    /// superblock whose free total disagrees with the bitmap groups was trusted (the
    /// invariant check after a commit caught it in debug builds; in release the total
    /// was simply wrong, and one below what is free could underflow).
    #[test]
    fn a_free_total_the_groups_disagree_with_is_a_violation() {
        let layout = Layout::for_size(70_000);
        let groups: Vec<GroupBlock> = (0..layout.groups)
            .map(|g| initial_group(&layout, g, &[]))
            .collect();
        let free: u64 = groups.iter().map(|b| u64::from(b.free)).sum();
        for total in [free - 174, free + 1, 0] {
            let mut a = Allocator::new(layout, 16384, total);
            let mut broke = None;
            for blk in groups.iter().cloned() {
                a.insert_group(blk, 0);
                broke = broke.or(a.take_violation());
            }
            let v = broke.expect("a wrong total is found");
            assert_eq!(v.what, "free total differs from the groups' counts");
        }
        // Below what the first group alone has free: found at once.
        let mut a = Allocator::new(layout, 16384, 10);
        a.insert_group(groups[0].clone(), 0);
        assert!(a.take_violation().is_some());
        // Partial and consistent: nothing.
        let mut a = Allocator::new(layout, 16384, free);
        a.insert_group(groups[1].clone(), 0);
        assert_eq!(a.take_violation(), None);
    }

    #[test]
    fn alloc_free_pin_commit() {
        let mut a = allocator();
        let total = a.available();
        let runs = a.alloc_data(600, 0).unwrap();
        assert_eq!(runs.iter().map(|r| r.end - r.start).sum::<u64>(), 600);
        assert!(runs
            .iter()
            .all(|r| r.end - r.start <= u64::from(MAX_EXTENT_BLOCKS)));
        assert_eq!(a.available(), total - 600);
        for r in &runs {
            a.commit_reserved(r.clone());
        }
        a.free(runs[0].clone());
        // Pending frees stay allocated until a checkpoint, but are reported free.
        assert_eq!(a.available(), total - 600);
        assert_eq!(a.free_after_checkpoint(), total - 600 + 256);
        let writes = a.prepare(1).unwrap();
        assert!(!writes.is_empty());
        // Freed by the checkpoint but pinned until it commits.
        assert_eq!(a.available(), total - 600);
        assert_eq!(a.free_after_checkpoint(), total - 600 + 256);
        let again = a.alloc_data(10, 0).unwrap();
        assert!(again.iter().all(|r| !a.pinned.overlaps(r.clone())));
        a.committed();
        assert_eq!(a.available(), total - 600 - 10 + 256);
    }

    #[test]
    fn reserved_blocks_are_written_free() {
        let mut a = allocator();
        let runs = a.alloc_data(5, 0).unwrap();
        let writes = a.prepare(1).unwrap();
        let g = GroupBlock::decode(&writes[0].data, writes[0].group).unwrap();
        let (_, bit) = Layout::group_of(runs[0].start);
        assert!(
            !test_bit(&g.bits, bit),
            "a reserved block was committed as allocated"
        );
        assert_eq!(a.committed_free(), a.available() + 5);
    }

    #[test]
    fn nospace_is_all_or_nothing() {
        let mut a = allocator();
        let avail = a.available();
        assert_eq!(a.alloc_data(avail + 1, 0), Err(AllocNeed::NoSpace));
        assert_eq!(a.alloc_data(avail - 10, 20), Err(AllocNeed::NoSpace));
        assert_eq!(a.available(), avail);
        a.alloc_data(avail, 0).unwrap();
        assert_eq!(a.available(), 0);
        assert_eq!(a.fill_pool(1), Err(AllocNeed::NoSpace));
    }

    #[test]
    fn nodes_are_contiguous_and_missing_groups_reported() {
        let layout = Layout::for_size(70_000);
        let mut a = Allocator::new(layout, 65536, 60_000);
        assert_eq!(a.fill_pool(1), Err(AllocNeed::Group(0)));
        a.insert_group(initial_group(&layout, 0, &[]), 0);
        a.fill_pool(3).unwrap();
        let n = a.take_node().unwrap();
        assert_eq!(a.is_allocated(n + 15), Some(true));
        assert_eq!(a.pool_len(), 2);
    }

    #[test]
    fn invariant_checks_find_broken_books() {
        let mut a = allocator();
        let runs = a.alloc_data(600, 0).unwrap();
        a.fill_pool(2).unwrap();
        for r in &runs {
            a.commit_reserved(r.clone());
        }
        a.free(runs[0].clone());
        assert_eq!(a.check_invariants(true), Ok(()));
        a.prepare(1).unwrap();
        assert_eq!(a.check_invariants(true), Ok(()));

        let mut miscounted = allocator();
        miscounted.free_total += 1;
        assert!(miscounted.check_invariants(false).is_err());

        // A pinned block handed out again.
        let mut reused = allocator();
        let r = reused.alloc_data(1, 0).unwrap().remove(0);
        reused.pinned.insert(r);
        assert!(reused.check_invariants(false).is_err());

        // A pending free whose bit was cleared early: only the full check reads bits.
        let mut early = allocator();
        let r = early.alloc_data(1, 0).unwrap().remove(0);
        early.commit_reserved(r.clone());
        early.free(r.clone());
        let (g, bit) = Layout::group_of(r.start);
        let group = early.groups.get_mut(&g).unwrap();
        set_bit(&mut group.bits, bit, false);
        group.free += 1;
        early.group_free[g as usize] = Some(group.free);
        early.free_total += 1;
        assert_eq!(early.check_invariants(false), Ok(()));
        assert!(early.check_invariants(true).is_err());
    }
}

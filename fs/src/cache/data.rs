//! The data cache: file data blocks kept in memory, keyed by their place on the device.
//!
//! **Coherent by construction.** Copy-on-write makes a written block immutable until it
//! is freed, so a cached copy of device block `b` is right for every file, snapshot and
//! clone that points at `b` until `b` is written again. Every write reaches the device
//! through [`crate::io::Dev`], which drops what it overwrites
//! ([`DataCache::invalidate`]), and so do discards, rebuild copies and repairs. An entry
//! also keeps the checksum it was verified against, and a lookup takes it only for the
//! checksum the reader's plan expects: a block rewritten under a reader is never
//! served in place of the new data, even if an invalidation were missed.
//!
//! **Fills.** Checksums are verified once, on the device read. A reader that misses
//! *claims* the run of blocks it is about to read ([`Part::Read`] holds the [`Fill`]);
//! other readers of those blocks wait for it ([`Part::Wait`], [`DataCache::wait`])
//! instead of reading them again (a demand read finds readahead in flight this way).
//! An invalidation that meets a claimed run spoils it: data read before a write is
//! never kept after it.
//!
//! **Replacement: 2Q per tenant.** A block enters *probation* on its first read and moves
//! to *protected* on its second (a block read ahead enters probation marked
//! `prefetched`, and its first read only clears the mark), so one pass over a file larger
//! than the cache cycles through probation and leaves the hot set in protected alone.
//! Blocks evicted from probation are remembered in a *ghost* list (numbers only); one
//! read again soon after goes straight to protected. Eviction takes probation's oldest
//! while probation holds more than a quarter of its tenant's blocks, else protected's
//! least recently used.
//!
//! **Fair between tenants.** Every block is charged to the tenant whose read brought it
//! in ([`Who`]: a 9P server's tenant, an export). A tenant that needs room takes it from
//! itself when it holds at least its fair share (the cache divided by the tenants holding
//! blocks), else from the tenant holding the most: a tenant streaming through its files
//! can evict another's hot blocks only down to that tenant's fair share.
//!
//! **One memory budget with the node cache.** The cache may hold its own limit plus what
//! the node caches leave unused of theirs ([`DataCache::set_limits`]; the node caches
//! publish their use through [`DataCache::node_gauge`]), and gives it back as nodes need
//! it ([`DataCache::trim`], and on every insert).

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Range;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use event_listener::Event;
use hashbrown::{HashMap, HashSet};
use spin::Mutex;

use super::lists::{Linked, Links, List};
use crate::format::BLOCK_SIZE;

/// Memory an entry costs besides its block: the slab entry, its map slot, the block's
/// reference count and allocation header.
const ENTRY_OVERHEAD: usize = 128;
/// Memory one cached block is charged.
pub const ENTRY_BYTES: usize = BLOCK_SIZE + ENTRY_OVERHEAD;
/// Tenants kept apart; more share one slot (with the filesystem's own reads).
pub const MAX_TENANTS: usize = 64;
/// Probation is evicted from first while it holds more than 1/`PROBATION_SHARE` of its
/// tenant's blocks (2Q's Kin).
const PROBATION_SHARE: usize = 4;
/// A tenant remembers as many evicted blocks as 1/`GHOST_SHARE` of its fair share (2Q's
/// Kout), at least [`MIN_GHOSTS`].
const GHOST_SHARE: usize = 2;
/// See [`GHOST_SHARE`].
const MIN_GHOSTS: usize = 64;

/// On whose behalf a block is read: a server's tenant id, or `None` for the
/// filesystem's own reads (and any caller that does not say).
pub type Who = Option<u64>;

/// A cached block's bytes (shared: a reader copies out of it with no lock held).
pub type BlockData = Arc<[u8]>;

/// Counters of the data cache, in all and per tenant. Blocks are 4 KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheCounters {
    /// Blocks a read found in the cache.
    pub hits: u64,
    /// Blocks a read had to get from the device (it read them, or waited for a read
    /// already under way).
    pub misses: u64,
    /// Blocks kept after a device read.
    pub inserted: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks dropped because the device block was written, discarded or freed.
    pub invalidations: u64,
    /// Blocks read ahead of the reader (readahead).
    pub prefetched: u64,
    /// Blocks read ahead that a reader then read.
    pub prefetch_hits: u64,
    /// Blocks read ahead and dropped before anyone read them.
    pub prefetch_unused: u64,
}

impl CacheCounters {
    /// Hits per block read (0 before the first read).
    pub fn hit_ratio(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            0.0
        } else {
            self.hits as f64 / all as f64
        }
    }
}

/// The data cache's state and counters (the `data_cache` object of the filesystem's
/// counters document).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DataCacheReport {
    /// Bytes the cache may use now: its own limit and what the node cache leaves unused.
    pub limit_bytes: u64,
    /// Its own limit (`data_cache=`; 0: off).
    pub own_limit_bytes: u64,
    /// Bytes charged for the blocks it holds.
    pub bytes: u64,
    /// Blocks it holds.
    pub blocks: u64,
    /// Blocks in protected (read at least twice).
    pub protected_blocks: u64,
    /// Reads of the device under way to fill it.
    pub fills: u64,
    /// Entries found with another checksum than the reader's plan and dropped (an
    /// invalidation was missed: must stay 0).
    pub stale: u64,
    /// The counters.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub counters: CacheCounters,
    /// Per tenant holding blocks or having read.
    pub tenants: Vec<TenantCacheReport>,
}

/// One tenant's share of the data cache (an element of [`DataCacheReport::tenants`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TenantCacheReport {
    /// The tenant's name, which labels its metrics: what the server calls it
    /// ([`DataCacheReport::name_tenants`]: `export:NAME`, `client:ADDR`), else
    /// `tenant:ID` (one gone since), or `filesystem` for the filesystem's own reads and
    /// tenants past [`MAX_TENANTS`].
    pub name: String,
    /// The tenant id (`None`: the filesystem's own).
    pub tenant: Option<u64>,
    /// Bytes charged for its blocks.
    pub bytes: u64,
    /// Its blocks.
    pub blocks: u64,
    /// Its blocks in protected.
    pub protected_blocks: u64,
    /// Its counters since it got its slot.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub counters: CacheCounters,
}

impl DataCacheReport {
    /// Names each tenant `name(id)` says (a server: its tenant's key); the others keep
    /// their id.
    pub fn name_tenants(&mut self, name: impl Fn(u64) -> Option<String>) {
        for t in &mut self.tenants {
            if let Some(n) = t.tenant.and_then(&name) {
                t.name = n;
            }
        }
    }
}

/// What a lookup found for part of the blocks asked for. `at` counts blocks from the
/// first one asked for.
#[derive(Debug)]
pub enum Part<'a> {
    /// Block `at` is cached: here it is.
    Hit {
        /// Which block.
        at: usize,
        /// Its bytes.
        data: BlockData,
    },
    /// Blocks `at..at + len` are being read by someone else: [`DataCache::wait`] for
    /// `fill`, then look again.
    Wait {
        /// First block.
        at: usize,
        /// Blocks.
        len: usize,
        /// The read under way.
        fill: u64,
    },
    /// Blocks `at..at + len` are claimed for the caller: read them, verify them and
    /// [`Fill::complete`] the claim (dropping it gives it up).
    Read {
        /// First block.
        at: usize,
        /// Blocks.
        len: usize,
        /// The claim.
        fill: Fill<'a>,
    },
}

/// A claim on a run of blocks being read from the device (see [`Part::Read`]).
#[derive(Debug)]
pub struct Fill<'a> {
    cache: &'a DataCache,
    id: u64,
    blocks: Range<u64>,
    done: bool,
}

impl Fill<'_> {
    /// The device blocks claimed.
    pub fn blocks(&self) -> Range<u64> {
        self.blocks.clone()
    }

    /// Keeps `data` — the claimed blocks as read from the device and verified against
    /// `csums`, one per block — for `who`; `prefetched` when read ahead of the reader.
    /// Nothing is kept if a write to any of the blocks came meanwhile.
    pub fn complete(mut self, who: Who, data: &[u8], csums: &[u32], prefetched: bool) {
        debug_assert_eq!(data.len(), csums.len() * BLOCK_SIZE);
        debug_assert_eq!(csums.len() as u64, self.blocks.end - self.blocks.start);
        self.done = true;
        let cache = self.cache;
        let target = cache.target();
        // Copied out before the lock is taken.
        let copies: Vec<BlockData> = if target >= ENTRY_BYTES {
            data.chunks(BLOCK_SIZE).map(BlockData::from).collect()
        } else {
            Vec::new()
        };
        let mut dropped = Vec::new();
        {
            let mut inner = cache.inner.lock();
            let spoiled = inner.release(self.id);
            // Looked at again: the node cache may have grown since.
            let target = cache.target();
            if !spoiled && !copies.is_empty() {
                let t = inner.tenant_slot(who);
                for ((block, data), &crc) in self.blocks.clone().zip(copies).zip(csums) {
                    inner.insert(target, t, block, crc, data, prefetched, &mut dropped);
                }
            }
            cache.publish(&inner);
        }
        cache.filled.notify(usize::MAX);
        drop(dropped);
    }
}

impl Drop for Fill<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cache.inner.lock().release(self.id);
            self.cache.filled.notify(usize::MAX);
        }
    }
}

/// Which queue an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// None: the slab slot is free.
    Free,
    /// Read once (or read ahead).
    Probation,
    /// Read again since.
    Protected,
}

/// A slab slot: one cached block.
#[derive(Debug)]
struct Entry {
    block: u64,
    crc: u32,
    /// Its tenant's slot.
    tenant: u16,
    queue: Queue,
    /// Read ahead and not yet read.
    prefetched: bool,
    links: Links,
    data: Option<BlockData>,
}

impl Linked for Entry {
    fn links(&mut self) -> &mut Links {
        &mut self.links
    }
}

/// Numbers of blocks a tenant evicted from probation lately (2Q's A1out).
#[derive(Debug, Default)]
struct Ghosts {
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl Ghosts {
    fn push(&mut self, block: u64, cap: usize) {
        if self.set.insert(block) {
            self.order.push_back(block);
        }
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `block` was evicted lately (forgetting it).
    fn take(&mut self, block: u64) -> bool {
        // Its place in `order` goes when it reaches the front.
        self.set.remove(&block)
    }

    fn clear(&mut self) {
        self.order.clear();
        self.set.clear();
    }
}

/// One tenant's queues and counters.
#[derive(Debug, Default)]
struct TenantQueues {
    /// The tenant (`None`: the filesystem's own reads, and tenants past the table).
    who: Who,
    probation: List,
    protected: List,
    ghosts: Ghosts,
    counters: CacheCounters,
}

impl TenantQueues {
    fn blocks(&self) -> usize {
        (self.probation.len() + self.protected.len()) as usize
    }
}

/// A run of blocks being read to fill the cache.
#[derive(Debug)]
struct Claim {
    id: u64,
    blocks: Range<u64>,
    /// A write or discard met it: what it read is not kept.
    spoiled: bool,
}

/// Everything behind the cache's lock.
#[derive(Debug, Default)]
struct Inner {
    /// Device block to slab slot.
    map: HashMap<u64, u32>,
    slab: Vec<Entry>,
    free: Vec<u32>,
    /// Slot 0 is the filesystem's own (and the overflow's).
    tenants: Vec<TenantQueues>,
    by_tenant: HashMap<u64, u16>,
    claims: Vec<Claim>,
    next_claim: u64,
    totals: CacheCounters,
    stale: u64,
}

impl Inner {
    fn blocks(&self) -> usize {
        self.map.len()
    }

    /// The slot of tenant `who`, taking a free one (or one holding nothing) for a new
    /// tenant; slot 0 when the table is full.
    fn tenant_slot(&mut self, who: Who) -> u16 {
        if self.tenants.is_empty() {
            self.tenants.push(TenantQueues::default());
        }
        let Some(id) = who else { return 0 };
        if let Some(&t) = self.by_tenant.get(&id) {
            return t;
        }
        let t = if self.tenants.len() < MAX_TENANTS {
            self.tenants.push(TenantQueues::default());
            self.tenants.len() - 1
        } else if let Some(t) = (1..self.tenants.len()).find(|&t| self.tenants[t].blocks() == 0) {
            if let Some(old) = self.tenants[t].who {
                self.by_tenant.remove(&old);
            }
            self.tenants[t] = TenantQueues::default();
            t
        } else {
            return 0;
        };
        self.tenants[t].who = who;
        self.by_tenant.insert(id, t as u16);
        t as u16
    }

    /// Ends claim `id`; whether it was spoiled.
    fn release(&mut self, id: u64) -> bool {
        match self.claims.iter().position(|c| c.id == id) {
            Some(i) => self.claims.swap_remove(i).spoiled,
            None => true,
        }
    }

    /// The unspoiled claim covering `block`.
    fn claim_of(&self, block: u64) -> Option<&Claim> {
        self.claims
            .iter()
            .find(|c| !c.spoiled && c.blocks.contains(&block))
    }

    fn claim(&mut self, blocks: Range<u64>) -> u64 {
        self.next_claim += 1;
        let id = self.next_claim;
        self.claims.push(Claim {
            id,
            blocks,
            spoiled: false,
        });
        id
    }

    /// A reader's use of entry `i`: the first read of a block read ahead clears its
    /// mark; a second read moves it to protected; protected keeps it recent.
    fn touch(&mut self, i: u32) {
        let e = &mut self.slab[i as usize];
        let t = e.tenant as usize;
        if e.prefetched {
            e.prefetched = false;
            self.tenants[t].counters.prefetch_hits += 1;
            self.totals.prefetch_hits += 1;
            return;
        }
        let q = &mut self.tenants[t];
        match self.slab[i as usize].queue {
            Queue::Probation => {
                q.probation.unlink(&mut self.slab, i);
                q.protected.push_front(&mut self.slab, i);
                self.slab[i as usize].queue = Queue::Protected;
            }
            Queue::Protected => q.protected.move_to_front(&mut self.slab, i),
            Queue::Free => unreachable!("a mapped entry is on a queue"),
        }
    }

    /// Takes entry `i` out of the cache (its bytes into `dropped`, to be freed with no
    /// lock held); remembers it as a ghost when `ghost` and it was on probation.
    fn remove(&mut self, i: u32, ghost: Option<usize>, dropped: &mut Vec<BlockData>) {
        let e = &mut self.slab[i as usize];
        let (t, block, queue, prefetched) = (e.tenant as usize, e.block, e.queue, e.prefetched);
        if let Some(data) = e.data.take() {
            dropped.push(data);
        }
        let q = &mut self.tenants[t];
        match queue {
            Queue::Probation => q.probation.unlink(&mut self.slab, i),
            Queue::Protected => q.protected.unlink(&mut self.slab, i),
            Queue::Free => unreachable!("a mapped entry is on a queue"),
        }
        if prefetched {
            q.counters.prefetch_unused += 1;
            self.totals.prefetch_unused += 1;
        }
        if let (Some(cap), Queue::Probation) = (ghost, queue) {
            q.ghosts.push(block, cap);
        }
        self.slab[i as usize].queue = Queue::Free;
        self.map.remove(&block);
        self.free.push(i);
    }

    /// The tenant to evict from, for a block of tenant `for_t`: itself if it holds at
    /// least its fair share of `target_blocks`, else the tenant holding the most.
    fn victim_tenant(&self, target_blocks: usize, for_t: usize) -> usize {
        let holding = self.tenants.iter().filter(|q| q.blocks() > 0).count();
        let active = holding + usize::from(self.tenants[for_t].blocks() == 0);
        let fair = target_blocks / active.max(1);
        let own = self.tenants[for_t].blocks();
        if own > 0 && own >= fair {
            return for_t;
        }
        (0..self.tenants.len())
            .max_by_key(|&t| self.tenants[t].blocks())
            .unwrap_or(for_t)
    }

    /// Evicts one block for tenant `for_t`; false when nothing is cached.
    fn evict_one(
        &mut self,
        target_blocks: usize,
        for_t: usize,
        dropped: &mut Vec<BlockData>,
    ) -> bool {
        if self.blocks() == 0 {
            return false;
        }
        let t = self.victim_tenant(target_blocks, for_t);
        let q = &self.tenants[t];
        let from_probation =
            q.protected.is_empty() || q.probation.len() as usize * PROBATION_SHARE > q.blocks();
        let victim = if from_probation {
            q.probation.back()
        } else {
            q.protected.back()
        };
        let Some(i) = victim else {
            return false;
        };
        let holding = self.tenants.iter().filter(|q| q.blocks() > 0).count();
        let ghosts = (target_blocks / holding.max(1) / GHOST_SHARE).max(MIN_GHOSTS);
        self.remove(i, Some(ghosts), dropped);
        self.tenants[t].counters.evictions += 1;
        self.totals.evictions += 1;
        true
    }

    /// Keeps block `block` (checksum `crc`) for tenant slot `t`, making room within
    /// `target` bytes.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        target: usize,
        t: u16,
        block: u64,
        crc: u32,
        data: BlockData,
        prefetched: bool,
        dropped: &mut Vec<BlockData>,
    ) {
        if self.map.contains_key(&block) {
            return;
        }
        let target_blocks = target / ENTRY_BYTES;
        while self.blocks() >= target_blocks {
            if !self.evict_one(target_blocks, t as usize, dropped) {
                return;
            }
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slab.push(Entry {
                    block,
                    crc,
                    tenant: t,
                    queue: Queue::Free,
                    prefetched,
                    links: Links::default(),
                    data: None,
                });
                (self.slab.len() - 1) as u32
            }
        };
        let q = &mut self.tenants[t as usize];
        let protect = !prefetched && q.ghosts.take(block);
        let e = &mut self.slab[i as usize];
        e.block = block;
        e.crc = crc;
        e.tenant = t;
        e.prefetched = prefetched;
        e.data = Some(data);
        if protect {
            e.queue = Queue::Protected;
            q.protected.push_front(&mut self.slab, i);
        } else {
            e.queue = Queue::Probation;
            q.probation.push_front(&mut self.slab, i);
        }
        self.map.insert(block, i);
        q.counters.inserted += 1;
        self.totals.inserted += 1;
        if prefetched {
            q.counters.prefetched += 1;
            self.totals.prefetched += 1;
        }
    }

    /// Evicts until at most `target` bytes are held.
    fn shrink(&mut self, target: usize, dropped: &mut Vec<BlockData>) {
        let target_blocks = target / ENTRY_BYTES;
        while self.blocks() > target_blocks {
            let biggest = (0..self.tenants.len())
                .max_by_key(|&t| self.tenants[t].blocks())
                .unwrap_or(0);
            if !self.evict_one(target_blocks, biggest, dropped) {
                break;
            }
        }
    }
}

/// The data cache. See the module documentation.
#[derive(Debug)]
pub struct DataCache {
    inner: Mutex<Inner>,
    /// Its own limit in bytes (0: off).
    limit: AtomicUsize,
    /// The node cache's limit, whose unused part it may borrow.
    node_limit: AtomicUsize,
    /// Memory the node caches use now (they publish it).
    node_bytes: Arc<AtomicUsize>,
    /// Blocks held, published after every change so [`DataCache::trim`] can tell
    /// without the lock whether it owes memory back.
    held: AtomicUsize,
    /// Notified whenever a fill ends.
    filled: Event,
}

impl Default for DataCache {
    fn default() -> Self {
        DataCache::new()
    }
}

impl DataCache {
    /// A cache that keeps nothing until [`DataCache::set_limits`] gives it room.
    pub fn new() -> DataCache {
        DataCache {
            inner: Mutex::new(Inner::default()),
            limit: AtomicUsize::new(0),
            node_limit: AtomicUsize::new(0),
            node_bytes: Arc::new(AtomicUsize::new(0)),
            held: AtomicUsize::new(0),
            filled: Event::new(),
        }
    }

    /// Lets the cache hold `limit` bytes of its own (0: nothing at all) plus whatever
    /// the node caches, whose limit is `node_limit`, leave unused.
    pub fn set_limits(&self, limit: usize, node_limit: usize) {
        self.limit.store(limit, Relaxed);
        self.node_limit.store(node_limit, Relaxed);
        self.trim();
    }

    /// Where the node caches publish the memory they use.
    pub fn node_gauge(&self) -> Arc<AtomicUsize> {
        self.node_bytes.clone()
    }

    /// Bytes the cache may hold now.
    pub fn target(&self) -> usize {
        match self.limit.load(Relaxed) {
            0 => 0,
            own => {
                let spare = self
                    .node_limit
                    .load(Relaxed)
                    .saturating_sub(self.node_bytes.load(Relaxed));
                own.saturating_add(spare)
            }
        }
    }

    /// Publishes what `inner` holds (called before its lock is released).
    fn publish(&self, inner: &Inner) {
        self.held.store(inner.blocks(), Relaxed);
    }

    /// Looks up blocks `first..first + csums.len()`, whose checksums a reader's plan
    /// says are `csums`, for `who`. Cached blocks come back as hits (a `demand` read —
    /// not readahead — counts them and keeps them recent); runs of blocks another read
    /// is filling as waits; the other runs as claims for the caller to read.
    pub fn lookup(&self, who: Who, first: u64, csums: &[u32], demand: bool) -> Vec<Part<'_>> {
        let mut parts = Vec::new();
        let mut dropped = Vec::new();
        let mut inner = self.inner.lock();
        let t = inner.tenant_slot(who) as usize;
        let mut at = 0;
        while at < csums.len() {
            let block = first + at as u64;
            if let Some(&i) = inner.map.get(&block) {
                let e = &inner.slab[i as usize];
                if e.crc == csums[at] {
                    let data = e.data.clone().expect("a mapped entry holds its block");
                    if demand {
                        inner.touch(i);
                        inner.tenants[t].counters.hits += 1;
                        inner.totals.hits += 1;
                    }
                    parts.push(Part::Hit { at, data });
                    at += 1;
                    continue;
                }
                // Another checksum than the plan's: never served.
                inner.stale += 1;
                inner.remove(i, None, &mut dropped);
            }
            let start = at;
            if let Some(c) = inner.claim_of(block) {
                let (id, end) = (c.id, c.blocks.end);
                let len = ((end - block) as usize).min(csums.len() - at);
                parts.push(Part::Wait { at, len, fill: id });
                at += len;
            } else {
                at += 1;
                while at < csums.len() {
                    let b = first + at as u64;
                    if inner.map.contains_key(&b) || inner.claim_of(b).is_some() {
                        break;
                    }
                    at += 1;
                }
                let blocks = block..first + at as u64;
                let id = inner.claim(blocks.clone());
                parts.push(Part::Read {
                    at: start,
                    len: at - start,
                    fill: Fill {
                        cache: self,
                        id,
                        blocks,
                        done: false,
                    },
                });
            }
            if demand {
                let n = (at - start) as u64;
                inner.tenants[t].counters.misses += n;
                inner.totals.misses += n;
            }
        }
        self.publish(&inner);
        drop(inner);
        drop(dropped);
        parts
    }

    /// Waits until fill `fill` (of a [`Part::Wait`]) has ended.
    pub async fn wait(&self, fill: u64) {
        loop {
            let listener = self.filled.listen();
            if !self.inner.lock().claims.iter().any(|c| c.id == fill) {
                return;
            }
            listener.await;
        }
    }

    /// Drops what the cache holds of device blocks `blocks` (written, discarded,
    /// freed), and spoils the fills under way over them.
    pub fn invalidate(&self, blocks: Range<u64>) {
        if blocks.is_empty() {
            return;
        }
        let mut dropped = Vec::new();
        {
            let mut inner = self.inner.lock();
            for c in &mut inner.claims {
                if c.blocks.start < blocks.end && blocks.start < c.blocks.end {
                    c.spoiled = true;
                }
            }
            if inner.map.is_empty() {
                return;
            }
            let found: Vec<u32> = if (blocks.end - blocks.start) as usize > inner.map.len() {
                inner
                    .map
                    .iter()
                    .filter(|(b, _)| blocks.contains(b))
                    .map(|(_, &i)| i)
                    .collect()
            } else {
                blocks.filter_map(|b| inner.map.get(&b).copied()).collect()
            };
            for i in found {
                let t = inner.slab[i as usize].tenant as usize;
                inner.remove(i, None, &mut dropped);
                inner.tenants[t].counters.invalidations += 1;
                inner.totals.invalidations += 1;
            }
            self.publish(&inner);
        }
        drop(dropped);
    }

    /// Gives back what the cache holds beyond what it may hold now (the node cache
    /// grew into the memory it lent).
    pub fn trim(&self) {
        let target = self.target();
        if self.held.load(Relaxed) * ENTRY_BYTES <= target {
            return;
        }
        let mut dropped = Vec::new();
        {
            let mut inner = self.inner.lock();
            inner.shrink(target, &mut dropped);
            self.publish(&inner);
        }
        drop(dropped);
    }

    /// Drops every block (the counters stay).
    pub fn clear(&self) {
        let mut dropped = Vec::new();
        {
            let mut inner = self.inner.lock();
            inner.shrink(0, &mut dropped);
            for q in &mut inner.tenants {
                q.ghosts.clear();
            }
            self.publish(&inner);
        }
        drop(dropped);
    }

    /// The counters in all.
    pub fn counters(&self) -> CacheCounters {
        self.inner.lock().totals
    }

    /// The counters of tenant `who` (zero if it has no slot).
    pub fn tenant_counters(&self, who: Who) -> CacheCounters {
        let inner = self.inner.lock();
        let t = match who {
            None => Some(0),
            Some(id) => inner.by_tenant.get(&id).map(|&t| t as usize),
        };
        t.and_then(|t| inner.tenants.get(t))
            .map_or_else(CacheCounters::default, |q| q.counters)
    }

    /// Blocks held, and of them in protected.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        let protected = inner.tenants.iter().map(|q| q.protected.len() as usize);
        (inner.blocks(), protected.sum())
    }

    /// The cache's state and counters, after giving back what it holds beyond what it
    /// may hold now (so its bytes never read above its limit).
    pub fn report(&self) -> DataCacheReport {
        let mut dropped = Vec::new();
        let report = self.report_within(self.target(), &mut dropped);
        drop(dropped);
        report
    }

    fn report_within(&self, target: usize, dropped: &mut Vec<BlockData>) -> DataCacheReport {
        let mut inner = self.inner.lock();
        inner.shrink(target, dropped);
        self.publish(&inner);
        let tenants = inner
            .tenants
            .iter()
            .filter(|q| q.blocks() > 0 || q.counters != CacheCounters::default())
            .map(|q| TenantCacheReport {
                name: q
                    .who
                    .map_or_else(|| "filesystem".into(), |id| alloc::format!("tenant:{id}")),
                tenant: q.who,
                bytes: (q.blocks() * ENTRY_BYTES) as u64,
                blocks: q.blocks() as u64,
                protected_blocks: u64::from(q.protected.len()),
                counters: q.counters,
            })
            .collect();
        DataCacheReport {
            limit_bytes: target as u64,
            own_limit_bytes: self.limit.load(Relaxed) as u64,
            bytes: (inner.blocks() * ENTRY_BYTES) as u64,
            blocks: inner.blocks() as u64,
            protected_blocks: inner
                .tenants
                .iter()
                .map(|q| u64::from(q.protected.len()))
                .sum(),
            fills: inner.claims.len() as u64,
            stale: inner.stale,
            counters: inner.totals,
            tenants,
        }
    }

    /// Checks the cache's books: every mapped entry on its tenant's queue, the queues'
    /// lengths adding up, free slots free (for tests).
    pub fn check(&self) -> Result<(), &'static str> {
        let inner = self.inner.lock();
        let queued: usize = inner.tenants.iter().map(TenantQueues::blocks).sum();
        if queued != inner.map.len() {
            return Err("queues and map disagree");
        }
        for (&b, &i) in &inner.map {
            let e = &inner.slab[i as usize];
            if e.block != b || e.queue == Queue::Free || e.data.is_none() {
                return Err("a mapped entry is not a cached block");
            }
        }
        if inner.free.len() + inner.map.len() != inner.slab.len() {
            return Err("slab slots lost");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// Block `b`'s contents and checksum in these tests.
    fn block(b: u64) -> (Vec<u8>, u32) {
        (vec![b as u8; BLOCK_SIZE], b as u32 ^ 0x5a5a)
    }

    /// Reads `first..first + n` for `who` as a reader would: hits, else fills.
    fn read(c: &DataCache, who: Who, first: u64, n: usize) -> (usize, usize) {
        let csums: Vec<u32> = (first..first + n as u64).map(|b| block(b).1).collect();
        let (mut hits, mut reads) = (0, 0);
        for part in c.lookup(who, first, &csums, true) {
            match part {
                Part::Hit { at, data } => {
                    assert_eq!(data[0], (first + at as u64) as u8);
                    hits += 1;
                }
                Part::Read { at, len, fill } => {
                    let mut data = Vec::new();
                    for b in fill.blocks() {
                        data.extend(block(b).0);
                    }
                    fill.complete(who, &data, &csums[at..at + len], false);
                    reads += len;
                }
                Part::Wait { .. } => panic!("nothing else reads"),
            }
        }
        (hits, reads)
    }

    fn cache(blocks: usize) -> DataCache {
        let c = DataCache::new();
        c.set_limits(blocks * ENTRY_BYTES, 0);
        c
    }

    #[test]
    fn hits_after_a_read_and_never_with_another_checksum() {
        let c = cache(16);
        assert_eq!(read(&c, None, 10, 4), (0, 4));
        assert_eq!(read(&c, None, 10, 4), (4, 0));
        // A plan with another checksum for block 11 (rewritten): a miss, never a hit.
        let parts = c.lookup(None, 11, &[0xdead], true);
        assert!(matches!(parts[..], [Part::Read { .. }]));
        drop(parts);
        assert_eq!(c.report().stale, 1);
        c.check().unwrap();
    }

    #[test]
    fn writes_drop_blocks_and_spoil_fills_under_way() {
        let c = cache(16);
        read(&c, None, 0, 8);
        c.invalidate(2..4);
        assert_eq!(read(&c, None, 0, 8), (6, 2));
        // A fill a write meets keeps nothing.
        let csums = [block(20).1];
        let mut parts = c.lookup(None, 20, &csums, true);
        let Some(Part::Read { fill, .. }) = parts.pop() else {
            panic!("a claim")
        };
        c.invalidate(20..21);
        fill.complete(None, &block(20).0, &csums, false);
        assert_eq!(read(&c, None, 20, 1), (0, 1));
        c.check().unwrap();
    }

    #[test]
    fn a_reader_waits_for_a_fill_under_way() {
        let c = cache(16);
        let csums: Vec<u32> = (0..4).map(|b| block(b).1).collect();
        let mut first = c.lookup(None, 0, &csums, true);
        let second = c.lookup(None, 0, &csums, true);
        let Part::Wait { fill: id, len, .. } = second[0] else {
            panic!("waits")
        };
        assert_eq!(len, 4);
        let Some(Part::Read { fill, .. }) = first.pop() else {
            panic!("a claim")
        };
        assert_eq!(fill.id, id);
        let data: Vec<u8> = (0..4).flat_map(|b| block(b).0).collect();
        fill.complete(None, &data, &csums, false);
        pollster::block_on(c.wait(id));
        assert_eq!(read(&c, None, 0, 4), (4, 0));
        // A claim given up (a failed read) ends the wait too.
        let mut parts = c.lookup(None, 8, &csums[..1], true);
        drop(parts.pop());
        assert!(c.inner.lock().claims.is_empty());
    }

    #[test]
    fn one_pass_over_a_large_file_leaves_the_hot_set() {
        let c = cache(100);
        // A hot set of 20 blocks, read twice: protected.
        for _ in 0..2 {
            read(&c, None, 0, 20);
        }
        // One pass over 1,000 other blocks.
        for b in (1000..2000).step_by(10) {
            read(&c, None, b, 10);
        }
        assert_eq!(
            read(&c, None, 0, 20),
            (20, 0),
            "the hot set survived the scan"
        );
        c.check().unwrap();
    }

    #[test]
    fn a_streaming_tenant_leaves_another_its_fair_share() {
        let c = cache(100);
        // Tenant 1's hot set: 40 blocks, read twice.
        for _ in 0..2 {
            read(&c, Some(1), 0, 40);
        }
        // Tenant 2 streams through 5,000 blocks, each read twice (so they look hot).
        for b in (10_000..15_000).step_by(10) {
            read(&c, Some(2), b, 10);
            read(&c, Some(2), b, 10);
        }
        assert_eq!(
            read(&c, Some(1), 0, 40),
            (40, 0),
            "within its fair share: kept"
        );
        assert!(c.tenant_counters(Some(2)).evictions > 0);
        assert_eq!(c.tenant_counters(Some(1)).evictions, 0);
        c.check().unwrap();
    }

    #[test]
    fn read_ahead_blocks_need_two_reads_to_be_protected() {
        let c = cache(64);
        let csums: Vec<u32> = (0..8).map(|b| block(b).1).collect();
        let data: Vec<u8> = (0..8).flat_map(|b| block(b).0).collect();
        for part in c.lookup(None, 0, &csums, false) {
            if let Part::Read { fill, .. } = part {
                fill.complete(None, &data, &csums, true);
            }
        }
        assert_eq!(c.counters().prefetched, 8);
        assert_eq!(read(&c, None, 0, 8), (8, 0));
        assert_eq!(c.counters().prefetch_hits, 8);
        assert_eq!(
            c.usage(),
            (8, 0),
            "a read of a block read ahead is its first"
        );
        read(&c, None, 0, 8);
        assert_eq!(c.usage(), (8, 8));
    }

    #[test]
    fn lends_and_gives_back_the_node_caches_room() {
        let c = DataCache::new();
        c.set_limits(10 * ENTRY_BYTES, 10 * ENTRY_BYTES);
        read(&c, None, 0, 20);
        assert_eq!(c.usage().0, 20);
        c.node_gauge().store(8 * ENTRY_BYTES, Relaxed);
        c.trim();
        assert_eq!(c.usage().0, 12);
        // Grown again, by less than a block: the report gives it back before it counts.
        read(&c, None, 20, 40);
        assert_eq!(c.usage().0, 12);
        c.node_gauge().store(8 * ENTRY_BYTES + 92, Relaxed);
        let r = c.report();
        assert!(r.bytes <= r.limit_bytes, "{} > {}", r.bytes, r.limit_bytes);
        assert_eq!(c.usage().0, 11);
        // Off: nothing kept.
        c.set_limits(0, 10 * ENTRY_BYTES);
        assert_eq!(c.usage().0, 0);
        assert_eq!(read(&c, None, 0, 4), (0, 4));
        assert_eq!(c.usage().0, 0);
    }
}

//! Crash-state enumeration: from a base image and a [`Recording`], the disk contents a
//! power failure could leave behind.
//!
//! # Model
//! A crash happens at a logical time `t` of the recording. A write is *durable* at `t`
//! if it completed and then either it was FUA, or a FLUSH issued after its completion
//! completed by `t`. Every other write issued by `t` (completed but unflushed, or still
//! in flight) is *volatile*: it may or may not have reached the media, in any order, and
//! an in-flight write may be torn. Discards are treated as writes of zeros. Failed
//! requests are ignored.
//!
//! Where several applied writes cover one block, the one that completed last wins (a
//! write issued after another completed always wins: caches do not reorder overwrites of
//! one block). Writes whose lifetimes overlapped may land either way round; *reordered*
//! states pick another such winner.
//!
//! # Crash points and states
//! Crash points are the instants just before each durability event (a FLUSH or FUA
//! completion) and the end of the recording: each point has the most volatile writes its
//! durable set allows, and a state at an earlier instant is a subset of one of these.
//! At each point, with `n` volatile writes:
//! - `n <= exhaustive_max`: all `2^n` subsets (the empty subset is the state "at the
//!   last flush"; the full one is "everything issued reached the media");
//! - otherwise: the empty and the full subset, up to `max_prefixes` prefixes in issue
//!   order, and `random_subsets` seeded random subsets;
//! - with `reorder`, a variant of each non-exhaustive subset where overlapping concurrent
//!   writes land differently (skipped when nothing differs);
//! - `torn_writes` states where one multi-block volatile write is applied in part
//!   (a random proper subset of its blocks, and a prefix), on top of the writes that
//!   completed before it was issued;
//! - `torn_sectors` states where one block of a volatile write is torn at a
//!   `sector_size` boundary (part old, part new, either way round);
//! - at most `max_per_point` states in all.
//!
//! Everything random derives from `seed` and the crash point's number, so a state is
//! reproducible from `(seed, index)`.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::overlay::{BlockRef, CrashDisk, Layer};
use block::Geometry;
use block::{Recording, RequestKind};

/// Bounds and seed of an enumeration (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashParams {
    /// Seed of every random choice.
    pub seed: u64,
    /// Volatile sets up to this size are enumerated exhaustively.
    pub exhaustive_max: usize,
    /// Random subsets per crash point above that size.
    pub random_subsets: usize,
    /// Prefix subsets per crash point above that size.
    pub max_prefixes: usize,
    /// Emit reordered variants.
    pub reorder: bool,
    /// Partly applied multi-block writes per crash point.
    pub torn_writes: usize,
    /// Torn blocks per crash point.
    pub torn_sectors: usize,
    /// Atomic unit inside a block, for torn blocks.
    pub sector_size: u32,
    /// Most states per crash point.
    pub max_per_point: usize,
}

impl Default for CrashParams {
    fn default() -> CrashParams {
        CrashParams {
            seed: 0,
            exhaustive_max: 6,
            random_subsets: 8,
            max_prefixes: 8,
            reorder: true,
            torn_writes: 2,
            torn_sectors: 2,
            sector_size: 512,
            max_per_point: 200,
        }
    }
}

/// How a state's volatile writes were chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Torn {
    /// Only these blocks (offsets within the write) of request `request` landed.
    Blocks {
        /// Request index in the recording.
        request: usize,
        /// Block offsets within the write that landed.
        landed: Vec<u64>,
    },
    /// Block `block` (offset within the write) of request `request` is torn at byte
    /// `split`: new data before the split if `new_first`, else after it.
    Sector {
        /// Request index in the recording.
        request: usize,
        /// Block offset within the write.
        block: u64,
        /// Byte offset of the tear inside the block.
        split: u32,
        /// Which side of the tear holds the new data.
        new_first: bool,
    },
}

/// What a crash state is made of: enough to understand and to reproduce it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashDesc {
    /// Running number of the state in the enumeration.
    pub index: usize,
    /// Crash point number.
    pub point: usize,
    /// Logical time of the crash: requests issued after it never happened, acknowledged
    /// operations are those that completed by then.
    pub time: u64,
    /// Number of durable writes.
    pub durable: usize,
    /// Request indices of the volatile writes at this point.
    pub volatile: Vec<usize>,
    /// Of those, the ones applied whole.
    pub applied: Vec<usize>,
    /// A partly applied write, if any.
    pub torn: Option<Torn>,
    /// Concurrent overlapping writes landed in a non-default order.
    pub reordered: bool,
    /// The enumeration's seed.
    pub seed: u64,
}

impl fmt::Display for CrashDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "crash state #{} (seed {}): crash point {} at time {}; {} durable writes; {} of {} volatile writes applied {:?}",
            self.index,
            self.seed,
            self.point,
            self.time,
            self.durable,
            self.applied.len(),
            self.volatile.len(),
            self.applied
        )?;
        match &self.torn {
            Some(Torn::Blocks { request, landed }) => {
                write!(f, "; request {request} torn, blocks {landed:?} landed")?
            }
            Some(Torn::Sector {
                request,
                block,
                split,
                new_first,
            }) => write!(
                f,
                "; block {block} of request {request} torn at byte {split} ({} half new)",
                if *new_first { "first" } else { "second" }
            )?,
            None => {}
        }
        if self.reordered {
            f.write_str("; reordered")?;
        }
        Ok(())
    }
}

/// One crash state: a disk to mount and its description.
#[derive(Debug)]
pub struct CrashState {
    /// The disk as the crash left it.
    pub disk: CrashDisk,
    /// What it is made of.
    pub desc: CrashDesc,
}

/// A write (or discard) as the enumeration sees it.
#[derive(Clone, Debug)]
struct W {
    request: usize,
    lba: u64,
    blocks: u64,
    /// `None`: a discard (zeros).
    data: Option<Arc<[u8]>>,
    issued: u64,
    /// Completion time, `u64::MAX` if never completed.
    completed: u64,
    /// When it became durable, `u64::MAX` if never.
    durable_at: u64,
}

impl W {
    fn block(&self, i: u64, zero: &Arc<[u8]>, bs: usize) -> BlockRef {
        match &self.data {
            Some(d) => BlockRef::new(d.clone(), i as usize, bs),
            None => BlockRef::new(zero.clone(), 0, bs),
        }
    }
}

/// A plan for one state at the current point.
#[derive(Clone, Debug)]
struct Plan {
    /// Indices into the point's volatile list, applied whole.
    applied: Vec<usize>,
    torn: Option<(usize, TornPlan)>,
    reorder_seed: Option<u64>,
}

#[derive(Clone, Debug)]
enum TornPlan {
    Blocks(Vec<u64>),
    Sector {
        block: u64,
        split: u32,
        new_first: bool,
    },
}

/// The crash states of a recording, produced lazily (see [`enumerate`]).
#[derive(Debug)]
pub struct CrashStates {
    geometry: Geometry,
    base: Arc<[u8]>,
    params: CrashParams,
    writes: Vec<W>,
    /// Crash times, increasing.
    points: Vec<u64>,
    point: usize,
    /// Durable writer of each block at the current point: (block, write index).
    durable: BTreeMap<u64, usize>,
    durable_layer: Arc<Layer>,
    durable_count: usize,
    /// Write indices in order of `durable_at`, and how many are applied.
    by_durability: Vec<usize>,
    applied_durable: usize,
    volatile: Vec<usize>,
    plans: Vec<Plan>,
    next_index: usize,
    zero: Arc<[u8]>,
}

/// Enumerates the crash states of `recording` over `base` (the image when recording
/// started; its length is the device's capacity).
pub fn enumerate(
    base: Arc<[u8]>,
    geometry: Geometry,
    recording: &Recording,
    params: &CrashParams,
) -> CrashStates {
    assert_eq!(
        base.len() as u64,
        geometry.capacity_bytes(),
        "base image size"
    );
    let bs = geometry.block_size as usize;
    let flushes: Vec<(u64, u64)> = recording
        .requests
        .iter()
        .filter(|r| r.kind == RequestKind::Flush && r.ok)
        .filter_map(|r| Some((r.issued, r.completed?)))
        .collect();
    let mut writes = Vec::new();
    for (request, r) in recording.requests.iter().enumerate() {
        let (lba, blocks, data, fua) = match &r.kind {
            RequestKind::Write { lba, data, fua } => {
                (*lba, (data.len() / bs) as u64, Some(data.clone()), *fua)
            }
            RequestKind::Discard { lba, blocks } => (*lba, *blocks, None, false),
            RequestKind::Flush => continue,
        };
        if r.completed.is_some() && !r.ok {
            continue; // failed: never applied
        }
        let completed = r.completed.unwrap_or(u64::MAX);
        // Durable once completed with FUA, or when a flush issued after its completion
        // completes. A write that never completed is never durable.
        let mut durable_at = if fua { completed } else { u64::MAX };
        for &(issued, done) in &flushes {
            if completed != u64::MAX && issued > completed {
                durable_at = durable_at.min(done);
            }
        }
        writes.push(W {
            request,
            lba,
            blocks,
            data,
            issued: r.issued,
            completed,
            durable_at,
        });
    }
    // Crash points: just before every durability event, and the end.
    let mut points: Vec<u64> = writes
        .iter()
        .map(|w| w.durable_at)
        .chain(flushes.iter().map(|&(_, done)| done))
        .filter(|&t| t != u64::MAX)
        .map(|t| t - 1)
        .collect();
    points.push(recording.now);
    points.sort_unstable();
    points.dedup();
    let mut by_durability: Vec<usize> = (0..writes.len()).collect();
    by_durability.sort_by_key(|&i| writes[i].durable_at);
    let mut states = CrashStates {
        geometry,
        base,
        params: *params,
        writes,
        points,
        point: 0,
        durable: BTreeMap::new(),
        durable_layer: Arc::new(Layer::new()),
        durable_count: 0,
        by_durability,
        applied_durable: 0,
        volatile: Vec::new(),
        plans: Vec::new(),
        next_index: 0,
        zero: Arc::from(vec![0u8; bs]),
    };
    if !states.points.is_empty() {
        states.enter_point();
    }
    states
}

/// A small seeded RNG per crash point.
fn rng(seed: u64, point: usize, salt: u64) -> oorandom::Rand64 {
    oorandom::Rand64::new((u128::from(seed) << 64) ^ (point as u128) << 8 ^ u128::from(salt))
}

impl CrashStates {
    /// Number of crash points.
    pub fn points(&self) -> usize {
        self.points.len()
    }

    fn bs(&self) -> usize {
        self.geometry.block_size as usize
    }

    /// Moves the durable layer forward to the current point and plans its states.
    fn enter_point(&mut self) {
        let t = self.points[self.point];
        let bs = self.bs();
        // Copy-on-write: the layer is cloned only if states of the last point are alive.
        let layer = Arc::make_mut(&mut self.durable_layer);
        while self.applied_durable < self.by_durability.len() {
            let wi = self.by_durability[self.applied_durable];
            if self.writes[wi].durable_at > t {
                break;
            }
            let w = &self.writes[wi];
            for b in 0..w.blocks {
                let lba = w.lba + b;
                if let Some(&old) = self.durable.get(&lba) {
                    if self.writes[old].completed > w.completed {
                        continue; // the newer write stays
                    }
                }
                self.durable.insert(lba, wi);
                layer.insert(lba, w.block(b, &self.zero, bs));
            }
            self.applied_durable += 1;
        }
        self.durable_count = self.applied_durable;
        self.volatile = (0..self.writes.len())
            .filter(|&i| {
                let w = &self.writes[i];
                w.issued <= t && w.durable_at > t
            })
            .collect();
        self.volatile.sort_by_key(|&i| self.writes[i].issued);
        self.plans = self.plan();
        self.plans.reverse(); // popped from the end
    }

    fn plan(&self) -> Vec<Plan> {
        let p = &self.params;
        let n = self.volatile.len();
        let mut rng = rng(p.seed, self.point, 1);
        let whole = |applied: Vec<usize>| Plan {
            applied,
            torn: None,
            reorder_seed: None,
        };
        let mut plans = Vec::new();
        if n <= p.exhaustive_max {
            for mask in 0u64..(1 << n) {
                plans.push(whole((0..n).filter(|i| mask >> i & 1 == 1).collect()));
            }
        } else {
            plans.push(whole(Vec::new()));
            plans.push(whole((0..n).collect()));
            let prefixes = p.max_prefixes.min(n - 1);
            for k in 1..=prefixes {
                plans.push(whole((0..k * n / (prefixes + 1)).collect()));
            }
            for r in 0..p.random_subsets {
                let per_mille = [500, 200, 800][r % 3];
                plans.push(whole(
                    (0..n)
                        .filter(|_| rng.rand_range(0..1000) < per_mille)
                        .collect(),
                ));
            }
            if p.reorder {
                let variants: Vec<Plan> = plans[1..]
                    .iter()
                    .map(|plan| Plan {
                        reorder_seed: Some(rng.rand_u64()),
                        ..plan.clone()
                    })
                    .collect();
                plans.extend(variants);
            }
        }
        // Torn writes, on top of what completed before the torn write was issued.
        let before = |vi: usize| -> Vec<usize> {
            let issued = self.writes[self.volatile[vi]].issued;
            (0..n)
                .filter(|&j| j != vi && self.writes[self.volatile[j]].completed < issued)
                .collect()
        };
        let multi: Vec<usize> = (0..n)
            .filter(|&vi| self.writes[self.volatile[vi]].blocks > 1)
            .collect();
        for k in 0..p.torn_writes.min(multi.len()) {
            let vi = multi[(rng.rand_range(0..multi.len() as u64) as usize + k) % multi.len()];
            let blocks = self.writes[self.volatile[vi]].blocks;
            let landed: Vec<u64> = loop {
                let pick: Vec<u64> = (0..blocks).filter(|_| rng.rand_range(0..2) == 1).collect();
                if !pick.is_empty() && (pick.len() as u64) < blocks {
                    break pick;
                }
            };
            let prefix_len = rng.rand_range(1..blocks);
            for landed in [landed, (0..prefix_len).collect()] {
                plans.push(Plan {
                    applied: before(vi),
                    torn: Some((vi, TornPlan::Blocks(landed))),
                    reorder_seed: None,
                });
            }
        }
        let sectors = self.geometry.block_size / p.sector_size.max(1);
        if sectors > 1 && n > 0 {
            for _ in 0..p.torn_sectors {
                let vi = rng.rand_range(0..n as u64) as usize;
                let block = rng.rand_range(0..self.writes[self.volatile[vi]].blocks);
                let split = rng.rand_range(1..u64::from(sectors)) as u32 * p.sector_size;
                plans.push(Plan {
                    applied: before(vi),
                    torn: Some((
                        vi,
                        TornPlan::Sector {
                            block,
                            split,
                            new_first: rng.rand_range(0..2) == 1,
                        },
                    )),
                    reorder_seed: None,
                });
            }
        }
        plans.truncate(p.max_per_point);
        plans
    }

    /// Builds the state for `plan`; `None` if it is a reorder variant identical to the
    /// default order.
    fn build(&self, plan: &Plan) -> Option<CrashState> {
        let bs = self.bs();
        let t = self.points[self.point];
        // Candidate writers per block: the durable writer plus the applied writes.
        let mut candidates: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for &vi in &plan.applied {
            let wi = self.volatile[vi];
            let w = &self.writes[wi];
            for b in 0..w.blocks {
                candidates.entry(w.lba + b).or_default().push(wi);
            }
        }
        let mut rng = plan
            .reorder_seed
            .map(|s| oorandom::Rand64::new(u128::from(s)));
        let mut reordered = false;
        let mut extra = Layer::new();
        for (&lba, writers) in &mut candidates {
            if let Some(&d) = self.durable.get(&lba) {
                writers.push(d);
            }
            let default = *writers
                .iter()
                .max_by_key(|&&wi| self.writes[wi].completed)
                .expect("non-empty");
            let mut winner = default;
            if let Some(rng) = rng.as_mut() {
                // Eligible: no other candidate was issued after it completed.
                let eligible: Vec<usize> = writers
                    .iter()
                    .copied()
                    .filter(|&c| {
                        writers
                            .iter()
                            .all(|&x| x == c || self.writes[x].issued < self.writes[c].completed)
                    })
                    .collect();
                winner = eligible[rng.rand_range(0..eligible.len() as u64) as usize];
                reordered |= winner != default;
            }
            if Some(&winner) != self.durable.get(&lba) {
                let w = &self.writes[winner];
                extra.insert(lba, w.block(lba - w.lba, &self.zero, bs));
            }
        }
        if plan.reorder_seed.is_some() && !reordered {
            return None;
        }
        let mut torn = None;
        if let Some((vi, how)) = &plan.torn {
            let wi = self.volatile[*vi];
            let w = &self.writes[wi];
            let request = w.request;
            match how {
                TornPlan::Blocks(landed) => {
                    for &b in landed {
                        extra.insert(w.lba + b, w.block(b, &self.zero, bs));
                    }
                    torn = Some(Torn::Blocks {
                        request,
                        landed: landed.clone(),
                    });
                }
                TornPlan::Sector {
                    block,
                    split,
                    new_first,
                } => {
                    let lba = w.lba + block;
                    let old = self.block_content(lba, &extra);
                    let new = w.block(*block, &self.zero, bs);
                    let new = new.bytes(bs);
                    let s = *split as usize;
                    let mut mixed = old;
                    if *new_first {
                        mixed[..s].copy_from_slice(&new[..s]);
                    } else {
                        mixed[s..].copy_from_slice(&new[s..]);
                    }
                    // The write's other blocks landed whole.
                    for b in 0..w.blocks {
                        if b != *block {
                            extra.insert(w.lba + b, w.block(b, &self.zero, bs));
                        }
                    }
                    extra.insert(lba, BlockRef::new(Arc::from(mixed), 0, bs));
                    torn = Some(Torn::Sector {
                        request,
                        block: *block,
                        split: *split,
                        new_first: *new_first,
                    });
                }
            }
        }
        let desc = CrashDesc {
            index: self.next_index,
            point: self.point,
            time: t,
            durable: self.durable_count,
            volatile: self
                .volatile
                .iter()
                .map(|&wi| self.writes[wi].request)
                .collect(),
            applied: plan
                .applied
                .iter()
                .map(|&vi| self.writes[self.volatile[vi]].request)
                .collect(),
            torn,
            reordered,
            seed: self.params.seed,
        };
        Some(CrashState {
            disk: CrashDisk::new(
                self.geometry,
                self.base.clone(),
                self.durable_layer.clone(),
                extra,
            ),
            desc,
        })
    }

    /// Content of block `lba` given the durable layer and `extra`.
    fn block_content(&self, lba: u64, extra: &Layer) -> Vec<u8> {
        let bs = self.bs();
        match extra.get(&lba).or_else(|| self.durable_layer.get(&lba)) {
            Some(b) => b.bytes(bs).to_vec(),
            None => self.base[lba as usize * bs..(lba as usize + 1) * bs].to_vec(),
        }
    }
}

impl Iterator for CrashStates {
    type Item = CrashState;

    fn next(&mut self) -> Option<CrashState> {
        loop {
            if let Some(plan) = self.plans.pop() {
                if let Some(state) = self.build(&plan) {
                    self.next_index += 1;
                    return Some(state);
                }
                continue;
            }
            if self.point + 1 >= self.points.len() {
                return None;
            }
            self.point += 1;
            self.enter_point();
        }
    }
}

/// A one-line summary of a recording for reports.
pub fn summary(recording: &Recording) -> String {
    let c = recording.counters;
    format!(
        "{} writes ({} FUA, {} bytes), {} flushes, {} discards, {} errors",
        c.writes, c.fua_writes, c.bytes_written, c.flushes, c.discards, c.errors
    )
}

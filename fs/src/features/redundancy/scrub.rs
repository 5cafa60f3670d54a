//! Scrub: an incremental, rate-limitable pass that reads every btree node reachable from
//! the committed roots and every data extent, and verifies their checksums.
//!
//! A pass walks the trees of the committed checkpoint depth-first from a work stack (the
//! cursor): each [`Redundancy::scrub_step`] reads nodes and extents until a byte budget is
//! spent, so the owner decides the rate. Leaves of the checksum tree queue their data
//! extents. Nothing is read through the node cache: a cached copy would hide a rotten
//! disk block.
//!
//! Copy-on-write keeps everything the walk started from in place until a later
//! checkpoint frees it: freed blocks stay pinned until that checkpoint's superblock is
//! written, and are then discarded and reused (the discard comes before the checkpoint
//! counts as committed in memory). A failure seen once a newer checkpoint has been made
//! may be such a block, so it is counted as *skipped* (not an error); the next pass looks
//! at the new tree.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::btree::Node;
use crate::core::txn::{Core, Step};
use crate::features::redundancy::legs::read_superblock;
use crate::features::redundancy::Redundancy;
use crate::format::bset::{parse_node, NodeId};
use crate::format::items::{decode_csums, decode_inode_refs, FileExtent};
use crate::format::key::kind;
use crate::format::superblock::NodePtr;
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::io::Verified;
use crate::util::crc::crc32c;
use block::BlockDevice;
use vfs::{Errno, FsResult, Ino, ROOT_INO};

/// Default scrub rate, in MiB per second (`scrub_rate=`, `ninefold serve --scrub-rate`):
/// about a tenth of a modest SSD, so clients keep their latency.
pub const DEFAULT_SCRUB_RATE_MIB: u32 = 16;
/// How often a background scrub runs a step; each reads [`budget_per_tick`] bytes.
pub const SCRUB_TICK: core::time::Duration = core::time::Duration::from_millis(100);

/// Bytes one step every [`SCRUB_TICK`] may read for a rate of `rate_mib` MiB/s (at
/// least one block).
pub fn budget_per_tick(rate_mib: u32) -> u64 {
    let per_sec = u64::from(rate_mib) << 20;
    (per_sec * SCRUB_TICK.as_millis() as u64 / 1000).max(BLOCK_SIZE as u64)
}

/// Most errors a report lists (all are counted).
pub const MAX_LISTED_ERRORS: usize = 64;
/// Deepest directory nesting a reported path follows.
const MAX_PATH_DEPTH: usize = 64;

/// One piece of work of a pass.
#[derive(Clone, Debug)]
enum Work {
    /// A btree node to read and verify.
    Node {
        tree: TreeId,
        level: u8,
        ptr: NodePtr,
    },
    /// A data extent starting at `block`, with one checksum per block.
    Data { block: u64, csums: Vec<u32> },
}

/// The file a data block belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataOwner {
    /// The inode.
    pub ino: Ino,
    /// Byte offset of the block in the file.
    pub offset: u64,
    /// A path of the inode from the root, when its names lead there.
    pub path: Option<String>,
}

/// A block that failed verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScrubError {
    /// A btree node failed to read or decode.
    Node {
        /// Its tree.
        tree: TreeId,
        /// Its level (0 = leaf).
        level: u8,
        /// Its first block.
        addr: u64,
        /// What is wrong.
        what: String,
    },
    /// A data block failed to read or its checksum.
    Data {
        /// The disk block.
        block: u64,
        /// The file it belongs to, if found.
        owner: Option<DataOwner>,
        /// What is wrong.
        what: String,
    },
}

impl core::fmt::Display for ScrubError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ScrubError::Node {
                tree,
                level,
                addr,
                what,
            } => write!(
                f,
                "{} tree node at block {addr} (level {level}): {what}",
                tree.name()
            ),
            ScrubError::Data { block, owner, what } => {
                write!(f, "data block {block}: {what}")?;
                match owner {
                    Some(o) => {
                        write!(f, " (inode {} offset {}", o.ino, o.offset)?;
                        if let Some(p) = &o.path {
                            write!(f, " {p}")?;
                        }
                        f.write_str(")")
                    }
                    None => f.write_str(" (owner not found)"),
                }
            }
        }
    }
}

/// What a pass found so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Checkpoint whose trees the pass walks.
    pub checkpoint_seq: u64,
    /// Btree nodes verified.
    pub nodes: u64,
    /// Data blocks verified.
    pub data_blocks: u64,
    /// Bytes read and verified.
    pub bytes: u64,
    /// Blocks that failed (all counted; the first [`MAX_LISTED_ERRORS`] listed).
    pub error_count: u64,
    /// The errors, as found.
    pub errors: Vec<ScrubError>,
    /// Nodes and data extents a copy of which (on a mirror) failed and was rewritten
    /// from a good one; those with no good copy left are errors.
    pub repaired: u64,
    /// Failures not counted as errors: seen once a newer checkpoint was made, so the
    /// block may have been freed and discarded or reused.
    pub skipped: u64,
    /// The pass finished (as opposed to running or stopped).
    pub complete: bool,
    /// The pass was stopped before it finished.
    pub stopped: bool,
}

impl core::fmt::Display for ScrubReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let state = if self.complete {
            "complete"
        } else if self.stopped {
            "stopped"
        } else {
            "running"
        };
        writeln!(f, "state {state}")?;
        writeln!(f, "checkpoint {}", self.checkpoint_seq)?;
        writeln!(f, "nodes {}", self.nodes)?;
        writeln!(f, "data_blocks {}", self.data_blocks)?;
        writeln!(f, "bytes {}", self.bytes)?;
        writeln!(f, "errors {}", self.error_count)?;
        writeln!(f, "repaired {}", self.repaired)?;
        writeln!(f, "skipped {}", self.skipped)?;
        for e in &self.errors {
            writeln!(f, "error {e}")?;
        }
        Ok(())
    }
}

/// Where a pass stands, as [`Redundancy::scrub_step`] returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubProgress {
    /// No pass is running.
    Idle,
    /// More to do.
    Running,
    /// This step finished the pass.
    Done,
}

/// The scrub state of a mounted filesystem.
#[derive(Debug, Default)]
pub(crate) struct ScrubState {
    /// The running pass's work stack (empty when idle).
    stack: Vec<Work>,
    running: bool,
    /// The running pass's report, or the last pass's.
    report: Option<ScrubReport>,
}

impl<D: BlockDevice> Redundancy<D> {
    /// Starts a scrub pass over the committed checkpoint; false if one is running.
    pub async fn scrub_start(&self) -> FsResult<bool> {
        if self.scrub.lock().running {
            return Ok(false);
        }
        // The committed roots are the ones on disk, not the in-memory superblock a
        // checkpoint in flight may already have changed.
        let (sb, _) = read_superblock(&self.engine.dev)
            .await
            .map_err(|_| Errno::EIO)?;
        let mut s = self.scrub.lock();
        if s.running {
            return Ok(false);
        }
        s.stack = TreeId::ALL
            .iter()
            .rev()
            .map(|&tree| (tree, sb.roots[tree as usize]))
            .filter(|(_, root)| root.ptr.addr != 0)
            .map(|(tree, root)| Work::Node {
                tree,
                level: root.level,
                ptr: root.ptr,
            })
            .collect();
        s.running = true;
        s.report = Some(ScrubReport {
            checkpoint_seq: sb.checkpoint_seq,
            ..ScrubReport::default()
        });
        drop(s);
        self.engine.core.lock().stats.scrub_running = 1;
        log::info!("scrub: started over checkpoint {}", sb.checkpoint_seq);
        Ok(true)
    }

    /// Stops the running pass (its report stays readable); false if none was running.
    pub fn scrub_stop(&self) -> bool {
        let mut s = self.scrub.lock();
        if !s.running {
            return false;
        }
        s.running = false;
        s.stack.clear();
        if let Some(r) = s.report.as_mut() {
            r.stopped = true;
        }
        drop(s);
        self.engine.core.lock().stats.scrub_running = 0;
        log::info!("scrub: stopped");
        true
    }

    /// The running pass's report so far, or the last pass's; `None` before the first.
    pub fn scrub_report(&self) -> Option<ScrubReport> {
        self.scrub.lock().report.clone()
    }

    /// Whether a pass is running.
    pub fn scrub_running(&self) -> bool {
        self.scrub.lock().running
    }

    /// Verifies pieces of the running pass until about `budget` bytes were read (at
    /// least one piece: a node, or a data extent of up to 1 MiB).
    pub async fn scrub_step(&self, budget: u64) -> FsResult<ScrubProgress> {
        let mut spent = 0u64;
        loop {
            let work = {
                let mut s = self.scrub.lock();
                if !s.running {
                    return Ok(ScrubProgress::Idle);
                }
                s.stack.pop()
            };
            let Some(work) = work else {
                self.scrub_finish();
                return Ok(ScrubProgress::Done);
            };
            spent += self.scrub_one(work).await?;
            if spent >= budget {
                return Ok(ScrubProgress::Running);
            }
        }
    }

    /// Runs a whole pass now and returns its report (for tools and tests).
    pub async fn scrub_all(&self) -> FsResult<ScrubReport> {
        self.scrub_start().await?;
        self.scrub_all_started().await
    }

    /// Runs the started pass to its end now and returns its report.
    pub async fn scrub_all_started(&self) -> FsResult<ScrubReport> {
        while self.scrub_step(u64::MAX).await? == ScrubProgress::Running {}
        Ok(self.scrub_report().unwrap_or_default())
    }

    fn scrub_finish(&self) {
        let mut s = self.scrub.lock();
        s.running = false;
        let report = s.report.as_mut().map(|r| {
            r.complete = true;
            r.clone()
        });
        drop(s);
        let mut c = self.engine.core.lock();
        c.stats.scrub_running = 0;
        c.stats.scrub_runs += 1;
        drop(c);
        if let Some(r) = report {
            log::info!(
                "scrub: complete: {} nodes, {} data blocks, {} bytes, {} errors, {} repaired, {} skipped",
                r.nodes,
                r.data_blocks,
                r.bytes,
                r.error_count,
                r.repaired,
                r.skipped
            );
        }
    }

    /// Verifies one piece; returns the bytes read.
    async fn scrub_one(&self, work: Work) -> FsResult<u64> {
        match work {
            Work::Node { tree, level, ptr } => self.scrub_node(tree, level, ptr).await,
            Work::Data { block, csums } => self.scrub_data(block, &csums).await,
        }
    }

    async fn scrub_node(&self, tree: TreeId, level: u8, ptr: NodePtr) -> FsResult<u64> {
        let valid = {
            let c = self.engine.core.lock();
            ptr.is_valid(&c.sb.layout, c.sb.node_size)
        };
        let blocks = u64::from(ptr.blocks);
        if !valid {
            self.scrub_failed(ScrubError::Node {
                tree,
                level,
                addr: ptr.addr,
                what: format!("invalid node pointer {ptr:?}"),
            });
            return Ok(0);
        }
        let mut buf = vec![0u8; blocks as usize * BLOCK_SIZE];
        let bytes = buf.len() as u64;
        self.scrub_count(bytes, 1, 0);
        let id = NodeId {
            tree,
            level,
            nonce: ptr.nonce,
        };
        // Every copy is checked (a mirror's bad ones mended); `buf` holds a good one
        // when there is one.
        let good = |b: &[u8]| parse_node(b, id, ptr.blocks).is_ok();
        let checked = self.engine.dev.check_copies(ptr.addr, &mut buf, good).await;
        self.scrub_mended(&checked);
        if let Err(e) = checked {
            self.scrub_failed(ScrubError::Node {
                tree,
                level,
                addr: ptr.addr,
                what: format!("read failed: {e}"),
            });
            return Ok(bytes);
        }
        let sets = match parse_node(&buf, id, ptr.blocks) {
            Ok(sets) => sets,
            Err(e) => {
                self.scrub_failed(ScrubError::Node {
                    tree,
                    level,
                    addr: ptr.addr,
                    what: format!(
                        "{} (bset at block {})",
                        e.what,
                        ptr.addr + u64::from(e.offset_blocks)
                    ),
                });
                return Ok(bytes);
            }
        };
        let node = Node::from_disk(id, ptr.addr, ptr.blocks, &sets);
        let mut found = Vec::new();
        for (key, val) in node.iter_from(&Key::MIN) {
            if level > 0 {
                match NodePtr::from_bytes(val) {
                    Some(child) => found.push(Work::Node {
                        tree,
                        level: level - 1,
                        ptr: child,
                    }),
                    None => self.scrub_failed(ScrubError::Node {
                        tree,
                        level,
                        addr: ptr.addr,
                        what: format!("bad child pointer under {key:?}"),
                    }),
                }
            } else if tree == TreeId::Csum && key.kind == kind::CSUM {
                match decode_csums(val) {
                    Some(csums) => found.push(Work::Data {
                        block: key.objectid,
                        csums,
                    }),
                    None => self.scrub_failed(ScrubError::Node {
                        tree,
                        level,
                        addr: ptr.addr,
                        what: format!("undecodable checksum item {key:?}"),
                    }),
                }
            }
        }
        // Depth-first in key order: the stack pops the first child next.
        found.reverse();
        self.scrub.lock().stack.extend(found);
        Ok(bytes)
    }

    async fn scrub_data(&self, start: u64, csums: &[u32]) -> FsResult<u64> {
        let total = self.engine.core.lock().sb.layout.total_blocks;
        let len = csums.len() as u64;
        if start.checked_add(len).is_none_or(|e| e > total) {
            self.scrub_failed(ScrubError::Data {
                block: start,
                owner: None,
                what: format!("extent of {len} blocks lies outside the filesystem"),
            });
            return Ok(0);
        }
        let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
        let bytes = buf.len() as u64;
        self.scrub_count(bytes, 0, len);
        let good = |b: &[u8]| {
            b.chunks(BLOCK_SIZE)
                .zip(csums)
                .all(|(data, &sum)| crc32c(data) == sum)
        };
        let checked = self.engine.dev.check_copies(start, &mut buf, good).await;
        self.scrub_mended(&checked);
        let bad: Vec<(u64, &str)> = match checked {
            Ok(_) => buf
                .chunks(BLOCK_SIZE)
                .zip(csums)
                .enumerate()
                .filter(|(_, (data, &sum))| crc32c(data) != sum)
                .map(|(i, _)| (start + i as u64, "checksum mismatch"))
                .collect(),
            Err(_) => (start..start + len).map(|b| (b, "read failed")).collect(),
        };
        for (block, what) in bad {
            let owner = self.data_owner(start, block).await;
            self.scrub_failed(ScrubError::Data {
                block,
                owner,
                what: String::from(what),
            });
        }
        Ok(bytes)
    }

    fn scrub_count(&self, bytes: u64, nodes: u64, data_blocks: u64) {
        if let Some(r) = self.scrub.lock().report.as_mut() {
            r.bytes += bytes;
            r.nodes += nodes;
            r.data_blocks += data_blocks;
        }
        self.engine.core.lock().stats.scrub_bytes += bytes;
    }

    /// Counts a piece whose bad copies were mended.
    fn scrub_mended(&self, checked: &Result<Verified, block::IoError>) {
        if let (Ok(Verified::Mended), Some(r)) = (checked, self.scrub.lock().report.as_mut()) {
            r.repaired += 1;
        }
    }

    /// Records a failure: an error, or skipped when a newer checkpoint has been made
    /// since the pass started (the block may no longer belong to the trees). Made, not
    /// committed: what a checkpoint frees is discarded before it counts as committed.
    fn scrub_failed(&self, err: ScrubError) {
        let latest = self.engine.core.lock().sb.checkpoint_seq;
        let mut s = self.scrub.lock();
        let Some(r) = s.report.as_mut() else {
            return;
        };
        if latest != r.checkpoint_seq {
            r.skipped += 1;
            log::debug!("scrub: {err} (after a newer checkpoint: skipped)");
            return;
        }
        r.error_count += 1;
        log::error!("scrub: {err}");
        if r.errors.len() < MAX_LISTED_ERRORS {
            r.errors.push(err);
        }
        drop(s);
        self.engine.core.lock().stats.scrub_errors += 1;
    }

    /// The file whose data extent starting at `extent` holds `block`: the extent's
    /// owner hint, its file extent covering the block, and a path from its names.
    async fn data_owner(&self, extent: u64, block: u64) -> Option<DataOwner> {
        self.engine
            .run(|c| find_owner(c, extent, block))
            .await
            .ok()?
    }
}

/// See [`Redundancy::data_owner`].
fn find_owner(c: &mut Core, extent: u64, block: u64) -> Step<Option<DataOwner>> {
    let mut owner = None;
    c.trees.range(
        TreeId::Extent,
        Key::new(extent, kind::EXTENT, 0),
        Key::new(extent, kind::EXTENT, u64::MAX),
        |_, v| {
            owner = crate::format::items::ExtentItem::decode(v).map(|e| e.owner);
            false
        },
    )?;
    let Some(ino) = owner else {
        return Ok(None);
    };
    let mut offset = None;
    c.trees.range(
        TreeId::Fs,
        Key::new(ino, kind::EXTENT_DATA, 0),
        Key::new(ino, kind::EXTENT_DATA, u64::MAX),
        |k, v| {
            if let Some(fe) = FileExtent::decode(v) {
                let first = fe.first_block();
                if fe.disk_block == extent
                    && (first..first + u64::from(fe.num_blocks)).contains(&block)
                {
                    offset = Some(k.offset + (block - first) * BLOCK_SIZE as u64);
                    return false;
                }
            }
            true
        },
    )?;
    let Some(offset) = offset else {
        return Ok(None);
    };
    Ok(Some(DataOwner {
        ino,
        offset,
        path: path_of(c, ino)?,
    }))
}

/// A path of `ino` from the root, following the first name at each level.
fn path_of(c: &mut Core, ino: Ino) -> Step<Option<String>> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut cur = ino;
    while cur != ROOT_INO {
        if names.len() >= MAX_PATH_DEPTH {
            return Ok(None);
        }
        let mut first = None;
        c.trees.range(
            TreeId::Fs,
            Key::new(cur, kind::INODE_REF, 0),
            Key::new(cur, kind::INODE_REF, u64::MAX),
            |_, v| {
                first = decode_inode_refs(v).and_then(|l| l.into_iter().next());
                first.is_none()
            },
        )?;
        let Some(r) = first else {
            return Ok(None);
        };
        names.push(r.name);
        cur = r.parent;
    }
    let mut path = String::new();
    for n in names.iter().rev() {
        path.push('/');
        path.push_str(&String::from_utf8_lossy(n));
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(Some(path))
}

//! Project quotas (after XFS's): a directory made a *quota root* charges everything in
//! its subtree to one project, whose id is the root's inode number.
//!
//! - Every inode item carries its project ([`InodeItem::project`]; 0: none); a new inode
//!   takes its directory's, a quota root has its own number.
//! - `(0, QUOTA, project)` ([`QuotaItem`]) keeps the limits and the usage: one inode per
//!   inode item, and its [`InodeItem::bytes`] (the data extents it references, what
//!   `st_blocks` shows). Directories, symlink targets and xattrs live in the btree and
//!   are charged as inodes only.
//! - **The usage is a function of the inode items**: every [`Core::commit`] compares the
//!   inode items it changes with what the tree holds and moves the difference into the
//!   projects' items in the same transaction ([`Core::charge_quotas`]). So every
//!   checkpoint is consistent, and so is log replay, which changes the trees through
//!   the same commits (`docs/durability.md`, "Quotas").
//! - A commit that would take a project past a limit fails with `EDQUOT`, unless it
//!   is [`Txn::unlimited`] (replay, labeling). Only growth is checked: deletes,
//!   truncations and overwrites never fail on a quota.
//! - `rename` and `link` into a directory of another project fail with `EXDEV` (as XFS
//!   with project inheritance), so `mv` copies; a quota root itself may move.
//! - Making a directory a quota root labels its subtree in bounded steps
//!   ([`Core::label_step`]) after a checkpoint made its item durable with the
//!   [`QuotaItem::LABELING`] flag; a mount that finds the flag finishes the labeling.
//!   A quota root stays one: lifting its limits leaves the project, unlimited. Its
//!   item goes with the last inode charged to it once the root is removed (files
//!   linked elsewhere keep it until then).

pub use crate::core::dir::same_project;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::checkpoint::CheckpointCause;
use crate::core::txn::{Core, Step, Stop, Txn};
use crate::engine::Engine;
use crate::features::snapshots::snapdir::is_snapshot_ino;
use crate::format::features;
use crate::format::items::{DirIndexRec, InodeItem, QuotaItem};
use crate::format::key::kind;
use crate::format::{Key, TreeId};
use crate::util::check::ensure;
use block::BlockDevice;
use vfs::{Errno, FsResult, Ino, QuotaInfo, QuotaLimits};

/// Directory entries labeled per step (one transaction, one hold of the core lock).
const LABEL_BATCH: usize = 128;

/// The key of `project`'s quota item.
pub fn quota_key(project: u64) -> Key {
    Key::new(0, kind::QUOTA, project)
}

/// A quota item as the interface shows it.
pub fn info(root: Ino, q: &QuotaItem) -> QuotaInfo {
    QuotaInfo {
        root,
        limits: QuotaLimits {
            bytes: q.byte_limit,
            inodes: q.inode_limit,
        },
        bytes: q.bytes,
        inodes: q.inodes,
    }
}

/// A change of one project's usage.
#[derive(Clone, Copy, Debug, Default)]
struct Delta {
    bytes: i128,
    inodes: i128,
}

/// Where a labeling walk is: directories still to list, and where in the first one.
#[derive(Clone, Debug, Default)]
pub struct LabelCursor {
    dirs: VecDeque<Ino>,
    next_index: u64,
}

impl Core {
    /// Whether quota roots exist (the feature bit): without them no inode has a project
    /// and commits skip the accounting.
    pub fn quotas_on(&self) -> bool {
        self.sb.ro_compat & features::RO_COMPAT_QUOTA != 0
    }

    /// `project`'s quota item as `tx` would leave it.
    pub fn quota_item(&mut self, tx: &Txn, project: u64) -> Step<Option<QuotaItem>> {
        match tx.get(self, TreeId::Fs, &quota_key(project))? {
            Some(b) => Ok(Some(
                QuotaItem::decode(&b).ok_or(Stop::Corrupt("undecodable quota item"))?,
            )),
            None => Ok(None),
        }
    }

    /// Moves the charges of the inode items `tx` changes into their projects' quota
    /// items, in `tx` (called by [`Core::commit`] before it changes anything). Fails
    /// with `EDQUOT` when a project would grow past a limit (unless `tx` is
    /// [`Txn::unlimited`]). A usage that would go below zero fails the filesystem (a
    /// production check); an inode charged to a project without an item is corruption
    /// (`EIO`). A removed root's item goes when nothing is charged to it any more.
    pub(crate) fn charge_quotas(&mut self, tx: &mut Txn) -> Step<()> {
        if !self.quotas_on() {
            return Ok(());
        }
        let mut deltas: BTreeMap<u64, Delta> = BTreeMap::new();
        let mut charge = |b: &[u8], sign: i128| -> Step<()> {
            let item = InodeItem::decode(b).ok_or(Stop::Corrupt("undecodable inode item"))?;
            if item.project != 0 {
                let d = deltas.entry(item.project).or_default();
                d.bytes += sign * i128::from(item.bytes);
                d.inodes += sign;
            }
            Ok(())
        };
        for (ino, new) in tx.inode_changes() {
            if let Some(old) = self
                .trees
                .get(TreeId::Fs, &crate::core::txn::inode_key(ino))?
            {
                charge(&old, -1)?;
            }
            if let Some(new) = new {
                charge(new, 1)?;
            }
        }
        for (project, d) in deltas {
            if d.bytes == 0 && d.inodes == 0 {
                continue;
            }
            let Some(mut q) = self.quota_item(tx, project)? else {
                return Err(Stop::Corrupt(
                    "inode charged to a project without a quota item",
                ));
            };
            let bytes = i128::from(q.bytes) + d.bytes;
            let inodes = i128::from(q.inodes) + d.inodes;
            self.check(ensure(
                bytes >= 0 && inodes >= 0,
                "quota usage never negative",
                || {
                    alloc::format!(
                        "project {project}: {} bytes {:+}, {} inodes {:+}",
                        q.bytes,
                        d.bytes,
                        q.inodes,
                        d.inodes
                    )
                },
            ))?;
            let over = |grows: bool, now: i128, limit: Option<u64>| {
                grows && limit.is_some_and(|l| now > i128::from(l))
            };
            if !tx.unlimited
                && (over(d.bytes > 0, bytes, q.byte_limit)
                    || over(d.inodes > 0, inodes, q.inode_limit))
            {
                self.stats.quota_exceeded += 1;
                return Err(Errno::EDQUOT.into());
            }
            q.bytes = bytes as u64;
            q.inodes = inodes as u64;
            let root = tx.get(self, TreeId::Fs, &crate::core::txn::inode_key(project))?;
            if root.is_none() && inodes == 0 {
                // The root was removed and nothing is charged any more: the project ends.
                tx.del(TreeId::Fs, quota_key(project));
            } else {
                tx.put(TreeId::Fs, quota_key(project), q.encode());
            }
        }
        Ok(())
    }

    /// `EDQUOT` before a write of file blocks `b0..b1` of `ino` (item `item`) does any
    /// I/O, if the blocks it would add (those not mapped now) take its project past its
    /// byte limit. The commit checks again, exactly ([`Core::charge_quotas`]).
    pub fn check_write_quota(&mut self, ino: Ino, item: &InodeItem, b0: u64, b1: u64) -> Step<()> {
        if item.project == 0 || !self.quotas_on() {
            return Ok(());
        }
        let Some(q) = self.quota_item(&Txn::new(), item.project)? else {
            return Ok(());
        };
        let Some(limit) = q.byte_limit else {
            return Ok(());
        };
        let bs = crate::format::BLOCK_SIZE as u64;
        if q.bytes.saturating_add((b1 - b0) * bs) <= limit {
            return Ok(());
        }
        let mapped: u64 = self
            .extents_in(ino, b0, b1, usize::MAX)?
            .iter()
            .map(|(fb, fe)| (fb + u64::from(fe.num_blocks)).min(b1) - (*fb).max(b0))
            .sum();
        if q.bytes.saturating_add((b1 - b0 - mapped) * bs) > limit {
            self.stats.quota_exceeded += 1;
            return Err(Errno::EDQUOT.into());
        }
        Ok(())
    }

    /// The quota of the project `ino` is charged to.
    pub fn op_quota(&mut self, ino: Ino) -> Step<Option<QuotaInfo>> {
        let project = self.inode(ino)?.project;
        if project == 0 {
            return Ok(None);
        }
        let q = self.quota_item(&Txn::new(), project)?.ok_or(Stop::Corrupt(
            "inode charged to a project without a quota item",
        ))?;
        Ok(Some(info(project, &q)))
    }

    /// Every quota root and its item, in project order.
    pub fn op_quotas(&mut self) -> Step<Vec<(Ino, QuotaItem)>> {
        let mut out = Vec::new();
        let mut bad = false;
        self.trees
            .range(
                TreeId::Fs,
                quota_key(0),
                quota_key(u64::MAX),
                |k, v| match QuotaItem::decode(v) {
                    Some(q) => {
                        out.push((k.offset, q));
                        true
                    }
                    None => {
                        bad = true;
                        false
                    }
                },
            )?;
        if bad {
            return Err(Stop::Corrupt("undecodable quota item"));
        }
        Ok(out)
    }

    /// The first step of `set_quota` on directory `dir`: changes the limits of an
    /// existing quota root (returns `false`), or creates its item, flagged
    /// [`QuotaItem::LABELING`] with nothing charged yet (returns `true`: the subtree
    /// must be labeled, after a checkpoint makes the item durable).
    pub fn op_set_quota(&mut self, dir: Ino, limits: QuotaLimits) -> Step<bool> {
        self.writable()?;
        let tx = Txn::new();
        let item = self.live_dir(&tx, dir)?;
        let existing = self.quota_item(&tx, dir)?;
        self.check_meta_space()?;
        let mut q = existing.unwrap_or(QuotaItem {
            flags: QuotaItem::LABELING,
            from: item.project,
            ..QuotaItem::default()
        });
        q.byte_limit = limits.bytes;
        q.inode_limit = limits.inodes;
        let mut tx = Txn::new();
        tx.put(TreeId::Fs, quota_key(dir), q.encode());
        self.commit(tx)?;
        // From now on commits charge projects; the next checkpoint writes the bit.
        self.sb.ro_compat |= features::RO_COMPAT_QUOTA;
        Ok(q.flags & QuotaItem::LABELING != 0)
    }

    /// Labels (and so charges) the next entries of the walk of project `project`'s
    /// subtree, at most [`LABEL_BATCH`] of them, in one transaction: inodes of the
    /// project it is taken from ([`QuotaItem::from`]) move to it; others (nested quota
    /// roots and their subtrees, files of other projects reached through hard links)
    /// keep theirs, and only directories it labels are entered. An empty cursor starts
    /// with the root itself. Returns where the walk goes on, `None` when it is done (the
    /// item's [`QuotaItem::LABELING`] flag is then cleared in the same transaction).
    pub fn label_step(
        &mut self,
        project: Ino,
        cursor: &Option<LabelCursor>,
    ) -> Step<Option<LabelCursor>> {
        self.writable()?;
        let mut tx = Txn::unlimited();
        let Some(mut q) = self.quota_item(&tx, project)? else {
            return Ok(None); // the root was removed with everything charged to it
        };
        if tx
            .get(self, TreeId::Fs, &crate::core::txn::inode_key(project))?
            .is_none()
        {
            // The root was removed (empty): nothing is left to label.
            q.flags &= !QuotaItem::LABELING;
            q.from = 0;
            tx.put(TreeId::Fs, quota_key(project), q.encode());
            self.commit(tx)?;
            return Ok(None);
        }
        let from = q.from;
        let mut cur = match cursor {
            Some(c) => c.clone(),
            None => {
                let mut root = tx.inode(self, project)?;
                if root.project != project {
                    root.project = project;
                    tx.put_inode(project, &root);
                }
                let mut dirs = VecDeque::new();
                dirs.push_back(project);
                LabelCursor {
                    dirs,
                    next_index: 0,
                }
            }
        };
        let mut done = 0;
        while done < LABEL_BATCH {
            let Some(&dir) = cur.dirs.front() else {
                break;
            };
            let mut entries = Vec::new();
            self.trees.range(
                TreeId::Fs,
                Key::new(dir, kind::DIR_INDEX, cur.next_index),
                Key::new(dir, kind::DIR_INDEX, u64::MAX),
                |k, v| {
                    entries.push((k.offset, v.to_vec()));
                    entries.len() < LABEL_BATCH - done
                },
            )?;
            if entries.is_empty() {
                cur.dirs.pop_front();
                cur.next_index = 0;
                continue;
            }
            for (index, v) in entries {
                let e =
                    DirIndexRec::decode(&v).ok_or(Stop::Corrupt("undecodable directory index"))?;
                cur.next_index = index + 1;
                done += 1;
                let mut item = tx.inode(self, e.ino)?;
                if item.project == from {
                    item.project = project;
                    tx.put_inode(e.ino, &item);
                }
                // A directory is labeled when its (only) parent is reached: enter it
                // then; one of another project is a nested root's, and stays out.
                if item.is_dir() && item.project == project {
                    cur.dirs.push_back(e.ino);
                }
            }
        }
        let finished = cur.dirs.is_empty();
        if finished {
            let mut q = self
                .quota_item(&tx, project)?
                .ok_or(Stop::Corrupt("labeling a project without a quota item"))?;
            q.flags &= !QuotaItem::LABELING;
            q.from = 0;
            tx.put(TreeId::Fs, quota_key(project), q.encode());
        }
        if !tx.is_empty() {
            self.commit(tx)?;
        }
        Ok((!finished).then_some(cur))
    }
}

/// Project quotas, the service: setting a quota root's limits (labeling its subtree),
/// finishing labelings a crash interrupted, listing the roots. What a commit charges is
/// the core's (`Core::op_set_quota` and the charging above).
pub(crate) struct Quotas<D: BlockDevice> {
    pub(crate) engine: Arc<Engine<D>>,
    /// Serialises `set_quota` (one labeling walk at a time).
    pub(crate) quota_lock: async_lock::Mutex<()>,
}

impl<D: BlockDevice> Quotas<D> {
    pub(crate) fn new(engine: Arc<Engine<D>>) -> Quotas<D> {
        Quotas {
            engine,
            quota_lock: async_lock::Mutex::new(()),
        }
    }

    /// [`vfs::FileSystem::set_quota`]: makes `dir` a quota root (labeling and charging
    /// its subtree in steps) or changes its limits. Returns once a checkpoint has made
    /// it durable. Calls are serialised (one labeling walk at a time).
    pub(crate) async fn set_quota_at(&self, dir: Ino, limits: QuotaLimits) -> FsResult<QuotaInfo> {
        if is_snapshot_ino(dir) {
            return Err(Errno::EROFS);
        }
        let _serial = self.quota_lock.lock().await;
        let label = self.engine.run(|c| c.op_set_quota(dir, limits)).await?;
        // The item is durable before any inode is labeled with the project: a labeled
        // inode an fsync logs is then always replayed onto a checkpoint that has it.
        self.engine.checkpoint(CheckpointCause::Quota).await?;
        if label {
            self.label(dir).await?;
            self.engine.checkpoint(CheckpointCause::Quota).await?;
        }
        let info = self.engine.run(|c| c.op_quota(dir)).await?;
        info.ok_or(Errno::EIO)
    }

    /// Runs the labeling walk of project `project` to its end.
    async fn label(&self, project: Ino) -> FsResult<()> {
        let mut cursor = None;
        loop {
            cursor = self.engine.run(|c| c.label_step(project, &cursor)).await?;
            self.engine.maintain().await?;
            if cursor.is_none() {
                return Ok(());
            }
        }
    }

    /// At mount: finishes the labeling of quota roots a crash interrupted (the walk
    /// starts over; inodes already labeled are passed over).
    pub(crate) async fn finish_labeling(&self) -> FsResult<()> {
        let roots = self.quotas().await?;
        for (root, q) in roots {
            if q.flags & QuotaItem::LABELING != 0 {
                log::info!("quota root {root}: finishing the labeling of its subtree");
                self.label(root).await?;
            }
        }
        Ok(())
    }

    /// Every quota root with its limits, usage and flags, in project (root inode) order.
    pub async fn quotas(&self) -> FsResult<Vec<(Ino, QuotaItem)>> {
        self.engine.run(|c| c.op_quotas()).await
    }
}

/// One quota root as `quota list` (ctl), `ninefold quota` and `fsck` print it:
/// `root INO: bytes USED of LIMIT, inodes USED of LIMIT`.
/// [`describe`] of what [`vfs::FileSystem::quota`] returns.
pub fn describe_info(q: &vfs::QuotaInfo) -> alloc::string::String {
    let item = QuotaItem {
        byte_limit: q.limits.bytes,
        inode_limit: q.limits.inodes,
        bytes: q.bytes,
        inodes: q.inodes,
        flags: 0,
        from: 0,
    };
    describe(q.root, &item)
}

pub fn describe(root: vfs::Ino, q: &QuotaItem) -> alloc::string::String {
    let limit = |l: Option<u64>| l.map_or_else(|| "none".into(), |v| alloc::format!("{v}"));
    let labeling = if q.flags & QuotaItem::LABELING != 0 {
        " (labeling)"
    } else {
        ""
    };
    alloc::format!(
        "root {root}: bytes {} of {}, inodes {} of {}{labeling}",
        q.bytes,
        limit(q.byte_limit),
        q.inodes,
        limit(q.inode_limit)
    )
}

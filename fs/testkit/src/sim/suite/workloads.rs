//! The crash suite's workloads: exhaustive short sequences (ACE-style), seeded random
//! sequences (fsx-style), scenarios named after the fstests cases, and concurrent syncs.
//!
//! Every workload starts from the same prelude, made durable by a clean remount:
//!
//! ```text
//! /a/        directory (xattr user.c on it after some ops)
//! /a/c       file, 12288 bytes, xattr user.a
//! /a/d       file, 5000 bytes
//! /b/        empty directory
//! ```
//!
//! Names are the test kit's `a b c d e` (`Path::of(&[0, 2])` is `/a/c`).

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::testing::{Name, Op, Path, Target, XName};
use vfs::{SetAttr, XattrMode};

/// One step of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// An op, run alone.
    Op(Op),
    /// Syncs run concurrently (their futures polled together).
    Together(Vec<Op>),
    /// Take a snapshot of this name (`NineFs::snapshot_create`).
    Snapshot(String),
    /// Delete the snapshot of this name.
    DeleteSnapshot(String),
    /// Make the directory at this path a quota root with no limits
    /// (`FileSystem::set_quota`): its subtree is labeled and charged to it. The model
    /// knows no quotas, so such a workload keeps renames and links within a project.
    Quota(Path),
}

/// A named workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Stable id: `ace:<n>`, `fsx:<seed>`, `scenario:<name>` (what `--replay` takes).
    pub id: String,
    /// The steps after the prelude.
    pub steps: Vec<Step>,
}

impl Workload {
    /// How many ops the steps hold.
    pub fn op_count(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Op(_) => 1,
                Step::Together(v) => v.len(),
                Step::Snapshot(_) | Step::DeleteSnapshot(_) | Step::Quota(_) => 0,
            })
            .sum()
    }
}

const A: u8 = 0;
const B: u8 = 1;
const C: u8 = 2;
const D: u8 = 3;
const E: u8 = 4;

fn p(names: &[u8]) -> Path {
    Path::of(names)
}

fn t(names: &[u8]) -> Target {
    Target::Path(p(names))
}

fn n(i: u8) -> Name {
    Name::Plain(i)
}

/// The prelude every workload starts from (see the module documentation).
pub fn prelude() -> Vec<Op> {
    vec![
        mkdir(&[], A),
        mkdir(&[], B),
        create(&[A], C),
        write(&[A, C], 0, 12288, 1),
        create(&[A], D),
        write(&[A, D], 0, 5000, 2),
        setxattr(&[A, C], 0, 20),
    ]
}

fn mkdir(dir: &[u8], name: u8) -> Op {
    Op::Mkdir {
        dir: p(dir),
        name: n(name),
        perm: 0o755,
    }
}

fn create(dir: &[u8], name: u8) -> Op {
    Op::Create {
        dir: p(dir),
        name: n(name),
        perm: 0o644,
    }
}

fn write(path: &[u8], offset: u64, len: u32, seed: u8) -> Op {
    Op::Write {
        target: t(path),
        offset,
        len,
        seed,
    }
}

fn append(path: &[u8], len: u32, seed: u8) -> Op {
    Op::Append {
        target: t(path),
        len,
        seed,
    }
}

fn truncate(path: &[u8], size: u64) -> Op {
    Op::Setattr {
        target: t(path),
        changes: SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    }
}

fn link(path: &[u8], dir: &[u8], name: u8) -> Op {
    Op::Link {
        target: t(path),
        dir: p(dir),
        name: n(name),
    }
}

fn unlink(dir: &[u8], name: u8) -> Op {
    Op::Unlink {
        dir: p(dir),
        name: n(name),
    }
}

fn rmdir(dir: &[u8], name: u8) -> Op {
    Op::Rmdir {
        dir: p(dir),
        name: n(name),
    }
}

fn rename(from_dir: &[u8], from: u8, to_dir: &[u8], to: u8) -> Op {
    Op::Rename {
        from_dir: p(from_dir),
        from: n(from),
        to_dir: p(to_dir),
        to: n(to),
    }
}

fn setxattr(path: &[u8], name: u8, len: u32) -> Op {
    Op::Setxattr {
        target: t(path),
        name: XName(name),
        len,
        seed: len as u8,
        how: XattrMode::Upsert,
    }
}

fn removexattr(path: &[u8], name: u8) -> Op {
    Op::Removexattr {
        target: t(path),
        name: XName(name),
    }
}

fn clone(src: &[u8], so: u64, dst: &[u8], dof: u64, len: u64) -> Op {
    Op::Clone {
        src: t(src),
        src_offset: so,
        dst: t(dst),
        dst_offset: dof,
        len,
    }
}

fn fsync(path: &[u8]) -> Op {
    Op::Fsync {
        target: t(path),
        datasync: false,
    }
}

fn fdatasync(path: &[u8]) -> Op {
    Op::Fsync {
        target: t(path),
        datasync: true,
    }
}

fn fsync_dir(dir: &[u8]) -> Op {
    Op::FsyncDir { dir: p(dir) }
}

/// The ACE op alphabet: every kind, each with one to four variants over the prelude's
/// namespace. The first variant of each kind is its representative for length-3
/// sequences.
pub fn alphabet() -> Vec<Vec<Op>> {
    vec![
        // create
        vec![create(&[A], E), create(&[B], C)],
        // write: overwrite across blocks, past the end, a new file's first bytes, an
        // O_APPEND write
        vec![
            write(&[A, C], 5000, 6000, 3),
            write(&[A, D], 5000, 3000, 4),
            write(&[A, E], 0, 100, 5),
            append(&[A, D], 3000, 6),
        ],
        // truncate: shrink, extend
        vec![truncate(&[A, C], 2000), truncate(&[A, D], 20000)],
        // link
        vec![link(&[A, C], &[B], E), link(&[A, D], &[A], B)],
        // unlink
        vec![unlink(&[A], C), unlink(&[A], D)],
        // rename: across directories, over another file, a directory, within one
        vec![
            rename(&[A], C, &[B], C),
            rename(&[A], D, &[A], C),
            rename(&[], A, &[], E),
            rename(&[A], C, &[A], E),
        ],
        // mkdir
        vec![mkdir(&[A], B), mkdir(&[B], A)],
        // rmdir
        vec![rmdir(&[], B), rmdir(&[A], B)],
        // setxattr: a file, a directory
        vec![setxattr(&[A, C], 1, 50), setxattr(&[A], 2, 10)],
        // removexattr
        vec![removexattr(&[A, C], 0)],
        // clone: whole blocks into another file, and back
        vec![
            clone(&[A, C], 0, &[A, D], 0, 8192),
            clone(&[A, D], 0, &[A, C], 8192, 4096),
        ],
        // fsync
        vec![
            fsync(&[A, C]),
            fsync(&[A, D]),
            fsync(&[A, E]),
            fsync(&[B, C]),
        ],
        // fdatasync
        vec![fdatasync(&[A, C]), fdatasync(&[A, D])],
        // fsync of a directory
        vec![fsync_dir(&[A]), fsync_dir(&[B]), fsync_dir(&[])],
    ]
}

/// Whether `path` names a directory in the workloads' namespace: `/a`, `/b`, `/e` (a
/// renamed `/a`) and the subdirectories the alphabet makes (`/a/b`, `/b/a`).
fn is_dir_path(path: &Path) -> bool {
    matches!(
        path.0.as_slice(),
        [] | [Name::Plain(A | B | E)]
            | [Name::Plain(A), Name::Plain(B)]
            | [Name::Plain(B), Name::Plain(A)]
    )
}

/// Paths an op changes (to fsync at the end of a sequence): `(path, is a directory)`.
fn touched(op: &Op) -> Vec<(Path, bool)> {
    let join = |dir: &Path, name: Name| {
        let mut d = dir.clone();
        d.0.push(name);
        d
    };
    let parent = |path: &Path| Path(path.0[..path.0.len().saturating_sub(1)].to_vec());
    match op {
        Op::Create { dir, name, .. } => vec![(join(dir, *name), false), (dir.clone(), true)],
        Op::Mkdir { dir, name, .. } => vec![(join(dir, *name), true), (dir.clone(), true)],
        Op::Link { target, dir, name } => {
            let mut v = vec![(join(dir, *name), false)];
            if let Target::Path(tp) = target {
                v.push((tp.clone(), false));
            }
            v
        }
        Op::Unlink { dir, .. } | Op::Rmdir { dir, .. } => vec![(dir.clone(), true)],
        Op::Rename {
            from_dir,
            to_dir,
            to,
            ..
        } => {
            let dest = join(to_dir, *to);
            let is_dir = is_dir_path(&dest);
            vec![(dest, is_dir), (from_dir.clone(), true)]
        }
        Op::Write { target, .. }
        | Op::Append { target, .. }
        | Op::Setattr { target, .. }
        | Op::Removexattr { target, .. } => match target {
            Target::Path(tp) => vec![(tp.clone(), false)],
            Target::Handle(_) => Vec::new(),
        },
        Op::Setxattr { target, .. } => match target {
            Target::Path(tp) => vec![(tp.clone(), is_dir_path(tp))],
            Target::Handle(_) => Vec::new(),
        },
        Op::Clone { dst, .. } => match dst {
            Target::Path(tp) => vec![(tp.clone(), false), (parent(tp), true)],
            Target::Handle(_) => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The syncs that end a sequence: an fsync of what its last changing op touched (the
/// file, then the directory), as ACE does.
fn tail(ops: &[Op]) -> Vec<Op> {
    let Some(last) = ops.iter().rev().find(|o| o.mutates()) else {
        return Vec::new();
    };
    touched(last)
        .into_iter()
        .take(2)
        .map(|(path, is_dir)| {
            if is_dir {
                Op::FsyncDir { dir: path }
            } else {
                Op::Fsync {
                    target: Target::Path(path),
                    datasync: false,
                }
            }
        })
        .collect()
}

/// The ACE sequences, in a fixed order: every sequence of one and two ops of the whole
/// alphabet, and of three ops over each kind's representative; each followed by its
/// [`tail`].
pub fn ace() -> Vec<Workload> {
    let alpha = alphabet();
    let all: Vec<Op> = alpha.iter().flatten().cloned().collect();
    let reps: Vec<Op> = alpha.iter().map(|v| v[0].clone()).collect();
    let mut seqs: Vec<Vec<Op>> = Vec::new();
    for a in &all {
        seqs.push(vec![a.clone()]);
    }
    for a in &all {
        for b in &all {
            seqs.push(vec![a.clone(), b.clone()]);
        }
    }
    for a in &reps {
        for b in &reps {
            for c in &reps {
                seqs.push(vec![a.clone(), b.clone(), c.clone()]);
            }
        }
    }
    seqs.into_iter()
        .enumerate()
        .map(|(i, ops)| {
            let mut steps: Vec<Step> = ops.iter().cloned().map(Step::Op).collect();
            steps.extend(tail(&ops).into_iter().map(Step::Op));
            Workload {
                id: format!("ace:{i}"),
                steps,
            }
        })
        .collect()
}

/// A seeded random sequence (fsx-style): 20 to 40 ops from the alphabet and random
/// writes and truncations, about a third of them syncs, now and then several syncs run
/// together, now and then a snapshot taken or deleted.
pub fn fsx(seed: u64) -> Workload {
    let mut rng = oorandom::Rand64::new(u128::from(seed) << 1 | 1);
    let alpha = alphabet();
    let files: [&[u8]; 5] = [&[A, C], &[A, D], &[A, E], &[B, C], &[B, E]];
    let syncs = |rng: &mut oorandom::Rand64| -> Op {
        let f = files[rng.rand_range(0..files.len() as u64) as usize];
        match rng.rand_range(0..6) {
            0 => fdatasync(f),
            1 => fsync_dir(&f[..1]),
            2 => fsync_dir(&[]),
            _ => fsync(f),
        }
    };
    let len = rng.rand_range(20..41) as usize;
    let mut steps = Vec::with_capacity(len);
    let mut taken: Vec<String> = Vec::new();
    while steps.len() < len {
        let step = match rng.rand_range(0..100) {
            0..=24 => Step::Op(syncs(&mut rng)),
            25..=29 => {
                let k = rng.rand_range(2..5) as usize;
                Step::Together((0..k).map(|_| syncs(&mut rng)).collect())
            }
            30..=44 => {
                let f = files[rng.rand_range(0..files.len() as u64) as usize];
                let off = rng.rand_range(0..40_000);
                let l = rng.rand_range(1..12_000) as u32;
                Step::Op(write(f, off, l, rng.rand_range(1..250) as u8))
            }
            45..=48 => {
                let f = files[rng.rand_range(0..files.len() as u64) as usize];
                Step::Op(truncate(f, rng.rand_range(0..40_000)))
            }
            49 => match taken.pop() {
                Some(name) if rng.rand_range(0..2) == 0 => Step::DeleteSnapshot(name),
                other => {
                    taken.extend(other);
                    let name = format!("s{}", steps.len());
                    taken.push(name.clone());
                    Step::Snapshot(name)
                }
            },
            _ => {
                let kind = &alpha[rng.rand_range(0..alpha.len() as u64) as usize];
                Step::Op(kind[rng.rand_range(0..kind.len() as u64) as usize].clone())
            }
        };
        steps.push(step);
    }
    Workload {
        id: format!("fsx:{seed}"),
        steps,
    }
}

fn scenario(name: &str, steps: Vec<Step>) -> Workload {
    Workload {
        id: format!("scenario:{name}"),
        steps,
    }
}

fn ops(v: Vec<Op>) -> Vec<Step> {
    v.into_iter().map(Step::Op).collect()
}

/// Scenarios named after the fstests fsync/log-replay cases they follow (adapted to the
/// operations the filesystem has: no fallocate, hole punching, mmap or snapshots), and
/// concurrent-sync scenarios.
pub fn scenarios() -> Vec<Workload> {
    vec![
        // generic/039: remove a hard link, fsync the inode: the link count is right.
        scenario(
            "generic-039",
            ops(vec![
                link(&[A, C], &[B], C),
                Op::Sync,
                unlink(&[B], C),
                fsync(&[A, C]),
            ]),
        ),
        // generic/040: many hard links, fsync.
        scenario(
            "generic-040",
            ops(vec![
                link(&[A, C], &[A], E),
                link(&[A, C], &[B], C),
                link(&[A, C], &[B], D),
                link(&[A, C], &[B], E),
                fsync(&[A, C]),
            ]),
        ),
        // generic/041: hard links, some removed after a sync, fsync.
        scenario(
            "generic-041",
            ops(vec![
                link(&[A, C], &[B], C),
                link(&[A, C], &[B], D),
                Op::Sync,
                unlink(&[B], C),
                link(&[A, C], &[B], E),
                fsync(&[A, C]),
            ]),
        ),
        // generic/059 (adapted: truncation makes the hole): shrink, extend, write past
        // the hole, fsync.
        scenario(
            "generic-059",
            ops(vec![
                truncate(&[A, C], 1000),
                truncate(&[A, C], 30000),
                write(&[A, C], 20000, 3000, 9),
                fsync(&[A, C]),
            ]),
        ),
        // generic/066: a removed xattr does not come back after fsync and replay.
        scenario(
            "generic-066",
            ops(vec![
                setxattr(&[A, C], 1, 40),
                setxattr(&[A, C], 2, 2000),
                Op::Sync,
                removexattr(&[A, C], 1),
                fsync(&[A, C]),
            ]),
        ),
        // generic/104: fsync a file with hard links in several directories.
        scenario(
            "generic-104",
            ops(vec![
                mkdir(&[B], A),
                link(&[A, C], &[B], C),
                link(&[A, C], &[B, A], C),
                fsync(&[A, C]),
            ]),
        ),
        // generic/106: unlink a hard link in a renamed directory, fsync the file.
        scenario(
            "generic-106",
            ops(vec![
                link(&[A, C], &[B], C),
                Op::Sync,
                rename(&[], B, &[], E),
                unlink(&[E], C),
                fsync(&[A, C]),
            ]),
        ),
        // generic/107: a hard link removed from a directory, fsync of the directory.
        scenario(
            "generic-107",
            ops(vec![
                link(&[A, C], &[B], C),
                link(&[A, C], &[B], D),
                Op::Sync,
                unlink(&[B], C),
                fsync_dir(&[B]),
            ]),
        ),
        // generic/311: writes of different shapes, each followed by fsync.
        scenario(
            "generic-311",
            ops(vec![
                write(&[A, D], 0, 4096, 11),
                fsync(&[A, D]),
                write(&[A, D], 100, 10, 12),
                fsync(&[A, D]),
                write(&[A, D], 40000, 9000, 13),
                fdatasync(&[A, D]),
                truncate(&[A, D], 9000),
                fsync(&[A, D]),
            ]),
        ),
        // generic/321: rename a file into a directory, fsync the directory.
        scenario(
            "generic-321",
            ops(vec![rename(&[A], C, &[B], C), fsync_dir(&[B])]),
        ),
        // generic/322: rename a file, fsync it under the new name.
        scenario(
            "generic-322",
            ops(vec![rename(&[A], C, &[A], E), fsync(&[A, E])]),
        ),
        // generic/335: move a file to another directory, create a new one in the old
        // directory, fsync the old directory: the moved file is not lost.
        scenario(
            "generic-335",
            ops(vec![
                rename(&[A], C, &[B], C),
                create(&[A], E),
                fsync_dir(&[A]),
            ]),
        ),
        // generic/336: a hard link moved to another directory, fsync of the file.
        scenario(
            "generic-336",
            ops(vec![
                link(&[A, C], &[A], E),
                Op::Sync,
                rename(&[A], E, &[B], E),
                fsync(&[A, C]),
            ]),
        ),
        // generic/341: rename a directory, create a new one under the old name, fsync
        // the new one: the renamed directory and its files survive.
        scenario(
            "generic-341",
            ops(vec![rename(&[], A, &[], E), mkdir(&[], A), fsync_dir(&[A])]),
        ),
        // generic/342: rename a file, create a new file under the old name, fsync it:
        // the renamed file is not lost.
        scenario(
            "generic-342",
            ops(vec![
                rename(&[A], C, &[A], E),
                create(&[A], C),
                write(&[A, C], 0, 3000, 21),
                fsync(&[A, C]),
            ]),
        ),
        // generic/343: rename a directory holding a file, fsync the file.
        scenario(
            "generic-343",
            ops(vec![rename(&[], A, &[B], E), fsync(&[B, E, C])]),
        ),
        // generic/376: rename a file and fsync the file, then its old directory.
        scenario(
            "generic-376",
            ops(vec![
                rename(&[A], D, &[B], D),
                fsync(&[B, D]),
                fsync_dir(&[A]),
            ]),
        ),
        // generic/483 (adapted: extension by truncate instead of fallocate): extend
        // past the data, fsync: the size is kept.
        scenario(
            "generic-483",
            ops(vec![
                truncate(&[A, D], 40000),
                fsync(&[A, D]),
                write(&[A, D], 100, 50, 22),
                fdatasync(&[A, D]),
            ]),
        ),
        // generic/509: a new file in a new directory, fsync of the file; then the
        // directory renamed and fsynced.
        scenario(
            "generic-509",
            ops(vec![
                mkdir(&[B], A),
                create(&[B, A], C),
                write(&[B, A, C], 0, 5000, 23),
                fsync(&[B, A, C]),
                rename(&[B], A, &[], E),
                fsync_dir(&[E]),
            ]),
        ),
        // generic/526-527 (in their spirit): rename over a file, new hard link, fsync.
        scenario(
            "generic-526",
            ops(vec![
                rename(&[A], D, &[A], C),
                link(&[A, C], &[B], D),
                fsync(&[A, C]),
            ]),
        ),
        // generic/535 (in its spirit): xattrs of a directory, fsync of the directory.
        scenario(
            "generic-535",
            ops(vec![
                setxattr(&[A], 1, 30),
                Op::Sync,
                removexattr(&[A], 1),
                setxattr(&[A], 2, 10),
                fsync_dir(&[A]),
            ]),
        ),
        // generic/588: clone part of an extent within a file, fsync, overwrite part of
        // it, fsync: the whole file is right after replay.
        scenario(
            "generic-588",
            ops(vec![
                clone(&[A, C], 0, &[A, C], 16384, 8192),
                fsync(&[A, C]),
                write(&[A, C], 18000, 2000, 24),
                fsync(&[A, C]),
            ]),
        ),
        // generic/457 (concurrent fsync of files sharing extents).
        scenario(
            "generic-457",
            vec![
                Step::Op(clone(&[A, C], 0, &[A, D], 0, 8192)),
                Step::Op(create(&[B], C)),
                Step::Op(clone(&[A, C], 4096, &[B, C], 0, 8192)),
                Step::Op(write(&[A, C], 0, 2000, 25)),
                Step::Together(vec![fsync(&[A, C]), fsync(&[A, D]), fsync(&[B, C])]),
                Step::Op(write(&[A, D], 6000, 2000, 26)),
                Step::Together(vec![fsync(&[A, D]), fsync(&[B, C]), fsync(&[A, C])]),
            ],
        ),
        // btrfs/192 (in its spirit: replay after many fsyncs with reflinks and
        // renames, several log commits).
        scenario(
            "btrfs-192",
            ops(vec![
                clone(&[A, C], 0, &[A, D], 0, 4096),
                fsync(&[A, D]),
                rename(&[A], D, &[B], D),
                fsync(&[B, D]),
                write(&[B, D], 2000, 9000, 27),
                fsync(&[B, D]),
                unlink(&[A], C),
                fsync_dir(&[A]),
            ]),
        ),
        // An append-only log (O_APPEND writes made durable one by one, as a database's
        // write-ahead log): every acknowledged record survives, in order.
        scenario(
            "append-log",
            ops(vec![
                append(&[A, D], 100, 41),
                fdatasync(&[A, D]),
                append(&[A, D], 5000, 42),
                fdatasync(&[A, D]),
                create(&[B], C),
                append(&[B, C], 300, 43),
                append(&[B, C], 300, 44),
                fsync(&[B, C]),
            ]),
        ),
        // Group commit: four files changed, their fsyncs run together.
        scenario(
            "group-commit",
            vec![
                Step::Op(write(&[A, C], 0, 3000, 31)),
                Step::Op(write(&[A, D], 6000, 3000, 32)),
                Step::Op(create(&[A], E)),
                Step::Op(write(&[A, E], 0, 7000, 33)),
                Step::Op(create(&[B], C)),
                Step::Together(vec![
                    fsync(&[A, C]),
                    fsync(&[A, D]),
                    fsync(&[A, E]),
                    fsync(&[B, C]),
                ]),
                Step::Op(write(&[A, E], 7000, 3000, 34)),
                Step::Together(vec![fdatasync(&[A, E]), fsync_dir(&[B]), fsync(&[A, C])]),
            ],
        ),
        // A snapshot taken between writes: whole or absent, and once taken it keeps the
        // contents of its time while the live files change.
        scenario(
            "snapshot-create",
            vec![
                Step::Op(write(&[A, C], 0, 9000, 40)),
                Step::Op(create(&[B], D)),
                Step::Snapshot(String::from("one")),
                Step::Op(write(&[A, C], 4096, 9000, 41)),
                Step::Op(unlink(&[B], D)),
                Step::Op(fsync(&[A, C])),
                Step::Snapshot(String::from("two")),
                Step::Op(truncate(&[A, C], 100)),
                Step::Op(fsync(&[A, C])),
            ],
        ),
        // Snapshot deletion: whole until the deletion commits, then gone, with the
        // blocks only it held free (fsck counts them).
        scenario(
            "snapshot-delete",
            vec![
                Step::Op(write(&[A, C], 0, 20_000, 42)),
                Step::Snapshot(String::from("old")),
                Step::Op(write(&[A, C], 0, 20_000, 43)),
                Step::Op(unlink(&[A], D)),
                Step::Snapshot(String::from("new")),
                Step::DeleteSnapshot(String::from("old")),
                Step::Op(create(&[B], C)),
                Step::Op(write(&[B, C], 0, 5000, 44)),
                Step::Op(fsync(&[B, C])),
                Step::DeleteSnapshot(String::from("new")),
            ],
        ),
        // A quota root made over a directory with unsynced and synced changes, then
        // changes in it synced: its labeling (charges moved from the root's project,
        // which the suite's image has) and the usage fsck recomputes hold in every
        // crash state.
        scenario(
            "quota-label",
            vec![
                Step::Op(write(&[A, C], 0, 9000, 50)),
                Step::Op(create(&[A], E)),
                Step::Op(write(&[A, E], 0, 5000, 51)),
                Step::Op(fsync(&[A, E])),
                Step::Quota(p(&[A])),
                Step::Op(write(&[A, D], 5000, 9000, 52)),
                Step::Op(fsync(&[A, D])),
                Step::Op(truncate(&[A, C], 100)),
                Step::Op(create(&[A], B)),
                Step::Op(fsync(&[A, C])),
                Step::Op(unlink(&[A], E)),
                Step::Op(fsync_dir(&[A])),
            ],
        ),
        // Concurrent syncs of one file, with a directory fsync among them.
        scenario(
            "together-same-file",
            vec![
                Step::Op(write(&[A, C], 100, 9000, 35)),
                Step::Op(rename(&[A], C, &[B], E)),
                Step::Together(vec![
                    fsync(&[B, E]),
                    fdatasync(&[B, E]),
                    fsync_dir(&[A]),
                    fsync(&[B, E]),
                ]),
            ],
        ),
    ]
}

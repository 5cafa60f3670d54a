//! The test kit checked against itself: the model agrees with the model, and
//! deliberately broken filesystems are caught (and the failures shrink).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use testkit::model::ModelFs;
use testkit::testing::strategy::{self, GenConfig};
use testkit::testing::{
    apply_blocking, run_against_model, CompareOptions, Handles, ManualClock, Name, Op, OpOutcome,
    Path, Target, VisibleState, XName,
};
use vfs::{Attr, DirEntry, Errno, FileSystem, FsResult, Ino, SetAttr, XattrMode};

/// Ways to break the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// `removexattr` succeeds but removes nothing.
    DropXattrRemoval,
    /// `rename` onto an existing name fails with `EEXIST`.
    RenameNoReplace,
    /// Writes past 8 KiB are silently dropped (but reported as written).
    TruncatedWrites,
    /// `readdir` lists the name `c` twice.
    ListTwice,
    /// A remount loses the xattrs of every inode.
    RemountLosesXattrs,
    /// `mtime` is not updated by truncate.
    TruncateKeepsMtime,
}

#[derive(Debug)]
struct Broken {
    inner: ModelFs<ManualClock>,
    bug: Bug,
}

impl FileSystem for Broken {
    vfs::forward_filesystem!(self.inner; except setattr, rename, readdir, write, removexattr);

    async fn setattr(&self, ino: Ino, changes: SetAttr) -> FsResult<Attr> {
        let before = self.inner.getattr(ino).await?;
        let mut attr = self.inner.setattr(ino, changes).await?;
        if self.bug == Bug::TruncateKeepsMtime && changes.size.is_some() && changes.mtime.is_none()
        {
            attr.mtime = before.mtime;
            let keep = SetAttr {
                mtime: Some(vfs::SetTime::To(before.mtime)),
                ..SetAttr::default()
            };
            self.inner.setattr(ino, keep).await?;
        }
        Ok(attr)
    }
    async fn rename(&self, od: Ino, on: &[u8], nd: Ino, nn: &[u8]) -> FsResult<()> {
        if self.bug == Bug::RenameNoReplace && self.inner.lookup(nd, nn).await.is_ok() {
            return Err(Errno::EEXIST);
        }
        self.inner.rename(od, on, nd, nn).await
    }
    async fn readdir(&self, dir: Ino, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let mut entries = self.inner.readdir(dir, offset, max).await?;
        if self.bug == Bug::ListTwice {
            if let Some(c) = entries.iter().find(|e| e.name == b"c").cloned() {
                entries.push(c);
            }
        }
        Ok(entries)
    }
    async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        if self.bug == Bug::TruncatedWrites && offset + data.len() as u64 > 8192 {
            let keep = 8192u64.saturating_sub(offset) as usize;
            if keep > 0 {
                self.inner.write(ino, offset, &data[..keep]).await?;
            } else {
                self.inner.getattr(ino).await?;
            }
            return Ok(data.len());
        }
        self.inner.write(ino, offset, data).await
    }
    async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        if self.bug == Bug::DropXattrRemoval {
            self.inner.getxattr(ino, name).await?;
            return Ok(());
        }
        self.inner.removexattr(ino, name).await
    }
}

/// A "remount" of the broken wrapper: the model's state carries over, except where the
/// bug says otherwise.
fn remount(fs: Broken) -> Broken {
    if fs.bug == Bug::RemountLosesXattrs {
        let state = VisibleState::capture_blocking(&fs.inner);
        for node in state.nodes.values() {
            for name in node.xattrs.keys() {
                pollster::block_on(fs.inner.removexattr(node.ino, name)).unwrap();
            }
        }
    }
    fs
}

fn run(bug: Bug, ops: &[Op]) -> Result<(), testkit::testing::Mismatch> {
    run_against_model(
        ops,
        |clock| Broken {
            inner: ModelFs::new(clock),
            bug,
        },
        remount,
        CompareOptions::default(),
    )
    .map(|_| ())
}

proptest! {
    #![proptest_config(Config { cases: strategy::cases(128), ..Config::default() })]

    /// The model agrees with itself on any sequence, and its visible states are free of
    /// anomalies.
    #[test]
    fn model_agrees_with_model(ops in strategy::ops(GenConfig::default(), 1..60)) {
        let runner = run_against_model(
            &ops,
            ModelFs::new,
            |fs| fs,
            CompareOptions { keep_model_states: true, ..CompareOptions::default() },
        )?;
        for state in &runner.model_states {
            prop_assert!(state.anomalies.is_empty(), "{state}");
        }
        prop_assert_eq!(runner.model_states.len(), ops.len() + 1);
    }
}

/// Runs generated sequences against a broken filesystem; returns the minimal failing
/// sequence proptest shrank to.
fn find_bug(bug: Bug) -> Vec<Op> {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 2000,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let result = runner.run(&strategy::ops(GenConfig::default(), 1..60), |ops| {
        run(bug, &ops)?;
        Ok(())
    });
    match result {
        Err(TestError::Fail(_, ops)) => ops,
        other => panic!("{bug:?} not caught: {other:?}"),
    }
}

#[test]
fn broken_filesystems_are_caught_and_shrunk() {
    for bug in [
        Bug::DropXattrRemoval,
        Bug::RenameNoReplace,
        Bug::TruncatedWrites,
        Bug::ListTwice,
        Bug::RemountLosesXattrs,
        Bug::TruncateKeepsMtime,
    ] {
        let ops = find_bug(bug);
        let prelude = strategy::prelude().len();
        assert!(
            ops.len() <= prelude + 4,
            "{bug:?}: shrunk to {} ops:\n{}",
            ops.len(),
            testkit::testing::format_ops(&ops)
        );
        // The minimal sequence still fails, and the report names it.
        let report = run(bug, &ops).unwrap_err().to_string();
        assert!(report.contains("sequence to replay"), "{report}");
    }
}

#[test]
fn the_unbroken_wrapper_passes() {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy::ops(GenConfig::default(), 1..60), |ops| {
            run(Bug::None, &ops)?;
            Ok(())
        })
        .unwrap();
}

fn file(dir: &[u8], name: u8) -> Target {
    let mut p = Path::of(dir);
    p.0.push(Name::Plain(name));
    Target::Path(p)
}

#[test]
fn dropped_xattr_removal_shows_in_outcome_and_state() {
    let ops = vec![
        Op::Create {
            dir: Path::root(),
            name: Name::Plain(0),
            perm: 0o644,
        },
        Op::Setxattr {
            target: file(&[], 0),
            name: XName(0),
            len: 3,
            seed: 1,
            how: XattrMode::Upsert,
        },
        Op::Removexattr {
            target: file(&[], 0),
            name: XName(0),
        },
    ];
    let m = run(Bug::DropXattrRemoval, &ops).unwrap_err();
    assert_eq!(m.index, 2);
    assert!(m.outcomes.is_none(), "both said OK");
    // The removal's ctime update is missing too.
    assert_eq!(m.state_diff.len(), 2, "{m}");
    assert!(m.state_diff[0].starts_with("/a: ctime"), "{m}");
    assert_eq!(m.state_diff[1], "/a: xattrs [] vs [\"user.a(3B)\"]", "{m}");
}

#[test]
fn listing_a_name_twice_is_an_anomaly() {
    let clock = ManualClock::default();
    let broken = Broken {
        inner: ModelFs::new(clock),
        bug: Bug::ListTwice,
    };
    let mut handles = Handles::default();
    let create = Op::Create {
        dir: Path::root(),
        name: Name::Plain(2),
        perm: 0o644,
    };
    apply_blocking(&broken, &mut handles, &create);
    let state = VisibleState::capture_blocking(&broken);
    assert_eq!(state.anomalies, ["/: c listed twice"]);
    let listing = apply_blocking(
        &broken,
        &mut handles,
        &Op::Readdir {
            dir: Path::root(),
            page: 64,
        },
    );
    assert!(
        matches!(listing.outcome, OpOutcome::Broken(_)),
        "{listing:?}"
    );
}

#[test]
fn remount_releases_unlinked_open_files() {
    let ops = vec![
        Op::Create {
            dir: Path::root(),
            name: Name::Plain(0),
            perm: 0o644,
        },
        Op::Open {
            target: file(&[], 0),
        },
        Op::Unlink {
            dir: Path::root(),
            name: Name::Plain(0),
        },
        Op::Write {
            target: Target::Handle(0),
            offset: 0,
            len: 10,
            seed: 3,
        },
        Op::Remount,
        Op::Write {
            target: Target::Handle(0),
            offset: 0,
            len: 10,
            seed: 3,
        },
    ];
    let runner = run_against_model(&ops, ModelFs::new, |fs| fs, CompareOptions::default()).unwrap();
    assert_eq!(runner.model.inode_count(), 1, "only the root is left");
    assert_eq!(runner.records[3].model.outcome, OpOutcome::Count(10));
    assert_eq!(runner.records[5].model.outcome, OpOutcome::Skipped);
}

#[test]
fn ino_map_pairs_inodes() {
    let ops = strategy::prelude();
    let runner = run_against_model(&ops, ModelFs::new, |fs| fs, CompareOptions::default()).unwrap();
    assert_eq!(runner.ino_map.len(), 8);
    assert!(runner.ino_map.iter().all(|(a, b)| a == b));
}

/// Generated sequences do interesting things: most ops succeed, every kind of op
/// succeeds sometimes, and the interesting errors show up.
#[test]
fn generated_sequences_are_interesting() {
    use std::collections::BTreeMap;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let strategy = strategy::ops(GenConfig::default(), 40..60);
    let mut ok: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    let mut enoent: BTreeMap<String, usize> = BTreeMap::new();
    let (mut total, mut succeeded) = (0, 0);
    for _ in 0..200 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let run = run_against_model(
            &ops,
            ModelFs::new,
            |fs| fs,
            CompareOptions {
                state_each_op: false,
                ..CompareOptions::default()
            },
        )
        .unwrap();
        for record in &run.records {
            let kind = format!("{:?}", record.op);
            let kind = kind.split([' ', '{']).next().unwrap().to_string();
            total += 1;
            match record.model.outcome {
                OpOutcome::Err(e) => {
                    *errors.entry(e.name()).or_default() += 1;
                    if e == Errno::ENOENT {
                        *enoent.entry(kind).or_default() += 1;
                    }
                }
                OpOutcome::Skipped => {}
                _ => {
                    succeeded += 1;
                    *ok.entry(kind).or_default() += 1;
                }
            }
        }
    }
    let rate = succeeded as f64 / total as f64;
    assert!(
        (0.4..0.95).contains(&rate),
        "success rate {rate}; {ok:?} {errors:?} ENOENT by op: {enoent:?}"
    );
    for kind in [
        "Create",
        "Mkdir",
        "Mknod",
        "Symlink",
        "Readlink",
        "Link",
        "Unlink",
        "Rmdir",
        "Rename",
        "Readdir",
        "Read",
        "Write",
        "Append",
        "Clone",
        "Setattr",
        "Getxattr",
        "Setxattr",
        "Listxattr",
        "Removexattr",
        "Open",
        "Release",
        "Fsync",
        "FsyncDir",
        "Sync",
        "Lookup",
        "Getattr",
    ] {
        assert!(
            ok.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never succeeds: {ok:?}"
        );
    }
    for errno in [
        "ENOENT",
        "EEXIST",
        "ENOTEMPTY",
        "EISDIR",
        "ENOTDIR",
        "EINVAL",
        "ENODATA",
    ] {
        assert!(
            errors.get(errno).copied().unwrap_or(0) > 0,
            "{errno} never seen: {errors:?}"
        );
    }
    eprintln!("success rate {rate:.2}\nok {ok:?}\nerrors {errors:?}\nENOENT {enoent:?}");
}

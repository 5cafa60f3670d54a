//! The contract checker's rules, each shown to accept what the contract allows and to
//! reject what it forbids, on recovered states made by hand from the model's history.

use block::Recorder;
use testkit::model::ModelFs;
use testkit::sim::contract::{record_run, Checker};
use testkit::testing::{CompareOptions, Name, Op, Path, Target, VisibleState, XName};
use vfs::{SetAttr, XattrMode};

fn name(i: u8) -> Name {
    Name::Plain(i)
}

fn t(i: u8) -> Target {
    Target::Path(Path::of(&[i]))
}

fn create(i: u8) -> Op {
    Op::Create {
        dir: Path::root(),
        name: name(i),
        perm: 0o644,
    }
}

fn write(i: u8, seed: u8) -> Op {
    Op::Write {
        target: t(i),
        offset: 0,
        len: 5000,
        seed,
    }
}

fn fsync(i: u8) -> Op {
    Op::Fsync {
        target: t(i),
        datasync: false,
    }
}

fn rename(from: u8, to: u8) -> Op {
    Op::Rename {
        from_dir: Path::root(),
        from: name(from),
        to_dir: Path::root(),
        to: name(to),
    }
}

/// Runs `ops` on the model (as both sides) and returns a checker and the model states.
fn checker(ops: &[Op]) -> (Checker, Vec<VisibleState>) {
    let (run, _) = record_run(
        ops,
        ModelFs::new,
        |fs| fs,
        &Recorder::default(),
        CompareOptions::default(),
    )
    .unwrap();
    let states = run.model_states.clone();
    (Checker::new(run), states)
}

fn key(path: &str) -> Vec<u8> {
    path.as_bytes().to_vec()
}

/// `state` without the entry at `path` (a file), with the root's link bookkeeping kept.
fn without(state: &VisibleState, path: &str) -> VisibleState {
    let mut s = state.clone();
    s.nodes.remove(&key(path)).expect("present");
    s
}

fn assert_ok(checker: &Checker, acked: usize, in_flight: bool, state: &VisibleState) {
    if let Err(v) = checker.check_acknowledged(acked, in_flight, state) {
        panic!("legal state rejected:\n{v}\n{state}");
    }
}

fn assert_violation(
    checker: &Checker,
    acked: usize,
    in_flight: bool,
    state: &VisibleState,
    rule: &str,
) {
    match checker.check_acknowledged(acked, in_flight, state) {
        Ok(()) => panic!("illegal state accepted ({rule} expected):\n{state}"),
        Err(v) => assert!(
            v.problems.iter().any(|p| p.starts_with(rule)),
            "expected {rule}, got:\n{v}"
        ),
    }
}

#[test]
fn unsynced_ops_may_be_lost_as_a_prefix() {
    let ops = [create(2), write(2, 1), create(3)];
    let (c, s) = checker(&ops);
    for state in &s {
        assert_ok(&c, 3, false, state);
    }
}

#[test]
fn fsync_of_one_file_keeps_it_but_not_its_siblings() {
    let ops = [create(2), create(3), write(3, 1), fsync(3)];
    let (c, s) = checker(&ops);
    // /c (created first, never fsynced) may be lost while /d survives.
    assert_ok(&c, 4, false, &without(&s[4], "c"));
    assert_ok(&c, 4, false, &s[4]);
    // /d may not be lost, nor its data.
    assert_violation(&c, 4, false, &without(&s[4], "d"), "R4");
    assert_violation(&c, 4, false, &s[2], "R2");
    // Before the fsync was acknowledged (in flight), anything goes.
    assert_ok(&c, 3, true, &s[0]);
}

#[test]
fn half_applied_inode_is_rejected() {
    let chmod = Op::Setattr {
        target: t(2),
        changes: SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    };
    let ops = [create(2), Op::Sync, write(2, 1), chmod];
    let (c, s) = checker(&ops);
    assert_ok(&c, 4, false, &s[3]);
    // The chmod without the write before it: a state that never existed.
    let mut mixed = s[4].clone();
    let before = s[3].nodes[&key("c")].clone();
    let before_write = s[2].nodes[&key("c")].clone();
    let node = mixed.nodes.get_mut(&key("c")).unwrap();
    node.content = before_write.content.clone();
    node.attr.size = before_write.attr.size;
    node.attr.times = before.attr.times;
    assert_violation(&c, 4, false, &mixed, "R2");
}

#[test]
fn fdatasync_may_put_data_ahead_of_metadata() {
    let chmod = Op::Setattr {
        target: t(2),
        changes: SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    };
    let datasync = Op::Fsync {
        target: t(2),
        datasync: true,
    };
    let ops = [create(2), Op::Sync, chmod, write(2, 1), datasync];
    let (mut c, s) = checker(&ops);
    c.times = false;
    // New data (state 4) with the mode from before the chmod (state 2): allowed.
    let mut mixed = s[5].clone();
    let old = s[2].nodes[&key("c")].clone();
    mixed.nodes.get_mut(&key("c")).unwrap().attr.mode = old.attr.mode;
    assert_ok(&c, 5, false, &mixed);
    // But the data must be the fdatasynced one.
    let mut stale = s[5].clone();
    let node = stale.nodes.get_mut(&key("c")).unwrap();
    node.content = old.content.clone();
    node.attr.size = old.attr.size;
    assert_violation(&c, 5, false, &stale, "R2");
}

#[test]
fn rename_is_atomic() {
    let ops = [create(2), Op::Sync, rename(2, 3)];
    let (c, s) = checker(&ops);
    assert_ok(&c, 3, false, &s[2]);
    assert_ok(&c, 3, false, &s[3]);
    // Neither name: the file was durable and never removed.
    assert_violation(&c, 3, false, &without(&s[3], "d"), "R4");
    // Both names: a link count it never had.
    let mut both = s[3].clone();
    let mut node = s[2].nodes[&key("c")].clone();
    node.attr.nlink = 2;
    both.nodes.get_mut(&key("d")).unwrap().attr.nlink = 2;
    node.link_of = None;
    both.nodes.insert(key("c"), node);
    assert_violation(&c, 3, false, &both, "R5");
}

#[test]
fn fsync_after_rename_keeps_the_new_name() {
    let ops = [create(2), Op::Sync, rename(2, 3), fsync(3)];
    let (c, s) = checker(&ops);
    assert_ok(&c, 4, false, &s[4]);
    assert_violation(&c, 4, false, &s[2], "R3");
}

#[test]
fn new_names_in_new_directories_survive_a_file_fsync() {
    let ops = [
        Op::Mkdir {
            dir: Path::root(),
            name: name(0),
            perm: 0o755,
        },
        Op::Create {
            dir: Path::of(&[0]),
            name: name(2),
            perm: 0o644,
        },
        Op::Fsync {
            target: Target::Path(Path::of(&[0, 2])),
            datasync: false,
        },
    ];
    let (c, s) = checker(&ops);
    assert_ok(&c, 3, false, &s[3]);
    assert_violation(&c, 3, false, &s[0], "R3");
}

#[test]
fn directory_fsync_persists_its_entries() {
    let ops = [create(2), create(3), Op::FsyncDir { dir: Path::root() }];
    let (c, s) = checker(&ops);
    assert_ok(&c, 3, false, &s[3]);
    assert_violation(&c, 3, false, &s[1], "R3");
    // ...including removals.
    let ops = [
        create(2),
        Op::Sync,
        Op::Unlink {
            dir: Path::root(),
            name: name(2),
        },
        Op::FsyncDir { dir: Path::root() },
    ];
    let (c, s) = checker(&ops);
    assert_ok(&c, 4, false, &s[4]);
    assert_violation(&c, 4, false, &s[2], "R3");
}

#[test]
fn removed_files_do_not_come_back_after_sync() {
    let unlink = Op::Unlink {
        dir: Path::root(),
        name: name(2),
    };
    let ops = [create(2), Op::Sync, unlink, Op::Sync];
    let (c, s) = checker(&ops);
    assert_ok(&c, 4, false, &s[4]);
    assert_violation(&c, 4, false, &s[2], "R2");
    // Before the second sync, the unlink may be lost.
    assert_ok(&c, 3, false, &s[2]);
}

#[test]
fn in_flight_op_may_or_may_not_show() {
    let ops = [create(2), Op::Sync, write(2, 7)];
    let (c, s) = checker(&ops);
    assert_ok(&c, 2, true, &s[3]);
    assert_ok(&c, 2, true, &s[2]);
    // Not started: its effect cannot show.
    assert_violation(&c, 2, false, &s[3], "R2");
}

#[test]
fn unknown_inodes_anomalies_and_times_are_rejected() {
    let ops = [create(2), Op::Sync];
    let (mut c, s) = checker(&ops);
    let mut phantom = s[2].clone();
    phantom.nodes.get_mut(&key("c")).unwrap().ino = 999;
    assert!(c
        .check_acknowledged(2, false, &phantom)
        .unwrap_err()
        .problems
        .iter()
        .any(|p| p.contains("never created")));
    let mut broken = s[2].clone();
    broken.anomalies.push("/: c listed twice".into());
    assert_violation(&c, 2, false, &broken, "R0");
    let mut odd_time = s[2].clone();
    odd_time.nodes.get_mut(&key("c")).unwrap().attr.times[1].sec += 12345;
    assert_violation(&c, 2, false, &odd_time, "R2");
    c.times = false;
    assert_ok(&c, 2, false, &odd_time);
}

#[test]
fn xattrs_are_metadata() {
    let set = Op::Setxattr {
        target: t(2),
        name: XName(0),
        len: 10,
        seed: 1,
        how: XattrMode::Upsert,
    };
    let ops = [create(2), set, fsync(2)];
    let (c, s) = checker(&ops);
    assert_ok(&c, 3, false, &s[3]);
    assert_violation(&c, 3, false, &s[1], "R2");
}

#[test]
fn remount_is_a_clean_unmount() {
    let ops = [create(2), write(2, 3), Op::Remount];
    let (c, s) = checker(&ops);
    assert_ok(&c, 3, false, &s[3]);
    assert_violation(&c, 3, false, &s[1], "R2");
    assert_ok(&c, 2, true, &s[1]);
}

//! `ninefold crash-trace` and `replay-trace` on a trace recorded on the host: the
//! filesystem over `logwrites::LogWritesDisk` (the format QEMU's `blklogwrites` writes),
//! a client noting every version it wrote and every fsync acknowledged; then every crash
//! state must mount, fsck clean and hold what was acknowledged, and an acknowledgement
//! log that claims more than was acknowledged must be caught.

mod common;

use std::path::{Path, PathBuf};

use block::MemDisk;
use common::{fsck_clean, ninefold};
use logwrites::acks::AckWriter;
use logwrites::LogWritesDisk;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use testkit::testing::{ManualClock, TEST_OWNER};
use vfs::{FileSystem, ROOT_INO};

fn temp_dir(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ninefold-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Records a small workload into `dir`: three files, each write followed by an fsync
/// (every third an fdatasync). `ack_early`: note each acknowledgement at the length the
/// log had when the write was sent, as a broken client log would.
fn record(dir: &Path, ack_early: bool) {
    let disk = MemDisk::new(4096, 4096);
    let opts = FormatOptions {
        uuid: [7; 16],
        secret: 0x7ace,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    std::fs::write(dir.join("base.img"), disk.snapshot()).unwrap();
    let (disk, log) = LogWritesDisk::new(disk);
    let log_len = || log.lock().unwrap().bytes().len() as u64;
    let fs = pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(ManualClock::default()),
    ))
    .unwrap();
    let mut acks = AckWriter::new(Vec::new());
    let mut rng = oorandom::Rand64::new(13);
    let mut files = Vec::new();
    for i in 0..3 {
        let name = format!("f{i}");
        let sent = log_len();
        acks.version(&name, Some(b""), sent).unwrap();
        let attr =
            pollster::block_on(fs.create(ROOT_INO, name.as_bytes(), 0o644, TEST_OWNER)).unwrap();
        files.push((name, attr.ino, Vec::<u8>::new()));
    }
    for step in 0..24 {
        let (name, ino, content) = &mut files[step % 3];
        let len = 1 + rng.rand_range(0..12_000) as usize;
        let offset = if content.is_empty() || rng.rand_range(0..3) > 0 {
            content.len()
        } else {
            rng.rand_range(0..content.len() as u64) as usize
        };
        let data: Vec<u8> = (0..len).map(|_| rng.rand_u64() as u8).collect();
        if content.len() < offset + len {
            content.resize(offset + len, 0);
        }
        content[offset..offset + len].copy_from_slice(&data);
        let sent = log_len();
        let version = acks.version(name, Some(content), sent).unwrap();
        pollster::block_on(fs.write(*ino, offset as u64, &data)).unwrap();
        let datasync = step % 3 == 2;
        pollster::block_on(fs.fsync(*ino, datasync)).unwrap();
        let acked = if ack_early { sent } else { log_len() };
        let op = if datasync { "fdatasync" } else { "fsync" };
        acks.ack(name, version, op, acked).unwrap();
    }
    std::fs::write(dir.join("acks.jsonl"), acks.into_inner().unwrap()).unwrap();
    std::fs::write(dir.join("trace.log"), log.lock().unwrap().bytes()).unwrap();
    drop(fs);
}

fn crash_trace(dir: &Path, extra: &[&str]) -> (bool, String) {
    let out = ninefold()
        .arg("crash-trace")
        .arg(dir)
        .args(["--per-point", "12"])
        .args(extra)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The number after `what` in the last line.
fn count(text: &str, what: &str) -> usize {
    let last = text.lines().last().unwrap_or("");
    let rest = &last[last
        .find(what)
        .unwrap_or_else(|| panic!("no {what} in {text}"))
        + what.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn every_crash_state_of_a_recorded_trace_keeps_what_was_acknowledged() {
    let dir = temp_dir("good");
    record(&dir, false);
    let (ok, text) = crash_trace(&dir, &[]);
    println!("{text}");
    assert!(ok, "{text}");
    assert!(count(&text, "trace crash states: ") > 100, "{text}");
    assert_eq!(count(&text, "violations: "), 0, "{text}");
    assert_eq!(count(&text, "fsck errors: "), 0, "{text}");
    // The trace really has the workload: 24 acknowledged syncs, flushes, and writes after
    // the super entry's count.
    assert!(text.contains("24 acknowledged syncs of 3 paths"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_acknowledgement_the_disk_never_had_is_a_violation_with_a_replay_command() {
    let dir = temp_dir("early");
    record(&dir, true);
    let (ok, text) = crash_trace(&dir, &[]);
    assert!(!ok, "{text}");
    assert!(count(&text, "violations: ") > 0, "{text}");
    // The printed command checks that one state again, and it fails the same way.
    let replay = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("replay: ninefold crash-trace "))
        .unwrap_or_else(|| panic!("no replay command in {text}"));
    let args: Vec<&str> = replay.split_whitespace().collect();
    let out = ninefold().arg("crash-trace").args(&args).output().unwrap();
    let again = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{again}");
    assert!(
        again.contains("trace crash states: 1, violations: 1"),
        "{again}"
    );
    assert!(again.contains("acknowledged at log byte"), "{again}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replay_trace_stops_at_the_last_flush() {
    let dir = temp_dir("replay");
    record(&dir, false);
    let out_img = dir.join("out.img");
    let run = |extra: &[&str]| {
        let out = ninefold()
            .arg("replay-trace")
            .args(["--base", dir.join("base.img").to_str().unwrap()])
            .args(["--trace", dir.join("trace.log").to_str().unwrap()])
            .args(["--out", out_img.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The whole log ends with an fsync's FLUSH: everything is applied, and fsck is clean.
    let text = run(&[]);
    let trace = logwrites::Trace::open(&dir.join("trace.log")).unwrap();
    let n = trace.entries().len();
    assert!(
        text.contains(&format!("{n} of {n} entries applied")),
        "{text}"
    );
    fsck_clean(&out_img);
    // Cut in the middle: only up to the last FLUSH within the cut.
    let cut = trace.entries()[n / 2].log_end;
    let durable = trace.durable_prefix(n / 2 + 1);
    assert!(durable < n / 2 + 1 || trace.entries()[n / 2].kind == logwrites::EntryKind::Flush);
    let text = run(&["--log-bytes", &cut.to_string()]);
    assert!(
        text.contains(&format!("{durable} of {n} entries applied")),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

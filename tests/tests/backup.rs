//! The nightly backup of docs/operating.md ("Nightly incremental backup to another
//! appliance"), run against two appliances with nothing mounted: each night is two host
//! commands, `ninefold snapshot create --connect A NAME` and `ninefold send --connect A
//! NAME [--from BASE] | ninefold receive --connect B`. The source serves the in-memory
//! filesystem, the backup a formatted disk; after each night every file of the backup's
//! snapshot is what the source's snapshot holds, read through a 9P client of each. Then
//! what an operator gets wrong: an address where nothing listens, and a stream whose base
//! the backup does not have (refused, the backup unchanged, exit 1 with the reason); the
//! backup, powered off, is clean by fsck. A send cut off mid-stream (the source
//! stopped) exits 1 and the backup refuses what reached it. The backup also takes `scrub`, `quota` and
//! `ctl` over `--connect`; an appliance without this host in `admin_allow=` refuses it,
//! saying so.
//!
//! Host ports: 9P on 16570 (the source), 16571 (the backup) and 16572 (the refusing one).

use std::process::{Command, Stdio};
use std::time::Duration;

use ninefold_tests::ninep::connect;
use ninefold_tests::{tool, FsImage, Qemu};
use ninep::testing::{Client, Exchange};
use ninep::wire::open_flags;
use serde_json::json;

/// How long an appliance may take to boot and answer under TCG.
const UP: Duration = Duration::from_secs(90);
const FILES: usize = 12;
const FILE_BYTES: usize = 64 * 1024;
/// The file of the stream cut off mid-way: several seconds at the source's stream rate.
const CUT_BYTES: usize = 8 << 20;

/// A file's bytes on night `night`: files `night % 3`, `night % 3 + 3`, ... change.
fn file_data(i: usize, night: usize) -> Vec<u8> {
    let stamp = (0..=night).filter(|n| i % 3 == n % 3).count();
    (0..FILE_BYTES)
        .map(|b| (b * 31 + i * 7 + stamp * 101) as u8)
        .collect()
}

fn write_file<X: Exchange>(c: &mut Client<X>, name: &str, data: &[u8]) {
    c.walk(1, 2, "").unwrap();
    if c.lcreate(2, name, open_flags::RDWR | open_flags::TRUNC, 0o644)
        .is_err()
    {
        c.clunk(2).ok();
        c.walk(1, 2, name).unwrap();
        c.lopen(2, open_flags::RDWR | open_flags::TRUNC).unwrap();
    }
    // In pieces within the client's msize (1 MiB).
    for (i, piece) in data.chunks(512 << 10).enumerate() {
        c.write(2, (i * (512 << 10)) as u64, piece).unwrap();
    }
    c.clunk(2).unwrap();
}

fn read_all<X: Exchange>(c: &mut Client<X>, path: &str) -> Vec<u8> {
    c.walk(1, 2, path).unwrap();
    c.lopen(2, open_flags::RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let chunk = c.read(2, out.len() as u64, 65536).unwrap();
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    c.clunk(2).unwrap();
    out
}

/// `ninefold ARGS`: exit status, stdout, stderr.
fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tool()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ninefold send --connect FROM SEND.. | ninefold receive --connect TO`: whether both
/// succeeded, and what each said on standard error.
fn send_into(from: &str, send: &[&str], to: &str) -> (bool, String, String) {
    let mut sender = Command::new(tool())
        .args(["send", "--connect", from])
        .args(send)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let receiver = Command::new(tool())
        .args(["receive", "--connect", to])
        .stdin(sender.stdout.take().unwrap())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let received = receiver.wait_with_output().unwrap();
    let sent = sender.wait_with_output().unwrap();
    (
        sent.status.success() && received.status.success(),
        String::from_utf8_lossy(&sent.stderr).into_owned(),
        String::from_utf8_lossy(&received.stderr).into_owned(),
    )
}

#[test]
fn a_nightly_backup_goes_from_one_appliance_into_another_with_two_commands() {
    let (source_port, backup_port) = (16570, 16571);
    let mut source = Qemu::serving()
        .memory("256M")
        .virtio_net_forwards(&[(source_port, 564)])
        .append("fs=memory admin_allow=10.0.2.2 stream_rate=1")
        .timeout(Duration::from_secs(400))
        .spawn();
    let disk = FsImage::formatted("256M");
    let mut backup = Qemu::serving()
        .memory("256M")
        .nvme_image("nf-backup", &disk)
        .virtio_net_forwards(&[(backup_port, 564)])
        .append("admin_allow=10.0.2.2 stream_rate=64")
        .qmp()
        .timeout(Duration::from_secs(400))
        .spawn();
    for vm in [&mut source, &mut backup] {
        vm.wait_for_event("listening", json!({"service": "9p", "port": 564}));
    }
    let (a, b) = (
        format!("127.0.0.1:{source_port}"),
        format!("127.0.0.1:{backup_port}"),
    );
    let mut src = connect(source_port, UP);
    src.attach(1, 0, "").unwrap();
    for i in 0..FILES {
        write_file(&mut src, &format!("f{i}"), &file_data(i, 0));
    }

    // Three nights: a full stream first, then increments from the night before.
    let nights = ["mon", "tue", "wed"];
    for (night, name) in nights.iter().enumerate() {
        if night > 0 {
            for i in (night % 3..FILES).step_by(3) {
                write_file(&mut src, &format!("f{i}"), &file_data(i, night));
            }
        }
        let (ok, out, err) = cli(&["snapshot", "create", "--connect", &a, name]);
        assert!(ok && out.starts_with("created snapshot"), "{out}{err}");
        let base = night.checked_sub(1).map(|n| nights[n]);
        let mut send = vec![*name];
        if let Some(base) = base {
            send.extend(["--from", base]);
        }
        let (ok, sent, received) = send_into(&a, &send, &b);
        assert!(
            ok,
            "night {name}: send said {sent:?}, receive said {received:?}"
        );
        println!("night {name}: {}", sent.lines().last().unwrap_or_default());

        let mut dst = connect(backup_port, UP);
        dst.attach(1, 0, "").unwrap();
        for i in 0..FILES {
            let path = format!(".snapshots/{name}/f{i}");
            let there = read_all(&mut src, &path);
            assert_eq!(there, file_data(i, night), "{path} on the source");
            assert!(
                read_all(&mut dst, &path) == there,
                "{path} differs on the backup"
            );
            // The backup's live tree is the newest snapshot.
            assert!(
                read_all(&mut dst, &format!("f{i}")) == there,
                "f{i} on the backup"
            );
        }
    }
    let (ok, list, err) = cli(&["snapshot", "list", "--connect", &b]);
    assert!(ok && list.starts_with("3 snapshot(s)"), "{list}{err}");

    // Nothing listens there: exit 1, saying what to check.
    let (ok, _, err) = cli(&["status", "--connect", "127.0.0.1:16579"]);
    assert!(!ok && err.contains("reachable"), "{err}");
    // An increment from a base the backup never received: refused whole, the backup
    // as it was.
    for name in ["skipped", "thu"] {
        let (ok, out, err) = cli(&["snapshot", "create", "--connect", &a, name]);
        assert!(ok, "{out}{err}");
    }
    let (ok, _, received) = send_into(&a, &["thu", "--from", "skipped"], &b);
    assert!(!ok && received.contains("refused"), "{received}");
    let (ok, list, err) = cli(&["snapshot", "list", "--connect", &b]);
    assert!(ok && list.starts_with("3 snapshot(s)"), "{list}{err}");

    // A send cut off mid-stream (the source gone, its stream at stream_rate=1 MiB/s):
    // the sender exits 1 saying why, the backup refuses the partial stream and keeps
    // what it had.
    let big: Vec<u8> = (0..CUT_BYTES).map(|b| (b * 13 + b / 4096) as u8).collect();
    write_file(&mut src, "big", &big);
    let (ok, out, err) = cli(&["snapshot", "create", "--connect", &a, "fri"]);
    assert!(ok, "{out}{err}");
    let cut = {
        let (a, b) = (a.clone(), b.clone());
        std::thread::spawn(move || send_into(&a, &["fri", "--from", "wed"], &b))
    };
    std::thread::sleep(Duration::from_secs(3));
    drop(src);
    let gone = source.stop();
    let (ok, sent, received) = cut.join().unwrap();
    if ok {
        gone.fail(&format!(
            "a send cut off by the source's end succeeded: {sent:?} / {received:?}"
        ));
    }
    println!("cut send: sender said {sent:?}, receiver said {received:?}");
    assert!(
        sent.trim_end().lines().last().is_some(),
        "the sender said nothing"
    );
    let (ok, list, err) = cli(&["snapshot", "list", "--connect", &b]);
    assert!(
        ok && list.starts_with("3 snapshot(s)") && !list.contains("fri"),
        "{list}{err}"
    );
    let mut dst = connect(backup_port, UP);
    dst.attach(1, 0, "").unwrap();
    assert!(
        dst.walk(1, 2, "big").is_err(),
        "the cut stream left big behind"
    );
    for i in 0..FILES {
        assert!(
            read_all(&mut dst, &format!("f{i}")) == file_data(i, nights.len() - 1),
            "f{i} changed on the backup by a cut stream"
        );
    }

    // The other admin commands against the running backup: a scrub pass (exit 0:
    // clean), the quota list, a ctl command, each as on an image.
    let (ok, out, err) = cli(&["scrub", "--connect", &b]);
    assert!(ok, "scrub: {out}{err}");
    let (ok, out, err) = cli(&["quota", "--connect", &b]);
    assert!(ok, "quota: {out}{err}");
    let (ok, out, err) = cli(&["ctl", "--connect", &b, "snapshot", "list"]);
    assert!(ok && out.starts_with("3 snapshot(s)"), "ctl: {out}{err}");
    let (ok, _, err) = cli(&["ctl", "--connect", &b, "no-such-command"]);
    assert!(!ok && err.contains("unknown command"), "{err}");
    // An appliance that does not let this host administer it: refused, saying how.
    let refusing_port = 16572;
    let mut refusing = Qemu::serving()
        .memory("128M")
        .virtio_net_forwards(&[(refusing_port, 564)])
        .append("fs=memory")
        .timeout(Duration::from_secs(120))
        .spawn();
    refusing.wait_for_event("listening", json!({"service": "9p", "port": 564}));
    let refusing = format!("127.0.0.1:{refusing_port}");
    let (ok, _, err) = cli(&["status", "--connect", &refusing]);
    assert!(!ok && err.contains("admin_allow="), "{err}");
    let (ok, _, err) = cli(&["snapshot", "create", "--connect", &refusing, "x"]);
    assert!(!ok && err.contains("admin_allow="), "{err}");

    // Powered off, the backup's disk is clean.
    backup.power_button();
    let off = backup.wait_for_exit(Duration::from_secs(120));
    if off.status != Some(0) {
        off.fail("expected the backup to power off (QEMU status 0)");
    }
    disk.fsck();
}

//! The `ninefold` binary's mkfs, fsck and dump, end to end on image files.

mod common;

use std::path::PathBuf;

use common::{fsck_clean, ninefold};

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ninefold-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn mkfs_then_fsck_a_1gib_image() {
    let img = temp("1g.img");
    let out = ninefold()
        .args([
            "mkfs",
            img.to_str().unwrap(),
            "--size",
            "1G",
            "--label",
            "test",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 30);
    let report = fsck_clean(&img);
    assert!(report.contains("clean"), "{report}");
    // -n (make no changes, e2fsck's habit) is accepted: the checker changes nothing.
    let out = ninefold().args(["fsck", "-n"]).arg(&img).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = ninefold()
        .args(["dump", img.to_str().unwrap(), "--tree", "fs"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("(1 INODE 0) mode 40755"), "{stdout}");
    assert!(stdout.contains("label \"test\""), "{stdout}");
    let out = ninefold()
        .args(["dump", img.to_str().unwrap(), "--inode", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("nlink 2"));

    // Damage the root node: errors, exit 4. One byte patched in place, so
    // the sparse image stays sparse (a full rewrite costs 1 GiB of disk).
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut sb = vec![0u8; 4096];
        file.seek(SeekFrom::Start(8192)).unwrap();
        file.read_exact(&mut sb).unwrap();
        let sb = ninefs::format::Superblock::decode(&sb).unwrap();
        let at = sb.root(ninefs::format::TreeId::Fs).ptr.addr * 4096 + 100;
        let mut byte = [0u8];
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut byte).unwrap();
        byte[0] ^= 0x40;
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&byte).unwrap();
    }
    let out = ninefold()
        .args(["fsck", img.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::fs::remove_file(&img).unwrap();
}

#[test]
fn operational_errors_exit_8() {
    let missing = temp("missing.img");
    let out = ninefold()
        .args(["fsck", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    let zeros = temp("zeros.img");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let out = ninefold()
        .args(["fsck", zeros.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    std::fs::remove_file(&zeros).unwrap();
    // mkfs of a missing image without --size is refused.
    let out = ninefold()
        .args(["mkfs", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Too small.
    let out = ninefold()
        .args(["mkfs", missing.to_str().unwrap(), "--size", "1M"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let _ = std::fs::remove_file(&missing);
}

#[test]
fn mkfs_grows_an_existing_image_and_ctl_and_scrub_run_on_it() {
    let img = temp("grow.img");
    let path = img.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = ninefold().args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    assert_eq!(run(&["mkfs", path, "--size", "16M"]).0, Some(0));
    // Never shrinks.
    let (code, text) = run(&["mkfs", path, "--size", "8M"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("never shrink"), "{text}");
    // Grows across allocation groups, keeping the filesystem (same uuid).
    let uuid = |p: &str| {
        let bytes = std::fs::read(p).unwrap();
        ninefs::format::Superblock::decode(&bytes[8192..12288])
            .or_else(|_| ninefs::format::Superblock::decode(&bytes[4096..8192]))
            .unwrap()
            .uuid
    };
    let before = uuid(path);
    let (code, text) = run(&["mkfs", path, "--size", "300M"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("300 MiB"), "{text}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 300 << 20);
    assert_eq!(uuid(path), before);
    fsck_clean(path);
    // The administration commands.
    let (code, text) = run(&["ctl", path, "sync"]);
    assert_eq!((code, text.trim()), (Some(0), "synced"));
    let (code, text) = run(&["ctl", path, "scrub"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("state complete") && text.contains("errors 0"),
        "{text}"
    );
    let (code, text) = run(&["ctl", path, "grow"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.starts_with("not grown"), "{text}");
    let (code, text) = run(&["ctl", path, "snapshot", "create", "x"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("created snapshot 1 \"x\""), "{text}");
    let (code, text) = run(&["ctl", path, "snapshot", "list"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.starts_with("1 snapshot(s)\n1 x checkpoint"), "{text}");
    let (code, text) = run(&["ctl", path, "snapshot", "delete", "x"]);
    assert_eq!((code, text.trim()), (Some(0), "deleted snapshot \"x\""));
    let (code, text) = run(&["ctl", path, "snapshot", "rename", "x"]);
    assert_ne!(code, Some(0));
    assert!(text.contains("unknown command"), "{text}");
    assert_eq!(run(&["scrub", path]).0, Some(0));
    // A damaged fs root node: scrub names it and exits 4.
    let bytes = std::fs::read(&img).unwrap();
    let sb = ninefs::format::Superblock::decode(&bytes[8192..12288])
        .or_else(|_| ninefs::format::Superblock::decode(&bytes[4096..8192]))
        .unwrap();
    let root = sb.root(ninefs::format::TreeId::Fs).ptr.addr as usize;
    let mut bad = bytes;
    bad[root * 4096 + 100] ^= 0x40;
    std::fs::write(&img, &bad).unwrap();
    let (code, text) = run(&["scrub", path]);
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains(&format!("fs tree node at block {root}")),
        "{text}"
    );
    std::fs::remove_file(&img).unwrap();
}

#[test]
fn snapshot_create_list_delete_on_an_image() {
    let img = temp("snap.img");
    let path = img.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = ninefold().args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(run(&["mkfs", path, "--size", "64M"]).0);
    let (ok, out, err) = run(&["snapshot", "create", path, "nightly"]);
    assert!(ok, "{err}");
    assert!(out.contains("created snapshot 1 \"nightly\""), "{out}");
    let (ok, _, err) = run(&["snapshot", "create", path, "nightly"]);
    assert!(!ok && err.contains("EEXIST"), "{err}");
    let (ok, _, err) = run(&["snapshot", "create", path, "no/slash"]);
    assert!(!ok && err.contains("EINVAL"), "{err}");
    assert!(run(&["snapshot", "create", path, "weekly"]).0);
    let (ok, out, _) = run(&["snapshot", "list", path]);
    assert!(ok);
    let names: Vec<&str> = out.lines().map(|l| l.split('\t').nth(1).unwrap()).collect();
    assert_eq!(names, ["nightly", "weekly"]);
    let (_, dump, _) = run(&["dump", path]);
    assert!(dump.contains("snapshot 2 \"weekly\""), "{dump}");
    let out = fsck_clean(path);
    assert!(out.contains("2 snapshots"), "{out}");
    assert!(run(&["snapshot", "delete", path, "nightly"]).0);
    let (ok, _, err) = run(&["snapshot", "delete", path, "nightly"]);
    assert!(!ok && err.contains("ENOENT"), "{err}");
    let (_, out, _) = run(&["snapshot", "list", path]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let out = fsck_clean(path);
    assert!(out.contains("1 snapshots"), "{out}");
    let _ = std::fs::remove_file(&img);
}

/// `ninefold dump IMAGE | head`: a reader that goes away ends the dump quietly (it
/// panicked on the broken pipe).
#[test]
fn dump_into_a_closed_pipe_ends_quietly() {
    let img = temp("pipe.img");
    let path = img.to_str().unwrap();
    let out = ninefold()
        .args(["mkfs", path, "--size", "64M"])
        .output()
        .unwrap();
    assert!(out.status.success());
    // The reading end is closed before the dump starts: its first write meets EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = ninefold()
        .args(["dump", path, "--tree", "fs"])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
    let _ = std::fs::remove_file(&img);
}

#[test]
fn quota_set_show_list_on_an_image() {
    let img = temp("quota.img");
    let path = img.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = ninefold().args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(run(&["mkfs", path, "--size", "64M"]).0);
    let (ok, out, _) = run(&["quota", path]);
    assert!(ok && out.is_empty(), "{out}");
    let (ok, out, _) = run(&["quota", path, "/"]);
    assert!(ok && out.contains("no quota"), "{out}");
    let (ok, out, err) = run(&["quota", path, "/", "--bytes", "1G", "--inodes", "1000"]);
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "/: root 1: bytes 0 of 1073741824, inodes 1 of 1000"
    );
    // A limit not given is kept; `none` lifts one.
    let (ok, out, _) = run(&["quota", path, "/", "--inodes", "none"]);
    assert!(
        ok && out.contains("bytes 0 of 1073741824, inodes 1 of none"),
        "{out}"
    );
    let (ok, out, _) = run(&["quota", path]);
    assert!(
        ok && out.trim() == "root 1: bytes 0 of 1073741824, inodes 1 of none",
        "{out}"
    );
    let out = fsck_clean(path);
    assert!(out.contains("quota root 1: bytes 0 of 1073741824"), "{out}");
    let (ok, _, err) = run(&["quota", path, "/missing", "--bytes", "1M"]);
    assert!(!ok && err.contains("ENOENT"), "{err}");
    let (ok, _, err) = run(&["quota", path, "/", "--bytes", "12x"]);
    assert!(!ok && err.contains("bad size"), "{err}");
    let _ = std::fs::remove_file(&img);
}

#[test]
fn a_mirrored_volume_takes_its_legs_in_any_order_mends_a_bad_copy_and_runs_with_a_leg_missing() {
    let (a, b) = (temp("leg-a.img"), temp("leg-b.img"));
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = ninefold()
        .args(["mkfs", a_s, b_s, "--size", "64M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (path, place) in [(&a, 0u32), (&b, 1)] {
        let bytes = std::fs::read(path).unwrap();
        let label = ninefs::format::label::DeviceLabel::decode(&bytes[..4096])
            .unwrap()
            .expect("a label");
        assert_eq!((label.place, label.legs), (place, 2));
    }
    let fsck = |args: &[&str]| {
        let out = ninefold().arg("fsck").args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = fsck(&[b_s, a_s]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("leg 1: Active"), "{text}");

    // The fs root node rots on leg A: scrub (legs opened for writing) mends it from B.
    let bytes = std::fs::read(&a).unwrap();
    let sb = ninefs::format::Superblock::decode(&bytes[8192..12288]).unwrap();
    let fs_root = sb.root(ninefs::format::TreeId::Fs).ptr.addr as usize;
    let mut bad = bytes;
    bad[fs_root * 4096 + 100] ^= 0x40;
    std::fs::write(&a, &bad).unwrap();
    // fsck checks each leg alone: A has an error, B is clean.
    let (code, text) = fsck(&[a_s, b_s]);
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("blocks free: ERRORS\nleg 1: "), "{text}");
    assert!(text.ends_with("blocks free: clean\n"), "{text}");
    let out = ninefold().args(["scrub", a_s, b_s]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("errors 0"), "{text}");
    assert!(
        text.contains("leg 0: Active, 0 read errors, 0 write errors, 1 repairs"),
        "{text}"
    );
    assert_ne!(std::fs::read(&a).unwrap(), bad, "mended on disk");

    // Leg B missing: every tool still works on A alone, and says so.
    let (code, text) = fsck(&[a_s]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("leg 1 of 2 missing"), "{text}");
    let out = ninefold().args(["dump", a_s]).output().unwrap();
    assert!(out.status.success());
    // Offline replacement: a fresh image in B's place, rebuilt from A to the end; then
    // it alone is the whole filesystem.
    let n = temp("leg-new.img");
    let n_s = n.to_str().unwrap();
    std::fs::File::create(&n)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = ninefold()
        .args(["ctl", a_s, "replace", "1", a_s])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a leg of the volume cannot be the new one"
    );
    let out = ninefold()
        .args(["ctl", a_s, "replace", "1", n_s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("leg 1 rebuilt"), "{text}");
    let (code, text) = fsck(&[n_s]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = fsck(&[a_s, n_s]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("leg 1: Active"), "{text}");
    std::fs::remove_file(n).unwrap();
    // Two legs of different volumes are refused.
    let c = temp("leg-c.img");
    let out = ninefold()
        .args(["mkfs", c.to_str().unwrap(), b_s, "--size", "64M"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (code, text) = fsck(&[a_s, c.to_str().unwrap()]);
    assert_eq!(code, Some(8), "{text}");
    for p in [a, b, c] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn send_and_receive_full_and_incremental_between_images() {
    let (src, dst) = (temp("send-src.img"), temp("send-dst.img"));
    let (full, incr) = (temp("send-full.stream"), temp("send-incr.stream"));
    let (src_p, dst_p, full_p) = (
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        full.to_str().unwrap(),
    );
    let run = |args: &[&str], stdin: Option<&[u8]>| {
        use std::io::Write;
        let mut child = ninefold()
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or_default()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(run(&["mkfs", src_p, "--size", "64M"], None).0);
    assert!(run(&["snapshot", "create", src_p, "a"], None).0);
    assert!(run(&["snapshot", "create", src_p, "b"], None).0);
    let (ok, _, err) = run(&["send", src_p, "a", "-o", full_p], None);
    assert!(ok && err.contains("sent a (full)"), "{err}");
    let (ok, stream, err) = run(&["send", src_p, "b", "--from", "a"], None);
    assert!(ok && err.contains("sent b (from a)"), "{err}");
    std::fs::write(&incr, &stream).unwrap();
    let (ok, _, err) = run(&["send", src_p, "b", "--from", "zz"], None);
    assert!(!ok && err.contains("ENOENT"), "{err}");

    // Into a new image: it needs a size; the incremental needs its base first.
    let (ok, _, err) = run(&["receive", dst_p, "-i", full_p], None);
    assert!(!ok && err.contains("give --size"), "{err}");
    assert!(run(&["mkfs", dst_p, "--size", "64M"], None).0);
    let (ok, _, err) = run(&["receive", dst_p], Some(&stream));
    assert!(!ok && err.contains("base snapshot \"a\""), "{err}");
    // A damaged stream is refused before anything is applied (a full one: an
    // incremental's base is looked for first).
    let full_stream = std::fs::read(full_p).unwrap();
    let cut = &full_stream[..full_stream.len() - 3];
    let (ok, _, err) = run(&["receive", dst_p], Some(cut));
    assert!(
        !ok && err.contains("truncated") && err.contains("nothing applied"),
        "{err}"
    );
    let (ok, out, err) = run(&["receive", dst_p, "-i", full_p], None);
    assert!(ok, "{err}");
    assert!(String::from_utf8_lossy(&out).contains("received snapshot a"));
    let (ok, out, err) = run(&["receive", dst_p], Some(&stream));
    assert!(
        ok && String::from_utf8_lossy(&out).contains("received snapshot b"),
        "{err}"
    );
    let (ok, _, err) = run(&["receive", dst_p], Some(&stream));
    assert!(!ok && err.contains("exists already"), "{err}");
    let (_, out, _) = run(&["snapshot", "list", dst_p], None);
    let names: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    fsck_clean(dst_p);
    let (ok, out, err) = run(&["receive", dst_p, "--rollback"], None);
    assert!(ok, "{err}");
    assert!(String::from_utf8_lossy(&out).contains("rolled back to snapshot b"));
    for p in [&src, &dst, &full, &incr] {
        let _ = std::fs::remove_file(p);
    }
}

//! Crash states from the real appliance's own block traces, and the power-cut test.
//!
//! The appliance boots with its disk under QEMU's `blklogwrites` driver, which appends
//! every write, FLUSH and discard the device completes to a dm-log-writes log. Host 9P
//! clients run real workloads against it and note, in an acknowledgement log
//! (`logwrites::acks`), every version of every path they write and every sync that was
//! acknowledged, timed by the log file's length (QEMU logs a request before the guest
//! hears it completed). `ninefold crash-trace` then enumerates the crash states of the
//! trace, mounts, fscks and checks each against the acknowledgements.
//!
//! Workloads (`NINEFOLD_TRACE_WORKLOADS`, comma-separated; default `writers`):
//! - `writers`: the kill test's writers: appends and overwrites of random data, each
//!   followed by fsync (every fourth fdatasync), a new file every 128 KiB;
//! - `smallfiles`: small files created in a new directory, each written and fsynced;
//! - `replace`: the atomic-replace idiom: write a temporary file, fsync, rename it over
//!   the target, fsync the directory;
//! - `truncate`: files grown by writes and shrunk or extended by truncation, each change
//!   fsynced;
//! - `guest-tar`, `guest-writers`, `guest-replace`: from a real Linux 9P client (v9fs):
//!   the Linux test guest (tests/guest, `make guest`) mounts the appliance and runs a
//!   plan the host made (tar extractions, `dd`, `mv`, `sync FILE`); see [`GuestPlan`].
//!
//! Knobs (environment): `NINEFOLD_TRACE_DISKS` (`nvme,virtio`; default `nvme`),
//! `NINEFOLD_TRACE_OPS` (synced operations per workload, default 60),
//! `NINEFOLD_TRACE_OUT` (keep the recordings in this directory, one subdirectory per
//! disk and workload, and leave checking to the caller: `make crash-trace`),
//! `NINEFOLD_TRACE_STATES` (most states checked per recording here, default 3000),
//! `NINEFOLD_TRACE_PORT` (9P host port, default 16400), `NINEFOLD_TRACE_SEEDS` (one
//! recording per seed, disk and workload; default `1`), `NINEFOLD_TRACE_SEED` (the power
//! cut's, default 1).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use logwrites::acks::{AckLog, AckWriter, Content};
use logwrites::Trace;
use ninefold_tests::ninep::{connect, connect_lossy, Tcp};
use ninefold_tests::{guest_dir, tool, FsImage, Qemu, Running};
use ninep::testing::{Client, Exchange};
use ninep::wire::{open_flags, setattr};
use serde_json::json;
use vfs::Errno;

const UP: Duration = Duration::from_secs(60);
/// Largest write.
const MAX_WRITE: u64 = 16 << 10;
/// The writers start a new file past this size.
const FILE_LIMIT: usize = 128 << 10;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn list(name: &str, default: &str) -> Vec<String> {
    env(name, default.to_string())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The client side of a recording: the acknowledgement log, timed by the trace's length.
struct Acks {
    log: PathBuf,
    writer: Mutex<AckWriter<Vec<u8>>>,
}

impl Acks {
    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Notes the version a request about to be sent makes; returns its number.
    fn version(&self, path: &str, content: Option<&[u8]>) -> u64 {
        let sent = self.log_len();
        self.writer
            .lock()
            .unwrap()
            .version(path, content, sent)
            .unwrap()
    }

    /// Notes that a sync of `version` of `path` was acknowledged just now.
    fn ack(&self, path: &str, version: u64, op: &str) {
        let acked = self.log_len();
        self.writer
            .lock()
            .unwrap()
            .ack(path, version, op, acked)
            .unwrap();
    }
}

/// A 9P client attached at fid 0.
fn client(port: u16) -> Client<Tcp> {
    let mut c = connect(port, UP);
    c.attach(0, 0, "").expect("attach");
    c
}

/// Random bytes, `min..max` of them.
fn random_bytes(rng: &mut oorandom::Rand64, min: u64, max: u64) -> Vec<u8> {
    let len = rng.rand_range(min..max);
    (0..len).map(|_| rng.rand_u64() as u8).collect()
}

/// Writes `data` at `offset` of `content` (the client's copy of a file).
fn apply_write(content: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if content.len() < offset + data.len() {
        content.resize(offset + data.len(), 0);
    }
    content[offset..offset + data.len()].copy_from_slice(data);
}

/// A kill-test writer's next write to `content` (the client's copy of a file), applied:
/// random data, appended or (four times in ten) overwriting at a random offset.
fn next_write(rng: &mut oorandom::Rand64, content: &mut Vec<u8>) -> (usize, Vec<u8>) {
    let data = random_bytes(rng, 1, MAX_WRITE);
    let offset = if content.is_empty() || rng.rand_range(0..10) < 6 {
        content.len()
    } else {
        rng.rand_range(0..content.len() as u64) as usize
    };
    apply_write(content, offset, &data);
    (offset, data)
}

/// One kill-test writer on `c`: `ops` writes, each followed by an fsync or fdatasync.
/// Returns at the first error (the power-cut test's writers end that way).
fn writer<X: Exchange>(
    mut c: Client<X>,
    acks: &Acks,
    id: usize,
    ops: usize,
    seed: u64,
) -> Result<(), String> {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let mut file = 0;
    let mut name = String::new();
    let mut content = Vec::new();
    let err = |what: &str, e: Errno| format!("writer {id}: {what}: {e:?}");
    c.attach(0, 0, "").map_err(|e| err("attach", e))?;
    for op in 0..ops {
        if op == 0 || content.len() >= FILE_LIMIT {
            let _ = c.clunk(1);
            name = format!("w{id}-{file:03}");
            file += 1;
            content.clear();
            c.walk(0, 1, "").map_err(|e| err("walk", e))?;
            acks.version(&name, Some(b""));
            c.lcreate(1, &name, open_flags::RDWR, 0o644)
                .map_err(|e| err("create", e))?;
        }
        let (offset, data) = next_write(&mut rng, &mut content);
        let version = acks.version(&name, Some(&content));
        match c.write(1, offset as u64, &data) {
            Ok(n) if n as usize == data.len() => {}
            Ok(n) => return Err(format!("writer {id}: short write {n} of {}", data.len())),
            Err(e) => return Err(err("write", e)),
        }
        let datasync = rng.rand_range(0..4) == 0;
        c.fsync(1, datasync).map_err(|e| err("fsync", e))?;
        acks.ack(&name, version, if datasync { "fdatasync" } else { "fsync" });
    }
    Ok(())
}

/// Small files in a new directory, each created, written and fsynced.
fn smallfiles(port: u16, acks: &Acks, ops: usize, seed: u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let mut c = client(port);
    c.mkdir(0, "small", 0o755).unwrap();
    for n in 0..ops {
        let name = format!("s{n:04}");
        let path = format!("small/{name}");
        let data = random_bytes(&mut rng, 0, 6000);
        c.walk(0, 1, "small").unwrap();
        acks.version(&path, Some(b""));
        c.lcreate(1, &name, open_flags::RDWR, 0o644).unwrap();
        let version = acks.version(&path, Some(&data));
        assert_eq!(c.write(1, 0, &data), Ok(data.len() as u32));
        // fsync persists the file and, as its only path, the new directory's binding.
        c.fsync(1, false).expect("fsync");
        acks.ack(&path, version, "fsync");
        c.clunk(1).unwrap();
    }
}

/// The atomic-replace idiom on three targets.
fn replace(port: u16, acks: &Acks, ops: usize, seed: u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let mut c = client(port);
    c.walk(0, 2, "").unwrap();
    c.lopen(2, open_flags::RDONLY | open_flags::DIRECTORY)
        .unwrap();
    for n in 0..ops {
        let target = format!("cfg{}", n % 3);
        let tmp = format!("{target}.tmp");
        let data = random_bytes(&mut rng, 1, 20_000);
        c.walk(0, 1, "").unwrap();
        acks.version(&tmp, Some(b""));
        c.lcreate(1, &tmp, open_flags::RDWR, 0o644).unwrap();
        let written = acks.version(&tmp, Some(&data));
        assert_eq!(c.write(1, 0, &data), Ok(data.len() as u32));
        c.fsync(1, false).expect("fsync");
        acks.ack(&tmp, written, "fsync");
        c.clunk(1).unwrap();
        let gone = acks.version(&tmp, None);
        let replaced = acks.version(&target, Some(&data));
        c.renameat(0, &tmp, 0, &target).unwrap();
        c.fsync(2, false).expect("directory fsync");
        acks.ack(&tmp, gone, "fsync(dir)");
        acks.ack(&target, replaced, "fsync(dir)");
    }
}

/// Files grown by writes and shrunk or extended by truncation.
fn truncate(port: u16, acks: &Acks, ops: usize, seed: u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let mut c = client(port);
    let mut files: Vec<Vec<u8>> = Vec::new();
    for n in 0..3u32 {
        let name = format!("t{n}");
        c.walk(0, 10 + n, "").unwrap();
        acks.version(&name, Some(b""));
        c.lcreate(10 + n, &name, open_flags::RDWR, 0o644).unwrap();
        files.push(Vec::new());
    }
    for op in 0..ops {
        let n = op % 3;
        let (name, fid) = (format!("t{n}"), 10 + n as u32);
        let content = &mut files[n];
        let version = if rng.rand_range(0..3) == 0 && !content.is_empty() {
            let size = rng.rand_range(0..content.len() as u64 * 2) as usize;
            content.resize(size, 0);
            let v = acks.version(&name, Some(content));
            c.setattr(fid, setattr::SIZE, 0, 0, 0, size as u64).unwrap();
            v
        } else {
            let data = random_bytes(&mut rng, 1, MAX_WRITE);
            let offset = rng.rand_range(0..content.len() as u64 + 1) as usize;
            apply_write(content, offset, &data);
            let v = acks.version(&name, Some(content));
            assert_eq!(c.write(fid, offset as u64, &data), Ok(data.len() as u32));
            v
        };
        c.fsync(fid, false).expect("fsync");
        acks.ack(&name, version, "fsync");
    }
}

/// A Linux-guest workload as the host plans it: the shell script the guest runs from the
/// mounted export (`/job/data/plan.sh`, run by tests/guest/job/trace.sh), the data files
/// it reads (beside it), and what each `trace-ack N` line it prints acknowledges. The
/// workload is deterministic, so every version is noted while planning, before the guest
/// starts: the log's length then is never later than the request that makes it.
struct GuestPlan<'a> {
    acks: &'a Acks,
    /// Host directory handed to the guest as `/job/data`.
    data: PathBuf,
    script: String,
    /// Per `trace-ack` line: what it acknowledges, as (path, version, op).
    acked: Vec<Vec<(String, u64, &'static str)>>,
}

impl GuestPlan<'_> {
    /// Notes a version of `path` (see [`Acks::version`]).
    fn version(&self, path: &str, content: Option<&[u8]>) -> u64 {
        self.acks.version(path, content)
    }

    /// A new data file holding `bytes`; returns its path in the guest.
    fn data_file(&self, bytes: &[u8]) -> String {
        let name = format!("d{:05}", std::fs::read_dir(&self.data).unwrap().count());
        std::fs::write(self.data.join(&name), bytes).unwrap();
        format!("/job/data/{name}")
    }

    /// Appends a command to the script.
    fn run(&mut self, command: &str) {
        self.script.push_str(command);
        self.script.push('\n');
    }

    /// Appends the next `trace-ack` line, acknowledging `what` once the guest prints it.
    fn ack(&mut self, what: Vec<(String, u64, &'static str)>) {
        self.run(&format!("echo trace-ack {}", self.acked.len()));
        self.acked.push(what);
    }
}

/// `guest-writers`: a kill-test writer ([`next_write`]) in the guest: each write a `dd`
/// at its offset, then `sync FILE` (fsync) or, one time in four, `sync -d FILE`
/// (fdatasync); a new file every 128 KiB.
fn guest_writers(p: &mut GuestPlan, ops: usize, seed: u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let (mut file, mut name, mut content) = (0, String::new(), Vec::new());
    for op in 0..ops {
        if op == 0 || content.len() >= FILE_LIMIT {
            name = format!("w-{file:03}");
            file += 1;
            content.clear();
            // dd creates it, then writes.
            p.version(&name, Some(b""));
        }
        let (offset, data) = next_write(&mut rng, &mut content);
        let version = p.version(&name, Some(&content));
        let src = p.data_file(&data);
        p.run(&format!(
            "dd if={src} of={name} bs=64k seek={offset} oflag=seek_bytes conv=notrunc 2>/dev/null"
        ));
        let datasync = rng.rand_range(0..4) == 0;
        p.run(&format!("sync {}{name}", if datasync { "-d " } else { "" }));
        p.ack(vec![(
            name.clone(),
            version,
            if datasync { "fdatasync" } else { "fsync" },
        )]);
    }
}

/// `guest-replace`: the atomic-replace idiom with the shell's tools: `dd` a temporary
/// file, `sync` it, `mv` it over one of three targets, `sync .` (the directory's fsync).
fn guest_replace(p: &mut GuestPlan, ops: usize, seed: u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    for n in 0..ops {
        let target = format!("cfg{}", n % 3);
        let tmp = format!("{target}.tmp");
        let data = random_bytes(&mut rng, 1, 20_000);
        let src = p.data_file(&data);
        p.version(&tmp, Some(b""));
        let written = p.version(&tmp, Some(&data));
        // One read and one write: the data is smaller than bs.
        p.run(&format!("dd if={src} of={tmp} bs=64k 2>/dev/null"));
        p.run(&format!("sync {tmp}"));
        p.ack(vec![(tmp.clone(), written, "fsync")]);
        let gone = p.version(&tmp, None);
        let replaced = p.version(&target, Some(&data));
        p.run(&format!("mv {tmp} {target}"));
        p.run("sync .");
        p.ack(vec![
            (tmp, gone, "fsync(dir)"),
            (target, replaced, "fsync(dir)"),
        ]);
    }
}

/// Files `guest-tar` extracts per round into the round's new directory.
const TAR_FILES: usize = 40;
/// Files of `common/`, all extracted in the first round; later rounds overwrite four.
const TAR_COMMON: usize = 12;

/// `guest-tar`: `rounds` archives the host made (GNU tar, ustar), each extracted by the
/// guest's `tar -xf` — a new directory per round (`rNN/dK/fMMM`, four subdirectories)
/// plus files of `common/` overwritten — then `sync`, which over v9fs reaches no server
/// (it has no `sync_fs`), and `sync` of every extracted file and directory (each an
/// fsync), after which the round is acknowledged. Sizes: mostly under 4 KiB, some up to
/// 60 KiB; tar writes a file in pieces (its copy buffer, 4 KiB or a multiple, or one
/// `sendfile`), so every 4 KiB prefix is a version, and an overwritten file (unlinked,
/// or truncated) passes through absent and empty.
fn guest_tar(p: &mut GuestPlan, rounds: usize, seed: u64, stage: &Path) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    for round in 0..rounds {
        let top = format!("r{round:02}");
        let mut files: Vec<String> = (0..TAR_FILES)
            .map(|k| format!("{top}/d{}/f{k:03}", k % 4))
            .collect();
        let common: Vec<usize> = match round {
            0 => (0..TAR_COMMON).collect(),
            _ => (0..4)
                .map(|_| rng.rand_range(0..TAR_COMMON as u64) as usize)
                .collect(),
        };
        files.extend(common.iter().map(|c| format!("common/f{c:02}")));
        files.sort();
        files.dedup();
        let dir = stage.join(&top);
        let mut acked = Vec::new();
        for path in files {
            let max = match rng.rand_range(0..10) {
                0..7 => 4096,
                7..9 => 32 << 10,
                _ => 60 << 10,
            };
            let data = random_bytes(&mut rng, 0, max);
            let file = dir.join(&path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &data).unwrap();
            if path.starts_with("common/") && round > 0 {
                p.version(&path, None);
            }
            let mut version = p.version(&path, Some(b""));
            for end in (4096..data.len()).step_by(4096).chain([data.len()]) {
                version = p.version(&path, Some(&data[..end]));
            }
            acked.push((path, version, "fsync"));
        }
        let archive = p.data_file(b"");
        let host_archive = p.data.join(Path::new(&archive).file_name().unwrap());
        let top_dirs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let status = Command::new("tar")
            .args([
                "--format=ustar",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
            ])
            .args(["--sort=name", "-cf"])
            .arg(&host_archive)
            .arg("-C")
            .arg(&dir)
            .args(top_dirs)
            .status()
            .expect("running tar");
        assert!(status.success(), "tar -c failed");
        p.run(&format!("tar -xf {archive}"));
        p.run("sync");
        p.run(&format!("tar -tf {archive} | xargs sync"));
        p.ack(acked);
    }
}

/// Plans and runs the Linux-guest `workload` against the appliance on `port`: the test
/// guest mounts it and runs the plan (tests/guest/job/trace.sh); each `trace-ack` line on
/// its console is acknowledged when the host sees it (late, which only weakens the
/// check). Leaves the guest's console in `dir/guest-console.log`.
fn run_guest_workload(workload: &str, port: u16, acks: &Acks, ops: usize, seed: u64, dir: &Path) {
    let data = dir.join("guest-data");
    let stage = dir.join("guest-stage");
    std::fs::create_dir_all(&data).unwrap();
    let mut p = GuestPlan {
        acks,
        data: data.clone(),
        script: String::new(),
        acked: Vec::new(),
    };
    match workload {
        "guest-writers" => guest_writers(&mut p, ops, seed),
        "guest-replace" => guest_replace(&mut p, ops, seed),
        "guest-tar" => guest_tar(&mut p, ops.div_ceil(TAR_FILES), seed, &stage),
        other => panic!("unknown workload {other}"),
    }
    std::fs::write(data.join("plan.sh"), &p.script).unwrap();
    let _ = std::fs::remove_dir_all(&stage);
    let console = dir.join("guest-console.log");
    let guest = guest_dir();
    let mut child = Command::new(guest.join("run-guest"))
        .args([
            "--name",
            "trace",
            "--timeout",
            "1500",
            "--net",
            "user",
            "--log",
        ])
        .arg(&console)
        .arg("--file")
        .arg(format!("{}:data", data.display()))
        .arg(guest.join("job/trace.sh"))
        .args(["10.0.2.2", &port.to_string()])
        .spawn()
        .expect("running tests/guest/run-guest");
    let mut noted = 0;
    let status = loop {
        let exited = child.try_wait().unwrap();
        let text =
            String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()).into_owned();
        // The steps run in order: the newest line seen acknowledges every step up to it.
        let newest = text
            .split("trace-ack ")
            .skip(1)
            .filter_map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .max();
        if let Some(n) = newest {
            for step in p.acked.get(noted..=n).expect("trace-ack past the plan") {
                for (path, version, op) in step {
                    acks.ack(path, *version, op);
                }
            }
            noted = noted.max(n + 1);
        }
        if let Some(status) = exited {
            break (status, text);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (status, text) = status;
    let _ = std::fs::remove_dir_all(&data);
    assert!(
        status.success() && text.contains("trace: plan done") && noted == p.acked.len(),
        "the guest's {workload} failed ({status}; {noted} of {} steps acknowledged); console {}:\n{}",
        p.acked.len(),
        console.display(),
        text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Runs `workload` against the appliance on `port`.
fn run_workload(workload: &str, port: u16, acks: &Arc<Acks>, ops: usize, seed: u64, dir: &Path) {
    match workload {
        "writers" => {
            let handles: Vec<_> = (0..4)
                .map(|w| {
                    let acks = acks.clone();
                    let s = seed + w as u64;
                    std::thread::spawn(move || {
                        writer(connect(port, UP), &acks, w, ops.div_ceil(4), s).unwrap()
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("writer");
            }
        }
        "smallfiles" => smallfiles(port, acks, ops, seed),
        "replace" => replace(port, acks, ops, seed),
        "truncate" => truncate(port, acks, ops, seed),
        guest if guest.starts_with("guest-") => {
            run_guest_workload(guest, port, acks, ops, seed, dir)
        }
        other => panic!("unknown workload {other}"),
    }
}

/// Boots the appliance on `image` with its disk logged to `log`.
fn boot_logged(image: &FsImage, log: &Path, disk: &str, port: u16) -> Running {
    let q = Qemu::serving()
        .memory("128M")
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(600));
    let mut vm = match disk {
        "virtio" => q.virtio_blk_logged(image, log),
        _ => q.nvme_logged("nf-trace", image, log),
    }
    .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    vm
}

/// Records `workload` on `disk` into `dir` (base.img, trace.log, acks.jsonl).
fn record(dir: &Path, disk: &str, workload: &str, port: u16, ops: usize, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let image = FsImage::formatted("64M");
    std::fs::copy(image.path(), dir.join("base.img")).unwrap();
    let log = dir.join("trace.log");
    let vm = boot_logged(&image, &log, disk, port);
    let acks = Arc::new(Acks {
        log: log.clone(),
        writer: Mutex::new(AckWriter::new(Vec::new())),
    });
    let t0 = Instant::now();
    run_workload(workload, port, &acks, ops, seed, dir);
    vm.stop().expect_no_line("!!!");
    let acks = Arc::into_inner(acks).expect("workload done");
    let bytes = acks.writer.into_inner().unwrap().into_inner().unwrap();
    std::fs::write(dir.join("acks.jsonl"), bytes).unwrap();
    let trace = Trace::open(&log).unwrap();
    eprintln!(
        "trace: recorded {workload} on {disk} in {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        trace.summary()
    );
}

/// Runs `ninefold crash-trace` on `dirs`; returns its output and the three counts of its
/// last line.
fn crash_trace(dirs: &[PathBuf], limit: usize) -> (String, [usize; 3]) {
    let out = Command::new(tool())
        .arg("crash-trace")
        .args(dirs)
        .args(["--limit", &limit.to_string()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text
        .lines()
        .rfind(|l| l.starts_with("trace crash states: "))
        .unwrap_or_else(|| panic!("no summary line:\n{text}"));
    let numbers: Vec<usize> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    (text.clone(), [numbers[0], numbers[1], numbers[2]])
}

/// Records the selected workloads on the selected disks and (unless the recordings are
/// kept for `make crash-trace`) checks their crash states.
#[test]
fn crash_states_of_recorded_traces_keep_every_acknowledged_sync() {
    let workloads = list("NINEFOLD_TRACE_WORKLOADS", "writers");
    let disks = list("NINEFOLD_TRACE_DISKS", "nvme");
    let ops = env("NINEFOLD_TRACE_OPS", 60);
    let port = env("NINEFOLD_TRACE_PORT", 16400);
    let seeds: Vec<u64> = list("NINEFOLD_TRACE_SEEDS", "1")
        .iter()
        .map(|s| s.parse().expect("NINEFOLD_TRACE_SEEDS: numbers"))
        .collect();
    let keep = std::env::var("NINEFOLD_TRACE_OUT").ok().map(PathBuf::from);
    let root = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ninefold-trace-{}", std::process::id()))
    });
    let mut dirs = Vec::new();
    for seed in &seeds {
        for disk in &disks {
            for workload in &workloads {
                let dir = root.join(format!("{disk}-{workload}-{seed}"));
                let _ = std::fs::remove_dir_all(&dir);
                record(&dir, disk, workload, port, ops, *seed);
                dirs.push(dir);
            }
        }
    }
    if keep.is_some() {
        return;
    }
    let (text, [states, violations, fsck_errors]) =
        crash_trace(&dirs, env("NINEFOLD_TRACE_STATES", 3000));
    eprintln!("{text}");
    assert!(states > 100, "too few crash states:\n{text}");
    assert_eq!((violations, fsck_errors), (0, 0), "{text}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Reads `path` over 9P (`None`: absent).
fn read_over_9p(c: &mut Client<Tcp>, path: &str) -> Option<Vec<u8>> {
    c.walk(0, 5, path).ok()?;
    c.lopen(5, open_flags::RDONLY).unwrap();
    let size = c.getattr(5).unwrap().size as usize;
    let mut data = Vec::with_capacity(size);
    while data.len() < size {
        let chunk = c.read(5, data.len() as u64, 1 << 20).unwrap();
        if chunk.is_empty() {
            break;
        }
        data.extend_from_slice(&chunk);
    }
    c.clunk(5).unwrap();
    Some(data)
}

/// The power cut: writers run, the power fails at a random moment (the log's length
/// then), QEMU is killed, and the disk the appliance restarts on is the base image with
/// the trace replayed only up to the last FLUSH completed before the cut (`ninefold
/// replay-trace --log-bytes`): what a device that loses its volatile cache keeps.
/// Acknowledgements before the cut must all be there. fsck must be clean
/// and every path must hold a version the acknowledgements allow.
fn power_cut(disk: &str, port: u16) {
    let seed = env("NINEFOLD_TRACE_SEED", 1);
    let dir = std::env::temp_dir().join(format!("ninefold-powercut-{}-{disk}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = FsImage::formatted("64M");
    let base = dir.join("base.img");
    std::fs::copy(image.path(), &base).unwrap();
    let log = dir.join("trace.log");
    let vm = boot_logged(&image, &log, disk, port);
    let acks = Arc::new(Acks {
        log: log.clone(),
        writer: Mutex::new(AckWriter::new(Vec::new())),
    });
    // Writers that run until the appliance dies under them.
    let handles: Vec<_> = (0..3)
        .map(|w| {
            let acks = acks.clone();
            std::thread::spawn(move || {
                // Ends with an error when the connection dies at the cut.
                let c = connect_lossy(port, UP);
                let _ = writer(c, &acks, w, usize::MAX, seed + w as u64);
            })
        })
        .collect();
    // The power fails at a random moment: the log's length then is the cut. QEMU runs
    // on a little (what it logs after the cut never reached the disk), then is killed.
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    std::thread::sleep(Duration::from_millis(rng.rand_range(3000..6000)));
    let cut = acks.log_len();
    std::thread::sleep(Duration::from_millis(300));
    vm.stop().expect_no_line("!!!");
    for h in handles {
        h.join().unwrap();
    }
    let acks = Arc::into_inner(acks).expect("writers done");
    let bytes = acks.writer.into_inner().unwrap().into_inner().unwrap();
    let acks = AckLog::read(&bytes[..]).unwrap();
    let trace = Trace::open(&log).unwrap();
    let before_cut = trace.entries_within(cut);
    let durable = trace.durable_prefix(before_cut);
    // The replayed disk replaces QEMU's file.
    let out = Command::new(tool())
        .arg("replay-trace")
        .args(["--base".as_ref(), base.as_os_str()])
        .args(["--trace".as_ref(), log.as_os_str()])
        .args(["--out".as_ref(), image.path().as_os_str()])
        .args(["--log-bytes", &cut.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    image.fsck();
    let mut vm = Qemu::serving()
        .memory("128M")
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(300))
        .nvme_image("nf-cut", &image)
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut c = client(port);
    let completed = |len: u64| trace.entries_within(len) <= durable;
    let mut problems = Vec::new();
    for (path, history) in &acks.paths {
        let seen = read_over_9p(&mut c, path).map(|d| Content::of(&d));
        let (allowed, _) = history.allowed(completed);
        if !allowed.iter().any(|v| v.content == seen) {
            problems.push(format!(
                "{path}: {seen:?}, allowed {:?}",
                allowed.iter().map(|v| v.version).collect::<Vec<_>>()
            ));
        }
    }
    drop(c);
    vm.stop().expect_no_line("!!!");
    let required = acks
        .paths
        .values()
        .flat_map(|h| &h.acks)
        .filter(|(acked, _, _)| completed(*acked))
        .count();
    eprintln!(
        "power cut on {disk}: {}; the power failed after entry {before_cut}, the disk keeps {durable} (up to the last FLUSH); {required} of {} acknowledged syncs came before the cut; {} paths checked",
        trace.summary(),
        acks.ack_count(),
        acks.paths.len()
    );
    assert!(
        acks.ack_count() > 0,
        "nothing was acknowledged before the cut"
    );
    assert!(
        problems.is_empty(),
        "after the power cut:\n{}",
        problems.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn power_cut_nvme_keeps_every_acknowledged_fsync() {
    power_cut("nvme", env("NINEFOLD_TRACE_PORT", 16400) + 1);
}

#[test]
fn power_cut_virtio_keeps_every_acknowledged_fsync() {
    power_cut("virtio", env("NINEFOLD_TRACE_PORT", 16400) + 2);
}

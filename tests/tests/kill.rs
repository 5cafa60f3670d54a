//! The kill test: while clients write and fsync, the appliance's QEMU is killed (SIGKILL)
//! at random moments; after each kill `ninefold fsck` must find the image clean, and
//! after each restart every acknowledged byte must be there.
//!
//! - Several writers, each on its own 9P connection (so fsyncs from different clients
//!   are in flight together), append to and overwrite their files with seeded random
//!   data, each write followed by `Tfsync` (sometimes `fdatasync`); every ~1 MiB a
//!   writer starts a new file, so new names must survive too. A writer has at most one
//!   write not yet acknowledged by an fsync at any time.
//! - What was acknowledged is known exactly (a reply arrived: see `ninep::Lossy`), so
//!   after a restart each file must equal its acknowledged content, or that content with
//!   the one unacknowledged write applied whole (a write is atomic; it may or may not
//!   have reached the disk). A file whose creation no fsync acknowledged may be missing,
//!   or be empty, or hold its first write whole. Nothing else may appear.
//! - One kill in five lands during boot and mount instead (recovery must survive being
//!   interrupted too).
//!
//! Knobs (environment): `NINEFOLD_KILLS` (default 3; `make crash-kill` runs 20),
//! `NINEFOLD_KILL_SEED` (default: from the clock; printed, and in every failure),
//! `NINEFOLD_KILL_DISK=nvme|virtio` (default nvme), `NINEFOLD_KILL_PORT` (9P host port,
//! default 15841), `NINEFOLD_KILL_WRITERS` (default 4), `NINEFOLD_KEEP_IMAGES=1` keeps a
//! failing image. Timing makes a run with the same seed similar, not identical.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ninefold_tests::ninep::{connect, connect_lossy, Lossy, Tcp, GONE};
use ninefold_tests::{any, FsImage, Qemu, Running};
use ninep::testing::Client;
use ninep::wire::open_flags;
use serde_json::json;

/// Rotate to a new file past this size.
const FILE_LIMIT: usize = 1 << 20;
/// Largest single write (one `Twrite`).
const MAX_WRITE: usize = 64 << 10;
const UP: Duration = Duration::from_secs(60);

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The write a file may or may not show: not yet acknowledged by an fsync.
#[derive(Clone, Debug)]
struct Pending {
    offset: usize,
    data: Vec<u8>,
}

/// What a file must hold after a crash.
#[derive(Clone, Debug, Default)]
struct FileModel {
    /// Content acknowledged by the last fsync.
    acked: Vec<u8>,
    /// Some fsync acknowledged the file's existence.
    durable: bool,
    /// The write since, if any.
    pending: Option<Pending>,
    /// Acknowledged fsyncs of this file (for the report).
    fsyncs: u64,
}

impl FileModel {
    /// The contents the file may legally have after a crash.
    fn candidates(&self) -> Vec<Vec<u8>> {
        let mut c = vec![self.acked.clone()];
        if let Some(p) = &self.pending {
            let mut applied = self.acked.clone();
            let end = p.offset + p.data.len();
            if applied.len() < end {
                applied.resize(end, 0);
            }
            applied[p.offset..end].copy_from_slice(&p.data);
            c.push(applied);
        }
        c
    }
}

/// Everything the writers were told, by file name.
type Model = BTreeMap<String, FileModel>;

/// A content digest for reports.
fn digest(data: &[u8]) -> u64 {
    crc::Crc::<u64>::new(&crc::CRC_64_ECMA_182).checksum(data)
}

/// One writer's run until its connection dies: returns its files' models.
fn writer(
    port: u16,
    id: usize,
    seed: u64,
    mut files: Vec<(String, FileModel)>,
    next_file: usize,
    started: Arc<AtomicUsize>,
) -> (Vec<(String, FileModel)>, usize, u64) {
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let mut next_file = next_file;
    let mut c: Client<Lossy> = connect_lossy(port, UP);
    let mut acked_fsyncs = 0;
    if c.attach(0, 0, "").is_err() {
        return (files, next_file, 0);
    }
    // Reopen the writer's newest file, or create its first.
    let mut open_new = files.is_empty() || files.last().unwrap().1.acked.len() >= FILE_LIMIT;
    if !open_new {
        let name = files.last().unwrap().0.clone();
        if c.walk(0, 1, &name).is_err() || c.lopen(1, open_flags::RDWR).is_err() {
            return (files, next_file, 0);
        }
    }
    loop {
        if open_new {
            let name = format!("w{id}-{next_file:04}");
            next_file += 1;
            files.push((name.clone(), FileModel::default()));
            let _ = c.clunk(1);
            if c.walk(0, 1, "").is_err() {
                break;
            }
            // The file may now exist or not: an empty pending write says so.
            files.last_mut().unwrap().1.pending = Some(Pending {
                offset: 0,
                data: Vec::new(),
            });
            if c.lcreate(1, &name, open_flags::RDWR, 0o644).is_err() {
                break;
            }
            open_new = false;
        }
        let m = &mut files.last_mut().unwrap().1;
        let size = m.pending.as_ref().map_or(m.acked.len(), |p| {
            m.acked.len().max(p.offset + p.data.len())
        });
        let len = 1 + rng.rand_range(0..MAX_WRITE as u64) as usize;
        // Mostly appends, some overwrites inside the file (and past its end).
        let offset = if size == 0 || rng.rand_range(0..10) < 6 {
            size
        } else {
            rng.rand_range(0..size as u64) as usize
        };
        let data: Vec<u8> = (0..len).map(|_| rng.rand_u64() as u8).collect();
        // From now on this write may land. Only an unacknowledged creation can be
        // pending here (an empty write): the file then holds nothing or this write.
        assert!(
            m.pending.as_ref().is_none_or(|p| p.data.is_empty()),
            "one unacknowledged write at a time"
        );
        m.pending = Some(Pending {
            offset,
            data: data.clone(),
        });
        match c.write(1, offset as u64, &data) {
            Ok(n) if n as usize == len => {}
            Ok(n) => panic!("short write: {n} of {len} (seed {seed})"),
            Err(_) => break,
        }
        let datasync = rng.rand_range(0..4) == 0;
        match c.fsync(1, datasync) {
            Ok(()) => {
                let applied = m.candidates().pop().unwrap();
                m.acked = applied;
                m.durable = true;
                m.pending = None;
                m.fsyncs += 1;
                if acked_fsyncs == 0 {
                    started.fetch_add(1, Ordering::Relaxed);
                }
                acked_fsyncs += 1;
            }
            Err(e) if e == GONE => break,
            Err(e) => panic!("fsync failed with {e:?} (seed {seed})"),
        }
        if m.acked.len() >= FILE_LIMIT {
            open_new = true;
        }
    }
    (files, next_file, acked_fsyncs)
}

/// Boots the appliance on `image`.
fn boot(image: &FsImage, disk: &str, port: u16, append: &str) -> Running {
    let q = Qemu::serving()
        .memory("128M")
        .virtio_net_forward(port, 564)
        .append(append)
        .timeout(Duration::from_secs(600));
    match disk {
        "virtio" => q.virtio_blk_image(image),
        _ => q.nvme_image("nf-kill", image),
    }
    .spawn()
}

/// Reads every file back and checks it against the model; returns the recovered state
/// as the model for the next round.
fn verify(c: &mut Client<Tcp>, model: &Model) -> Result<(Model, u64), String> {
    c.walk(0, 1, "").unwrap();
    c.lopen(1, open_flags::RDONLY).unwrap();
    let names: Vec<String> = c
        .readdir_all(1, 65536)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    c.clunk(1).unwrap();
    for n in &names {
        if !model.contains_key(n) {
            return Err(format!("a file no writer created: {n}"));
        }
    }
    let mut recovered = Model::new();
    let mut bytes = 0;
    for (name, m) in model {
        let present = names.contains(name);
        if !present {
            if m.durable {
                return Err(format!(
                    "{name} is gone, but {} fsync(s) acknowledged it ({} bytes, digest {:016x})",
                    m.fsyncs,
                    m.acked.len(),
                    digest(&m.acked)
                ));
            }
            continue;
        }
        c.walk(0, 2, name).unwrap();
        c.lopen(2, open_flags::RDONLY).unwrap();
        let size = c.getattr(2).unwrap().size as usize;
        let mut got = Vec::with_capacity(size);
        while got.len() < size {
            let chunk = c.read(2, got.len() as u64, 1 << 20).unwrap();
            if chunk.is_empty() {
                break;
            }
            got.extend_from_slice(&chunk);
        }
        c.clunk(2).unwrap();
        bytes += got.len() as u64;
        let candidates = m.candidates();
        if !candidates.contains(&got) {
            let acked = &m.acked;
            let first_diff = got
                .iter()
                .zip(acked.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(acked.len()));
            return Err(format!(
                "{name}: {} bytes (digest {:016x}) match no legal state: acknowledged {} bytes (digest {:016x}, first difference at byte {first_diff}){}",
                got.len(),
                digest(&got),
                acked.len(),
                digest(acked),
                m.pending.as_ref().map_or(String::new(), |p| format!(
                    ", or with the unacknowledged write of {} bytes at {} applied",
                    p.data.len(),
                    p.offset
                ))
            ));
        }
        recovered.insert(
            name.clone(),
            FileModel {
                acked: got,
                durable: true,
                pending: None,
                fsyncs: m.fsyncs,
            },
        );
    }
    Ok((recovered, bytes))
}

/// One kill test run.
#[derive(Clone, Debug)]
struct Params {
    kills: usize,
    disk: String,
    port: u16,
    writers: usize,
    seed: u64,
    /// Extra kernel options.
    append: String,
}

/// What a passing run did.
#[derive(Debug)]
struct Summary {
    fsyncs: u64,
    bytes: u64,
    files: usize,
}

/// Runs the kill test; `Err` says which acknowledged data a restart lost (or what else
/// broke the contract).
fn run(p: &Params) -> Result<Summary, String> {
    let seed = p.seed;
    let mut rng = oorandom::Rand64::new(u128::from(seed));
    let image = FsImage::formatted("512M");
    let mut model = Model::new();
    let mut next_file = vec![0usize; p.writers];
    let (mut fsyncs_total, mut bytes_total) = (0u64, 0u64);
    let t0 = Instant::now();
    for round in 1..=p.kills + 1 {
        let mut vm = boot(&image, &p.disk, p.port, &p.append);
        let during_boot = round <= p.kills && round > 1 && rng.rand_range(0..5) == 0;
        if during_boot {
            // Kill somewhere in boot, mount and recovery.
            std::thread::sleep(Duration::from_millis(rng.rand_range(0..1500)));
            let b = vm.stop();
            b.expect_no_line("!!!");
            image.fsck();
            eprintln!(
                "kill test: kill {round} during boot (after {:?})",
                b.elapsed
            );
            continue;
        }
        vm.wait_for_event("listening", json!({"service": "9p"}));
        if p.append.is_empty() {
            let mounted = vm.wait_for_event("mounted", any());
            if round > 1 && mounted["clean"] != false {
                vm.fail("the mount after a kill did not see an unclean filesystem");
            }
        }
        // What survived the previous kill.
        let mut c = connect(p.port, UP);
        c.attach(0, 0, "").unwrap();
        let verified = verify(&mut c, &model);
        drop(c);
        let (recovered, bytes) = match verified {
            Ok(v) => v,
            Err(why) => {
                let b = vm.stop();
                return Err(format!(
                    "kill test, seed {seed} (NINEFOLD_KILL_SEED={seed}), after kill {}: {why}\n--- appliance log after the restart\n{}",
                    round - 1,
                    b.serial
                ));
            }
        };
        model = recovered;
        bytes_total += bytes;
        if round > p.kills {
            vm.stop().expect_no_line("!!!");
            image.fsck();
            break;
        }

        // Writers, each continuing its own files.
        let started = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..p.writers)
            .map(|w| {
                let prefix = format!("w{w}-");
                let files: Vec<(String, FileModel)> = model
                    .iter()
                    .filter(|(n, _)| n.starts_with(&prefix))
                    .map(|(n, m)| (n.clone(), m.clone()))
                    .collect();
                let (next, s, port) = (next_file[w], rng.rand_u64(), p.port);
                let started = started.clone();
                std::thread::spawn(move || writer(port, w, s, files, next, started))
            })
            .collect();
        // Kill at a random moment once every writer is under way.
        let wait_start = Instant::now();
        while started.load(Ordering::Relaxed) < p.writers && wait_start.elapsed() < UP {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(rng.rand_range(200..3000)));
        let b = vm.stop();
        b.expect_no_line("!!!");
        let mut fsyncs = 0;
        for (w, h) in handles.into_iter().enumerate() {
            let (files, next, n) = h.join().expect("writer thread");
            next_file[w] = next;
            fsyncs += n;
            for (name, m) in files {
                model.insert(name, m);
            }
        }
        fsyncs_total += fsyncs;
        let report = image.fsck();
        eprintln!(
            "kill test: kill {round}: {fsyncs} fsyncs acknowledged, {} files; fsck: {}",
            model.len(),
            report.lines().last().unwrap_or("")
        );
    }
    eprintln!(
        "kill test: {} kills in {:?}: {fsyncs_total} acknowledged fsyncs, {bytes_total} bytes verified after restarts, {} files (seed {seed})",
        p.kills,
        t0.elapsed(),
        model.len()
    );
    Ok(Summary {
        fsyncs: fsyncs_total,
        bytes: bytes_total,
        files: model.len(),
    })
}

fn seed() -> u64 {
    env(
        "NINEFOLD_KILL_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            % 1_000_000_007,
    )
}

#[test]
fn acknowledged_fsyncs_survive_kills() {
    let p = Params {
        kills: env("NINEFOLD_KILLS", 3),
        disk: env("NINEFOLD_KILL_DISK", "nvme".to_string()),
        port: env("NINEFOLD_KILL_PORT", 15841),
        writers: env("NINEFOLD_KILL_WRITERS", 4),
        seed: seed(),
        append: String::new(),
    };
    eprintln!(
        "kill test: {} kills, {} writers, {} disk, seed {} (NINEFOLD_KILL_SEED={} repeats the workload)",
        p.kills, p.writers, p.disk, p.seed, p.seed
    );
    match run(&p) {
        Ok(s) => {
            assert!(s.fsyncs > 0, "no fsync was ever acknowledged");
            assert!(s.bytes > 0 && s.files > 0, "{s:?}");
        }
        Err(why) => panic!("{why}"),
    }
}

/// The test can fail: the in-memory filesystem forgets everything at a kill, so the
/// acknowledged fsyncs are missing after the restart and the run reports them.
#[test]
fn the_kill_test_catches_lost_fsyncs() {
    let p = Params {
        kills: 1,
        disk: "nvme".into(),
        port: env("NINEFOLD_KILL_PORT", 15841) + 1,
        writers: 2,
        seed: seed(),
        append: "fs=memory".into(),
    };
    let why = run(&p).expect_err("a filesystem that forgets passed the kill test");
    assert!(why.contains("fsync(s) acknowledged it"), "{why}");
    assert!(
        why.contains(&format!("NINEFOLD_KILL_SEED={}", p.seed)),
        "{why}"
    );
}

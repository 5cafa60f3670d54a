//! A harness for booting the appliance in QEMU and reading its serial console.
//!
//! ```no_run
//! use ninefold_tests::Qemu;
//! use kernel::exit::ExitCode;
//! use serde_json::json;
//!
//! let boot = Qemu::appliance().nvme("serial-1").edu().append("selftest").run();
//! boot.expect_exit(ExitCode::Success);
//! boot.expect_event("selftest", json!({"check": "msi", "result": "ok"}));
//! ```
//!
//! Tests read the appliance's events (`kernel/src/event.rs`, listed in docs/testing.md,
//! "Events"): `EVENT {...}` lines on its event channel — the second serial port (COM2),
//! which the harness gives a file of its own — one JSON object each, named by their
//! `event` field. They wait for an event ([`Running::wait_for_event`]) and check its
//! fields ([`Boot::expect_event`]), never the wording of the log, which is for people;
//! only the tests of the log itself (crash reports, the configuration line, the quiet
//! console) match lines of the console. An event is matched by a closure over its JSON
//! object or by a JSON object whose fields it must have ([`Matches`]).
//!
//! Every boot runs under a timeout (a hang fails the test) with the serial console (COM1)
//! on QEMU's stdout and the event channel (COM2) in a temporary file. Failed expectations
//! panic with the QEMU command line, how QEMU ended, the whole console and the events,
//! so a failure explains itself.
//!
//! Environment: `NINEFOLD_IMAGE` (default: `build/appliance.elf` in the workspace),
//! `NINEFOLD_QEMU` (default `qemu-system-x86_64`), `NINEFOLD_ACCEL` (default `tcg`),
//! `NINEFOLD_TOOL` (the host CLI, default `target/debug/ninefold`: `make tool`).
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kernel::exit::ExitCode;
use serde_json::Value;

pub mod blkdebug;
pub mod hostile;
pub mod ninep;
pub mod qmp;
pub mod stats;

/// How long a boot may take before it counts as hung. Boots take well under a second
/// under TCG; this leaves room for a loaded machine.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// The appliance image the tests boot.
pub fn image() -> PathBuf {
    match std::env::var_os("NINEFOLD_IMAGE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/appliance.elf"),
    }
}

/// The host CLI (`ninefold mkfs`, `fsck`, ...).
pub fn tool() -> PathBuf {
    match std::env::var_os("NINEFOLD_TOOL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ninefold"),
    }
}

/// The Linux test guest's directory, after checking the guest is built.
pub fn guest_dir() -> PathBuf {
    let guest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("guest");
    // Where tests/guest/build-guest puts the guest ($BUILD/guest/out, BUILD=build).
    let repo = guest.join("../..");
    let build = std::env::var_os("BUILD").map_or(repo.join("build"), |b| repo.join(b));
    assert!(
        build.join("guest/out/stamp").exists(),
        "the Linux test guest is not built in {}: run `make guest` (make test does)",
        build.display()
    );
    guest
}

/// A fresh path for a temporary disk file.
fn temp_disk_path(what: &str) -> PathBuf {
    temp_path(what, "img")
}

/// A fresh path for a temporary file (`ninefold-WHAT-PID-N.EXT`).
fn temp_path(what: &str, ext: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "ninefold-{what}-{}-{}.{ext}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A sparse scratch disk file, deleted on drop.
#[derive(Debug)]
struct ScratchDisk(PathBuf);

impl ScratchDisk {
    fn new(size: u64) -> ScratchDisk {
        let path = temp_disk_path("test");
        let f = std::fs::File::create(&path).expect("creating a scratch disk");
        f.set_len(size).expect("sizing a scratch disk");
        ScratchDisk(path)
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A disk image file for the appliance's filesystem, deleted on drop: formatted by the
/// host tool (`ninefold mkfs`, as a user would) or left blank, and checked afterwards
/// with `ninefold fsck`.
#[derive(Debug)]
pub struct FsImage(PathBuf);

impl FsImage {
    /// A `size` image (e.g. `"256M"`) formatted with `ninefold mkfs`.
    pub fn formatted(size: &str) -> FsImage {
        let image = FsImage(temp_disk_path("fs"));
        let out = Command::new(tool())
            .arg("mkfs")
            .arg(&image.0)
            .args(["--size", size, "--label", "test"])
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run {}: {e} (make tool builds it)", tool().display())
            });
        assert!(
            out.status.success(),
            "ninefold mkfs failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        image
    }

    /// A sparse image of `bytes` holding nothing.
    pub fn blank(bytes: u64) -> FsImage {
        let image = FsImage(temp_disk_path("blank"));
        let f = std::fs::File::create(&image.0).expect("creating an image");
        f.set_len(bytes).expect("sizing an image");
        image
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Runs `ninefold fsck` on it; returns its exit status and output.
    pub fn fsck_status(&self) -> (Option<i32>, String) {
        let out = Command::new(tool())
            .arg("fsck")
            .arg(&self.0)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool().display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    /// The check every test makes of an image after the appliance (or QEMU's death) has
    /// left it: `ninefold fsck` must find it clean (exit status 0: no error; an image not
    /// unmounted cleanly, with a log to replay, is clean too). Returns its report for
    /// further checks (`fsck_unmounted_cleanly` makes the usual one); a test that
    /// counts failures instead of stopping at the first uses `fsck_status`.
    pub fn fsck(&self) -> String {
        let (status, text) = self.fsck_status();
        assert_eq!(
            status,
            Some(0),
            "ninefold fsck {} failed:\n{text}",
            self.0.display()
        );
        text
    }

    /// [`FsImage::fsck`], and the image was unmounted cleanly: the report warns of no
    /// unclean unmount and of no log for the next mount to replay. Returns the report.
    pub fn fsck_unmounted_cleanly(&self) -> String {
        let report = self.fsck();
        for unclean in ["not unmounted cleanly", "replay"] {
            assert!(
                !report.contains(unclean),
                "ninefold fsck {}: not unmounted cleanly:\n{report}",
                self.0.display()
            );
        }
        report
    }
}

impl Drop for FsImage {
    fn drop(&mut self) {
        if !std::thread::panicking() || std::env::var_os("NINEFOLD_KEEP_IMAGES").is_none() {
            let _ = std::fs::remove_file(&self.0);
        } else {
            eprintln!("kept image {}", self.0.display());
        }
    }
}

/// A QEMU command line for one boot of the appliance.
#[derive(Debug)]
pub struct Qemu {
    qemu: String,
    args: Vec<String>,
    memory: String,
    append: Vec<String>,
    timeout: Duration,
    disks: Vec<ScratchDisk>,
    next_id: usize,
    qmp: Option<PathBuf>,
    /// The event channel's file (COM2), deleted with the boot.
    events: ScratchDisk,
}

/// vCPUs of the appliance in the tests that serve clients ([`Qemu::serving`]):
/// `NINEFOLD_SMP` (`NINEFOLD_SMP=1 make test-qemu` serves from one), default 4 — QEMU's
/// multi-threaded TCG runs them on the host's cores.
pub fn serving_cpus() -> u32 {
    std::env::var("NINEFOLD_SMP")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| (1..=16).contains(&n))
        .unwrap_or(4)
}

impl Qemu {
    /// The appliance with no devices: 128 MiB, one CPU, the console (COM1) on stdout and
    /// the event channel (COM2) in a file of its own, the `isa-debug-exit` device for
    /// exit codes, no display, no reboot on triple fault.
    pub fn appliance() -> Qemu {
        let image = image();
        assert!(
            image.exists(),
            "{} does not exist: build it with `make image` (make test does)",
            image.display()
        );
        let accel = std::env::var("NINEFOLD_ACCEL").unwrap_or_else(|_| "tcg".into());
        let events = ScratchDisk(temp_path("events", "log"));
        let events_serial = format!("file:{}", events.0.display());
        let args = [
            "-accel",
            &accel,
            "-smp",
            "1",
            "-display",
            "none",
            "-vga",
            "none",
            "-monitor",
            "none",
            "-serial",
            "stdio",
            "-serial",
            &events_serial,
            "-no-reboot",
            "-nodefaults",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
            "-kernel",
            &image.to_string_lossy(),
        ];
        Qemu {
            qemu: std::env::var("NINEFOLD_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into()),
            args: args.iter().map(|s| s.to_string()).collect(),
            memory: "128M".into(),
            append: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            disks: Vec::new(),
            next_id: 0,
            qmp: None,
            events,
        }
    }

    /// The appliance as the tests that serve clients boot it: [`Qemu::appliance`] with
    /// [`serving_cpus`] vCPUs, every one of which serves connections.
    pub fn serving() -> Qemu {
        Qemu::appliance().cpus(serving_cpus())
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    fn scratch_drive(&mut self) -> String {
        let disk = ScratchDisk::new(64 << 20);
        let id = self.id("drive");
        let spec = format!("file={},if=none,id={id},format=raw", disk.0.display());
        self.disks.push(disk);
        self.args.extend(["-drive".into(), spec]);
        id
    }

    /// Virtual CPUs (QEMU `-smp`; one unless set).
    pub fn cpus(mut self, n: u32) -> Self {
        let at = self
            .args
            .iter()
            .position(|a| a == "-smp")
            .expect("-smp is set in appliance()");
        self.args[at + 1] = n.to_string();
        self
    }

    /// Guest memory (QEMU `-m`), e.g. `"1G"`.
    pub fn memory(mut self, size: &str) -> Self {
        self.memory = size.into();
        self
    }

    /// Adds kernel command-line options.
    pub fn append(mut self, options: &str) -> Self {
        self.append.push(options.into());
        self
    }

    /// Gives up (and fails expectations) after `t`.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Adds raw QEMU arguments.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// The QEMU machine type (`-machine`, e.g. `"q35"`; QEMU's default is `pc`).
    pub fn machine(self, machine: &str) -> Self {
        self.args(&["-machine", machine])
    }

    /// A QMP socket, for acting on the running machine ([`Running::power_button`]).
    pub fn qmp(mut self) -> Self {
        let path = temp_path("qmp", "sock");
        self.args.extend([
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", path.display()),
        ]);
        self.qmp = Some(path);
        self
    }

    /// An NVMe controller (1b36:0010) with a 64 MiB scratch disk and this serial number.
    pub fn nvme(self, serial: &str) -> Self {
        self.nvme_with(serial, "")
    }

    /// Like [`Qemu::nvme`], with extra device properties (e.g. `",mdts=10"`).
    pub fn nvme_with(mut self, serial: &str, properties: &str) -> Self {
        let drive = self.scratch_drive();
        self.args.extend([
            "-device".into(),
            format!("nvme,drive={drive},serial={serial}{properties}"),
        ]);
        self
    }

    /// An NVMe controller whose namespace is `image` (not deleted with the boot);
    /// discards punch holes in the image, as `make run` does.
    pub fn nvme_image(mut self, serial: &str, image: &FsImage) -> Self {
        let id = self.id("drive");
        self.args.extend([
            "-drive".into(),
            format!(
                "file={},if=none,id={id},format=raw,discard=unmap",
                image.path().display()
            ),
            "-device".into(),
            format!("nvme,drive={id},serial={serial}"),
        ]);
        self
    }

    /// A modern virtio-blk device on `image` (discards punch holes in it).
    pub fn virtio_blk_image(mut self, image: &FsImage) -> Self {
        let id = self.id("drive");
        self.args.extend([
            "-drive".into(),
            format!(
                "file={},if=none,id={id},format=raw,discard=unmap",
                image.path().display()
            ),
            "-device".into(),
            format!("virtio-blk-pci,drive={id},disable-legacy=on"),
        ]);
        self
    }

    /// `image` as a block node under QEMU's `blklogwrites` driver: every write, FLUSH and
    /// discard that completes is appended to the dm-log-writes log `log` (created empty),
    /// with 4 KiB log sectors (the filesystem's block). Returns the node name.
    fn logged_node(&mut self, image: &FsImage, log: &Path) -> String {
        std::fs::File::create(log).expect("creating the write log");
        let node = self.id("logged");
        self.args.extend([
            "-blockdev".into(),
            format!(
                "driver=file,node-name={node}-file,filename={},discard=unmap",
                image.path().display()
            ),
            "-blockdev".into(),
            format!(
                "driver=file,node-name={node}-log,filename={}",
                log.display()
            ),
            "-blockdev".into(),
            format!(
                "driver=blklogwrites,node-name={node},file={node}-file,log={node}-log,log-sector-size=4096,discard=unmap"
            ),
        ]);
        node
    }

    /// `image` under QEMU's `blkdebug` driver, failing requests by the rules in `config`
    /// ([`blkdebug::Blkdebug`]), under a raw format node that raises the events the rules
    /// match. Returns the raw node's name.
    fn blkdebug_node(&mut self, image: &FsImage, config: &blkdebug::Blkdebug) -> String {
        let node = self.id("faulty");
        let conf = temp_path(&node, "blkdebug.conf");
        config.write_to(&conf);
        // Deleted with the boot, as the scratch disks are.
        self.disks.push(ScratchDisk(conf.clone()));
        self.args.extend([
            "-blockdev".into(),
            format!(
                "driver=file,node-name={node}-file,filename={}",
                image.path().display()
            ),
            "-blockdev".into(),
            format!(
                "driver=blkdebug,node-name={node}-debug,image={node}-file,config={}",
                conf.display()
            ),
            "-blockdev".into(),
            format!("driver=raw,node-name={node},file={node}-debug"),
        ]);
        node
    }

    /// An NVMe controller on `image`, failing requests by `config` from outside (QEMU's
    /// `blkdebug`).
    pub fn nvme_blkdebug(
        mut self,
        serial: &str,
        image: &FsImage,
        config: &blkdebug::Blkdebug,
    ) -> Self {
        let node = self.blkdebug_node(image, config);
        self.args.extend([
            "-device".into(),
            format!("nvme,drive={node},serial={serial}"),
        ]);
        self
    }

    /// A modern virtio-blk device on `image`, failing requests by `config` like
    /// [`Qemu::nvme_blkdebug`].
    pub fn virtio_blk_blkdebug(mut self, image: &FsImage, config: &blkdebug::Blkdebug) -> Self {
        let node = self.blkdebug_node(image, config);
        self.args.extend([
            "-device".into(),
            format!("virtio-blk-pci,drive={node},disable-legacy=on"),
        ]);
        self
    }

    /// An NVMe controller on `image`, every completed write, FLUSH and discard logged to
    /// `log` in the dm-log-writes format (QEMU's `blklogwrites`; `ninefold crash-trace`
    /// reads it).
    pub fn nvme_logged(mut self, serial: &str, image: &FsImage, log: &Path) -> Self {
        let node = self.logged_node(image, log);
        self.args.extend([
            "-device".into(),
            format!("nvme,drive={node},serial={serial}"),
        ]);
        self
    }

    /// A modern virtio-blk device on `image`, logged like [`Qemu::nvme_logged`].
    pub fn virtio_blk_logged(mut self, image: &FsImage, log: &Path) -> Self {
        let node = self.logged_node(image, log);
        self.args.extend([
            "-device".into(),
            format!("virtio-blk-pci,drive={node},disable-legacy=on"),
        ]);
        self
    }

    /// A modern virtio-blk device (1af4:1042) with a 64 MiB scratch disk.
    pub fn virtio_blk(mut self) -> Self {
        let drive = self.scratch_drive();
        self.args.extend([
            "-device".into(),
            format!("virtio-blk-pci,drive={drive},disable-legacy=on"),
        ]);
        self
    }

    /// A modern virtio-net NIC (1af4:1041) on QEMU user networking.
    pub fn virtio_net(mut self) -> Self {
        let id = self.id("net");
        self.args.extend([
            "-netdev".into(),
            format!("user,id={id}"),
            "-device".into(),
            format!("virtio-net-pci,netdev={id},disable-legacy=on,romfile="),
        ]);
        self
    }

    /// A modern virtio-net NIC on QEMU user networking with `127.0.0.1:host_port` on the
    /// host forwarded to the appliance's TCP `guest_port`.
    pub fn virtio_net_forward(self, host_port: u16, guest_port: u16) -> Self {
        self.virtio_net_forwards(&[(host_port, guest_port)])
    }

    /// Like [`Qemu::virtio_net_forward`], with several `(host_port, guest_port)` pairs.
    pub fn virtio_net_forwards(mut self, ports: &[(u16, u16)]) -> Self {
        let id = self.id("net");
        let fwd: String = ports
            .iter()
            .map(|(h, g)| format!(",hostfwd=tcp:127.0.0.1:{h}-:{g}"))
            .collect();
        self.args.extend([
            "-netdev".into(),
            format!("user,id={id}{fwd}"),
            "-device".into(),
            format!("virtio-net-pci,netdev={id},disable-legacy=on,romfile="),
        ]);
        self
    }

    /// A modern virtio-net NIC on a point-to-point link over UDP on 127.0.0.1 (QEMU
    /// `-netdev dgram`): frames arrive on `port` and go to `peer_port`, where another QEMU
    /// (a Linux guest: `run-guest --net dgram:PEER_PORT:PORT`) listens. Jumbo frames pass.
    pub fn virtio_net_dgram(mut self, port: u16, peer_port: u16) -> Self {
        let id = self.id("net");
        self.args.extend([
            "-netdev".into(),
            format!(
                "dgram,id={id},local.type=inet,local.host=127.0.0.1,local.port={port},\
                 remote.type=inet,remote.host=127.0.0.1,remote.port={peer_port}"
            ),
            "-device".into(),
            format!("virtio-net-pci,netdev={id},disable-legacy=on,romfile="),
        ]);
        self
    }

    /// A modern virtio-net NIC on the existing tap device `ifname` (QEMU `-netdev tap`,
    /// no scripts, no vhost, with the virtio-net header: the device offers checksum and
    /// segmentation offloads, which QEMU's user networking does not). The test makes
    /// the tap, gives the host side an address and reaches the appliance at its own
    /// (`ip=`); see tests/tests/offload.rs.
    pub fn virtio_net_tap(mut self, ifname: &str) -> Self {
        let id = self.id("net");
        self.args.extend([
            "-netdev".into(),
            format!("tap,id={id},ifname={ifname},script=no,downscript=no,vhost=off,vnet_hdr=on"),
            "-device".into(),
            format!("virtio-net-pci,netdev={id},disable-legacy=on,romfile="),
        ]);
        self
    }

    /// QEMU's `edu` test device (1234:11e8), which raises an MSI on request.
    pub fn edu(self) -> Self {
        self.args(&["-device", "edu"])
    }

    fn full_args(&self) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(["-m".into(), self.memory.clone()]);
        args.extend(["-append".into(), self.append.join(" ")]);
        args
    }

    /// The command line, shell-quoted, for reports and for reproducing by hand.
    pub fn command_line(&self) -> String {
        let quote = |a: &str| {
            if a.is_empty() || a.contains([' ', '"', '\'']) {
                format!("'{a}'")
            } else {
                a.to_string()
            }
        };
        std::iter::once(self.qemu.as_str())
            .chain(self.full_args().iter().map(String::as_str))
            .map(quote)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Starts QEMU with the serial console on piped stdout, the event channel in its
    /// file and its messages on piped stderr.
    fn launch(&self) -> Child {
        // QEMU opens it for writing (truncating it); it exists before, for the reader.
        File::create(&self.events.0).expect("creating the event channel's file");
        Command::new(&self.qemu)
            .args(self.full_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.qemu))
    }

    /// Boots in the background; the test talks to the appliance while it runs, then
    /// [`Running::stop`]s it. The timeout still applies (QEMU is killed when it passes).
    pub fn spawn(self) -> Running {
        let command = self.command_line();
        let started = Instant::now();
        let mut child = self.launch();
        let serial = Arc::new(Mutex::new(Vec::new()));
        let mut stdout = child.stdout.take().expect("piped stdout");
        let sink = serial.clone();
        let out = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        let stderr = child.stderr.take().expect("piped stderr");
        let err = read_to_end_in_background(stderr);
        let reader = File::open(&self.events.0).expect("opening the event channel's file");
        Running {
            child,
            command,
            started,
            deadline: started + self.timeout,
            serial,
            events: Mutex::new(EventLog {
                file: reader,
                text: Vec::new(),
            }),
            threads: Some((out, err)),
            _disks: self.disks,
            _events: self.events,
            qmp: self.qmp,
        }
    }

    /// Boots and waits for QEMU to exit or the timeout to pass.
    pub fn run(self) -> Boot {
        let command = self.command_line();
        let started = Instant::now();
        let mut child = self.launch();
        let mut stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let out = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = stdout.read_to_end(&mut v);
            v
        });
        let err = read_to_end_in_background(stderr);
        let deadline = started + self.timeout;
        let status = loop {
            match child.try_wait().expect("waiting for QEMU") {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let serial = String::from_utf8_lossy(&out.join().unwrap_or_default()).replace('\r', "");
        let events = std::fs::read(&self.events.0).unwrap_or_default();
        Boot {
            command,
            status: status.and_then(|s| s.code()),
            timed_out: status.is_none(),
            elapsed: started.elapsed(),
            serial,
            events: String::from_utf8_lossy(&events).replace('\r', ""),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

/// Reads `stderr` to its end on a thread of its own (a full pipe would stall QEMU).
fn read_to_end_in_background(mut stderr: ChildStderr) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    })
}

/// An appliance running in the background (see [`Qemu::spawn`]); killed when dropped.
#[derive(Debug)]
pub struct Running {
    child: Child,
    command: String,
    started: Instant,
    deadline: Instant,
    serial: Arc<Mutex<Vec<u8>>>,
    events: Mutex<EventLog>,
    threads: Option<(JoinHandle<()>, JoinHandle<String>)>,
    _disks: Vec<ScratchDisk>,
    _events: ScratchDisk,
    qmp: Option<PathBuf>,
}

/// The event channel of a running appliance: its file, read as it grows.
#[derive(Debug)]
struct EventLog {
    file: File,
    text: Vec<u8>,
}

impl Running {
    /// QEMU's process id (to read its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The serial console so far.
    pub fn serial(&self) -> String {
        String::from_utf8_lossy(&self.serial.lock().unwrap()).replace('\r', "")
    }

    /// Bytes the console (COM1) has written so far, as QEMU passed them on.
    pub fn console_bytes(&self) -> usize {
        self.serial.lock().unwrap().len()
    }

    /// The event channel (COM2) so far.
    pub fn event_log(&self) -> String {
        let mut log = self.events.lock().unwrap();
        let EventLog { file, text } = &mut *log;
        let _ = file.read_to_end(text);
        String::from_utf8_lossy(text).replace('\r', "")
    }

    /// The events so far, in order. Fails (stopping QEMU, printing everything) on an
    /// event line that does not parse.
    pub fn events(&mut self) -> Vec<Value> {
        match parse_events(&self.event_log()) {
            Ok(events) => events,
            Err(why) => self.fail(&why),
        }
    }

    /// Waits (until the boot's timeout) for the first `kind` event that `matches`, since
    /// the boot; returns it. Fails, stopping QEMU and printing everything, if none comes
    /// before QEMU exits or the timeout.
    pub fn wait_for_event(&mut self, kind: &str, matches: impl Matches) -> Value {
        self.wait_for_event_after(0, kind, &matches)
    }

    /// Like [`Running::wait_for_event`], for an event emitted after `earlier` (an event
    /// waited for before).
    pub fn wait_for_event_following(
        &mut self,
        earlier: &Value,
        kind: &str,
        matches: impl Matches,
    ) -> Value {
        let events = self.events();
        let Some(at) = events.iter().position(|e| e == earlier) else {
            self.fail(&format!("no event {earlier} on the event channel"));
        };
        self.wait_for_event_after(at + 1, kind, &matches)
    }

    fn wait_for_event_after(&mut self, seen: usize, kind: &str, matches: &dyn Matches) -> Value {
        loop {
            let events = self.events();
            if let Some(e) = find_event(&events[seen.min(events.len())..], kind, matches) {
                return e.clone();
            }
            let exited = self.child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() >= self.deadline {
                let why = no_event(&events, kind, matches);
                self.fail(&why);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether QEMU is still running (it has not exited or been killed).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops QEMU (if still running) and returns the whole boot.
    pub fn stop(mut self) -> Boot {
        self.finish()
    }

    /// Presses the machine's ACPI power button (QMP `system_powerdown`; needs
    /// [`Qemu::qmp`]). Fails, printing everything, if QEMU cannot be told.
    pub fn power_button(&mut self) {
        let Some(path) = self.qmp.clone() else {
            self.fail("power_button needs Qemu::qmp()");
        };
        if let Err(e) = qmp::execute(&path, "system_powerdown") {
            self.fail(&format!("pressing the power button: {e}"));
        }
    }

    /// Waits up to `within` for QEMU to exit by itself and returns the whole boot;
    /// fails (killing it, printing everything) if it is still running then.
    pub fn wait_for_exit(mut self, within: Duration) -> Boot {
        let deadline = Instant::now() + within;
        while self.is_running() {
            if Instant::now() >= deadline {
                self.fail(&format!("QEMU did not exit by itself within {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.finish()
    }

    /// Fails with `why`, printing the command line and the serial log so far.
    pub fn fail(&mut self, why: &str) -> ! {
        let boot = self.finish();
        boot.fail(why)
    }

    fn finish(&mut self) -> Boot {
        let status = match self.child.try_wait().ok().flatten() {
            Some(s) => Some(s),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                None
            }
        };
        let events = self.event_log();
        let stderr = match self.threads.take() {
            Some((out, err)) => {
                let _ = out.join();
                err.join().unwrap_or_default()
            }
            None => String::new(),
        };
        Boot {
            command: self.command.clone(),
            status: status.and_then(|s| s.code()),
            timed_out: status.is_none() && Instant::now() >= self.deadline,
            elapsed: self.started.elapsed(),
            serial: self.serial(),
            events,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(path) = &self.qmp {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// How a boot ended, and what it printed.
#[derive(Debug)]
pub struct Boot {
    /// The QEMU command line.
    pub command: String,
    /// QEMU's exit status (`None` if killed).
    pub status: Option<i32>,
    /// The timeout killed QEMU.
    pub timed_out: bool,
    /// Wall time of the boot.
    pub elapsed: Duration,
    /// The serial console (COM1).
    pub serial: String,
    /// The event channel (COM2): the `EVENT {...}` lines.
    pub events: String,
    /// QEMU's own error output.
    pub stderr: String,
}

impl fmt::Display for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.command)?;
        if self.timed_out {
            writeln!(f, "ended:   TIMED OUT after {:?} (hang?)", self.elapsed)?;
        } else {
            writeln!(
                f,
                "ended:   exit status {:?} after {:?}",
                self.status, self.elapsed
            )?;
        }
        if !self.stderr.trim().is_empty() {
            writeln!(f, "qemu stderr:\n{}", self.stderr.trim_end())?;
        }
        writeln!(f, "----- serial log -----\n{}", self.serial.trim_end())?;
        writeln!(f, "----- end of serial log -----")?;
        writeln!(f, "----- events -----\n{}", self.events.trim_end())?;
        write!(f, "----- end of events -----")
    }
}

impl Boot {
    /// Fails (printing everything) with `why`.
    pub fn fail(&self, why: &str) -> ! {
        panic!("{why}\n{self}")
    }

    /// Expects the appliance to have exited through `isa-debug-exit` with `code`.
    pub fn expect_exit(&self, code: ExitCode) -> &Self {
        if self.status != Some(code.qemu_status()) {
            let got = ExitCode::ALL
                .iter()
                .find(|c| Some(c.qemu_status()) == self.status)
                .map_or_else(|| format!("{:?}", self.status), |c| format!("{c:?}"));
            self.fail(&format!(
                "expected exit {code:?} (status {}), got {got}",
                code.qemu_status()
            ));
        }
        self
    }

    /// The events, in order. Fails (printing everything) on an event line that does not
    /// parse.
    pub fn all_events(&self) -> Vec<Value> {
        parse_events(&self.events).unwrap_or_else(|why| self.fail(&why))
    }

    /// The `kind` events, in order.
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.all_events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }

    /// The first `kind` event that `matches`.
    pub fn event(&self, kind: &str, matches: impl Matches) -> Option<Value> {
        find_event(&self.all_events(), kind, &matches).cloned()
    }

    /// Expects a `kind` event that `matches`, and returns the first.
    pub fn expect_event(&self, kind: &str, matches: impl Matches) -> Value {
        let events = self.all_events();
        match find_event(&events, kind, &matches) {
            Some(e) => e.clone(),
            None => self.fail(&no_event(&events, kind, &matches)),
        }
    }

    /// Expects no `kind` event that `matches`.
    pub fn expect_no_event(&self, kind: &str, matches: impl Matches) -> &Self {
        if let Some(e) = find_event(&self.all_events(), kind, &matches) {
            self.fail(&format!("unexpected event {e}"));
        }
        self
    }

    /// Fails the test if the appliance panicked: the line its panic handler prints
    /// (`kernel/src/fault.rs`, `!!! KERNEL PANIC at FILE:LINE:COL: MESSAGE`).
    pub fn expect_no_panic(&self) -> &Self {
        if let Some(l) = self.line("!!! KERNEL PANIC") {
            self.fail(&format!("the appliance panicked: {l}"));
        }
        self
    }

    /// The first serial line containing `needle`. For tests of the log itself: others
    /// read events.
    pub fn line(&self, needle: &str) -> Option<&str> {
        self.serial.lines().find(|l| l.contains(needle))
    }

    /// Expects a serial line containing `needle`, and returns it.
    pub fn expect_line(&self, needle: &str) -> &str {
        self.line(needle)
            .unwrap_or_else(|| self.fail(&format!("no serial line contains {needle:?}")))
    }

    /// Expects no serial line containing `needle`.
    pub fn expect_no_line(&self, needle: &str) -> &Self {
        if let Some(l) = self.line(needle) {
            self.fail(&format!("unexpected line {l:?}"));
        }
        self
    }
}

/// What an event must be like to match: a closure over its JSON object, or a JSON
/// object (`json!({"service": "9p"})`) whose fields the event must have, with equal
/// values (objects compared the same way, recursively: the event may have more fields).
pub trait Matches {
    /// Whether `event` matches.
    fn matches(&self, event: &Value) -> bool;
    /// What is expected, for failure reports.
    fn describe(&self) -> String;
}

impl<F: Fn(&Value) -> bool> Matches for F {
    fn matches(&self, event: &Value) -> bool {
        self(event)
    }

    fn describe(&self) -> String {
        "matching the test's predicate".into()
    }
}

impl Matches for Value {
    fn matches(&self, event: &Value) -> bool {
        has_fields(event, self)
    }

    fn describe(&self) -> String {
        format!("with {self}")
    }
}

/// Matches any event of its kind.
pub fn any() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Whether `got` has every field of `want` (recursively for objects), equal.
fn has_fields(got: &Value, want: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| has_fields(gv, v))),
        _ => want == got,
    }
}

/// The events on the event channel `log` (its `EVENT {...}` lines), in order. A last
/// line without its newline is not there yet (being written, or cut short by a kill).
fn parse_events(log: &str) -> Result<Vec<Value>, String> {
    let complete = log.rfind('\n').map_or("", |end| &log[..end]);
    complete
        .lines()
        .filter_map(|l| l.strip_prefix(kernel::event::PREFIX))
        .map(|json| {
            serde_json::from_str::<Value>(json)
                .ok()
                .filter(|e| e["event"].is_string())
                .ok_or_else(|| format!("a malformed event line: {json:?}"))
        })
        .collect()
}

/// The first `kind` event of `events` that `matches`.
fn find_event<'a>(events: &'a [Value], kind: &str, matches: &dyn Matches) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["event"] == kind && matches.matches(e))
}

/// Why no event was found, with the events of that kind there were.
fn no_event(events: &[Value], kind: &str, matches: &dyn Matches) -> String {
    let same: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == kind)
        .map(Value::to_string)
        .collect();
    format!(
        "no {kind:?} event {}; the {kind:?} events were: [{}]",
        matches.describe(),
        same.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SERIAL: &str = "[    0.1] INFO  boot: complete in 12 ms\n\
        EVENT {\"event\":\"booted\",\"ms\":12}\n\
        [    0.2] INFO  EVENT {\"event\":\"not\"}: not at the start of a line\n\
        EVENT {\"event\":\"listening\",\"service\":\"9p\",\"port\":564,\"exports\":[{\"export\":\":/\"}]}\n\
        EVENT {\"event\":\"listening\",\"service\":\"stats\",\"port\":5641}\n";

    #[test]
    fn events_are_the_prefixed_lines_in_order() {
        let events = parse_events(SERIAL).unwrap();
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
        assert_eq!(kinds, ["booted", "listening", "listening"]);
        assert!(parse_events("EVENT {\"event\":\n").is_err(), "cut short");
        let writing = format!("{SERIAL}EVENT {{\"event\":\"cpus\"");
        assert_eq!(parse_events(&writing).unwrap(), events, "not written yet");
        assert!(
            parse_events("EVENT {\"no\":\"kind\"}\n").is_err(),
            "no kind"
        );
    }

    #[test]
    fn an_event_matches_the_fields_it_has_or_a_predicate() {
        let events = parse_events(SERIAL).unwrap();
        let stats = json!({"service": "stats"});
        assert_eq!(find_event(&events, "listening", &stats), Some(&events[2]));
        let nested = json!({"service": "9p", "exports": [{"export": ":/"}]});
        assert_eq!(find_event(&events, "listening", &nested), Some(&events[1]));
        assert!(find_event(&events, "listening", &json!({"port": 1})).is_none());
        assert!(find_event(&events, "listening", &json!({"missing": null})).is_none());
        assert!(find_event(&events, "booted", &any()).is_some());
        let late = |e: &Value| e["ms"].as_u64() > Some(10);
        assert!(find_event(&events, "booted", &late).is_some());
        let why = no_event(&events, "listening", &json!({"port": 1}));
        assert!(
            why.contains("with {\"port\":1}") && why.contains("5641"),
            "{why}"
        );
    }
}

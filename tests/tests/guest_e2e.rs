//! End to end with a real Linux 9P client: the appliance boots in QEMU (128 MiB) serving
//! its filesystem from an NVMe disk formatted by `ninefold mkfs`; the Linux test guest
//! (tests/guest, `make guest`) boots in a second QEMU, mounts it through the host forward
//! (10.0.2.2:PORT from the guest's user network) with
//! `trans=tcp,version=9p2000.L,msize=1048576` and runs the file-operation job
//! (`tests/guest/job/fsops.sh`, with xattrs). Afterwards the host checks over 9P what the
//! guest left behind, kills the appliance, requires `ninefold fsck` to find the image
//! clean, boots it again and finds the file the guest fsynced.
//!
//! A second test runs the same job over a guest-to-guest link with jumbo frames; a third
//! checks POSIX locks as Linux applications see them (`fcntl(F_GETLK)` across two mounts,
//! sqlite3); a fourth has two tenants of the appliance, each on its own address of a
//! guest-to-guest link, and one attacks while the other works (issue 26).
//!
//! Host ports: 15830; UDP 15832-15833 (the jumbo link); 15834 (locks); 15835 (setting up
//! the tenants' image), UDP 15836-15837 (their link).

use std::process::Command;
use std::time::Duration;

use ninefold_tests::ninep::{connect, Tcp};
use ninefold_tests::{guest_dir, FsImage, Qemu, Running};
use ninep::wire::open_flags;
use serde_json::json;

/// Boots the appliance on `image`, 9P forwarded from `port`.
fn boot(image: &FsImage, port: u16) -> Running {
    let mut vm = Qemu::serving()
        .memory("128M")
        .nvme_image("nf-e2e", image)
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(600))
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    vm
}

/// Reads `fsops/kept.txt` over 9P.
fn kept(c: &mut ninep::testing::Client<Tcp>) -> String {
    c.walk(0, 2, "fsops/kept.txt").unwrap();
    c.lopen(2, open_flags::RDONLY).unwrap();
    let text = String::from_utf8(c.read(2, 0, 4096).unwrap()).unwrap();
    c.clunk(2).unwrap();
    text
}

/// Runs `job` (a script of `tests/guest/job/`) with `args` in the Linux guest, networked
/// by `net_args` for `run-guest`, with `env` (`K=V`); fails the test (showing `vm`'s
/// console too) unless the job exits 0 after printing its summary line
/// `NAME: N passed, 0 failed` (NAME: the script's name) with at least `min_checks`
/// checks.
fn run_job(
    vm: &mut Running,
    name: &str,
    net_args: &[&str],
    env: &[String],
    job: &str,
    args: &[&str],
    min_checks: u32,
) {
    let guest = guest_dir();
    let console = std::env::temp_dir().join(format!("ninefold-{name}-{}.log", std::process::id()));
    let mut run = Command::new(guest.join("run-guest"));
    run.args(["--name", name, "--timeout", "400"])
        .args(net_args)
        .arg("--log")
        .arg(&console);
    for e in env {
        run.arg("--env").arg(e);
    }
    let run = run
        .arg(guest.join("job").join(job))
        .args(args)
        .output()
        .expect("running tests/guest/run-guest");
    // The guest's console: one "ok"/"not ok" line per check and the summary.
    let stdout = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let label = format!("{}: ", job.trim_end_matches(".sh"));
    let summary = stdout
        .lines()
        .find(|l| l.contains(&label) && l.contains(" passed, "))
        .map(str::to_string);
    if !run.status.success() || summary.as_deref().is_none_or(|s| !s.contains(" 0 failed")) {
        vm.fail(&format!(
            "the guest's {job} failed ({:?}; {summary:?})\n--- guest console\n{stdout}\n--- run-guest\n{}{stderr}",
            run.status,
            String::from_utf8_lossy(&run.stdout)
        ));
    }
    let passed: u32 = summary
        .as_deref()
        .and_then(|s| s.split(&label).nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= min_checks, "only {passed} checks ran:\n{stdout}");
}

/// Runs the file-operation job (`fsops.sh`, with xattrs) against the appliance `vm` at
/// `addr`:`port`. The guest writes `fsops/kept.txt` holding `ninefold TOKEN\n` and
/// fsyncs it; returns that content.
fn run_fsops(vm: &mut Running, net_args: &[&str], addr: &str, port: u16, name: &str) -> String {
    let token = format!("{:x}", std::process::id() as u64 * 2654435761);
    let env = [
        format!("NF_SMOKE_TOKEN={token}"),
        "NF_FSOPS_XATTR=1".to_string(),
    ];
    let port = port.to_string();
    run_job(
        vm,
        name,
        net_args,
        &env,
        "fsops.sh",
        &[addr, &port, "/"],
        40,
    );
    format!("ninefold {token}\n")
}

#[test]
fn linux_guest_mounts_the_appliance_and_runs_file_operations() {
    let port = 15830;
    let image = FsImage::formatted("512M");
    let mut vm = boot(&image, port);
    let want = run_fsops(&mut vm, &["--net", "user"], "10.0.2.2", port, "e2e");

    // What the server holds now: the kept file with the guest's data, nothing else.
    let mut c = connect(port, Duration::from_secs(10));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "fsops").unwrap();
    c.lopen(1, open_flags::RDONLY).unwrap();
    let mut names: Vec<String> = c
        .readdir_all(1, 4096)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "kept.txt"]);
    assert_eq!(kept(&mut c), want);
    drop(c);
    // Killed, as a crash would: the image is consistent and the fsynced file survives.
    let first = vm.stop();
    first.expect_no_line("!!!");
    image.fsck();
    let mut vm = boot(&image, port);
    vm.wait_for_event("mounted", json!({"clean": false}));
    let mut c = connect(port, Duration::from_secs(10));
    c.attach(0, 0, "").unwrap();
    assert_eq!(
        kept(&mut c),
        want,
        "the fsynced file after a kill and a reboot"
    );
    drop(c);
    vm.stop().expect_no_line("!!!");
    image.fsck();
}

/// The same job over a guest-to-guest link with jumbo frames (`mtu=9000` on both ends,
/// as `make bench` runs): 64 KiB writes and 1 MiB msize in 9000-byte frames.
#[test]
fn linux_guest_mounts_the_appliance_over_jumbo_frames() {
    let (appliance_port, guest_port) = (15832, 15833);
    let image = FsImage::formatted("512M");
    let mut vm = Qemu::serving()
        .memory("128M")
        .nvme_image("nf-jumbo", &image)
        .virtio_net_dgram(appliance_port, guest_port)
        .append("ip=10.0.4.1/24 mtu=9000")
        .timeout(Duration::from_secs(600))
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let net = format!("dgram:{guest_port}:{appliance_port}");
    let args = ["--net", &net, "--ip", "10.0.4.2/24", "--mtu", "9000"];
    run_fsops(&mut vm, &args, "10.0.4.1", 564, "jumbo");
    // The `stats` events carry the counters document, the NIC's counters in it (every
    // 10 s while the counters change): take the first after the guest's connection
    // closed.
    let closed = vm.wait_for_event("conn_closed", json!({"how": "closed_by_peer"}));
    let stats = vm.wait_for_event_following(&closed, "stats", ninefold_tests::any());
    let longest = stats["counters"]["nic"]["rx_longest"].as_u64().unwrap_or(0);
    assert!(
        (1515..=9014).contains(&longest),
        "no jumbo frame arrived: {stats}"
    );
    let serial = vm.stop();
    serial.expect_no_line("!!!");
    let config = serial.expect_event("config", ninefold_tests::any());
    assert!(
        config["effective"]
            .as_str()
            .is_some_and(|c| c.split(' ').any(|o| o == "mtu=9000")),
        "{config}"
    );
    image.fsck();
}

/// POSIX locks through a real Linux client (`tests/guest/job/locks.sh`): the guest mounts
/// the appliance (serving an in-memory filesystem) twice, and `fcntl(F_GETLK)` through
/// one mount reports nothing on a free file and the lock a process holds through the
/// other mount (Linux sends every `Tgetlock` with type `UNLCK`); sqlite3 in
/// `journal_mode=persist`, whose hot-journal check is an `F_GETLK`, commits.
#[test]
fn linux_guest_sees_posix_locks_across_mounts() {
    let port = 15834;
    let mut vm = Qemu::serving()
        .memory("128M")
        .append("fs=memory")
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let port = port.to_string();
    run_job(
        &mut vm,
        "locks",
        &["--net", "user"],
        &[],
        "locks.sh",
        &["10.0.2.2", &port],
        10,
    );
    vm.stop().expect_no_line("!!!");
}

/// Two tenants through a real Linux client (`tests/guest/job/tenants.sh`): the appliance
/// exports `a` (4 MiB and 100 inodes of quota) to 10.0.4.2 only and `b` to 10.0.4.130
/// only, on a guest-to-guest link where the guest holds both addresses. Tenant A fills its
/// space and inodes, takes every lock of its share (16 here), runs eight readers and
/// mounts past the connection limit (12 here); after each, B's create, write, fsync,
/// read-back, mkdir and setxattr, a lock and a fresh mount all succeed within 5 s each.
/// Then fsck finds the image clean.
#[test]
fn tenants_of_the_appliance_do_not_deny_each_other_service() {
    let (setup_port, appliance_port, guest_port) = (15835, 15836, 15837);
    let image = FsImage::formatted("256M");
    make_dirs(&image, setup_port, &["a", "b"]);
    let mut vm = Qemu::serving()
        .memory("256M")
        .nvme_image("nf-tenants", &image)
        .virtio_net_dgram(appliance_port, guest_port)
        .append(
            "ip=10.0.4.1/24 max_conns=12 max_locks_per_tenant=16 \
             export=a:/a:allow=10.0.4.2/32:quota=4M:inodes=100 \
             export=b:/b:allow=10.0.4.130/32",
        )
        .timeout(Duration::from_secs(900))
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let net = format!("dgram:{guest_port}:{appliance_port}");
    run_job(
        &mut vm,
        "tenants",
        &["--net", &net, "--ip", "10.0.4.2/24"],
        &[],
        "tenants.sh",
        &["10.0.4.1", "564", "10.0.4.2", "10.0.4.130"],
        35,
    );
    let serial = vm.stop();
    serial.expect_no_line("!!!");
    image.fsck();
}

/// Makes directories `names` at the root of `image` through `ninefold serve` on
/// 127.0.0.1:`port` (the appliance's exports need them to exist when it boots).
fn make_dirs(image: &FsImage, port: u16, names: &[&str]) {
    let mut serve = Command::new(ninefold_tests::tool())
        .arg("serve")
        .arg(image.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .spawn()
        .expect("starting ninefold serve");
    let mut c = connect(port, Duration::from_secs(30));
    c.attach(0, 0, "").unwrap();
    for name in names {
        c.mkdir(0, name, 0o777).unwrap();
    }
    drop(c);
    let pid = serve.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    assert!(
        serve.wait().unwrap().success(),
        "ninefold serve did not stop cleanly"
    );
}

//! End to end with a real Linux 9P client: the appliance boots in QEMU (128 MiB) serving
//! its filesystem from an NVMe disk formatted by `ninefold mkfs`; the Linux test guest
//! (tests/guest, `make guest`) boots in a second QEMU, mounts it through the host forward
//! (10.0.2.2:PORT from the guest's user network) with
//! `trans=tcp,version=9p2000.L,msize=1048576` and runs the file-operation job
//! (`tests/guest/job/fsops.sh`, with xattrs). Afterwards the host checks over 9P what the
//! guest left behind, kills the appliance, requires `ninefold fsck` to find the image
//! clean, boots it again and finds the file the guest fsynced.
//!
//! Host port: 15830.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use net::wire::open_flags;
use ninefold_tests::ninep::{connect, Tcp};
use ninefold_tests::{FsImage, Qemu, Running};

/// Boots the appliance on `image`, 9P forwarded from `port`.
fn boot(image: &FsImage, port: u16) -> Running {
    let mut vm = Qemu::appliance()
        .memory("128M")
        .nvme_image("nf-e2e", image)
        .virtio_net_forward(port, 564)
        .timeout(Duration::from_secs(600))
        .spawn();
    vm.wait_for_line("9p: listening on");
    vm
}

/// Reads `fsops/kept.txt` over 9P.
fn kept(c: &mut net::testing::Client<Tcp>) -> String {
    c.walk(0, 2, "fsops/kept.txt").unwrap();
    c.lopen(2, open_flags::RDONLY).unwrap();
    let text = String::from_utf8(c.read(2, 0, 4096).unwrap()).unwrap();
    c.clunk(2).unwrap();
    text
}

#[test]
fn linux_guest_mounts_the_appliance_and_runs_file_operations() {
    let guest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("guest");
    // Where tests/guest/build-guest puts the guest ($BUILD/guest/out, BUILD=build).
    let repo = guest.join("../..");
    let build = std::env::var_os("BUILD").map_or(repo.join("build"), |b| repo.join(b));
    assert!(
        build.join("guest/out/stamp").exists(),
        "the Linux test guest is not built in {}: run `make guest` (make test does)",
        build.display()
    );
    let port = 15830;
    let image = FsImage::formatted("512M");
    let mut vm = boot(&image, port);

    let token = format!("{:x}", std::process::id() as u64 * 2654435761);
    let console = std::env::temp_dir().join(format!("ninefold-e2e-{}.log", std::process::id()));
    let run = Command::new(guest.join("run-guest"))
        .args(["--name", "e2e", "--net", "user", "--timeout", "400"])
        .arg("--log")
        .arg(&console)
        .arg("--env")
        .arg(format!("NF_SMOKE_TOKEN={token}"))
        .args(["--env", "NF_FSOPS_XATTR=1"])
        .arg(guest.join("job/fsops.sh"))
        .args(["10.0.2.2", &port.to_string(), "/"])
        .output()
        .expect("running tests/guest/run-guest");
    // The guest's console: one "ok"/"not ok" line per check and the summary.
    let stdout = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let summary = stdout
        .lines()
        .find(|l| l.contains("fsops: ") && l.contains(" passed, "))
        .map(str::to_string);
    if !run.status.success() || summary.as_deref().is_none_or(|s| !s.contains(" 0 failed")) {
        vm.fail(&format!(
            "the guest's file operations failed ({:?}; {summary:?})\n--- guest console\n{stdout}\n--- run-guest\n{}{stderr}",
            run.status,
            String::from_utf8_lossy(&run.stdout)
        ));
    }
    let passed: u32 = summary
        .as_deref()
        .and_then(|s| s.split("fsops: ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 40, "only {passed} checks ran:\n{stdout}");

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
    let want = format!("ninefold {token}\n");
    assert_eq!(kept(&mut c), want);
    drop(c);
    // Killed, as a crash would: the image is consistent and the fsynced file survives.
    let first = vm.stop();
    first.expect_no_line("!!!");
    image.fsck();
    let mut vm = boot(&image, port);
    vm.wait_for_line("NOT cleanly unmounted");
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

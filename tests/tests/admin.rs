//! The administration export on the appliance: `admin_allow=` opens aname `ctl` to the
//! host (10.0.2.2 through QEMU user networking), which starts a scrub through the `ctl`
//! file and reads `status` until the background pass completes; a list that leaves the
//! host out refuses it; a snapshot taken through `ctl` keeps the old contents while the
//! client writes on. The appliance serves the in-memory filesystem in 128 MiB.
//!
//! Host ports: 9P on 16550-16551.

use std::time::{Duration, Instant};

use ninefold_tests::ninep::connect;
use ninefold_tests::{Qemu, Running};
use ninep::testing::Client;
use ninep::wire::open_flags;
use serde_json::json;
use vfs::Errno;

/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);

fn appliance(port: u16, options: &str) -> Running {
    let mut vm = Qemu::serving()
        .memory("128M")
        .virtio_net_forwards(&[(port, 564)])
        .append("fs=memory")
        .append(options)
        .timeout(Duration::from_secs(120))
        .spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );
    vm
}

/// Reads file `name` of the admin export attached at fid 0.
fn read<X: ninep::testing::Exchange>(c: &mut Client<X>, name: &str) -> String {
    c.walk(0, 9, name).unwrap();
    c.lopen(9, open_flags::RDONLY).unwrap();
    let data = c.read(9, 0, 65536).unwrap();
    c.clunk(9).unwrap();
    String::from_utf8(data).unwrap()
}

#[test]
fn ctl_starts_a_scrub_that_completes_in_the_background() {
    let port = 16550;
    let mut vm = appliance(port, "admin_allow=10.0.2.2 scrub_rate=64");
    let listening = vm.wait_for_event("listening", json!({"service": "9p"}));
    let ctl = json!({"export": "ctl:/:allow=10.0.2.2", "clients": "10.0.2.2"});
    assert!(
        listening["exports"]
            .as_array()
            .is_some_and(|e| e.contains(&ctl)),
        "no ctl export: {listening}"
    );
    let mut c = connect(port, UP);
    // Something to verify: a few files with data.
    c.attach(1, 0, "").unwrap();
    for i in 0..4 {
        c.walk(1, 2, "").unwrap();
        c.lcreate(2, &format!("f{i}"), open_flags::RDWR, 0o644)
            .unwrap();
        c.write(2, 0, &vec![i as u8 + 1; 200_000]).unwrap();
        c.clunk(2).unwrap();
    }
    c.attach(0, 0, "ctl").unwrap();
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, open_flags::WRONLY).unwrap();
    c.write(8, 0, b"sync\n").unwrap();
    assert_eq!(c.write(8, 0, b"scrub start\n"), Ok(12));
    assert_eq!(c.write(8, 0, b"frobnicate\n"), Err(Errno::EINVAL));
    c.clunk(8).unwrap();
    assert!(read(&mut c, "ctl").starts_with("error: unknown command"));
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        let status = read(&mut c, "status");
        if status.contains("scrub complete") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "scrub did not complete: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.contains(" errors 0 "), "{status}");
    let report = read(&mut c, "scrub");
    assert!(report.contains("errors 0\n"), "{report}");
    let data: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("data_blocks "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(data >= 4 * 200_000 / 4096, "{report}");
    let scrub = vm.wait_for_event("scrub", json!({"errors": 0}));
    assert!(scrub["data_blocks"].as_u64() >= Some(data), "{scrub}");

    // A snapshot through the control file; the client keeps writing; the snapshot keeps
    // the old contents, read-only, at /.snapshots/NAME.
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, open_flags::WRONLY).unwrap();
    c.write(8, 0, b"snapshot create nightly\n").unwrap();
    c.clunk(8).unwrap();
    assert!(read(&mut c, "ctl").starts_with("created snapshot"));
    c.walk(1, 2, "f0").unwrap();
    c.lopen(2, open_flags::RDWR).unwrap();
    c.write(2, 0, &[0xee; 4096]).unwrap();
    c.fsync(2, false).unwrap();
    assert_eq!(c.read(2, 0, 4).unwrap(), [0xee; 4], "the live file changed");
    c.clunk(2).unwrap();
    c.walk(1, 3, ".snapshots/nightly/f0").unwrap();
    c.lopen(3, open_flags::RDONLY).unwrap();
    assert_eq!(
        c.read(3, 0, 4).unwrap(),
        [1; 4],
        "the snapshot kept the old contents"
    );
    c.clunk(3).unwrap();
    c.walk(1, 3, ".snapshots/nightly").unwrap();
    assert_eq!(
        c.lcreate(3, "new", open_flags::RDWR, 0o644),
        Err(Errno::EROFS),
        "snapshots are read-only"
    );
    c.clunk(3).unwrap();
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, open_flags::WRONLY).unwrap();
    c.write(8, 0, b"snapshot list\n").unwrap();
    c.clunk(8).unwrap();
    let list = read(&mut c, "ctl");
    assert!(list.starts_with("1 snapshot(s)\n1 nightly "), "{list}");
}

#[test]
fn a_host_outside_admin_allow_is_refused() {
    let port = 16551;
    let _vm = appliance(port, "admin_allow=192.0.2.0/24");
    let mut c = connect(port, UP);
    assert_eq!(c.attach(0, 0, "ctl"), Err(Errno::EACCES));
    // The ordinary export is as before, and shows no trace of the admin tree.
    c.attach(1, 0, "").unwrap();
    assert_eq!(c.walk(1, 2, "ctl"), Err(Errno::ENOENT));
}

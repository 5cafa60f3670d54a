//! The ACPI power button (QMP `system_powerdown`, what `virsh shutdown` and `make run`'s
//! Ctrl-C send): the appliance closes its 9P connections, makes everything durable,
//! unmounts cleanly and powers itself off; on the host the image is then clean, with no
//! log to replay, and data written without any fsync is there.
//!
//! Host ports: 16150-16153 (9P on the even one, the counters service on the odd one).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use ninefold_tests::ninep::{connect, serve_on_host, Tcp, REPLY_TIMEOUT};
use ninefold_tests::stats::{counter, json};
use ninefold_tests::{any, tool, Boot, FsImage, Qemu, Running};
use ninep::testing::Client;
use ninep::wire::{open_flags, Tmsg};
use serde_json::json;

const MIB: usize = 1 << 20;
/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);
/// `shutdown_timeout=` for these boots.
const LIMIT_SECS: u64 = 8;

/// Boots the appliance with a QMP socket, 9P forwarded from `port` and the counters
/// service from `port + 1`.
fn boot(q: Qemu, port: u16) -> Running {
    let mut vm = q
        .memory("256M")
        .virtio_net_forwards(&[(port, 564), (port + 1, 5641)])
        .append(&format!("shutdown_timeout={LIMIT_SECS}"))
        .qmp()
        .timeout(Duration::from_secs(240))
        .spawn();
    vm.wait_for_event("power_button", json!({"armed": true}));
    vm.wait_for_event("ready", json!({"serving": true}));
    vm
}

/// A pattern that tells its offsets apart.
fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i * 7 % 251) as u8).collect()
}

/// Attaches `c` and creates `name` with `data` in the root, without any fsync; the
/// file stays open on fid 1.
fn write_without_fsync(c: &mut Client<Tcp>, name: &str, data: &[u8]) {
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, name, open_flags::RDWR, 0o644).unwrap();
    for (i, chunk) in data.chunks(256 * 1024).enumerate() {
        let written = c.write(1, (i * 256 * 1024) as u64, chunk).unwrap();
        assert_eq!(written as usize, chunk.len());
    }
}

/// Presses the power button and waits for the machine to turn itself off: ACPI
/// soft-off makes QEMU exit with status 0 (the debug-exit device would give 33).
fn power_off(mut vm: Running, also: impl FnOnce(&mut Running)) -> Boot {
    vm.power_button();
    vm.wait_for_event(
        "shutdown",
        json!({"step": "started", "serving": true, "limit_secs": LIMIT_SECS}),
    );
    also(&mut vm);
    let boot = vm.wait_for_exit(Duration::from_secs(LIMIT_SECS + 30));
    if boot.status != Some(0) {
        boot.fail("expected QEMU to exit with status 0 (ACPI soft-off)");
    }
    boot.expect_event("shutdown", json!({"step": "unmounted"}));
    boot.expect_event("shutdown", json!({"step": "done"}));
    boot.expect_event("power_off", any());
    boot.expect_no_line("!!!");
    boot
}

/// The host's verdict on the image: fsck clean with nothing to replay, superblock
/// clean.
fn expect_clean(image: &FsImage) {
    image.fsck_unmounted_cleanly();
    let dump = Command::new(tool())
        .arg("dump")
        .arg(image.path())
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    let superblock = dump.lines().next().unwrap_or_default();
    assert!(
        superblock.ends_with(" clean") && !superblock.contains("not clean"),
        "ninefold dump: {superblock}"
    );
}

/// Reads `name` from the image with `ninefold serve --read-only` on the host.
fn read_on_host(image: &FsImage, name: &str) -> Vec<u8> {
    let (mut server, mut c) = serve_on_host(image.path());
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, name).unwrap();
    c.lopen(1, open_flags::RDONLY).unwrap();
    let mut data = Vec::new();
    loop {
        let got = c.read(1, data.len() as u64, MIB as u32 / 2).unwrap();
        if got.is_empty() {
            break;
        }
        data.extend(got);
    }
    let _ = server.kill();
    let _ = server.wait();
    data
}

/// A versioned, attached client on `port` whose socket receives into a tiny buffer
/// and is then never read: replies to it cannot be delivered.
fn stalled_client(port: u16, name: &str) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .connect(&SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    let mut c = Client::new(Tcp(stream));
    c.version(MIB as u32, b"9P2000.L").unwrap();
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, name).unwrap();
    c.lopen(1, open_flags::RDONLY).unwrap();
    c.io.0
}

#[test]
fn the_power_button_closes_clients_unmounts_cleanly_and_powers_off() {
    const PORT: u16 = 16150;
    let image = FsImage::formatted("256M");
    // Up to 16 MiB of replies per connection (a quarter of client_mem=), far more than
    // the host's socket buffers take in.
    let vm = boot(
        Qemu::serving()
            .nvme_image("nf-shutdown", &image)
            .append("client_mem=64"),
        PORT,
    );
    let data = pattern(MIB);
    // A mount that wrote a file and never fsynced it.
    let mut writer = connect(PORT, UP);
    write_without_fsync(&mut writer, "unsynced", &data);
    // A client that asks for 32 MiB and reads none of it: it cannot be closed politely.
    let mut stalled = stalled_client(PORT, "unsynced");
    let mut reads = Vec::new();
    for tag in 10..42u16 {
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: MIB as u32,
        }
        .encode(tag, &mut reads)
        .unwrap();
    }
    stalled.write_all(&reads).unwrap();
    // Wait until the replies have filled every buffer on the way and stopped flowing.
    let mut sent = 0;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = counter(&json(PORT + 1), "/9p/tx_bytes");
        if now > 2 * MIB as u64 && now == sent {
            break;
        }
        sent = now;
    }
    let before = json(PORT + 1);
    assert_eq!(before["power"]["button_armed"], true);
    assert_eq!(before["power"]["shutdown"]["started"], false);

    let boot = power_off(vm, |vm| {
        // A second press while shutting down is ignored, and counted; the counters
        // service still answers while the 9P service closes.
        vm.power_button();
        vm.wait_for_event("shutdown", json!({"step": "press_ignored"}));
        let during = json(PORT + 1);
        assert_eq!(counter(&during, "/power/button_presses"), 2);
        assert_eq!(during["power"]["shutdown"]["started"], true);
        assert_eq!(counter(&during, "/power/shutdown/ignored_presses"), 1);
        assert_eq!(counter(&during, "/power/shutdown/connections_closed"), 1);
        assert!(counter(&during, "/power/sci_interrupts") >= 2);
    });
    boot.expect_event("shutdown", json!({"step": "listener_closed", "open": 2}));
    boot.expect_event("conn_closed", json!({"how": "shutdown"}));
    boot.expect_event("conn_closed", json!({"how": "shutdown_reset"}));
    boot.expect_event(
        "shutdown",
        json!({
            "step": "connections_closed",
            "asked": 2,
            "reset": 1,
            "grace_secs": LIMIT_SECS / 2,
        }),
    );
    drop((writer, stalled));

    expect_clean(&image);
    assert!(read_on_host(&image, "unsynced") == data, "the file's data");
}

#[test]
fn the_power_button_works_on_q35_with_virtio_blk() {
    const PORT: u16 = 16152;
    let image = FsImage::formatted("128M");
    let vm = boot(
        Qemu::serving().machine("q35").virtio_blk_image(&image),
        PORT,
    );
    let data = pattern(300_000);
    let mut writer = connect(PORT, UP);
    write_without_fsync(&mut writer, "unsynced", &data);
    let boot = power_off(vm, |_| {});
    boot.expect_event(
        "shutdown",
        json!({"step": "connections_closed", "asked": 1, "reset": 0}),
    );
    drop(writer);

    expect_clean(&image);
    assert!(read_on_host(&image, "unsynced") == data, "the file's data");
}

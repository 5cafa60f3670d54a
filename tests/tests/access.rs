//! Access control on the appliance: through QEMU user networking every host connection
//! reaches it from 10.0.2.2, so command-line allow-lists that include that address or
//! not decide what the host may do. The appliance serves the in-memory filesystem in
//! 128 MiB; one boot names exports, one shuts the host out.
//!
//! Host ports: 9P on 15951-15952, the counters service on 15961-15962.

use std::io::{Read, Write};
use std::time::Duration;

use ninefold_tests::ninep::{connect, stream};
use ninefold_tests::{stats, Qemu, Running};
use ninep::wire::{open_flags, Tmsg};
use serde_json::{json, Value};
use vfs::Errno;

/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);

/// Boots the appliance on the in-memory filesystem with `options`, its 9P port
/// forwarded from `port` and its counters service from `port + 10`; returns once it
/// listens.
fn appliance(port: u16, options: &str) -> Running {
    let mut vm = Qemu::serving()
        .memory("128M")
        .virtio_net_forwards(&[(port, 564), (port + 10, 5641)])
        .append("fs=memory")
        .append(options)
        .timeout(Duration::from_secs(300))
        .spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );
    vm
}

/// The 9P exports the appliance listens with, as `(export, clients)` pairs.
fn exports(vm: &mut Running) -> Vec<(String, String)> {
    let listening = vm.wait_for_event("listening", json!({"service": "9p"}));
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    listening["exports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (text(&e["export"]), text(&e["clients"])))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the appliance closes a connection to host `port` without a word: sends
/// `request` and expects end-of-stream (or a reset) rather than an answer. QEMU accepts
/// on the host side first, so a refusal shows only as this close.
fn closed_without_answer(port: u16, request: &[u8]) -> bool {
    let mut s = stream(port);
    // The appliance may reset before the request arrives: that is an answer too.
    let _ = s.write_all(request);
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Named exports for a host inside `allow=`: aname "" is gone, a read-only export, an
/// all-squashing path export, an export whose own allow-list leaves the host out.
#[test]
fn named_exports_for_an_allowed_host() {
    let port = 15951;
    let mut vm = appliance(
        port,
        "allow=10.0.2.2 export=admin:/ export=ro:/:ro export=pub:/pub:squash=all export=far:/:allow=192.0.2.0/24 stats_allow=10.0.2.0/24",
    );
    let config = vm.wait_for_event("config", ninefold_tests::any());
    assert!(
        config["effective"].as_str().is_some_and(|c| c
            .contains("export=far:/:allow=192.0.2.0/24 allow=10.0.2.2 stats_allow=10.0.2.0/24")),
        "{config}"
    );
    let far = (
        "far:/:allow=192.0.2.0/24".to_string(),
        "192.0.2.0/24".to_string(),
    );
    assert!(exports(&mut vm).contains(&far), "{:?}", exports(&mut vm));
    let mut c = connect(port, UP);
    assert_eq!(c.attach(0, 0, ""), Err(Errno::ENOENT), "no implicit export");
    c.attach(0, 0, "admin").unwrap();
    c.mkdir(0, "pub", 0o777).unwrap();
    let public = c.walk(0, 1, "pub").unwrap()[0];
    // Read-only.
    c.attach(2, 0, "ro").unwrap();
    assert_eq!(c.mkdir(2, "x", 0o755), Err(Errno::EROFS));
    // A path export, squashing everyone to nobody.
    assert_eq!(c.attach(3, 1000, "pub").unwrap(), public);
    c.walk(3, 4, "").unwrap();
    c.lcreate(4, "by-1000", open_flags::RDWR, 0o644).unwrap();
    let st = c.getattr(4).unwrap();
    assert_eq!((st.uid, st.gid), (65534, 65534));
    // The export's own list does not include the host.
    assert_eq!(c.attach(5, 0, "far"), Err(Errno::EACCES));
    let counters = stats::json(port + 10);
    assert_eq!(stats::counter(&counters, "/9p/refused_attaches"), 1);
    assert_eq!(stats::counter(&counters, "/9p/refused_connections"), 0);
    vm.stop().expect_no_line("!!!").expect_no_line("ERROR");
}

/// A host outside `allow=` (and so outside the default `stats_allow=`): its 9P and
/// counters connections are closed at once, and counted.
#[test]
fn a_host_outside_the_allow_list_is_disconnected() {
    let port = 15952;
    let mut vm = appliance(port, "allow=192.0.2.0/24,fd00::/8");
    assert_eq!(
        exports(&mut vm),
        [(":/".to_string(), "192.0.2.0/24,fd00::/8".to_string())]
    );
    vm.wait_for_event(
        "listening",
        json!({"service": "stats", "port": 5641, "clients": "192.0.2.0/24,fd00::/8"}),
    );
    let mut version = Vec::new();
    Tmsg::Version {
        msize: 8192,
        version: b"9P2000.L",
    }
    .encode(0xffff, &mut version)
    .unwrap();
    assert!(closed_without_answer(port, &version), "9P answered");
    assert!(
        closed_without_answer(port + 10, b"json\n"),
        "counters answered"
    );
    // Both refusals show in the counters the console logs (every 10 s, on change).
    let stats = vm.wait_for_event(
        "stats",
        json!({"counters": {"access": {"refused_stats": 1}}}),
    );
    let ninep = &stats["counters"]["9p"];
    assert!(
        ninep["refused_connections"] == 1 && ninep["refused_attaches"] == 0,
        "{stats}"
    );
    vm.stop().expect_no_line("!!!").expect_no_line("ERROR");
}

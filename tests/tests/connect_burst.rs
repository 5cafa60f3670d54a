//! Guests mounting together: a burst of connections arriving within one poll of the
//! appliance's network stack, more than its pool of listening sockets holds, must all be
//! served. smoltcp answers a SYN no listening socket takes with a RST, and a Linux client
//! then fails its mount at once ("connection refused"); the appliance's SYN gate
//! (`kernel/src/net/syn_gate.rs`) holds such SYNs back instead, keeps them, and lets them
//! in once the pool (grown for the burst) has a socket listening for them. Without the
//! gate, 24 of 32 clients connecting together were reset.
//!
//! Host port: 9P on 16670.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use ninefold_tests::ninep::read_frame;
use ninefold_tests::Qemu;
use ninep::wire::{Rmsg, Tmsg};

const PORT: u16 = 16670;
/// Four times the listening pool. QEMU's user network accepts host connections with a
/// listen backlog of 1, so some clients' SYNs to it are dropped by the host and retried
/// (1, 3, 7 ... s): a slow client here is QEMU's; a reset one is the appliance's.
const CLIENTS: usize = 16;

/// Connects and sends `Tversion`; the `Rversion` or what went wrong.
fn version(start: &Barrier) -> Result<(), String> {
    start.wait();
    let mut s = TcpStream::connect(("127.0.0.1", PORT)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut frame = Vec::new();
    Tmsg::Version {
        msize: 65536,
        version: b"9P2000.L",
    }
    .encode(0xffff, &mut frame)
    .unwrap();
    s.write_all(&frame).map_err(|e| format!("send: {e}"))?;
    let reply = read_frame(&mut s).map_err(|e| format!("no Rversion: {e}"))?;
    match Rmsg::decode(&reply) {
        Ok((_, Rmsg::Version { .. })) => Ok(()),
        other => Err(format!("not an Rversion: {other:?}")),
    }
}

#[test]
fn a_burst_of_connections_is_served_not_reset() {
    let mut vm = Qemu::serving()
        .memory("256M")
        .append(&format!("fs=memory max_conns_per_client={}", 2 * CLIENTS))
        .virtio_net_forward(PORT, 564)
        .timeout(Duration::from_secs(180))
        .spawn();
    vm.wait_for_event("ready", serde_json::json!({"serving": true}));
    // One connection first: the forward is up and the appliance answers.
    let warm = Barrier::new(1);
    for _ in 0..50 {
        if version(&warm).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let began = std::time::Instant::now();
    let start = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || version(&start))
        })
        .collect();
    let failed: Vec<String> = clients
        .into_iter()
        .filter_map(|c| c.join().unwrap().err())
        .collect();
    eprintln!("{CLIENTS} clients served within {:?}", began.elapsed());
    let serial = vm.serial();
    assert!(
        failed.is_empty(),
        "{} of {CLIENTS} clients connecting together failed: {failed:?}\n{serial}",
        failed.len()
    );
}

//! The server's CPU time per request, with its clock on (as in the appliance): requests
//! fed to a `Connection` in memory, so the figure is the codec, the connection driver,
//! the server and the model filesystem, without a transport. `make bench-host` (or
//! `cargo bench -p ninefold-ninep --bench requests`) prints the best of five runs of
//! this thread's CPU time (Linux's schedstat, so time the thread waited for a CPU on a
//! busy machine does not count); nothing here passes or fails on time.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::OnceLock;
use std::time::Instant;

use common::*;
use ninep::server::Config;
use ninep::wire::open_flags::RDWR;

const ROUNDS: u64 = 100_000;

/// The server's clock.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// This thread's time on a CPU so far, in nanoseconds.
fn cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let on_cpu = stat.split_whitespace().next().expect("a first field");
    on_cpu.parse().expect("nanoseconds")
}

fn main() {
    let server = model_server(Config {
        clock: Some(now_ns),
        ..Config::default()
    });
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    let data = vec![7u8; 4096];
    let time = |what: &str, requests: u64, f: &mut dyn FnMut(u64)| {
        let best = (0..5)
            .map(|_| {
                let t0 = cpu_ns();
                (0..ROUNDS).for_each(&mut *f);
                cpu_ns() - t0
            })
            .min()
            .unwrap();
        let per_request = best as f64 / (ROUNDS * requests) as f64;
        println!("{what}: {per_request:.0} ns of CPU per request");
    };
    time("Tgetattr", 1, &mut |_| {
        c.getattr(1).unwrap();
    });
    time("Twrite of 4 KiB", 1, &mut |i| {
        c.write(1, (i % 64) * 4096, &data).unwrap();
    });
    time("Twalk + Tclunk", 2, &mut |_| {
        c.walk(0, 2, "f").unwrap();
        c.clunk(2).unwrap();
    });
}

//! How long lock requests take while one connection holds 40,000 locks on the file (a
//! scan of the locks cost 1.4 ms per request). `make bench-host` (or `cargo bench -p
//! ninefold-ninep --bench locks`) prints the figures; nothing here passes or fails on
//! time.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use ninep::server::{Config, TenantLimits};
use ninep::wire::{lock, open_flags as of};

const RDWR: u32 = of::RDWR;

fn main() {
    let server = model_server(Config {
        max_locks_per_conn: 100_000,
        max_locks: 100_000,
        // The connections' tenant holds them all (its default share is a quarter).
        tenant: TenantLimits {
            max_locks: 100_000,
            ..Config::default().tenant
        },
        ..Config::default()
    });
    let mut a = client(&server);
    let mut b = client(&server);
    a.attach(0, 0, "").unwrap();
    a.lcreate(0, "f", RDWR, 0o644).unwrap();
    b.attach(0, 0, "").unwrap();
    b.walk(0, 1, "f").unwrap();
    b.lopen(1, RDWR).unwrap();
    let id = [b'n'; 64];
    for i in 0..40_000 {
        assert_eq!(
            lock_as(&mut a, 0, lock::WRLCK, 2 * i, 99, &id),
            Ok(lock::SUCCESS)
        );
    }
    let rounds = 10_000u64;
    let time = |what: &str, f: &mut dyn FnMut(u64)| {
        let t0 = std::time::Instant::now();
        for i in 0..rounds {
            f(i);
        }
        println!(
            "{what}: {:.2} µs per request",
            t0.elapsed().as_secs_f64() * 1e6 / rounds as f64
        );
    };
    time(
        "another connection's Tgetlock(UNLCK) over the whole file",
        &mut |_| {
            assert_eq!(b.getlock(1, lock::UNLCK, 0, 0, 7).unwrap().0, lock::WRLCK);
        },
    );
    time(
        "the holder's Tgetlock(UNLCK) over the whole file",
        &mut |_| {
            let reply = getlock_as(&mut a, 0, lock::UNLCK, (0, 0), &id).unwrap();
            assert_eq!(reply.0, lock::UNLCK);
        },
    );
    time(
        "another connection's Tlock + unlock of a free byte",
        &mut |i| {
            let off = 2 * (i % 40_000) + 1;
            assert_eq!(b.lock(1, lock::WRLCK, off, 1, 7).unwrap(), lock::SUCCESS);
            assert_eq!(b.lock(1, lock::UNLCK, off, 1, 7).unwrap(), lock::SUCCESS);
        },
    );
    time("the holder's relock of one of its bytes", &mut |i| {
        let off = 2 * (i % 40_000);
        assert_eq!(
            lock_as(&mut a, 0, lock::RDLCK, off, 99, &id),
            Ok(lock::SUCCESS)
        );
    });
}

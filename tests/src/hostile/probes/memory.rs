//! Probes that make the server hold memory: values bound into fids, replies the client
//! never reads, fids by the thousand.

use std::time::{Duration, Instant};

use ninep::wire::{open_flags, Tmsg};
use vfs::Errno;

use super::{fixture, in_parallel, Ctx, Outcome, STALL};
use crate::hostile::raw::{
    attached, closed_by_server, cycling_tag, frame, send_all, socket, Drain,
};

/// (a) Every hog binds a copy of the 64 KiB xattr into every fid it may have, pipelined,
/// and holds them for the window. Without a budget that is 256 MiB per connection; with
/// one, walks get `ENOMEM` (or `EMFILE` past the fid limit) and the appliance lives.
pub fn xattr_flood(ctx: &Ctx<'_>, conns: usize) -> Outcome {
    let max_fids = ctx.limits.max_fids;
    let hogs = in_parallel(conns, |_| {
        let mut out = Outcome::default();
        let mut c = match attached(ctx.port, 0, "") {
            Ok(c) => c,
            Err(e) => {
                out.fail(format!("a hog could not attach: {e}"));
                return out;
            }
        };
        if let Err(e) = c.walk(0, 1, fixture::XATTR) {
            out.fail(format!("a hog could not walk to the file: {e}"));
            return out;
        }
        let Some(s) = socket(&c) else {
            out.fail("a hog lost its connection during setup");
            return out;
        };
        let drain = Drain::start(&s);
        let walks = (2..max_fids + 64).map(|newfid| {
            frame(
                cycling_tag(newfid as usize),
                &Tmsg::Xattrwalk {
                    fid: 1,
                    newfid,
                    name: fixture::XATTR_NAME.as_bytes(),
                },
            )
        });
        let sent = send_all(&s, walks, STALL);
        drain.wait_for(sent.frames as u64, ctx.deadline());
        ctx.hold();
        let t = drain.finish();
        out.add("walks", sent.frames as u64);
        out.add("shed", u64::from(t.closed_by_server));
        out.tally("", &t, &[Errno::ENOMEM, Errno::EMFILE]);
        // What one connection held: at most its share of the budget.
        out.check(
            t.ok * fixture::XATTR_SIZE as u64 <= ctx.memory_limit,
            || {
                format!(
                    "one connection holds {} values of 64 KiB, more than the whole budget ({} MiB)",
                    t.ok,
                    ctx.memory_limit >> 20
                )
            },
        );
        out
    });
    let mut out = Outcome::default();
    for h in hogs {
        out.merge(h);
    }
    let refused = out.findings.get("ENOMEM").copied().unwrap_or(0);
    out.check(refused > 0, || {
        "no xattr walk was refused: the values are not bounded".into()
    });
    out
}

/// Issue 26's sequence: twelve hogs each walk the 64 KiB xattr into fids until `ENOMEM`
/// (the budget spent) and hold them; a client that attached before sends a 512 KiB
/// `Twrite` in one frame. The server must reclaim memory from a hog and answer the write,
/// and the next request on that connection, while the hogs still hold theirs (a lost
/// wake-up left it unanswered for good).
pub fn parked_writer(ctx: &Ctx<'_>) -> Outcome {
    const HOGS: usize = 12;
    const SIZE: usize = 512 << 10;
    let mut out = Outcome::default();
    let mut writer = match attached(ctx.port, 0, "") {
        Ok(c) => c,
        Err(e) => {
            out.fail(format!("the writer could not attach: {e}"));
            return out;
        }
    };
    let setup = writer.walk(0, 1, fixture::OPEN_DIR).and_then(|_| {
        writer.lcreate(
            1,
            "parked-writer",
            open_flags::RDWR | open_flags::TRUNC,
            0o644,
        )
    });
    if let Err(e) = setup {
        out.fail(format!("the writer could not create its file: {e}"));
        return out;
    }
    let spent = std::sync::Barrier::new(HOGS + 1);
    std::thread::scope(|scope| {
        let hogs = scope.spawn(|| {
            in_parallel(HOGS, |_| {
                let mut out = Outcome::default();
                let c = attached(ctx.port, 0, "").and_then(|mut c| {
                    c.walk(0, 1, fixture::XATTR)?;
                    Ok(c)
                });
                let mut c = match c {
                    Ok(c) => c,
                    Err(e) => {
                        out.fail(format!("a hog could not attach: {e}"));
                        spent.wait();
                        return out;
                    }
                };
                let mut held = 0;
                for newfid in 2..ctx.limits.max_fids {
                    match c.xattrwalk(1, newfid, fixture::XATTR_NAME) {
                        Ok(_) => held += 1,
                        Err(Errno::ENOMEM | Errno::EMFILE) => break,
                        Err(e) => {
                            out.add(format!("hog {e}"), 1);
                            break;
                        }
                    }
                }
                out.add("values held", held);
                spent.wait();
                ctx.hold();
                out
            })
        });
        spent.wait();
        // Every hog was refused: the budget is spent. The writer's frame now waits for
        // memory until the server reclaims some.
        let sent = Instant::now();
        let answered = writer
            .write(1, 0, &vec![7u8; SIZE])
            .and_then(|n| writer.getattr(1).map(|_| n));
        let took = sent.elapsed();
        out.note("write answered ms", took.as_millis() as u64);
        match answered {
            Ok(n) => out.check(n as usize == SIZE, || format!("wrote {n} of {SIZE} bytes")),
            Err(e) => out.fail(format!("the parked write got {e}")),
        }
        out.check(Instant::now() < ctx.deadline(), || {
            format!("the write was answered only after {took:?}, when the hogs let go")
        });
        for h in hogs.join().unwrap() {
            out.merge(h);
        }
    });
    out
}

/// (b) Every hog pipelines reads of the whole msize from a 1 MiB file and never reads a
/// reply, holding the connection for the window. The server must stop taking its input
/// (backpressure: `memory_waits`) instead of queueing replies, and may shed it when
/// others need the memory.
pub fn read_flood(ctx: &Ctx<'_>, conns: usize) -> Outcome {
    let waits_before = ctx.counter("memory_waits");
    let count = ctx.limits.msize - 11;
    let depth = ctx.scale.read_flood_depth;
    let hogs = in_parallel(conns, |_| {
        let mut out = Outcome::default();
        let mut c = match attached(ctx.port, 0, "") {
            Ok(c) => c,
            Err(e) => {
                out.fail(format!("a hog could not attach: {e}"));
                return out;
            }
        };
        let setup = c
            .walk(0, 1, fixture::BIG)
            .and_then(|_| c.lopen(1, open_flags::RDONLY));
        if let Err(e) = setup {
            out.fail(format!("a hog could not open the file: {e}"));
            return out;
        }
        let Some(s) = socket(&c) else {
            out.fail("a hog lost its connection during setup");
            return out;
        };
        let reads = (0..depth).map(|i| {
            frame(
                cycling_tag(i),
                &Tmsg::Read {
                    fid: 1,
                    offset: 0,
                    count,
                },
            )
        });
        let sent = send_all(&s, reads, STALL);
        out.add("reads sent", sent.frames as u64);
        out.add("writers blocked", u64::from(sent.blocked));
        ctx.hold();
        out.add(
            "shed",
            u64::from(sent.failed || closed_by_server(&s, Duration::from_millis(200))),
        );
        // Dropping the socket with replies unread resets the connection.
        drop(c);
        out
    });
    let mut out = Outcome::default();
    for h in hogs {
        out.merge(h);
    }
    match ctx.counter_change("memory_waits", waits_before) {
        Ok(waits) => {
            out.note("memory waits", waits);
            out.check(waits > 0, || {
                "the server never stopped taking unread reads (no memory_waits)".into()
            });
        }
        Err(e) => out.fail(e),
    }
    out
}

/// (k) Every hog walks fid 0 into every fid number up to the limit and past it,
/// pipelined, and holds them: walks beyond the limit get `EMFILE`, and beyond the
/// memory account `ENOMEM`.
pub fn fid_flood(ctx: &Ctx<'_>) -> Outcome {
    let max_fids = ctx.limits.max_fids;
    let hogs = in_parallel(ctx.scale.fid_flood_conns, |_| {
        let mut out = Outcome::default();
        let c = match attached(ctx.port, 0, "") {
            Ok(c) => c,
            Err(e) => {
                out.fail(format!("a hog could not attach: {e}"));
                return out;
            }
        };
        let Some(s) = socket(&c) else {
            out.fail("a hog lost its connection during setup");
            return out;
        };
        let drain = Drain::start(&s);
        let walks = (1..max_fids + 500).map(|newfid| {
            frame(
                cycling_tag(newfid as usize),
                &Tmsg::Walk {
                    fid: 0,
                    newfid,
                    names: Vec::new(),
                },
            )
        });
        let sent = send_all(&s, walks, STALL);
        drain.wait_for(sent.frames as u64, ctx.deadline());
        ctx.hold();
        let t = drain.finish();
        out.add("walks", sent.frames as u64);
        out.add("shed", u64::from(t.closed_by_server));
        out.tally("", &t, &[Errno::EMFILE, Errno::ENOMEM]);
        // Fid 0 is the attach's.
        out.check(t.ok < u64::from(max_fids), || {
            format!(
                "{} walks bound a fid beside fid 0, above max_fids={max_fids}",
                t.ok
            )
        });
        out.check(
            t.ok + 1 == u64::from(max_fids) || t.closed_by_server || t.errno(Errno::ENOMEM) > 0,
            || {
                format!(
                    "only {} of {max_fids} fids bound, and nothing refused for memory",
                    t.ok + 1
                )
            },
        );
        out
    });
    let mut out = Outcome::default();
    for h in hogs {
        out.merge(h);
    }
    let refused = out.findings.get("EMFILE").copied().unwrap_or(0)
        + out.findings.get("ENOMEM").copied().unwrap_or(0);
    out.check(refused > 0, || {
        "no walk beyond the fid limit was refused".into()
    });
    out
}

/// (c) Every connection reads the cache flood's file (more than a 128 MiB appliance's
/// data cache holds) as fast as it can for the window: a sequential 1 MiB read (so
/// readahead runs too), then eight 4 KiB reads at random, over and over, checking every
/// byte. The data cache must churn within its limit (evictions, never more bytes than
/// it may hold, no stale block), the heap within its size (the suite's sampler), and
/// every byte read must be the file's.
pub fn cache_flood(ctx: &Ctx<'_>) -> Outcome {
    let size = ctx.scale.cache_flood_bytes as u64;
    let count = ctx.limits.msize - 24;
    let readers = in_parallel(ctx.scale.cache_flood_conns, |n| {
        let mut out = Outcome::default();
        let mut c = match attached(ctx.port, 0, "") {
            Ok(c) => c,
            Err(e) => {
                out.fail(format!("a reader could not attach: {e}"));
                return out;
            }
        };
        if let Err(e) = c
            .walk(0, 1, fixture::STREAM)
            .and_then(|_| c.lopen(1, open_flags::RDONLY))
        {
            out.fail(format!("a reader could not open the file: {e}"));
            return out;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let check = |out: &mut Outcome, at: u64, got: &[u8]| {
            out.add("bytes read", got.len() as u64);
            let wrong = got
                .iter()
                .zip(at..)
                .position(|(&b, i)| b != fixture::stream_byte(i));
            if let Some(i) = wrong {
                out.fail(format!("wrong data at byte {} of the file", at + i as u64));
            }
        };
        let mut at = (n as u64 * size / 3) / 4096 * 4096;
        while Instant::now() < ctx.deadline() && out.failures.is_empty() {
            match c.read(1, at, count) {
                Ok(data) => {
                    check(&mut out, at, &data);
                    at = if data.is_empty() {
                        0
                    } else {
                        at + data.len() as u64
                    };
                }
                Err(e) => {
                    out.fail(format!("a sequential read got {e}"));
                    break;
                }
            }
            for _ in 0..8 {
                let off = random() % (size / 4096) * 4096;
                match c.read(1, off, 4096) {
                    Ok(data) => check(&mut out, off, &data),
                    Err(e) => out.fail(format!("a random read got {e}")),
                }
            }
        }
        out
    });
    let mut out = Outcome::default();
    for r in readers {
        out.merge(r);
    }
    match ctx.counters() {
        Ok(v) => {
            let at = |path: &str| crate::stats::counter_or_zero(&v, path);
            let (bytes, limit) = (at("/fs/data_cache/bytes"), at("/fs/data_cache/limit_bytes"));
            out.note("cache MiB", bytes >> 20);
            out.note("cache evictions", at("/fs/data_cache/evictions"));
            out.note("cache hits", at("/fs/data_cache/hits"));
            out.note("cache misses", at("/fs/data_cache/misses"));
            out.note("read ahead MiB", at("/fs/readahead/bytes") >> 20);
            out.check(bytes <= limit, || {
                format!("the data cache holds {bytes} bytes, more than its limit {limit}")
            });
            // Reading more distinct blocks than the cache holds must have evicted some.
            let read = out.findings.get("bytes read").copied().unwrap_or(0);
            out.check(
                read < 2 * size || at("/fs/data_cache/evictions") > 0,
                || {
                    format!(
                        "{read} bytes read of a {size}-byte file and the data cache never evicted"
                    )
                },
            );
            out.check(at("/fs/data_cache/stale") == 0, || {
                "the data cache held a block a write had replaced".into()
            });
        }
        Err(e) => out.fail(e),
    }
    out
}

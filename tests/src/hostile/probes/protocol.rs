//! Protocol probes: versions the server does not speak, flushes by the thousand and tags
//! used twice, the deepest walks and widest readdirs, and fuzzed frames through the
//! appliance's TCP stack.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ninep::testing::Client;
use ninep::wire::{open_flags, Tmsg};
use vfs::Errno;

use super::{fixture, in_parallel, Ctx, Outcome, STALL};
use crate::hostile::fuzz::{FrameFuzzer, Kind};
use crate::hostile::raw::{attached, cycling_tag, frame, is_gone, send_all, socket, Drain, Tally};
use crate::ninep::Lossy;

/// The fuzzer's uid (it owns [`fixture::FUZZ_DIR`] and nothing else).
pub const FUZZ_UID: u32 = 4242;

/// (g) `Tversion` with a version the server does not speak leaves the session
/// unversioned: every request gets `EPROTO` until a good `Tversion`. So do requests
/// before any `Tversion`; an msize below the minimum is `EINVAL`.
pub fn unknown_version(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    let before = ctx.counter("unknown_versions");
    let Ok(s) = TcpStream::connect(("127.0.0.1", ctx.port)) else {
        out.fail("no connection");
        return out;
    };
    let _ = s.set_read_timeout(Some(crate::ninep::REPLY_TIMEOUT));
    let mut c = Client::new(Lossy::new(s));
    let expect = |out: &mut Outcome, what: &str, got: Result<(), Errno>, want: Errno| {
        out.check(got == Err(want), || format!("{what}: {got:?}, not {want}"));
    };
    let attach = |c: &mut Client<Lossy>| c.attach(0, 0, "").map(drop);
    let got = attach(&mut c);
    expect(&mut out, "attach before Tversion", got, Errno::EPROTO);
    match c.version(ctx.limits.msize, b"9P2000.u") {
        Ok((_, v)) => out.check(v == b"unknown", || {
            format!(
                "Tversion 9P2000.u answered version {:?}",
                String::from_utf8_lossy(&v)
            )
        }),
        Err(e) => out.fail(format!("Tversion 9P2000.u: {e}")),
    }
    let got = attach(&mut c);
    expect(
        &mut out,
        "attach after an unknown version",
        got,
        Errno::EPROTO,
    );
    let got = c.walk(0, 1, "").map(drop);
    expect(
        &mut out,
        "walk after an unknown version",
        got,
        Errno::EPROTO,
    );
    let got = c.version(100, b"9P2000.L").map(drop);
    expect(&mut out, "Tversion with msize 100", got, Errno::EINVAL);
    match c.version(u32::MAX, b"9P2000.L") {
        Ok((msize, _)) => out.check(msize <= ctx.limits.msize, || {
            format!("Tversion with msize 4 GiB negotiated {msize}")
        }),
        Err(e) => out.fail(format!("Tversion 9P2000.L: {e}")),
    }
    let got = attach(&mut c);
    out.check(got.is_ok(), || {
        format!("attach after a good Tversion: {got:?}")
    });
    match ctx.counter_change("unknown_versions", before) {
        Ok(counted) => {
            out.note("unknown versions counted", counted);
            out.check(counted >= 1, || {
                "the unknown version was not counted".into()
            });
        }
        Err(e) => out.fail(e),
    }
    out
}

/// Tags of the flush storm's reads and flushes, and of flushes of idle tags.
fn storm_tags(pair: usize) -> (u16, u16) {
    (2 * pair as u16 + 1, 2 * pair as u16 + 2)
}
/// Tags of the flushes of idle tags, and the idle tags they flush (never used).
const IDLE_FLUSH_TAG_BASE: u16 = 50_000;
const IDLE_TAG_BASE: u16 = 60_000;

/// Bytes each read of the flush storm asks for: enough to keep a few in flight, not so
/// much that the storm is a bandwidth test.
const STORM_READ: u32 = 64 << 10;

/// (j) 64 KiB reads each followed at once by its `Tflush`, and flushes of tags never
/// used, pipelined; then two requests with one tag. Every flush is answered
/// `Rflush`; a flushed request's reply, if sent, comes before its `Rflush` and never
/// after; a duplicate tag closes the connection or both requests are answered.
pub fn flush_storm(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    let pairs = ctx.scale.flush_pairs.min(20_000);
    let open = |c: &mut Client<Lossy>| {
        c.walk(0, 1, fixture::BIG)
            .and_then(|_| c.lopen(1, open_flags::RDONLY))
    };
    let r = attached(ctx.port, 0, "").and_then(|mut c| open(&mut c).map(|_| c));
    let c = match r {
        Ok(c) => c,
        Err(e) => {
            out.fail(format!("setup: {e}"));
            return out;
        }
    };
    let Some(s) = socket(&c) else {
        out.fail("connection lost during setup");
        return out;
    };
    let drain = Drain::start_recording(&s, true);
    let mut frames = Vec::new();
    let mut idle_flushes = 0;
    for i in 0..pairs {
        let (read, flush) = storm_tags(i);
        let offset = (i * STORM_READ as usize % fixture::BIG_SIZE) as u64;
        frames.push(frame(
            read,
            &Tmsg::Read {
                fid: 1,
                offset,
                count: STORM_READ,
            },
        ));
        frames.push(frame(flush, &Tmsg::Flush { oldtag: read }));
        if i.is_multiple_of(10) {
            let tag = IDLE_FLUSH_TAG_BASE + idle_flushes;
            let oldtag = IDLE_TAG_BASE + idle_flushes;
            frames.push(frame(tag, &Tmsg::Flush { oldtag }));
            idle_flushes += 1;
        }
    }
    let expected = frames.len() as u64;
    let sent = send_all(&s, frames, STALL);
    drain.wait_for(
        expected,
        ctx.deadline().max(Instant::now() + Duration::from_secs(20)),
    );
    let t = drain.finish();
    out.note("requests", sent.frames as u64);
    out.tally("", &t, &[]);
    out.check(!t.closed_by_server && t.replies() == expected, || {
        format!("{} of {expected} requests answered", t.replies())
    });
    check_flush_order(&mut out, &t, pairs, idle_flushes);
    duplicate_tag(ctx, &mut out);
    out
}

/// Checks the order of the flush storm's replies.
fn check_flush_order(out: &mut Outcome, t: &Tally, pairs: usize, idle_flushes: u16) {
    const RFLUSH: u8 = 109;
    let mut seen: BTreeMap<u16, Vec<(usize, u8)>> = BTreeMap::new();
    for (at, &(tag, ty)) in t.order.iter().enumerate() {
        seen.entry(tag).or_default().push((at, ty));
    }
    let mut reads_answered = 0;
    let mut misordered = 0;
    for i in 0..pairs {
        let (read, flush) = storm_tags(i);
        let flushed = seen.get(&flush).map_or(&[][..], |v| v.as_slice());
        let Some(&(flushed_at, ty)) = flushed.first() else {
            continue; // counted as unanswered already
        };
        out.check(ty == RFLUSH && flushed.len() == 1, || {
            format!("Tflush tag {flush} answered {flushed:?}")
        });
        let reads = seen.get(&read).map_or(&[][..], |v| v.as_slice());
        reads_answered += reads.len();
        misordered += reads.iter().filter(|(at, _)| *at > flushed_at).count();
        out.check(reads.len() <= 1, || {
            format!("tag {read} answered {} times", reads.len())
        });
    }
    for k in 0..idle_flushes {
        let tag = IDLE_FLUSH_TAG_BASE + k;
        let got = seen
            .get(&tag)
            .map(|v| v.iter().map(|&(_, ty)| ty).collect::<Vec<_>>());
        out.check(got == Some(vec![RFLUSH]), || {
            format!("the flush of an idle tag ({tag}) was answered {got:?}")
        });
    }
    out.note("flushed reads still answered", reads_answered as u64);
    out.check(misordered == 0, || {
        format!("{misordered} flushed requests answered after their Rflush")
    });
}

/// Two requests with one tag in one segment: the server either answers both (the first
/// was done before the second came) or closes the connection; it never hangs.
fn duplicate_tag(ctx: &Ctx<'_>, out: &mut Outcome) {
    let r = attached(ctx.port, 0, "").and_then(|mut c| {
        c.walk(0, 1, fixture::BIG)
            .and_then(|_| c.lopen(1, open_flags::RDONLY))
            .map(|_| c)
    });
    let Some((_c, s)) = r.ok().and_then(|c| socket(&c).map(|s| (c, s))) else {
        out.fail("duplicate tag: setup failed");
        return;
    };
    let drain = Drain::start(&s);
    let read = frame(
        7,
        &Tmsg::Read {
            fid: 1,
            offset: 0,
            count: ctx.limits.msize - 11,
        },
    );
    let twice = [read.clone(), read].concat();
    send_all(&s, [twice], STALL);
    let t = drain.finish_after(Duration::from_secs(20));
    out.note(
        "duplicate tag closed the connection",
        u64::from(t.closed_by_server),
    );
    out.check(t.closed_by_server || t.replies() == 2, || {
        format!(
            "two requests with one tag: {} replies and the connection open",
            t.replies()
        )
    });
}

/// (l) Walks of 16 names down a deep tree and up `..`, walks of missing long names, and
/// readdirs of the whole msize over a wide directory, pipelined in rounds by several
/// connections for the window.
pub fn deep_and_wide(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = build_deep_and_wide(ctx) {
        out.fail(format!("setup: {e}"));
        return out;
    }
    let results = in_parallel(4, |_| walk_and_list(ctx));
    for r in results {
        match r {
            Ok(t) => out.tally("", &t, &[Errno::ENOENT]),
            Err(e) => out.fail(e),
        }
    }
    out
}

/// Names of the deep tree below [`fixture::DIR`]: `deep/d/d/...`.
const DEEP: &str = "deep";
const WIDE: &str = "wide";

/// Makes `hostile/wide` with `scale.wide_entries` subdirectories (pipelined) and
/// `hostile/deep/d/d/...` `scale.deep_levels` deep.
fn build_deep_and_wide(ctx: &Ctx<'_>) -> Result<(), String> {
    let e = |what: &'static str| move |e: Errno| format!("{what}: {e}");
    let mut c = attached(ctx.port, 0, "").map_err(e("attach"))?;
    c.walk(0, 1, fixture::DIR).map_err(e("walk"))?;
    c.mkdir(1, WIDE, 0o755).map_err(e("mkdir wide"))?;
    c.walk(1, 2, WIDE).map_err(e("walk wide"))?;
    let s = socket(&c).ok_or("connection lost")?;
    let drain = Drain::start(&s);
    let names: Vec<String> = (0..ctx.scale.wide_entries)
        .map(|k| format!("entry-{k:05}"))
        .collect();
    let mkdirs = names.iter().enumerate().map(|(k, name)| {
        frame(
            cycling_tag(k),
            &Tmsg::Mkdir {
                dfid: 2,
                name: name.as_bytes(),
                mode: 0o755,
                gid: 0,
            },
        )
    });
    let sent = send_all(&s, mkdirs, STALL);
    drain.wait_for(
        sent.frames as u64,
        Instant::now() + Duration::from_secs(120),
    );
    let t = drain.finish();
    if t.ok != ctx.scale.wide_entries as u64 {
        return Err(format!(
            "{} of {} entries made: {:?}",
            t.ok, ctx.scale.wide_entries, t.errors
        ));
    }
    // The first connection is shut down now; the tree is made on another.
    let mut c = attached(ctx.port, 0, "").map_err(e("attach"))?;
    c.walk(0, 1, fixture::DIR).map_err(e("walk"))?;
    c.mkdir(1, DEEP, 0o755).map_err(e("mkdir deep"))?;
    c.walk(1, 1, DEEP).map_err(e("walk deep"))?;
    for _ in 0..ctx.scale.deep_levels {
        c.mkdir(1, "d", 0o755).map_err(e("mkdir d"))?;
        c.walk(1, 1, "d").map_err(e("walk d"))?;
    }
    Ok(())
}

/// One connection's rounds of deep walks, `..` walks, missing names and wide readdirs
/// until the window's end; replies tallied.
fn walk_and_list(ctx: &Ctx<'_>) -> Result<Tally, String> {
    let mut c = attached(ctx.port, 0, "").map_err(|e| format!("attach: {e}"))?;
    c.walk(0, 1, &format!("{}/{WIDE}", fixture::DIR))
        .and_then(|_| c.lopen(1, open_flags::RDONLY))
        .map_err(|e| format!("opening the wide directory: {e}"))?;
    let s = socket(&c).ok_or("connection lost")?;
    let drain = Drain::start(&s);
    let mut deep: Vec<&[u8]> = vec![fixture::DIR.as_bytes(), DEEP.as_bytes()];
    deep.resize(16, b"d");
    let dots: Vec<&[u8]> = vec![b".."; 16];
    let long = vec![b'm'; 255];
    let missing: Vec<&[u8]> = vec![&long; 16];
    let mut sent = 0u64;
    let mut tag = 0usize;
    let mut next_tag = || {
        tag += 1;
        cycling_tag(tag)
    };
    while Instant::now() < ctx.deadline() && !drain.ended() {
        let mut round = Vec::new();
        for k in 0..4u32 {
            round.push(frame(
                next_tag(),
                &Tmsg::Readdir {
                    fid: 1,
                    offset: 0,
                    count: ctx.limits.msize - 11,
                },
            ));
            round.push(frame(
                next_tag(),
                &Tmsg::Walk {
                    fid: 0,
                    newfid: 10 + k,
                    names: deep.clone(),
                },
            ));
            round.push(frame(
                next_tag(),
                &Tmsg::Walk {
                    fid: 0,
                    newfid: 20 + k,
                    names: dots.clone(),
                },
            ));
            round.push(frame(
                next_tag(),
                &Tmsg::Walk {
                    fid: 0,
                    newfid: 30 + k,
                    names: missing.clone(),
                },
            ));
        }
        sent += send_all(&s, round, STALL).frames as u64;
        drain.wait_for(sent, Instant::now() + Duration::from_secs(30));
        let clunks: Vec<Vec<u8>> = (0..4u32)
            .flat_map(|k| [10 + k, 20 + k])
            .map(|fid| frame(next_tag(), &Tmsg::Clunk { fid }))
            .collect();
        sent += send_all(&s, clunks, STALL).frames as u64;
        drain.wait_for(sent, Instant::now() + Duration::from_secs(30));
    }
    let t = drain.finish();
    if t.replies() < sent && !t.closed_by_server {
        return Err(format!(
            "{} of {sent} requests unanswered",
            sent - t.replies()
        ));
    }
    Ok(t)
}

/// The fuzzing seed: `NINEFOLD_HOSTILE_SEED`, or one from the clock (printed).
pub fn fuzz_seed() -> u64 {
    std::env::var("NINEFOLD_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// (i) Seeded random and mutated frames (see [`crate::hostile::fuzz`]) from several
/// connections of the fuzzer's unprivileged user, through QEMU's network and the
/// appliance's smoltcp stack. A connection the server closes is replaced. Every reply
/// must decode; the suite checks the rest.
pub fn fuzzed_frames(ctx: &Ctx<'_>) -> Outcome {
    let seed = fuzz_seed();
    eprintln!("hostile: fuzz seed {seed} (NINEFOLD_HOSTILE_SEED={seed} repeats it)");
    let conns = ctx.scale.fuzz_conns.max(1);
    let per_conn = ctx.scale.fuzz_frames / conns;
    let results = in_parallel(conns, |i| fuzz_stream(ctx, seed, i as u64, per_conn));
    let mut out = Outcome::default();
    out.note("seed", seed);
    for r in results {
        out.merge(r);
    }
    out
}

/// One fuzzing connection (replaced whenever the server closes it) sending `frames`
/// pieces or until the window's end.
fn fuzz_stream(ctx: &Ctx<'_>, seed: u64, stream: u64, frames: usize) -> Outcome {
    let mut out = Outcome::default();
    let mut fuzzer = FrameFuzzer::new(seed, stream, ctx.limits.msize);
    let mut sent = 0;
    let deadline = ctx.deadline().max(Instant::now() + Duration::from_secs(5));
    while sent < frames && Instant::now() < deadline {
        let c = match attached(ctx.port, FUZZ_UID, "") {
            Ok(mut c) => match c.walk(0, 1, fixture::FUZZ_DIR) {
                Ok(_) => c,
                Err(e) => {
                    out.fail(format!("the fuzzer could not walk to its directory: {e}"));
                    return out;
                }
            },
            Err(e) if is_gone(e) => {
                out.fail("the fuzzer could not connect");
                return out;
            }
            Err(e) => {
                out.fail(format!("the fuzzer could not attach: {e}"));
                return out;
            }
        };
        out.add("connections", 1);
        let Some(s) = socket(&c) else { continue };
        let drain = Drain::start(&s);
        let mut on_this = 0u64;
        while sent < frames && Instant::now() < deadline && !drain.ended() {
            let piece = fuzzer.next_piece();
            sent += 1;
            out.add(format!("{:?} pieces", piece.kind), 1);
            let r = send_all(&s, [piece.bytes], STALL);
            if r.failed || piece.kind == Kind::Cut {
                // Let the reader see the server's close, if it comes.
                drain.wait_for(u64::MAX, Instant::now() + Duration::from_millis(300));
                break;
            }
            on_this += 1;
            // Stay within reach of the replies (a desynchronised stream may have none).
            if on_this.is_multiple_of(64) {
                drain.wait_for(
                    on_this.saturating_sub(256),
                    Instant::now() + Duration::from_secs(2),
                );
            }
        }
        let t = drain.finish();
        out.add("closed by the server", u64::from(t.closed_by_server));
        out.add("replies", t.replies());
        out.check(t.undecodable == 0, || {
            format!("{} replies to fuzzed frames did not decode", t.undecodable)
        });
    }
    out.add("pieces", sent as u64);
    out
}

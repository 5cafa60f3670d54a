//! The lock-table probe: a flood of one-byte POSIX locks, locks with the longest client
//! ids a frame can carry, and `Tgetlock` as the Linux client sends it (type `UNLCK`)
//! while the table is full.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ninep::testing::Client;
use ninep::wire::{lock, open_flags, Tmsg};
use vfs::Errno;

use super::{fixture, Ctx, Outcome, STALL};
use crate::hostile::raw::{attached, cycling_tag, frame, send_all, socket, Drain, Tally};
use crate::ninep::Lossy;

/// Longest client id a `Tlock` can carry (a 9P string).
const LONGEST_CLIENT_ID: usize = 65_535;
/// Where the long-id locks go: far from the flood's bytes.
const LONG_ID_BASE: u64 = 1 << 40;

/// A connection attached as root with [`fixture::LOCKS`] open for writing as fid 1.
fn lock_file_open(ctx: &Ctx<'_>) -> Result<Client<Lossy>, String> {
    let mut c = attached(ctx.port, 0, "").map_err(|e| format!("attach: {e}"))?;
    c.walk(0, 1, fixture::LOCKS)
        .and_then(|_| c.lopen(1, open_flags::RDWR))
        .map_err(|e| format!("opening the lock file: {e}"))?;
    Ok(c)
}

/// `Tlock` frames for `count` write locks of one byte each, every other byte from
/// `first` (so they never merge), all of one owner.
fn one_byte_locks(
    first: u64,
    count: usize,
    client_id: &[u8],
) -> impl Iterator<Item = Vec<u8>> + '_ {
    (0..count).map(move |k| {
        frame(
            cycling_tag(k),
            &Tmsg::Lock {
                fid: 1,
                lock_type: lock::WRLCK,
                flags: 0,
                start: first + 2 * k as u64,
                length: 1,
                proc_id: 1,
                client_id,
            },
        )
    })
}

/// Pipelines `frames` on `c`'s connection and waits until `deadline` for their replies.
fn pipelined(
    c: &Client<Lossy>,
    frames: impl Iterator<Item = Vec<u8>>,
    deadline: Instant,
) -> Result<(usize, Drain), String> {
    let s = socket(c).ok_or("connection lost during setup")?;
    let drain = Drain::start(&s);
    let sent = send_all(&s, frames, STALL);
    drain.wait_for(sent.frames as u64, deadline);
    Ok((sent.frames, drain))
}

/// Checks that every one of `sent` lock requests was answered: granted, or refused with
/// `allowed`.
fn judge(out: &mut Outcome, what: &str, sent: usize, t: &Tally, allowed: &[Errno]) {
    out.add(format!("{what} sent"), sent as u64);
    out.tally(&format!("{what} "), t, allowed);
    out.check(t.replies() == sent as u64 || t.closed_by_server, || {
        format!(
            "{what}: {} of {sent} requests unanswered by the window's end",
            sent as u64 - t.replies()
        )
    });
    let not_granted: u64 = t
        .lock_status
        .iter()
        .filter(|(s, _)| **s != lock::SUCCESS)
        .map(|(_, n)| n)
        .sum();
    out.check(not_granted == 0, || {
        format!(
            "{what}: {not_granted} disjoint locks answered other than SUCCESS ({:?})",
            t.lock_status
        )
    });
}

/// (e) `scale.locks` one-byte locks over `scale.lock_conns` connections, held for the
/// window; meanwhile `Tgetlock(UNLCK)` from another connection must report a held lock,
/// and locks with 65,535-byte client ids must be refused (`EINVAL`).
pub fn lock_flood(ctx: &Ctx<'_>) -> Outcome {
    let conns = ctx.scale.lock_conns.max(1);
    let per_conn = ctx.scale.locks / conns;
    let flooded = AtomicUsize::new(0);
    let mut out = Outcome::default();
    std::thread::scope(|scope| {
        let hogs: Vec<_> = (0..conns)
            .map(|i| {
                let flooded = &flooded;
                scope.spawn(move || {
                    let r = lock_file_open(ctx).and_then(|c| {
                        let first = (i * per_conn * 2) as u64;
                        let frames = one_byte_locks(first, per_conn, b"hostile");
                        let (sent, drain) = pipelined(&c, frames, ctx.deadline())?;
                        flooded.fetch_add(1, Ordering::SeqCst);
                        ctx.hold();
                        Ok((sent, drain.finish()))
                    });
                    if r.is_err() {
                        flooded.fetch_add(1, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        // Once the table is full (or the window is nearly over), probe it.
        let probe_by = ctx.deadline() - ctx.scale.window / 4;
        while flooded.load(Ordering::SeqCst) < conns && Instant::now() < probe_by {
            std::thread::sleep(Duration::from_millis(50));
        }
        getlock_unlck(ctx, &mut out);
        long_client_ids(ctx, &mut out);
        for h in hogs {
            match h.join().expect("a lock hog panicked") {
                Ok((sent, t)) => {
                    judge(&mut out, "locks", sent, &t, &[Errno::ENOLCK, Errno::ENOMEM])
                }
                Err(e) => out.fail(format!("a lock hog: {e}")),
            }
        }
    });
    out
}

/// `Tgetlock` with type `UNLCK` (what Linux sends for `F_GETLK`) over byte 0, which the
/// first hog holds: the answer is that lock.
fn getlock_unlck(ctx: &Ctx<'_>, out: &mut Outcome) {
    let reply = lock_file_open(ctx).and_then(|mut c| {
        c.getlock(1, lock::UNLCK, 0, 1, 99)
            .map_err(|e| format!("Tgetlock(UNLCK) of a held byte: {e}"))
    });
    match reply {
        Ok((kind, start, _, _)) => {
            out.note("getlock answered", 1);
            out.check(kind == lock::WRLCK && start == 0, || {
                format!("Tgetlock(UNLCK) of a held byte answered type {kind} at {start}, not the holder's write lock")
            });
        }
        Err(e) => out.fail(e),
    }
}

/// Locks (and a `Tgetlock`) with 65,535-byte client ids: each must be refused with
/// `EINVAL` rather than stored.
fn long_client_ids(ctx: &Ctx<'_>, out: &mut Outcome) {
    let id = vec![b'x'; LONGEST_CLIENT_ID];
    let r = lock_file_open(ctx).and_then(|mut c| {
        let got = c.rpc(&Tmsg::Getlock {
            fid: 1,
            lock_type: lock::WRLCK,
            start: LONG_ID_BASE,
            length: 1,
            proc_id: 7,
            client_id: &id,
        });
        if got != Err(Errno::EINVAL) {
            out.fail(format!(
                "Tgetlock with a 65,535-byte client id answered {:?}, not EINVAL",
                got.map(|_| "a lock")
            ));
        }
        let frames = one_byte_locks(LONG_ID_BASE, ctx.scale.long_id_locks, &id);
        let deadline = ctx.deadline().max(Instant::now() + Duration::from_secs(10));
        let (sent, drain) = pipelined(&c, frames, deadline)?;
        Ok((sent, drain.finish()))
    });
    match r {
        Ok((sent, t)) => {
            out.add("long-id locks sent", sent as u64);
            out.tally("long-id locks ", &t, &[Errno::EINVAL]);
            out.check(t.ok == 0, || {
                format!(
                    "{} locks with 65,535-byte client ids were answered with Rlock, not EINVAL",
                    t.ok
                )
            });
        }
        Err(e) => out.fail(format!("long client ids: {e}")),
    }
}

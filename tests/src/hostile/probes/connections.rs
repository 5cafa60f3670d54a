//! Probes on connections: holding slots without speaking, frames that never finish, and
//! clients that want all of the CPU.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ninep::wire::{getattr, Tmsg};

use super::{in_parallel, Ctx, Outcome, STALL};
use crate::hostile::honest::time_to_attach;
use crate::hostile::raw::{
    attached, closed_by_server, cycling_tag, frame, send_all, socket, Drain,
};

/// A TCP connection to the appliance's 9P port, nothing sent.
fn silent(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_nodelay(true).ok()?;
    Some(s)
}

/// Waits until `deadline` for every stream to be closed by the server; returns how many
/// were.
fn closed_by(streams: &[TcpStream], deadline: Instant) -> usize {
    let mut open: Vec<&TcpStream> = streams.iter().collect();
    let total = open.len();
    while !open.is_empty() && Instant::now() < deadline {
        open.retain(|s| !closed_by_server(s, Duration::from_millis(50)));
        if !open.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    total - open.len()
}

/// How long a burst of connections may take to reach the appliance. QEMU's user network
/// takes a burst from the host slowly (its listening socket's backlog is short; the
/// host's client retransmits the rest 1, 2, 4, 8 s ... apart), and some wait over a
/// minute: the appliance cannot close what has not reached it.
const BURST_ACCEPTED: Duration = Duration::from_secs(60);

/// When unversioned connections opened at `opened` must be gone by: the handshake
/// deadline twice over (the sweep runs every second; TCG is slow), and not before the
/// window's end.
fn handshake_deadline(ctx: &Ctx<'_>, opened: Instant) -> Instant {
    let by = opened + ctx.limits.handshake_timeout * 2 + Duration::from_secs(5);
    by.max(ctx.deadline())
}

/// Waits until every stream is closed, or, once the handshake deadline has passed, the
/// appliance holds no connection beyond the honest clients' on two readings a second
/// apart (the rest are still in QEMU's queue), or `BURST_ACCEPTED` is over. Returns how
/// many streams were closed and whether the appliance was seen holding none of them.
fn silent_ones_gone(ctx: &Ctx<'_>, streams: &[TcpStream], opened: Instant) -> (usize, bool) {
    let honest = ctx.scale.honest_clients as u64;
    let give_up = opened + ctx.limits.handshake_timeout + BURST_ACCEPTED;
    let mut open: Vec<&TcpStream> = streams.iter().collect();
    let mut quiet_readings = 0;
    while !open.is_empty() && Instant::now() < give_up {
        open.retain(|s| !closed_by_server(s, Duration::from_millis(20)));
        if Instant::now() >= handshake_deadline(ctx, opened) {
            let held = ctx.counter("connections").unwrap_or(u64::MAX);
            quiet_readings = if held <= honest {
                quiet_readings + 1
            } else {
                0
            };
            if quiet_readings >= 2 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    (
        streams.len() - open.len(),
        open.is_empty() || quiet_readings >= 2,
    )
}

/// (c) More connections than the limit that never send a byte. A new client must still
/// connect and attach within the attach bound (their slots are reclaimed: they have no
/// fids), and the appliance closes every one of them at the handshake deadline after it
/// accepted it.
pub fn silent_flood(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    let before = (
        ctx.counter("handshake_timeouts"),
        ctx.counter("slot_reclaims"),
    );
    let opened = Instant::now();
    let streams: Vec<TcpStream> = (0..ctx.scale.silent_conns)
        .filter_map(|_| silent(ctx.port))
        .collect();
    out.note("connections", streams.len() as u64);
    std::thread::sleep(Duration::from_secs(1));
    match time_to_attach(ctx.port) {
        Ok(took) => {
            out.note("ms to attach during the flood", took.as_millis() as u64);
            out.check(took <= ctx.attach_bound, || {
                format!(
                    "a new client took {took:?} to attach (bound {:?})",
                    ctx.attach_bound
                )
            });
        }
        Err(e) => out.fail(format!(
            "a new client could not attach during the flood: {e}"
        )),
    }
    let (closed, appliance_clear) = silent_ones_gone(ctx, &streams, opened);
    out.note("closed by the server", closed as u64);
    out.note("still queued in QEMU", (streams.len() - closed) as u64);
    out.check(appliance_clear, || {
        format!(
            "{:?} after the flood the appliance still holds silent connections ({} of {} closed)",
            opened.elapsed(),
            closed,
            streams.len()
        )
    });
    match ctx.counter_change("handshake_timeouts", before.0) {
        Ok(n) => {
            out.note("handshake timeouts", n);
            out.check(n > 0, || "no handshake timeout counted".into());
        }
        Err(e) => out.fail(e),
    }
    if let Ok(n) = ctx.counter_change("slot_reclaims", before.1) {
        out.note("slot reclaims", n);
    }
    out
}

/// How a slowloris connection misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slow {
    /// Two bytes of a size field, then nothing (never versioned).
    SizeField,
    /// A `Tversion`, one byte per second (never versioned in time).
    Drip,
    /// Versioned and attached, then the first 4 KiB of a 512 KiB `Twrite`.
    HalfWrite,
}

/// (d) Frames that never finish. Connections that never complete `Tversion` are closed
/// at the handshake deadline; attached ones with a half-sent frame stay (they are
/// mounts) until their memory is needed by others, and honest clients are served
/// throughout.
pub fn slowloris(ctx: &Ctx<'_>) -> Outcome {
    let kinds = [Slow::SizeField, Slow::Drip, Slow::HalfWrite];
    let opened = Instant::now();
    let results = in_parallel(ctx.scale.slowloris_conns, |i| {
        let kind = kinds[i % kinds.len()];
        let connected = Instant::now();
        let by = handshake_deadline(ctx, connected).max(connected + BURST_ACCEPTED / 4);
        (kind, slow_client(ctx, kind, by))
    });
    let mut out = Outcome::default();
    for (kind, r) in results {
        match r {
            Err(e) => out.fail(format!("{kind:?}: {e}")),
            Ok(closed) => {
                out.add(format!("{kind:?} connections"), 1);
                out.add(format!("{kind:?} closed by the server"), u64::from(closed));
                if kind != Slow::HalfWrite {
                    out.check(closed, || {
                        format!("an unversioned {kind:?} connection was still open {:?} after connecting", opened.elapsed())
                    });
                }
            }
        }
    }
    out
}

/// One slowloris connection until `by` (at least the window's end); returns whether the
/// server closed it.
fn slow_client(ctx: &Ctx<'_>, kind: Slow, by: Instant) -> Result<bool, String> {
    match kind {
        Slow::SizeField => {
            let mut s = silent(ctx.port).ok_or("no connection")?;
            s.write_all(&[0x00, 0x10]).map_err(|e| e.to_string())?;
            Ok(closed_by(std::slice::from_ref(&s), by) == 1)
        }
        Slow::Drip => {
            let mut s = silent(ctx.port).ok_or("no connection")?;
            let version = frame(
                ninep::wire::NOTAG,
                &Tmsg::Version {
                    msize: ctx.limits.msize,
                    version: ninep::wire::VERSION_9P2000_L,
                },
            );
            for byte in version.iter().take(version.len() - 1) {
                if s.write_all(std::slice::from_ref(byte)).is_err()
                    || closed_by_server(&s, Duration::from_secs(1))
                {
                    return Ok(true);
                }
                if Instant::now() >= by {
                    return Ok(false);
                }
            }
            Ok(closed_by(std::slice::from_ref(&s), by) == 1)
        }
        Slow::HalfWrite => {
            let c = attached(ctx.port, 0, "").map_err(|e| format!("attach: {e}"))?;
            let s = socket(&c).ok_or("connection lost during setup")?;
            let data = vec![0x42u8; 512 << 10];
            let write = frame(
                1,
                &Tmsg::Write {
                    fid: 0,
                    offset: 0,
                    data: ninep::wire::Data(&data),
                },
            );
            let sent = send_all(&s, [write[..4096].to_vec()], STALL);
            if sent.failed {
                return Ok(true);
            }
            std::thread::sleep(ctx.deadline().saturating_duration_since(Instant::now()));
            Ok(closed_by_server(&s, Duration::from_millis(200)))
        }
    }
}

/// Getattrs a fairness hog keeps outstanding (beyond what the server has answered).
const FAIRNESS_AHEAD: u64 = 512;

/// (h) Many connections pipelining `Tgetattr` as fast as the server answers, for the
/// window. Every one of them is served (none starves), and honest clients keep their
/// latency (the suite's bounds).
pub fn fairness(ctx: &Ctx<'_>) -> Outcome {
    let served = in_parallel(ctx.scale.fairness_conns, |_| {
        let c = attached(ctx.port, 0, "").map_err(|e| format!("a hog could not attach: {e}"))?;
        let s = socket(&c).ok_or("a hog lost its connection during setup")?;
        let drain = Drain::start(&s);
        let mut sent = 0u64;
        while Instant::now() < ctx.deadline() && !drain.ended() {
            // Stay a bounded distance ahead of the replies.
            if sent >= drain.replies() + FAIRNESS_AHEAD {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let batch = (sent..sent + 128).map(|i| {
                frame(
                    cycling_tag(i as usize),
                    &Tmsg::Getattr {
                        fid: 0,
                        request_mask: getattr::BASIC,
                    },
                )
            });
            let r = send_all(&s, batch, STALL);
            sent += r.frames as u64;
            if r.failed {
                break;
            }
        }
        Ok::<_, String>(drain.finish())
    });
    let mut out = Outcome::default();
    let mut per_hog = Vec::new();
    for r in served {
        match r {
            Ok(t) => {
                out.tally("", &t, &[]);
                out.add("shed", u64::from(t.closed_by_server));
                per_hog.push(t.replies());
            }
            Err(e) => out.fail(e),
        }
    }
    let min = per_hog.iter().copied().min().unwrap_or(0);
    let max = per_hog.iter().copied().max().unwrap_or(0);
    out.note("fewest replies to one hog", min);
    out.note("most replies to one hog", max);
    out.check(min > 0, || {
        "a pipelining connection got no replies at all".into()
    });
    out
}

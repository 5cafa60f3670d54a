//! Hostile clients against the server in memory: what one client can make the server
//! hold is bounded by its memory account, the others keep their service, deadlines close
//! connections that hold a slot without using it, and the server reclaims memory and
//! slots from clients that hold them without using them.

mod common;

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use common::{client, frame, model_server, poll, Local, Model};
use ninep::conn::{CloseReason, Connection, Transport};
use ninep::server::{Config, Server, Timeouts};
use ninep::testing::Client;
use ninep::wire::{open_flags::RDWR, Rmsg, Tmsg, XATTR_CREATE};
use vfs::Errno;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const SEC: u64 = 1_000_000_000;

thread_local! {
    /// The fake clock of this test's thread.
    static NOW: Cell<u64> = const { Cell::new(0) };
}

fn fake_now() -> u64 {
    NOW.with(Cell::get)
}

fn advance(ns: u64) {
    NOW.with(|c| c.set(c.get() + ns));
}

/// A server with a `limit`-byte client budget, the fake clock, msize 64 KiB.
fn server_with(limit: usize) -> Arc<Server<Model>> {
    let mut config = Config {
        max_msize: 64 * KIB as u32,
        clock: Some(fake_now),
        ..Config::default()
    };
    config.memory = config.memory_for(limit);
    model_server(config)
}

/// A versioned connection, fed by hand.
fn raw(server: &Arc<Server<Model>>) -> Connection<Model> {
    let mut conn = Connection::new(server.clone());
    conn.receive(&frame(
        0xffff,
        Tmsg::Version {
            msize: 64 * KIB as u32,
            version: b"9P2000.L",
        },
    ));
    poll(&mut conn);
    conn.take_output().expect("Rversion");
    conn
}

/// Feeds `f` to `conn` and polls; returns whether the whole frame was taken.
fn send(conn: &mut Connection<Model>, f: &[u8]) -> bool {
    let taken = conn.receive(f);
    poll(conn);
    taken == f.len()
}

/// Errno of an `Rlerror`, `None` for any other reply.
fn errno(reply: &[u8]) -> Option<Errno> {
    match Rmsg::decode(reply).expect("reply decodes").1 {
        Rmsg::Lerror { ecode } => Some(Errno(ecode)),
        _ => None,
    }
}

/// A file `name` at the root with `len` bytes and a 64 KiB `user.big` xattr.
fn big_file(c: &mut Client<Local<Model>>, name: &str, len: usize) {
    c.walk(0, 9, "").unwrap();
    c.lcreate(9, name, RDWR, 0o644).unwrap();
    let chunk = vec![7u8; 32 * KIB];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(chunk.len());
        c.write(9, off as u64, &chunk[..n]).unwrap();
        off += n;
    }
    c.clunk(9).unwrap();
    c.walk(0, 9, name).unwrap();
    c.xattrcreate(9, "user.big", 64 * KIB as u64, XATTR_CREATE)
        .unwrap();
    c.write(9, 0, &vec![1u8; 32 * KIB]).unwrap();
    c.write(9, 32 * KIB as u64, &vec![2u8; 32 * KIB]).unwrap();
    c.clunk(9).unwrap();
}

/// Attaches fid 0 and walks fid 1 to `name` (the root if empty) on a raw connection.
fn attach_and_walk(conn: &mut Connection<Model>, name: &[u8]) {
    let names = if name.is_empty() { vec![] } else { vec![name] };
    for f in [
        frame(
            1,
            Tmsg::Attach {
                fid: 0,
                afid: !0,
                uname: b"",
                aname: b"",
                n_uname: 0,
            },
        ),
        frame(
            2,
            Tmsg::Walk {
                fid: 0,
                newfid: 1,
                names,
            },
        ),
    ] {
        assert!(send(conn, &f));
        assert_eq!(errno(&conn.take_output().unwrap()), None);
    }
}

#[test]
fn an_xattr_walk_flood_is_bounded_and_others_keep_their_service() {
    let server = server_with(8 * MIB);
    let held_cap = server.config().memory.held_per_connection;
    let mut honest = client(&server);
    honest.attach(0, 0, "").unwrap();
    big_file(&mut honest, "f", 4 * KIB);
    // Two hostile connections bind a copy of the 64 KiB value into every fid they can.
    let mut hogs = [raw(&server), raw(&server)];
    let mut enomem = 0;
    for hog in &mut hogs {
        attach_and_walk(hog, b"f");
        for newfid in 100..4000u32 {
            let f = frame(
                3,
                Tmsg::Xattrwalk {
                    fid: 1,
                    newfid,
                    name: b"user.big",
                },
            );
            assert!(send(hog, &f));
            match errno(&hog.take_output().unwrap()) {
                None => {}
                Some(Errno::ENOMEM) => enomem += 1,
                Some(e) => panic!("xattrwalk: {e}"),
            }
            assert!(hog.session().account().held() <= held_cap);
        }
    }
    assert!(enomem > 7000, "only {enomem} walks refused");
    let m = server.memory();
    assert!(m.peak <= m.limit, "{m:?}");
    assert!(m.refused.xattrs > 0);
    assert!(server.stats().enomem_replies > 7000);
    // The honest client still works (its reservation, and the memory the hogs left).
    honest.walk(0, 1, "f").unwrap();
    honest.lopen(1, 0).unwrap();
    assert_eq!(honest.read(1, 0, 100).unwrap(), vec![7u8; 100]);
    assert_eq!(honest.xattrwalk(0, 2, "").unwrap(), 0);
    honest.clunk(2).unwrap();
    // Tearing the hogs down gives everything back.
    for hog in hogs {
        pollster::block_on(hog.shutdown());
    }
    let m = server.memory();
    assert_eq!(
        (m.charged.xattrs, m.charged.frames, m.charged.replies),
        (0, 0, 0)
    );
}

#[test]
fn unread_replies_stop_input_within_the_connection_limit() {
    let server = server_with(8 * MIB);
    let per_connection = server.config().memory.per_connection;
    let mut honest = client(&server);
    honest.attach(0, 0, "").unwrap();
    big_file(&mut honest, "f", 64 * KIB);
    let mut hog = raw(&server);
    attach_and_walk(&mut hog, b"f");
    assert!(send(&mut hog, &frame(3, Tmsg::Lopen { fid: 1, flags: 0 })));
    assert_eq!(errno(&hog.take_output().unwrap()), None);
    // Pipeline reads of the whole msize and never take a reply.
    let mut sent = 0;
    for tag in 10..1000u16 {
        let f = frame(
            tag,
            Tmsg::Read {
                fid: 1,
                offset: 0,
                count: 64 * KIB as u32,
            },
        );
        if !send(&mut hog, &f) {
            break;
        }
        sent += 1;
    }
    assert!(sent < 990, "the server kept taking requests ({sent})");
    let account = hog.session().account().clone();
    assert!(account.charged() <= per_connection);
    assert!(server.stats().memory_waits > 0);
    // Everyone else is served.
    honest.walk(0, 1, "f").unwrap();
    honest.lopen(1, 0).unwrap();
    assert_eq!(honest.read(1, 0, 10).unwrap(), vec![7u8; 10]);
    // Once the client reads, the rest of its requests are served.
    let mut replies = 0;
    for _ in 0..10_000 {
        while hog.take_output().is_some() {
            replies += 1;
        }
        poll(&mut hog);
        if hog.in_flight() == 0 && hog.output().is_empty() {
            break;
        }
    }
    assert!(replies >= sent);
}

#[test]
fn memory_is_reclaimed_from_a_client_that_does_not_read_its_replies() {
    NOW.with(|c| c.set(0));
    // A budget that five hogs with a few unread replies each fill (each may take a
    // quarter of it).
    let server = server_with(2 * MIB);
    let mut setup = client(&server);
    setup.attach(0, 0, "").unwrap();
    big_file(&mut setup, "f", 64 * KIB);
    drop(setup);
    let mut hogs = Vec::new();
    for _ in 0..5 {
        let mut hog = raw(&server);
        attach_and_walk(&mut hog, b"f");
        assert!(send(&mut hog, &frame(3, Tmsg::Lopen { fid: 1, flags: 0 })));
        hog.take_output().unwrap();
        for tag in 10..200u16 {
            let f = frame(
                tag,
                Tmsg::Read {
                    fid: 1,
                    offset: 0,
                    count: 64 * KIB as u32,
                },
            );
            if !send(&mut hog, &f) {
                break;
            }
        }
        hogs.push(hog);
    }
    assert!(server.memory().committed + 64 * KIB as u64 > server.memory().limit);
    // An honest client that needs more than its reservation cannot get it now...
    let mut honest = raw(&server);
    attach_and_walk(&mut honest, b"f");
    assert!(send(
        &mut honest,
        &frame(3, Tmsg::Lopen { fid: 1, flags: 0 })
    ));
    honest.take_output().unwrap();
    let read = frame(
        4,
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 64 * KIB as u32,
        },
    );
    // ...but once the hogs' replies have waited unread past the stall time, its request
    // makes the server close the biggest of them.
    advance(Timeouts::default().stall_ns + SEC);
    assert!(send(&mut honest, &read));
    let closed: Vec<_> = hogs
        .iter_mut()
        .map(|h| {
            poll(h);
            h.closing()
        })
        .collect();
    assert!(
        closed.contains(&Some(CloseReason::MemoryReclaimed)),
        "{closed:?}"
    );
    assert!(server.stats().memory_reclaims >= 1);
    // The shed connection's teardown gives its memory back and the request is served.
    for hog in hogs {
        if hog.closing().is_some() {
            pollster::block_on(hog.shutdown());
        }
    }
    poll(&mut honest);
    let reply = honest.take_output().expect("the honest read was served");
    assert_eq!(errno(&reply), None);
}

#[test]
fn a_connection_without_tversion_is_closed_after_the_handshake_deadline() {
    NOW.with(|c| c.set(0));
    let server = server_with(8 * MIB);
    let mut silent = Connection::new(server.clone());
    let mut versioned = raw(&server);
    advance(Timeouts::default().handshake_ns - 1);
    assert_eq!(server.sweep(), 0);
    advance(1);
    assert_eq!(server.sweep(), 1);
    poll(&mut silent);
    poll(&mut versioned);
    assert_eq!(silent.closing(), Some(CloseReason::HandshakeTimeout));
    // The versioned one has no fid either: it goes at the idle deadline.
    assert_eq!(versioned.closing(), None);
    advance(Timeouts::default().idle_ns);
    assert_eq!(server.sweep(), 1);
    poll(&mut versioned);
    assert_eq!(versioned.closing(), Some(CloseReason::IdleTimeout));
    assert_eq!(server.stats().handshake_timeouts, 1);
    assert_eq!(server.stats().idle_timeouts, 1);
}

#[test]
fn a_mount_stays_however_quiet_it_is() {
    NOW.with(|c| c.set(0));
    let server = server_with(8 * MIB);
    let mut mount = client(&server);
    mount.attach(0, 1000, "").unwrap();
    advance(7 * 24 * 3600 * SEC);
    assert_eq!(server.sweep(), 0);
    assert!(!server.reclaim_slot(), "a mount's slot is never reclaimed");
    mount.walk(0, 1, "").unwrap();
}

#[test]
fn a_new_client_takes_the_slot_of_the_quietest_connection_without_fids() {
    NOW.with(|c| c.set(0));
    let server = server_with(8 * MIB);
    let mut older = raw(&server);
    advance(SEC);
    let mut newer = raw(&server);
    let mut mount = raw(&server);
    attach_and_walk(&mut mount, b"");
    assert!(server.reclaim_slot());
    // The newer one has been quiet for less than the grace period: it is left alone.
    assert!(!server.reclaim_slot());
    for c in [&mut older, &mut newer, &mut mount] {
        poll(c);
    }
    assert_eq!(older.closing(), Some(CloseReason::SlotReclaimed));
    assert_eq!((newer.closing(), mount.closing()), (None, None));
    assert_eq!(server.stats().slot_reclaims, 1);
}

#[test]
fn an_unknown_version_leaves_the_session_unversioned() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    let (_, version) = c.version(8192, b"9P2000.u").unwrap();
    assert_eq!(version, b"unknown");
    assert_eq!(c.attach(0, 0, ""), Err(Errno::EPROTO));
    assert_eq!(c.walk(0, 1, ""), Err(Errno::EPROTO));
    c.version(8192, b"9P2000.L").unwrap();
    c.attach(0, 0, "").unwrap();
    assert_eq!(server.stats().unknown_versions, 1);
}

/// Creates file `f` at the root holding `data`, on a connection of its own.
fn create_f(server: &Arc<Server<Model>>, data: &[u8]) {
    let mut setup = client(server);
    setup.attach(0, 0, "").unwrap();
    setup.walk(0, 1, "").unwrap();
    setup.lcreate(1, "f", RDWR, 0o644).unwrap();
    if !data.is_empty() {
        setup.write(1, 0, data).unwrap();
    }
}

/// The frames of a session's start: `Tversion` at `msize`, then `Tattach` of fid 0 (tag 1).
fn version_and_attach(msize: u32) -> Vec<u8> {
    let mut input = frame(
        0xffff,
        Tmsg::Version {
            msize,
            version: b"9P2000.L",
        },
    );
    input.extend(frame(
        1,
        Tmsg::Attach {
            fid: 0,
            afid: !0,
            uname: b"",
            aname: b"",
            n_uname: 0,
        },
    ));
    input
}

/// A transport that has a request stream to give and takes every reply; serving a
/// request takes 100 µs of the fake clock. At each flush it records the bytes written
/// since the one before.
#[derive(Default)]
struct Pipelined {
    input: Vec<u8>,
    pos: usize,
    replies: usize,
    unflushed: usize,
    flushes: Vec<usize>,
}

impl Pipelined {
    /// A session's start, then `n` `Tgetattr`s of the root, all sent at once.
    fn getattrs(n: u16) -> Pipelined {
        let mut input = version_and_attach(8192);
        for tag in 2..2 + n {
            input.extend(frame(
                tag,
                Tmsg::Getattr {
                    fid: 0,
                    request_mask: 0x7ff,
                },
            ));
        }
        Pipelined {
            input,
            ..Pipelined::default()
        }
    }
}

impl Transport for Pipelined {
    type Error = ();
    fn poll_read(&mut self, _: &mut Context<'_>, buf: &mut [u8]) -> Poll<Result<usize, ()>> {
        let n = buf.len().min(self.input.len() - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(n))
    }
    fn poll_write(&mut self, _: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, ()>> {
        advance(100_000);
        self.replies += 1;
        self.unflushed += buf.len();
        Poll::Ready(Ok(buf.len()))
    }
    fn flush(&mut self) {
        self.flushes.push(core::mem::take(&mut self.unflushed));
    }
}

#[test]
fn a_pipelining_client_yields_the_cpu_after_its_quantum() {
    NOW.with(|c| c.set(0));
    let server = server_with(8 * MIB);
    let mut io = Pipelined::getattrs(1998);
    let conn = Connection::new(server.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let mut run = Box::pin(conn.run(&mut io));
    // A poll serves requests for its quantum (2 ms: 20 requests here), finishing the
    // round it is in (at most the 128 requests a connection may have outstanding), then
    // asks to be polled again.
    let mut polls = 0;
    while run.as_mut().poll(&mut cx).is_pending() {
        polls += 1;
        assert!(polls < 100_000, "never finished");
    }
    drop(run);
    assert_eq!(io.replies, 2000);
    assert!(polls >= 2000 / 128, "served everything in {polls} polls");
    assert!(server.stats().cpu_yields >= 2000 / 128);
}

#[test]
fn replies_made_together_are_flushed_together() {
    NOW.with(|c| c.set(0));
    let server = server_with(8 * MIB);
    let mut io = Pipelined::getattrs(32);
    let conn = Connection::new(server);
    let mut cx = Context::from_waker(Waker::noop());
    let mut run = Box::pin(conn.run(&mut io));
    while run.as_mut().poll(&mut cx).is_pending() {}
    drop(run);
    // Every byte written was flushed, none flushed twice, and the 34 replies of
    // requests that arrived together left in a few flushes, not one each.
    assert_eq!(io.unflushed, 0, "replies left unflushed");
    assert!(io.flushes.iter().all(|&n| n > 0), "{:?}", io.flushes);
    assert!(
        io.flushes.len() <= 4,
        "{} flushes: {:?}",
        io.flushes.len(),
        io.flushes
    );
}

#[test]
fn an_unfinished_frame_counts_as_unused_memory_after_the_stall_time() {
    NOW.with(|c| c.set(0));
    let server = server_with(256 * KIB);
    create_f(&server, &[7u8; 4096]);
    // Each slow client sends the start of a 64 KiB Twrite and stops.
    let write = frame(
        9,
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: ninep::wire::Data(&[5u8; 64 * KIB - 100]),
        },
    );
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut c = raw(&server);
        attach_and_walk(&mut c, b"f");
        // The last ones may find the budget spent: they wait for memory.
        send(&mut c, &write[..1000]);
        slow.push(c);
    }
    let mut honest = raw(&server);
    attach_and_walk(&mut honest, b"f");
    assert!(send(
        &mut honest,
        &frame(3, Tmsg::Lopen { fid: 1, flags: 0 })
    ));
    honest.take_output().unwrap();
    advance(Timeouts::default().stall_ns);
    let read = frame(
        4,
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 60 * KIB as u32,
        },
    );
    assert!(send(&mut honest, &read));
    assert!(
        honest.take_output().is_none(),
        "the budget had room after all"
    );
    let mut shed = 0;
    for c in &mut slow {
        poll(c);
        shed += usize::from(c.closing() == Some(CloseReason::MemoryReclaimed));
    }
    assert!(shed >= 1, "no slow client was shed");
}

#[test]
fn lock_records_are_charged_to_their_connection_and_given_back() {
    // 1 MiB of budget: an eighth (128 KiB) for a connection's held state.
    let server = server_with(MIB);
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    let mut granted = 0u64;
    let refused = loop {
        match c.lock(1, ninep::wire::lock::WRLCK, 2 * granted, 1, 1) {
            Ok(_) => granted += 1,
            Err(e) => break e,
        }
        assert!(granted < 10_000, "no limit");
    };
    assert_eq!(refused, Errno::ENOLCK);
    let account = c.io.conn.session().account().clone();
    assert_eq!(
        account.charged_for(ninep::memory::Use::Locks),
        server.lock_bytes(c.io.conn.session())
    );
    assert!(account.held() <= server.config().memory.held_per_connection);
    assert!(server.memory().refused.locks > 0);
    // Closing the file drops its locks and their memory.
    c.clunk(1).unwrap();
    assert_eq!(account.charged_for(ninep::memory::Use::Locks), 0);
    assert_eq!(server.lock_count(), 0);
}

#[test]
fn one_address_cannot_take_every_connection_slot() {
    let server = model_server(Config {
        max_conns_per_client: 3,
        ..Config::default()
    });
    let guest: std::net::IpAddr = "10.0.2.7".parse().unwrap();
    let other: std::net::IpAddr = "10.0.2.8".parse().unwrap();
    let mut open = Vec::new();
    for _ in 0..3 {
        assert!(server.admit(Some(guest)));
        open.push(Connection::from_peer(server.clone(), guest));
    }
    assert!(!server.admit(Some(guest)), "a fourth from the same guest");
    assert!(server.admit(Some(other)), "another guest is let in");
    assert_eq!(server.stats().client_conn_limit_hits, 1);
    // A connection being shed no longer counts.
    open[0].session().request_close(CloseReason::IdleTimeout);
    assert!(server.admit(Some(guest)));
}

/// A transport that gives its whole input in the first reads, then waits (as a client
/// that sent one big request and waits for its reply), and records whether its task was
/// woken.
struct SentWhole {
    input: Vec<u8>,
    pos: usize,
    replies: Vec<u8>,
}

impl Transport for SentWhole {
    type Error = ();
    fn poll_read(&mut self, _: &mut Context<'_>, buf: &mut [u8]) -> Poll<Result<usize, ()>> {
        if self.pos == self.input.len() {
            // Nothing more comes: a wake-up can only come from the server.
            return Poll::Pending;
        }
        let n = buf.len().min(self.input.len() - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(n))
    }
    fn poll_write(&mut self, _: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, ()>> {
        self.replies.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
}

/// Counts its wakes.
#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 26: a connection that read a big request's first bytes while the memory budget
/// was spent waits for memory; when memory comes back it must take up the bytes it had
/// already read, not wait for more from its client (which sent everything and waits for
/// the reply): the wake-up must not be lost.
#[test]
fn a_connection_waiting_for_memory_resumes_its_read_bytes_when_memory_comes_back() {
    NOW.with(|c| c.set(0));
    let server = server_with(512 * KIB);
    create_f(&server, &[]);
    // Another client's connections hold every byte the budget has (each up to its own
    // share; the victim's connection was opened first, as in the sequence).
    let victim = Connection::new(server.clone());
    let hogs: Vec<_> = (0..8).map(|_| raw(&server)).collect();
    let mut charges = Vec::new();
    for c in &hogs {
        let account = c.session().account().clone();
        while let Ok(charge) = account.charge(ninep::memory::Use::Frames, 4 * KIB) {
            charges.push(charge);
        }
    }
    assert!(
        server.memory().committed >= server.memory().limit - 8 * KIB as u64,
        "the budget is spent: {:?}",
        server.memory()
    );
    // The victim sends a 60 KiB Twrite in one piece: its first read takes the size
    // field and more into the connection's staging buffer; the frame waits for memory.
    let mut input = version_and_attach(64 * KIB as u32);
    input.extend(frame(
        2,
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"f"],
        },
    ));
    input.extend(frame(
        3,
        Tmsg::Lopen {
            fid: 1,
            flags: RDWR,
        },
    ));
    input.extend(frame(
        4,
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: ninep::wire::Data(&[9u8; 60 * KIB]),
        },
    ));
    let mut io = SentWhole {
        input,
        pos: 0,
        replies: Vec::new(),
    };
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut run = Box::pin(victim.run(&mut io));
    // Polls while the task has been woken since its last poll, as an executor would.
    fn settle<F: Future>(mut run: std::pin::Pin<&mut F>, cx: &mut Context<'_>, wakes: &Wakes) {
        loop {
            let before = wakes.0.load(std::sync::atomic::Ordering::SeqCst);
            assert!(run.as_mut().poll(cx).is_pending());
            if wakes.0.load(std::sync::atomic::Ordering::SeqCst) == before {
                break;
            }
        }
    }
    settle(run.as_mut(), &mut cx, &wakes);
    assert!(
        server.stats().memory_waits > 0,
        "the victim's frame did not wait for memory"
    );
    // The other client lets go of its memory; its connections close.
    drop(charges);
    drop(hogs);
    settle(run.as_mut(), &mut cx, &wakes);
    drop(run);
    let mut replies = Vec::new();
    let mut rest = &io.replies[..];
    while rest.len() >= 4 {
        let size = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        replies.push(Rmsg::decode(&rest[..size]).unwrap().1.msg_type());
        rest = &rest[size..];
    }
    // Rversion, Rattach, Rwalk, Rlopen, then the Rwrite (119) of the request that waited.
    assert_eq!(replies.len(), 5, "replies {replies:?}");
    assert_eq!(replies[4], 119, "replies {replies:?}");
}

#[test]
fn a_fresh_attach_waits_for_memory_reclaimed_from_hogs_rather_than_failing() {
    // No reservations: the last bytes of the budget are anyone's.
    let mut config = Config {
        max_msize: 64 * KIB as u32,
        clock: Some(fake_now),
        ..Config::default()
    };
    config.memory = config.memory_for(2 * MIB);
    config.memory.reserve = 0;
    let server = model_server(config);
    let mut setup = client(&server);
    setup.attach(0, 0, "").unwrap();
    big_file(&mut setup, "f", 4 * KIB);
    drop(setup);
    // Hogs (one tenant, as every client of the appliance behind QEMU's user network is)
    // bind a copy of the 64 KiB value into fids until the budget refuses them (or a
    // hog below its share waits for memory reclaimed from the others).
    let mut hogs = Vec::new();
    let mut full = false;
    while !full {
        let mut hog = raw(&server);
        attach_and_walk(&mut hog, b"f");
        for newfid in 100..200u32 {
            let walk = Tmsg::Xattrwalk {
                fid: 1,
                newfid,
                name: b"user.big",
            };
            assert!(send(&mut hog, &frame(3, walk)));
            match hog.take_output() {
                None => full = true,
                Some(r) if errno(&r) == Some(Errno::ENOMEM) => {
                    full = server.memory().committed + 64 * KIB as u64 > server.memory().limit
                }
                Some(_) => continue,
            }
            break;
        }
        hogs.push(hog);
        assert!(hogs.len() < 64, "the budget never filled");
    }
    // The bytes left, fewer than a value's, go to fids.
    let mut filler = raw(&server);
    attach_and_walk(&mut filler, b"");
    for newfid in 1000..9000u32 {
        let clone = Tmsg::Walk {
            fid: 1,
            newfid,
            names: vec![],
        };
        assert!(send(&mut filler, &frame(4, clone)));
        match filler.take_output() {
            Some(r) if errno(&r).is_none() => continue,
            _ => break,
        }
    }
    hogs.push(filler);
    // A new mount's attach needs a fid the budget has no room for: it waits while the
    // server closes a hog holding more than its share...
    let mut honest = raw(&server);
    let attach = Tmsg::Attach {
        fid: 0,
        afid: !0,
        uname: b"",
        aname: b"",
        n_uname: 0,
    };
    assert!(send(&mut honest, &frame(1, attach)));
    if let Some(reply) = honest.take_output() {
        panic!("answered before memory came back: {:?}", errno(&reply));
    }
    assert!(server.stats().reclaim_waits >= 1);
    let mut closed = 0;
    for hog in &mut hogs {
        poll(hog);
        if hog.closing() == Some(CloseReason::MemoryReclaimed) {
            closed += 1;
        }
    }
    assert!(closed >= 1);
    // ...and is answered once that hog's teardown gives its memory back.
    for hog in hogs {
        if hog.closing().is_some() {
            pollster::block_on(hog.shutdown());
        }
    }
    poll(&mut honest);
    let reply = honest.take_output().expect("the attach was answered");
    assert_eq!(errno(&reply), None);
}

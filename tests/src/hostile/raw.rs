//! Raw 9P over TCP, as a hostile client speaks it: frames built with `ninep::wire` and
//! sent without waiting for their replies, replies read (or not) on another thread and
//! tallied by outcome.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ninep::testing::Client;
use ninep::wire::{Rmsg, Tmsg};
use vfs::Errno;

use crate::ninep::{connect_lossy_timed, Handshake, Lossy, GONE};

/// The symbolic name of errno `e` (`E37` for one that `vfs::Errno` cannot name).
pub fn errno_name(e: u32) -> String {
    match Errno(e) {
        GONE => "ECONNRESET".into(),
        known if known.name() != "E?" => known.name().into(),
        _ => format!("E{e}"),
    }
}

/// How long a probe waits for the appliance to take a new connection.
pub const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// The frame of `msg` with `tag`.
pub fn frame(tag: u16, msg: &Tmsg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(tag, &mut out).expect("request encodes");
    out
}

/// The tag of the `i`-th request of a long pipelined run: 1..=60000, round and round.
/// A connection has at most a few thousand requests outstanding (its in-flight limit
/// plus what the socket buffers hold), so a tag comes back only long after its reply.
pub fn cycling_tag(i: usize) -> u16 {
    (i % 60_000) as u16 + 1
}

/// A versioned connection (msize 1 MiB) attached as `uid` to export `aname`, with fid 0
/// at the export's root. `Err` says why not (the errno of a refused attach, or that no
/// connection could be made).
pub fn attached(port: u16, uid: u32, aname: &str) -> Result<Client<Lossy>, Errno> {
    attached_timed(port, uid, aname).map(|(c, _, _)| c)
}

/// [`attached`], and how long its parts took: making the connection ([`Handshake`]:
/// `connect()`, `Tversion`, failed tries) and the `Tattach` exchange.
pub fn attached_timed(
    port: u16,
    uid: u32,
    aname: &str,
) -> Result<(Client<Lossy>, Handshake, Duration), Errno> {
    let (mut c, handshake) = connect_lossy_timed(port, CONNECT_WAIT);
    let t = Instant::now();
    c.attach(0, uid, aname)?;
    Ok((c, handshake.unwrap_or_default(), t.elapsed()))
}

/// A clone of the client's socket, for raw frames; `None` once the connection is gone.
pub fn socket(c: &Client<Lossy>) -> Option<TcpStream> {
    c.io.stream().and_then(|s| s.try_clone().ok())
}

/// How a run of [`send_all`] ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Frames written whole.
    pub frames: usize,
    /// The server stopped taking bytes (nothing was taken for the stall time): it
    /// applies backpressure.
    pub blocked: bool,
    /// The connection failed (closed or reset by the server).
    pub failed: bool,
}

/// Writes `frames` one after another, as fast as the server takes them. Stops when
/// nothing was taken for `stall` (the server stopped reading) or the connection fails.
pub fn send_all(
    stream: &TcpStream,
    frames: impl IntoIterator<Item = Vec<u8>>,
    stall: Duration,
) -> Sent {
    let mut sent = Sent::default();
    if stream.set_write_timeout(Some(stall)).is_err() {
        sent.failed = true;
        return sent;
    }
    let mut w = stream;
    for f in frames {
        match w.write_all(&f) {
            Ok(()) => sent.frames += 1,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                sent.blocked = true;
                break;
            }
            Err(_) => {
                sent.failed = true;
                break;
            }
        }
    }
    sent
}

/// Replies counted by outcome.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Replies that were not `Rlerror`.
    pub ok: u64,
    /// `Rlerror`s by errno.
    pub errors: BTreeMap<u32, u64>,
    /// Frames that did not decode as a reply (a server bug).
    pub undecodable: u64,
    /// `(tag, type)` of every reply in arrival order, if recording was asked for.
    pub order: Vec<(u16, u8)>,
    /// The `Rlock` statuses, by status.
    pub lock_status: BTreeMap<u8, u64>,
    /// The server ended the connection (EOF or reset) before we stopped reading.
    pub closed_by_server: bool,
}

impl Tally {
    /// Replies of any kind.
    pub fn replies(&self) -> u64 {
        self.ok + self.errors.values().sum::<u64>()
    }

    /// `Rlerror`s with `e`.
    pub fn errno(&self, e: Errno) -> u64 {
        self.errors.get(&e.0).copied().unwrap_or(0)
    }

    /// `Rlerror`s with an errno not in `allowed`, as `"ENAME×count"` strings.
    pub fn unexpected(&self, allowed: &[Errno]) -> Vec<String> {
        self.errors
            .iter()
            .filter(|(e, _)| !allowed.contains(&Errno(**e)))
            .map(|(e, n)| format!("{}×{n}", errno_name(*e)))
            .collect()
    }

    fn count(&mut self, reply: &[u8], record: bool) {
        match Rmsg::decode(reply) {
            Ok((tag, msg)) => {
                if record {
                    self.order.push((tag, msg.msg_type()));
                }
                match msg {
                    Rmsg::Lerror { ecode } => *self.errors.entry(ecode).or_default() += 1,
                    Rmsg::Lock { status } => {
                        *self.lock_status.entry(status).or_default() += 1;
                        self.ok += 1;
                    }
                    _ => self.ok += 1,
                }
            }
            Err(_) => self.undecodable += 1,
        }
    }

    /// Adds `other`'s counts to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.ok += other.ok;
        self.undecodable += other.undecodable;
        for (e, n) in &other.errors {
            *self.errors.entry(*e).or_default() += n;
        }
        for (s, n) in &other.lock_status {
            *self.lock_status.entry(*s).or_default() += n;
        }
        self.closed_by_server |= other.closed_by_server;
    }
}

/// A thread reading and tallying the replies of one connection until the server ends
/// it or [`Drain::finish`] stops it.
#[derive(Debug)]
pub struct Drain {
    stream: TcpStream,
    stopping: Arc<AtomicBool>,
    replies: Arc<AtomicU64>,
    thread: JoinHandle<Tally>,
}

impl Drain {
    /// Starts reading `stream`'s replies (from a clone of it).
    pub fn start(stream: &TcpStream) -> Drain {
        Drain::start_recording(stream, false)
    }

    /// Like [`Drain::start`]; with `record`, the tally keeps every reply's tag and type
    /// in arrival order.
    pub fn start_recording(stream: &TcpStream, record: bool) -> Drain {
        let mut reader = stream.try_clone().expect("cloning a socket");
        // The reader blocks until a reply comes or the connection ends; `finish` shuts
        // the socket down to end it.
        let _ = reader.set_read_timeout(None);
        let stopping = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(AtomicU64::new(0));
        let (stop, count) = (stopping.clone(), replies.clone());
        let thread = std::thread::spawn(move || {
            let mut tally = Tally::default();
            loop {
                match read_reply(&mut reader) {
                    Ok(reply) => {
                        tally.count(&reply, record);
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {
                        tally.closed_by_server = !stop.load(Ordering::SeqCst);
                        return tally;
                    }
                }
            }
        });
        Drain {
            stream: stream.try_clone().expect("cloning a socket"),
            stopping,
            replies,
            thread,
        }
    }

    /// Whether the reading has ended (the server closed the connection).
    pub fn ended(&self) -> bool {
        self.thread.is_finished()
    }

    /// Replies read so far.
    pub fn replies(&self) -> u64 {
        self.replies.load(Ordering::SeqCst)
    }

    /// Waits until `n` replies have come, the connection has ended, or `deadline`.
    pub fn wait_for(&self, n: u64, deadline: Instant) {
        while self.replies() < n && !self.ended() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops reading (shutting the connection down both ways) and returns the tally.
    pub fn finish(self) -> Tally {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.thread.join().expect("the reply reader panicked")
    }

    /// Lets the reader run for up to `wait` or until the server ends the connection,
    /// then [`Drain::finish`]es.
    pub fn finish_after(self, wait: Duration) -> Tally {
        self.wait_for(u64::MAX, Instant::now() + wait);
        self.finish()
    }
}

/// Reads one reply frame; frames above 16 MiB count as a broken stream.
fn read_reply(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let len = u32::from_le_bytes(size) as usize;
    if !(7..=(16 << 20)).contains(&len) {
        return Err(std::io::Error::other(format!("reply frame size {len}")));
    }
    let mut frame = size.to_vec();
    frame.resize(len, 0);
    s.read_exact(&mut frame[4..])?;
    Ok(frame)
}

/// Whether the server has closed `stream` (EOF or reset), looking for up to `wait`.
/// Bytes that arrive meanwhile are read and dropped.
pub fn closed_by_server(stream: &TcpStream, wait: Duration) -> bool {
    let Ok(mut s) = stream.try_clone() else {
        return true;
    };
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// The errno of an `Rlerror` frame, `None` for any other reply.
pub fn errno_of(reply: &[u8]) -> Option<Errno> {
    match Rmsg::decode(reply) {
        Ok((_, Rmsg::Lerror { ecode })) => Some(Errno(ecode)),
        _ => None,
    }
}

/// Whether `e` means the connection is gone (the [`Lossy`] client's answer).
pub fn is_gone(e: Errno) -> bool {
    e == GONE
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_closed_connection_is_seen_closed_and_an_open_one_open() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let closing = TcpStream::connect(("127.0.0.1", port)).unwrap();
        drop(l.accept().unwrap());
        let staying = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _kept = l.accept().unwrap();
        assert!(closed_by_server(&closing, Duration::from_secs(5)));
        assert!(!closed_by_server(&staying, Duration::from_millis(100)));
    }
}

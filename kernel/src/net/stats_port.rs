//! The counters service (`stats=PORT`, default 5641): a read-only TCP port that answers
//! each connection with a snapshot of the appliance's counters and closes it — `nc
//! ADDR 5641` prints JSON, `echo stat | nc ADDR 5641` prints `/sys/block`-style lines,
//! `curl http://ADDR:5641/` works too, and Prometheus scrapes `http://ADDR:5641/metrics`.
//! The request formats are `metrics::endpoint`'s.
//!
//! It changes nothing and holds nothing between connections. Clients outside its
//! allow-list (`stats_allow=`, default `allow=`) are reset at once, and counted. At most
//! [`MAX_CLIENTS`] are answered at once (more are reset); each gets small buffers.

use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::future::poll_fn;
use core::task::Poll;
use core::time::Duration;

use super::sockets::SockId;
use ninep::server::AllowList;
use smoltcp::socket::tcp::{self, State};

use super::stack::Stack;
use super::stats::Counter;
use crate::report::Snapshot;
use crate::task;
use metrics::endpoint::Request;

/// Clients answered at once.
pub const MAX_CLIENTS: usize = 4;
/// How long a client may take to send its request line; one that sends nothing gets the
/// JSON document after this.
pub const REQUEST_WAIT: Duration = Duration::from_millis(250);
/// How long sending the answer and closing may take before the connection is reset.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request line read.
const MAX_REQUEST: usize = 256;
const RX_BUFFER: usize = 1024;
const TX_BUFFER: usize = 16 * 1024;

/// What the service reports.
#[allow(async_fn_in_trait)]
pub trait Source {
    /// The counters now.
    async fn snapshot(&self) -> Snapshot;
}

/// The counters service's own counters.
#[derive(Debug, Default)]
pub struct PortStats {
    /// Connections reset at once: the client's address is not in the allow-list.
    pub refused: Counter,
}

/// Says (log line and `listening` event) that the counters service listens on `port`
/// for the clients `allow` admits: called as [`run`] is spawned, so that it comes before
/// the appliance says it is ready.
pub fn announce(port: u16, allow: &AllowList) {
    log::info!(
        "stats: counters service on port {port}, clients: {allow} (JSON; `stat` for /sys/block-style lines; GET /metrics for Prometheus)"
    );
    crate::event::emit(crate::event::Event::Listening {
        service: "stats",
        address: None,
        port,
        max_conns: None,
        exports: alloc::vec::Vec::new(),
        clients: Some(crate::event::Text::display(allow)),
    });
}

/// Serves `source` on TCP `port` to the clients `allow` admits, for as long as the
/// appliance runs ([`announce`] it first).
pub async fn run<S: Source + 'static>(
    stack: Arc<Stack>,
    port: u16,
    allow: AllowList,
    stats: Rc<PortStats>,
    source: Rc<S>,
) {
    let busy = Rc::new(Cell::new(0usize));
    loop {
        let Some(h) = listen(&stack, port) else {
            task::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let (state, peer) = poll_fn(|cx| {
            stack.peek_tcp(h, |s| match s.state() {
                State::Listen | State::SynReceived => {
                    s.register_recv_waker(cx.waker());
                    Poll::Pending
                }
                state => Poll::Ready((state, s.remote_endpoint())),
            })
        })
        .await;
        let admitted = allow.admits(peer.map(|ep| ep.addr.into()));
        if !admitted && state != State::Closed {
            stats.refused.inc();
            log::debug!("stats: {peer:?} refused: not in stats_allow");
        }
        if state == State::Closed || !admitted || busy.get() >= MAX_CLIENTS {
            // A handshake that failed, a client not allowed, or too many clients: reset
            // and listen afresh.
            stack.reset_and_remove(h).await;
            continue;
        }
        busy.set(busy.get() + 1);
        let (stack, source, busy) = (stack.clone(), source.clone(), busy.clone());
        task::spawn(async move {
            answer(&stack, h, &*source).await;
            stack.remove(h);
            busy.set(busy.get() - 1);
        });
    }
}

fn listen(stack: &Stack, port: u16) -> Option<SockId> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; RX_BUFFER]),
        tcp::SocketBuffer::new(vec![0u8; TX_BUFFER]),
    );
    s.set_nagle_enabled(false);
    if let Err(e) = s.listen(port) {
        log::error!("stats: listen on port {port}: {e:?}");
        return None;
    }
    Some(stack.add(s))
}

/// Reads the request line (briefly), answers, closes.
async fn answer<S: Source>(stack: &Stack, h: SockId, source: &S) {
    let socket = stack.cell(h);
    let with = |f: &mut dyn FnMut(&mut tcp::Socket<'static>)| socket.with(f);
    let mut line: Vec<u8> = Vec::new();
    let read_line = poll_fn(|cx| {
        let mut done = false;
        with(&mut |s| {
            let mut chunk = [0u8; 64];
            while !done && s.can_recv() {
                match s.recv_slice(&mut chunk) {
                    Ok(n) => {
                        line.extend_from_slice(&chunk[..n]);
                        done = line.contains(&b'\n') || line.len() >= MAX_REQUEST;
                    }
                    Err(_) => done = true,
                }
            }
            if !s.may_recv() {
                done = true;
            } else if !done {
                s.register_recv_waker(cx.waker());
            }
        });
        stack.kick();
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    let _ = task::timeout(REQUEST_WAIT, read_line).await;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let request = Request::parse(&line[..end]);
    let out = request.answer(&source.snapshot().await);

    let mut sent = 0;
    let send = poll_fn(|cx| {
        let mut result = Poll::Pending;
        with(&mut |s| {
            while sent < out.len() && s.can_send() {
                match s.send_slice(&out[sent..]) {
                    Ok(n) if n > 0 => sent += n,
                    _ => break,
                }
            }
            if sent == out.len() || !s.may_send() {
                s.close();
                result = Poll::Ready(());
            } else {
                s.register_send_waker(cx.waker());
            }
        });
        stack.kick();
        result
    });
    let closed = poll_fn(|cx| {
        let mut result = Poll::Pending;
        with(&mut |s| match s.state() {
            State::Closed | State::TimeWait => result = Poll::Ready(()),
            _ => s.register_send_waker(cx.waker()),
        });
        result
    });
    let finished = async {
        send.await;
        closed.await;
    };
    if task::timeout(ANSWER_TIMEOUT, finished).await.is_err() {
        with(&mut |s| s.abort());
        stack.kick();
        super::stack::yield_now().await;
    }
}

//! The serving policy (`ninep::service`) over an in-memory endpoint: admission and its
//! refusals, placement on workers, how a connection's end is classified and closed, and
//! the shutdown's polite close and shed.

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{frame, model_server, Model};
use futures_util::future::join;
use ninep::conn::Transport;
use ninep::server::{AllowList, Config, Export};
use ninep::service::{Endpoint, Refusal, Runtime, Service, ServiceConfig};
use ninep::wire::{Rmsg, Tmsg, NOTAG};

/// The type byte of `Rversion`.
const RVERSION: u8 = 101;

/// What a test sees of an [`Pipe`]'s life.
#[derive(Debug, Default)]
struct Wire {
    /// Bytes the client sent that the server has not read.
    input: VecDeque<u8>,
    /// The client closed its side (FIN).
    eof: bool,
    /// Bytes the server sent.
    output: Vec<u8>,
    /// The server's task, waiting for input.
    reader: Option<Waker>,
    closed: bool,
    aborted: bool,
    released: bool,
}

/// An in-memory connection whose client side the test holds.
#[derive(Clone, Debug, Default)]
struct Pipe(Arc<Mutex<Wire>>);

impl Pipe {
    /// A connection whose client has sent `bytes`.
    fn with_input(bytes: &[u8]) -> Pipe {
        let p = Pipe::default();
        p.0.lock().unwrap().input.extend(bytes);
        p
    }

    /// The client closes its side.
    fn hang_up(&self) {
        let mut w = self.0.lock().unwrap();
        w.eof = true;
        if let Some(r) = w.reader.take() {
            r.wake();
        }
    }

    /// The types of the replies the server sent.
    fn reply_types(&self) -> Vec<u8> {
        let w = self.0.lock().unwrap();
        let mut out = Vec::new();
        let mut rest = &w.output[..];
        while rest.len() >= 4 {
            let size = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            let (tag, r) = Rmsg::decode(&rest[..size]).unwrap();
            assert_eq!(tag, NOTAG);
            out.push(r.msg_type());
            rest = &rest[size..];
        }
        out
    }

    fn state(&self) -> (bool, bool, bool) {
        let w = self.0.lock().unwrap();
        (w.closed, w.aborted, w.released)
    }
}

impl Transport for Pipe {
    type Error = ();

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<Result<usize, ()>> {
        let mut w = self.0.lock().unwrap();
        if !w.input.is_empty() {
            let n = buf.len().min(w.input.len());
            for (b, v) in buf.iter_mut().zip(w.input.drain(..n)) {
                *b = v;
            }
            return Poll::Ready(Ok(n));
        }
        if w.eof {
            return Poll::Ready(Ok(0));
        }
        w.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_write(&mut self, _: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, ()>> {
        self.0.lock().unwrap().output.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
}

impl Endpoint for Pipe {
    fn close(&mut self) {
        self.0.lock().unwrap().closed = true;
    }

    fn poll_closed(&mut self, _: &mut Context<'_>, _stopping: bool) -> Poll<()> {
        Poll::Ready(())
    }

    async fn abort(&mut self) {
        self.0.lock().unwrap().aborted = true;
    }

    fn was_reset(&mut self) -> bool {
        false
    }

    fn rx_bytes(&self) -> u64 {
        0
    }

    fn tx_bytes(&self) -> u64 {
        self.0.lock().unwrap().output.len() as u64
    }

    fn release(self) {
        self.0.lock().unwrap().released = true;
    }
}

/// A runtime whose sleeps never end: no timeout passes.
struct Timeless;

impl Runtime for Timeless {
    fn sleep(&self, _: Duration) -> impl Future<Output = ()> {
        std::future::pending()
    }
}

/// A runtime whose sleeps end at once: every timeout passes at its first wait.
struct Instant;

impl Runtime for Instant {
    fn sleep(&self, _: Duration) -> impl Future<Output = ()> {
        std::future::ready(())
    }
}

fn service(config: Config, max_conns: usize, workers: usize) -> Arc<Service<Model>> {
    Arc::new(Service::new(
        model_server(config),
        ServiceConfig {
            max_conns,
            max_conns_per_tenant: max_conns,
            workers,
            stack_worker: None,
            worker_noun: "worker",
        },
    ))
}

fn peer(addr: &str) -> Option<SocketAddr> {
    Some(addr.parse().unwrap())
}

fn version() -> Vec<u8> {
    frame(
        NOTAG,
        Tmsg::Version {
            msize: 65536,
            version: b"9P2000.L",
        },
    )
}

#[test]
fn admission_refuses_unknown_clients_and_a_full_house_and_spreads_the_rest() {
    let config = Config {
        allow: AllowList::parse("10.0.0.0/8").unwrap(),
        ..Config::default()
    };
    let s = service(config, 3, 3);
    assert_eq!(
        s.admit(peer("192.0.2.1:700"), 0..3).map(|a| a.worker),
        Err(Refusal::NotAllowed)
    );
    assert_eq!(s.server().stats().refused_connections, 1);
    let admitted: Vec<_> = (0..3)
        .map(|i| s.admit(peer(&format!("10.0.0.{i}:700")), 0..3).unwrap())
        .collect();
    let workers: Vec<_> = admitted.iter().map(|a| a.worker).collect();
    assert_eq!(workers, [0, 1, 2], "one connection per worker");
    // At the limit, with no idle connection whose slot could be reclaimed.
    assert_eq!(
        s.admit(peer("10.0.0.9:700"), 0..3).map(|a| a.worker),
        Err(Refusal::Full)
    );
    assert_eq!(s.stats().refused.get(), 1);
    assert_eq!(s.stats().active(), 3);
    // A connection that never reached its worker counts as ended.
    s.abandon(1);
    assert_eq!(s.stats().active(), 2);
    assert_eq!(s.stats().worker(1).active(), 0);
    assert_eq!(
        s.admit(peer("10.0.0.9:700"), [1, 2]).map(|a| a.worker),
        Ok(1),
        "only the workers offered"
    );
}

#[test]
fn a_connection_its_peer_closes_is_answered_closed_politely_and_released() {
    let s = service(Config::default(), 4, 2);
    let pipe = Pipe::with_input(&version());
    pipe.hang_up();
    let admitted = s.admit(peer("127.0.0.1:1"), 0..2).unwrap();
    pollster::block_on(s.serve(&Timeless, pipe.clone(), peer("127.0.0.1:1"), admitted));
    assert_eq!(pipe.reply_types(), [RVERSION]);
    assert_eq!(
        pipe.state(),
        (true, false, true),
        "closed, not reset, released"
    );
    let st = s.stats();
    assert_eq!(
        (st.accepted.get(), st.closed.get(), st.peer_closed.get()),
        (1, 1, 1)
    );
    assert_eq!(st.active(), 0);
}

#[test]
fn a_shutdown_closes_idle_connections_politely() {
    let s = service(Config::default(), 4, 1);
    let pipe = Pipe::with_input(&version());
    let admitted = s.admit(peer("127.0.0.1:1"), [0]).unwrap();
    let (_, drained) = pollster::block_on(join(
        s.serve(&Timeless, pipe.clone(), peer("127.0.0.1:1"), admitted),
        s.drain(&Timeless, Duration::from_secs(5)),
    ));
    assert_eq!((drained.asked, drained.shed), (1, 0));
    assert_eq!(pipe.reply_types(), [RVERSION], "answered first");
    assert_eq!(pipe.state(), (true, false, true), "FIN, not a reset");
    assert_eq!(s.stats().shutdown_closed.get(), 1);
    assert_eq!(s.stats().active(), 0);
}

#[test]
fn a_shutdown_resets_what_has_not_closed_after_the_grace_time() {
    let s = service(Config::default(), 4, 1);
    let pipe = Pipe::with_input(&version());
    let admitted = s.admit(peer("127.0.0.1:1"), [0]).unwrap();
    let mut serve = pin!(s.serve(&Timeless, pipe.clone(), peer("127.0.0.1:1"), admitted));
    // The connection has answered and waits for its client.
    let mut cx = Context::from_waker(Waker::noop());
    assert!(serve.as_mut().poll(&mut cx).is_pending());
    // The grace time passes before the connection runs again.
    let (_, drained) = pollster::block_on(join(serve, s.drain(&Instant, Duration::ZERO)));
    assert_eq!((drained.asked, drained.shed), (1, 1));
    assert_eq!(pipe.state(), (false, true, true), "reset, released");
    assert_eq!(s.stats().shutdown_shed.get(), 1);
}

#[test]
fn the_listener_hears_of_ended_connections_and_of_the_stop() {
    let s = service(Config::default(), 4, 1);
    let mut cx = Context::from_waker(Waker::noop());
    s.clear_ended();
    assert!(s.poll_ended(&mut cx).is_pending());
    assert!(s.poll_stop(&mut cx).is_pending());
    let admitted = s.admit(peer("127.0.0.1:1"), [0]).unwrap();
    s.abandon(admitted.worker);
    assert!(s.poll_ended(&mut cx).is_ready());
    assert!(s.poll_ended(&mut cx).is_pending(), "cleared by the wait");
    s.stop_listening();
    assert!(s.stopping());
    assert!(s.poll_stop(&mut cx).is_ready());
    assert!(s.poll_stop(&mut cx).is_ready(), "stays stopped");
}

/// Two exports, each with its own allow-list: two tenants.
fn two_tenants() -> Config {
    let export = |name: &str, allow: &str| Export {
        allow: Some(AllowList::parse(allow).unwrap()),
        ..Export::root(name)
    };
    Config {
        exports: vec![export("a", "10.1.0.0/16"), export("b", "10.2.0.0/16")],
        // A clock that stands still: no connection has been quiet long enough to lose
        // its slot for being idle, so only the tenant rule takes slots.
        clock: Some(|| 0),
        ..Config::default()
    }
}

fn tenant_service(max_conns: usize, max_conns_per_tenant: usize) -> Arc<Service<Model>> {
    Arc::new(Service::new(
        model_server(two_tenants()),
        ServiceConfig {
            max_conns,
            max_conns_per_tenant,
            workers: 1,
            stack_worker: None,
            worker_noun: "worker",
        },
    ))
}

#[test]
fn a_tenant_on_many_addresses_holds_at_most_its_share_of_connections() {
    let s = tenant_service(8, 3);
    // Tenant a from three addresses takes its three slots; a fourth is refused whatever
    // the address.
    let a: Vec<_> = (1..=3)
        .map(|i| s.admit(peer(&format!("10.1.0.{i}:700")), [0]).unwrap())
        .collect();
    assert_eq!(
        s.admit(peer("10.1.0.9:700"), [0]).map(|a| a.worker),
        Err(Refusal::TenantFull)
    );
    assert_eq!(s.stats().tenant_refused.get(), 1);
    // Tenant b is let in.
    let b = s.admit(peer("10.2.0.1:700"), [0]).unwrap();
    let tenants = s.server().tenant_stats();
    let conns = |name: &str| tenants.iter().find(|t| t.tenant == name).unwrap().conns;
    assert_eq!((conns("export:a"), conns("export:b")), (3, 1));
    // A slot goes back with its ticket.
    drop(a);
    assert!(s.admit(peer("10.1.0.9:700"), [0]).is_ok());
    drop(b);
}

#[test]
fn at_the_limit_a_tenant_below_its_share_takes_a_slot_from_the_tenant_above_its_own() {
    let s = tenant_service(4, 8);
    let server = s.server().clone();
    // Tenant a fills every slot.
    let a: Vec<_> = (1..=4)
        .map(|i| s.admit(peer(&format!("10.1.0.{i}:700")), [0]).unwrap())
        .collect();
    let sessions: Vec<_> = (0..4)
        .map(|i| server.new_session(peer(&format!("10.1.0.{}:700", i + 1)).map(|p| p.ip())))
        .collect();
    // Tenant b (no slot: below its fair share of 2) gets one: a's newest connection is
    // asked to close.
    let b = s.admit(peer("10.2.0.1:700"), [0]);
    assert!(b.is_ok(), "{b:?}");
    let closing: Vec<_> = sessions
        .iter()
        .filter_map(|x| x.close_requested())
        .collect();
    assert_eq!(closing, [ninep::conn::CloseReason::SlotReclaimed]);
    assert_eq!(server.stats().slot_reclaims, 1);
    // Tenant a, above its share, is refused at the limit: nothing is taken from b.
    assert_eq!(
        s.admit(peer("10.1.0.9:700"), [0]).map(|a| a.worker),
        Err(Refusal::Full)
    );
    drop((a, b));
}

//! Shared pieces of the server tests: a clock, an in-memory exchange that drives a
//! `Connection` directly, and a filesystem wrapper whose `fsync` waits for the test.

#![allow(dead_code)]

use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use ninep::conn::Connection;
use ninep::server::{Config, Server};
use ninep::testing::{Client, Exchange};
use ninep::wire::{Rmsg, Tmsg};
use testkit::model::ModelFs;
use vfs::*;

/// A clock that ticks one second per reading (from any thread).
#[derive(Debug, Default)]
pub struct Ticks(AtomicI64);

impl Clock for Ticks {
    fn now(&self) -> Timespec {
        Timespec {
            sec: 1_700_000_000 + self.0.fetch_add(1, Relaxed) + 1,
            nsec: 0,
        }
    }
}

pub type Model = ModelFs<Ticks>;

/// A server over a fresh model filesystem.
pub fn model_server(config: Config) -> Arc<Server<Model>> {
    Arc::new(Server::new(ModelFs::new(Ticks::default()), config))
}

/// Polls a connection's requests once with a no-op waker.
pub fn poll<F: FileSystem + 'static>(conn: &mut Connection<F>) {
    let mut cx = Context::from_waker(Waker::noop());
    let _ = conn.poll_requests(&mut cx);
}

/// Drives a `Connection` in memory: a request is fed in whole, the requests are polled,
/// and the first queued reply is the answer.
pub struct Local<F: FileSystem + 'static> {
    pub conn: Connection<F>,
}

impl<F: FileSystem + 'static> Exchange for Local<F> {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        assert_eq!(self.conn.receive(request), request.len(), "request taken");
        poll(&mut self.conn);
        self.conn.take_output().expect("a reply")
    }
}

/// A versioned client on a new connection of `server`.
pub fn client<F: FileSystem + 'static>(server: &Arc<Server<F>>) -> Client<Local<F>> {
    let mut c = Client::new(Local {
        conn: Connection::new(server.clone()),
    });
    c.version(1 << 20, b"9P2000.L").unwrap();
    c
}

/// Encodes a request frame.
pub fn frame(tag: u16, msg: Tmsg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(tag, &mut out).unwrap();
    out
}

/// All replies queued on a connection, as (tag, type).
pub fn replies<F: FileSystem + 'static>(conn: &mut Connection<F>) -> Vec<(u16, u8)> {
    let mut out = Vec::new();
    while let Some(f) = conn.take_output() {
        let (tag, r) = Rmsg::decode(&f).unwrap();
        out.push((tag, r.msg_type()));
    }
    out
}

/// A gate tests open by hand.
#[derive(Debug, Default)]
pub struct Gate {
    open: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
    arrivals: AtomicU32,
}

impl Gate {
    pub fn open(&self) {
        self.open.store(true, Relaxed);
        for w in self.waiting.lock().unwrap().drain(..) {
            w.wake();
        }
    }

    /// Times `fsync` arrived at the gate.
    pub fn arrivals(&self) -> u32 {
        self.arrivals.load(Relaxed)
    }

    async fn pass(&self) {
        self.arrivals.fetch_add(1, Relaxed);
        poll_fn(|cx| {
            // Checked under the lock `open` drains the waiters with: not lost in between.
            let mut waiting = self.waiting.lock().unwrap();
            if self.open.load(Relaxed) {
                Poll::Ready(())
            } else {
                waiting.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// The model filesystem with an `fsync` that waits for [`Gate::open`].
pub struct GatedFs {
    pub inner: Model,
    pub gate: Arc<Gate>,
}

impl FileSystem for GatedFs {
    vfs::forward_filesystem!(self.inner; except fsync);

    async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        self.gate.pass().await;
        self.inner.fsync(ino, datasync).await
    }
}

/// `Tlock` for a given client id; the status.
pub fn lock_as<X: ninep::testing::Exchange>(
    c: &mut ninep::testing::Client<X>,
    fid: u32,
    lock_type: u8,
    start: u64,
    proc_id: u32,
    client_id: &[u8],
) -> Result<u8, Errno> {
    let msg = Tmsg::Lock {
        fid,
        lock_type,
        flags: 0,
        start,
        length: 1,
        proc_id,
        client_id,
    };
    let reply = c.rpc(&msg)?;
    match Rmsg::decode(&reply).unwrap().1 {
        Rmsg::Lock { status } => Ok(status),
        r => panic!("{r:?}"),
    }
}

/// `Tgetlock` for a given client id; the reply's fields.
pub fn getlock_as<X: ninep::testing::Exchange>(
    c: &mut ninep::testing::Client<X>,
    fid: u32,
    lock_type: u8,
    (start, length): (u64, u64),
    client_id: &[u8],
) -> Result<(u8, u64, u64, u32, Vec<u8>), Errno> {
    let msg = Tmsg::Getlock {
        fid,
        lock_type,
        start,
        length,
        proc_id: 99,
        client_id,
    };
    let reply = c.rpc(&msg)?;
    match Rmsg::decode(&reply).unwrap().1 {
        Rmsg::Getlock {
            lock_type,
            start,
            length,
            proc_id,
            client_id,
        } => Ok((lock_type, start, length, proc_id, client_id.to_vec())),
        r => panic!("{r:?}"),
    }
}

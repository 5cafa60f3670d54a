//! A smoltcp TCP socket as a 9P [`Transport`].
//!
//! Reads and writes copy between the socket's ring buffers and the connection's frames;
//! when nothing can move, the socket's receive or send waker is registered so the
//! connection's task sleeps until smoltcp has data or room (or the state changes: smoltcp
//! wakes both wakers on every state change, so a reset is noticed too). Data queued for
//! sending goes out from the connection's CPU (`Stack::transmit`) when the connection
//! flushes, after writing every reply it had (so replies made together share segments
//! and frames, as Linux's TCP autocorking joins small writes), as does a
//! window update when a read reopened a window that was more than half closed; a smaller
//! one rides on the next segment the stack sends.
//!
//! The connection may be served on another CPU than the stack's poll task: it holds its
//! socket's cell and works on it in short closures (`super::sockets`), and counts its
//! bytes in its own CPU's counters.
//!
//! As the serving policy's [`Endpoint`], it closes politely with smoltcp's `close` (FIN
//! after the queued data), resets with the stack's `reset`, and frees the socket at the
//! end.

use alloc::sync::Arc;
use core::task::{Context, Poll};

use super::sockets::{SockId, SocketCell};
use ninep::conn::Transport;
use ninep::service::stats::ServiceStats;
use ninep::service::Endpoint;
use smoltcp::socket::tcp::{self, State};

use super::stack::Stack;

/// Why a transfer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpError {
    /// smoltcp refused the receive (the socket is in a state that has no receive half).
    Recv(tcp::RecvError),
    /// smoltcp refused the send.
    Send(tcp::SendError),
}

/// One accepted connection's socket. See the module documentation.
#[derive(Debug)]
pub struct TcpTransport {
    stack: Arc<Stack>,
    handle: SockId,
    socket: Arc<SocketCell>,
    stats: Arc<ServiceStats>,
    /// The CPU serving it (its byte counters).
    cpu: usize,
    /// Bytes this connection received and sent.
    rx: u64,
    tx: u64,
    /// Bytes were queued since the last [`Transport::flush`]: they go out then, together.
    unsent: bool,
}

impl TcpTransport {
    /// The socket `handle` of `stack`, served on CPU `cpu`.
    pub fn new(stack: Arc<Stack>, handle: SockId, stats: Arc<ServiceStats>, cpu: usize) -> Self {
        TcpTransport {
            socket: stack.cell(handle),
            stack,
            handle,
            stats,
            cpu,
            rx: 0,
            tx: 0,
            unsent: false,
        }
    }

    /// Runs `f` on the socket (it becomes due for sending).
    pub fn with<R>(&self, f: impl FnOnce(&mut tcp::Socket<'static>) -> R) -> R {
        self.socket.with(f)
    }
}

impl Transport for TcpTransport {
    type Error = TcpError;

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<Result<usize, TcpError>> {
        let mut reopened = false;
        let r = self.with(|s| {
            if s.can_recv() {
                // Less than half the window was open: the client may be waiting for it.
                reopened = 2 * s.recv_queue() > s.recv_capacity();
                return Poll::Ready(s.recv_slice(buf).map_err(TcpError::Recv));
            }
            // Not yet established (a SYN-ACK in flight) or waiting for data: sleep. A
            // socket that will never receive again reads as end of stream.
            if s.may_recv() || s.state() == State::SynReceived {
                s.register_recv_waker(cx.waker());
                return Poll::Pending;
            }
            Poll::Ready(Ok(0))
        });
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.rx += n as u64;
                self.stats.worker(self.cpu).rx_bytes.add(n as u64);
                if reopened {
                    // The receive window grew much: advertise it now.
                    self.stack.transmit(self.handle);
                }
            }
        }
        r
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, TcpError>> {
        let r = self.with(|s| {
            if s.can_send() {
                return Poll::Ready(s.send_slice(buf).map_err(TcpError::Send));
            }
            if s.may_send() || s.state() == State::SynReceived {
                s.register_send_waker(cx.waker());
                return Poll::Pending;
            }
            Poll::Ready(Ok(0))
        });
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.tx += n as u64;
                self.stats.worker(self.cpu).tx_bytes.add(n as u64);
                self.unsent = true;
            }
        }
        r
    }

    fn flush(&mut self) {
        if core::mem::take(&mut self.unsent) {
            self.stack.transmit(self.handle);
        }
    }

    fn yield_cpu(&mut self, cx: &mut Context<'_>) {
        crate::task::yield_to_others(cx);
    }
}

impl Endpoint for TcpTransport {
    fn close(&mut self) {
        self.with(|s| s.close());
        self.stack.kick();
    }

    fn poll_closed(&mut self, cx: &mut Context<'_>, stopping: bool) -> Poll<()> {
        self.with(|s| match s.state() {
            State::Closed | State::TimeWait => Poll::Ready(()),
            State::FinWait2 if stopping => Poll::Ready(()),
            _ => {
                s.register_send_waker(cx.waker());
                Poll::Pending
            }
        })
    }

    async fn abort(&mut self) {
        self.stack.reset(self.handle).await;
    }

    fn was_reset(&mut self) -> bool {
        self.with(|s| s.state()) == State::Closed
    }

    fn rx_bytes(&self) -> u64 {
        self.rx
    }

    fn tx_bytes(&self) -> u64 {
        self.tx
    }

    fn release(self) {
        self.stack.remove(self.handle);
    }
}

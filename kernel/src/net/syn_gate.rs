//! Holds back the TCP SYNs that no listening socket could take, and lets them in once one
//! can.
//!
//! smoltcp has no accept queue: a SYN that finds no socket in the LISTEN state is answered
//! with a RST, and a Linux client then fails its mount at once ("connection refused"). The
//! 9P listener keeps a small pool of listening sockets, refilled whenever its task runs,
//! but guests mounting together send more SYNs within one poll of the stack than the pool
//! holds. The gate lets through as many SYNs for the service's port as there are sockets
//! listening and keeps the rest, a copy of each frame in a small **backlog**, until the
//! listener has refilled the pool: the NIC's receive path asks the gate for a kept SYN
//! ([`SynGate::replay`]) before it takes a frame from the device, so a client of a burst
//! waits for the listener, not for its own retransmission. That wait would be long: QEMU's
//! user network, through which the host reaches the appliance, connects to the guest with
//! a TCP of its own (BSD's) whose first SYN retransmission comes after 6 s (Linux's after
//! 1 s). A retransmitted SYN that is already kept is not kept twice. The backlog is
//! bounded ([`SYN_BACKLOG`] frames of at most [`MAX_HELD_FRAME`] bytes): a SYN past it is
//! dropped, counted, and its client retransmits.
//!
//! The gate also tells the listener how many clients it held back ([`SynGate::take_held`],
//! waking it): the listener then keeps that many more sockets listening for a while, and
//! [`SynGate::arm`] says when kept SYNs can go in (the listener then kicks the stack).
//! When the listener has no socket at all (the hard connection cap, or shutting down) it
//! opens the gate: every SYN goes through, the kept ones too, and smoltcp refuses them at
//! once rather than leaving clients retrying for minutes. A pool whose sockets are all
//! mid-handshake (a burst just taken) has none listening but is not empty: the gate then
//! holds every SYN until the pool is refilled, rather than letting smoltcp refuse them.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::task::Waker;

use atomic_waker::AtomicWaker;

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Address, Ipv4Packet, TcpPacket,
};

use super::limits::SYN_BACKLOG;
use crate::report::ListenerReport;

/// Longest SYN frame the backlog keeps (a SYN with every TCP and IP option is 134 bytes;
/// longer ones carry data, and are dropped like those past the backlog).
pub const MAX_HELD_FRAME: usize = 256;

/// The gate in front of one listening port. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct SynGate {
    state: spin::Mutex<State>,
    /// The listener, woken when a SYN is held back.
    listener: AtomicWaker,
}

/// What the gate's lock guards.
#[derive(Debug, Default)]
struct State {
    /// The gated port, once armed (kept while open, to count its SYNs).
    port: Option<u16>,
    /// SYNs that may still go in before the listener arms the gate again; `None`: open.
    left: Option<usize>,
    /// SYNs held back and kept, oldest first.
    backlog: VecDeque<Held>,
    /// The pool as last armed: sockets, and those of them listening.
    pool: usize,
    listening: usize,
    /// Counters since boot: connection requests for the port, those held back (kept or
    /// dropped), kept ones let in later, held ones not kept, and those the stack found
    /// no listening socket for (answered with a reset).
    syns: u64,
    held: u64,
    replayed: u64,
    dropped: u64,
    refused: u64,
    /// Clients held back since the listener last asked ([`SynGate::take_held`]).
    held_unseen: usize,
}

/// A SYN in the backlog.
#[derive(Debug)]
struct Held {
    client: (Ipv4Address, u16),
    frame: Vec<u8>,
}

/// What the gate needs of a connection request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Syn {
    port: u16,
    client: (Ipv4Address, u16),
}

impl SynGate {
    /// Lets `listening` more SYNs for `port` in, the kept ones first, holding back the
    /// rest (all of them with none listening: the pool of `pool` sockets is being
    /// refilled). Returns whether kept SYNs may go in now: the stack should poll.
    pub fn arm(&self, port: u16, listening: usize, pool: usize) -> bool {
        let mut s = self.state.lock();
        s.port = Some(port);
        s.left = Some(listening);
        s.pool = pool;
        s.listening = listening;
        listening > 0 && !s.backlog.is_empty()
    }

    /// Opens the gate (there is no pool): every SYN goes in, the kept ones too. Returns
    /// whether there are kept SYNs: the stack should poll.
    pub fn open(&self) -> bool {
        let mut s = self.state.lock();
        s.left = None;
        s.pool = 0;
        s.listening = 0;
        !s.backlog.is_empty()
    }

    /// Whether the received Ethernet `frame` may go on to the stack: anything but a
    /// connection request (SYN without ACK) to the gated port, or one a listening socket
    /// can still take while none is kept. A SYN held back is kept if it fits and counted.
    pub fn admits(&self, frame: &[u8]) -> bool {
        let Some(syn) = syn_of(frame) else {
            return true;
        };
        let mut s = self.state.lock();
        if s.port != Some(syn.port) {
            return true;
        }
        s.syns += 1;
        match s.left {
            None => return true,
            Some(left) if left > 0 && s.backlog.is_empty() => {
                s.left = Some(left - 1);
                return true;
            }
            Some(_) => {}
        }
        s.held += 1;
        if s.backlog.iter().any(|h| h.client == syn.client) {
            // A retransmission of a kept one: that client is waiting already.
        } else if frame.len() > MAX_HELD_FRAME || s.backlog.len() >= SYN_BACKLOG {
            s.dropped += 1;
            s.held_unseen += 1;
        } else {
            s.backlog.push_back(Held {
                client: syn.client,
                frame: frame.to_vec(),
            });
            s.held_unseen += 1;
        }
        drop(s);
        self.listener.wake();
        false
    }

    /// The oldest kept SYN, if a listening socket can take it now (or the gate is open):
    /// the stack takes it in as if it had just been received.
    pub fn replay(&self) -> Option<Vec<u8>> {
        let mut s = self.state.lock();
        if s.backlog.is_empty() {
            return None;
        }
        match s.left {
            Some(0) => return None,
            Some(left) => s.left = Some(left - 1),
            None => {}
        }
        s.replayed += 1;
        s.backlog.pop_front().map(|h| h.frame)
    }

    /// Counts a connection request for the port that the stack found no listening
    /// socket for (smoltcp answers it with a reset): `frame` is one the stack could not
    /// route to a socket.
    pub fn unrouted(&self, frame: &[u8]) {
        let Some(syn) = syn_of(frame) else {
            return;
        };
        let mut s = self.state.lock();
        if s.port == Some(syn.port) {
            s.refused += 1;
        }
    }

    /// SYNs held back since boot (kept or dropped).
    pub fn held(&self) -> u64 {
        self.state.lock().held
    }

    /// Clients held back since the last call: those waiting in the backlog, or
    /// retransmitting.
    pub fn take_held(&self) -> usize {
        core::mem::take(&mut self.state.lock().held_unseen)
    }

    /// Wakes `waker` (the listener) whenever a SYN is held back.
    pub fn register_listener(&self, waker: &Waker) {
        self.listener.register(waker);
    }

    /// The gate's counters and the pool as last armed.
    pub fn report(&self) -> ListenerReport {
        let s = self.state.lock();
        ListenerReport {
            pool: s.pool as u64,
            listening: s.listening as u64,
            backlog: s.backlog.len() as u64,
            syns: s.syns,
            syns_replayed: s.replayed,
            syns_dropped: s.dropped,
            syns_refused: s.refused,
        }
    }
}

/// The connection request (SYN without ACK) over IPv4 in an Ethernet frame; `None` for
/// every other frame (malformed ones included: smoltcp judges those).
fn syn_of(frame: &[u8]) -> Option<Syn> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp || ip.frag_offset() != 0 {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    (tcp.syn() && !tcp.ack()).then(|| Syn {
        port: tcp.dst_port(),
        client: (ip.src_addr(), tcp.src_port()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::TcpControl;

    /// An Ethernet frame carrying a TCP segment from client port `from` to `port` with
    /// `control` (and an ACK number when `ack`).
    fn segment(from: u16, port: u16, control: TcpControl, ack: bool) -> Vec<u8> {
        super::super::test_frames::tcp(from, port, control, ack)
    }

    /// A connection request from client port `from` to port 564.
    fn syn(from: u16) -> Vec<u8> {
        segment(from, 564, TcpControl::Syn, false)
    }

    #[test]
    fn lets_in_as_many_syns_as_sockets_listen_and_the_rest_once_refilled() {
        let gate = SynGate::default();
        assert!(!gate.arm(564, 2, 4), "nothing kept");
        assert!(gate.admits(&syn(40000)));
        assert!(gate.admits(&syn(40001)));
        assert!(!gate.admits(&syn(40002)), "a third SYN is held back");
        assert_eq!(gate.held(), 1);
        assert_eq!(gate.take_held(), 1, "the listener learns of it");
        assert_eq!(gate.take_held(), 0);
        assert_eq!(gate.replay(), None, "no socket listening for it yet");
        // Everything else passes while the gate is shut.
        assert!(gate.admits(&segment(40000, 564, TcpControl::None, true)));
        assert!(
            gate.admits(&segment(40000, 564, TcpControl::Syn, true)),
            "SYN-ACK"
        );
        assert!(
            gate.admits(&segment(40000, 5641, TcpControl::Syn, false)),
            "another port"
        );
        assert!(gate.admits(&[0u8; 10]), "not a frame smoltcp would take");
        // The listener refilled its pool: the kept SYN goes in, as it was received.
        assert!(gate.arm(564, 1, 4), "the stack should poll");
        assert_eq!(gate.replay(), Some(syn(40002)));
        assert_eq!(gate.replay(), None);
        assert!(!gate.admits(&syn(40003)), "its socket was the last one");
        let r = gate.report();
        assert_eq!(
            (r.syns, r.syns_replayed, r.syns_dropped, r.backlog),
            (4, 1, 0, 1)
        );
        assert_eq!((r.pool, r.listening), (4, 1));
    }

    #[test]
    fn kept_syns_go_in_first_and_in_order() {
        let gate = SynGate::default();
        gate.arm(564, 0, 4);
        assert!(!gate.admits(&syn(1)));
        assert!(!gate.admits(&syn(2)));
        gate.arm(564, 1, 4);
        assert_eq!(gate.replay(), Some(syn(1)));
        assert_eq!(gate.replay(), None);
        // A new client queues behind the one still kept, even with a socket listening.
        gate.arm(564, 1, 4);
        assert!(!gate.admits(&syn(3)));
        assert_eq!(gate.replay(), Some(syn(2)));
        gate.arm(564, 4, 4);
        assert_eq!(gate.replay(), Some(syn(3)));
        assert_eq!(gate.replay(), None);
        assert!(gate.admits(&syn(4)), "nothing kept: straight in");
        assert_eq!(gate.report().syns_replayed, 3);
    }

    #[test]
    fn a_retransmitted_syn_is_kept_once() {
        let gate = SynGate::default();
        gate.arm(564, 0, 4);
        assert!(!gate.admits(&syn(7)));
        assert!(!gate.admits(&syn(7)), "the client's retransmission");
        assert_eq!(gate.held(), 2);
        assert_eq!(gate.take_held(), 1, "one client waits");
        gate.arm(564, 4, 4);
        assert_eq!(gate.replay(), Some(syn(7)));
        assert_eq!(gate.replay(), None);
    }

    #[test]
    fn the_backlog_is_bounded() {
        let gate = SynGate::default();
        gate.arm(564, 0, 4);
        for port in 0..=SYN_BACKLOG as u16 {
            assert!(!gate.admits(&syn(1000 + port)));
        }
        let mut long = syn(9);
        long.resize(MAX_HELD_FRAME + 1, 0);
        assert!(!gate.admits(&long), "too long to keep");
        let r = gate.report();
        assert_eq!((r.backlog, r.syns_dropped), (SYN_BACKLOG as u64, 2));
        assert_eq!(gate.take_held(), SYN_BACKLOG + 2, "dropped ones retransmit");
    }

    #[test]
    fn an_open_gate_lets_everything_in_the_kept_syns_too() {
        let gate = SynGate::default();
        // Every socket of the pool mid-handshake: held, kept.
        gate.arm(564, 0, 4);
        assert!(!gate.admits(&syn(1)));
        assert_eq!((gate.held(), gate.take_held()), (1, 1));
        // No pool at all (the hard cap, a shutdown): in, and smoltcp answers RST, so the
        // clients learn at once.
        assert!(gate.open(), "the kept one goes in");
        assert_eq!(gate.replay(), Some(syn(1)));
        assert!(gate.admits(&syn(2)));
        assert!(gate.admits(&syn(3)));
        assert_eq!(gate.held(), 1);
        assert!(!gate.open(), "nothing kept");
        gate.unrouted(&syn(2));
        gate.unrouted(&segment(2, 564, TcpControl::None, true));
        assert_eq!(gate.report().syns_refused, 1, "only connection requests");
    }
}

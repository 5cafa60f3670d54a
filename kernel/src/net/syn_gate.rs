//! Holds back the TCP SYNs that no listening socket could take.
//!
//! smoltcp has no accept queue: a SYN that finds no socket in the LISTEN state is answered
//! with a RST, and a Linux client then fails its mount at once ("connection refused"). The
//! 9P listener keeps a small pool of listening sockets, refilled whenever its task runs,
//! but guests mounting together send more SYNs within one poll of the stack than the pool
//! holds. The gate lets through as many SYNs for the service's port as there are sockets
//! listening and drops the rest before smoltcp sees them: each client retransmits its SYN
//! (Linux after 1 s, QEMU's user network sooner) and finds a socket listening by then.
//! Clients that started together retransmit together, so the gate also tells the listener
//! how many it held back ([`SynGate::take_held`], waking it): the listener then keeps that
//! many more sockets listening until those clients are in.
//! When the listener has no socket at all (the hard connection cap, or shutting down) it
//! opens the gate, so clients are refused at once instead of retrying for minutes. A pool
//! whose sockets are all mid-handshake (a burst just taken) has none listening but is not
//! empty: the gate then holds every SYN until the pool is refilled, rather than letting
//! smoltcp refuse them.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use core::task::Waker;

use atomic_waker::AtomicWaker;

use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};

use crate::report::ListenerReport;

/// The gate in front of one listening port. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct SynGate {
    /// The gated port, with the SYNs it may still let through; `None`: open.
    armed: spin::Mutex<Option<(u16, usize)>>,
    /// The port, once armed (kept while open, to count its SYNs).
    port: spin::Mutex<Option<u16>>,
    /// The pool as last armed: sockets, and those of them listening.
    pool: AtomicUsize,
    listening: AtomicUsize,
    /// Connection requests for the port since boot.
    syns: AtomicU64,
    /// Of them, those that reached the stack with no socket listening (answered RST).
    refused: AtomicU64,
    /// SYNs held back (dropped) since boot.
    held: AtomicU64,
    /// SYNs held back since the listener last asked ([`SynGate::take_held`]).
    held_unseen: AtomicUsize,
    /// The listener, woken when a SYN is held back.
    listener: AtomicWaker,
}

impl SynGate {
    /// Lets `listening` more SYNs for `port` through, holding back the rest (all of
    /// them with none listening: the pool of `pool` sockets is being refilled).
    pub fn arm(&self, port: u16, listening: usize, pool: usize) {
        *self.armed.lock() = Some((port, listening));
        *self.port.lock() = Some(port);
        self.pool.store(pool, Relaxed);
        self.listening.store(listening, Relaxed);
    }

    /// Opens the gate: every SYN goes through (there is no pool).
    pub fn open(&self) {
        *self.armed.lock() = None;
        self.pool.store(0, Relaxed);
        self.listening.store(0, Relaxed);
    }

    /// Counts a connection request for the port that the stack found no listening
    /// socket for (smoltcp answers it with a reset): `frame` is one the stack could not
    /// route to a socket.
    pub fn unrouted(&self, frame: &[u8]) {
        if syn_to(frame).is_some() && syn_to(frame) == *self.port.lock() {
            self.refused.fetch_add(1, Relaxed);
        }
    }

    /// The gate's counters and the pool as last armed.
    pub fn report(&self) -> ListenerReport {
        ListenerReport {
            pool: self.pool.load(Relaxed) as u64,
            listening: self.listening.load(Relaxed) as u64,
            syns: self.syns.load(Relaxed),
            syns_refused: self.refused.load(Relaxed),
        }
    }

    /// Whether the Ethernet `frame` may go on to the stack: anything but a connection
    /// request (SYN without ACK) to the gated port, or one a listening socket can still
    /// take. A held-back frame is counted.
    pub fn admits(&self, frame: &[u8]) -> bool {
        let syn = syn_to(frame);
        if syn.is_some() && syn == *self.port.lock() {
            self.syns.fetch_add(1, Relaxed);
        }
        let mut armed = self.armed.lock();
        let Some((port, left)) = *armed else {
            return true;
        };
        if syn != Some(port) {
            return true;
        }
        if left == 0 {
            drop(armed);
            self.held.fetch_add(1, Relaxed);
            self.held_unseen.fetch_add(1, Relaxed);
            self.listener.wake();
            return false;
        }
        *armed = Some((port, left - 1));
        true
    }

    /// SYNs held back since boot.
    pub fn held(&self) -> u64 {
        self.held.load(Relaxed)
    }

    /// SYNs held back since the last call: clients that will retransmit.
    pub fn take_held(&self) -> usize {
        self.held_unseen.swap(0, Relaxed)
    }

    /// Wakes `waker` (the listener) whenever a SYN is held back.
    pub fn register_listener(&self, waker: &Waker) {
        self.listener.register(waker);
    }
}

/// The destination port of an IPv4 TCP connection request (SYN without ACK) in an
/// Ethernet frame; `None` for every other frame (malformed ones included: smoltcp judges
/// those).
fn syn_to(frame: &[u8]) -> Option<u16> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp || ip.frag_offset() != 0 {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    (tcp.syn() && !tcp.ack()).then(|| tcp.dst_port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use smoltcp::wire::TcpControl;

    /// An Ethernet frame carrying a TCP segment to `port` with `control` (and an ACK
    /// number when `ack`).
    fn segment(port: u16, control: TcpControl, ack: bool) -> Vec<u8> {
        super::super::test_frames::tcp(40000, port, control, ack)
    }

    #[test]
    fn lets_through_as_many_syns_as_sockets_listen() {
        let gate = SynGate::default();
        let syn = segment(564, TcpControl::Syn, false);
        gate.arm(564, 2, 4);
        assert!(gate.admits(&syn));
        assert!(gate.admits(&syn));
        assert!(!gate.admits(&syn), "a third SYN is held back");
        assert_eq!(gate.held(), 1);
        assert_eq!(gate.take_held(), 1, "the listener learns of it");
        assert_eq!(gate.take_held(), 0);
        // Everything else passes while the gate is shut.
        assert!(gate.admits(&segment(564, TcpControl::None, true)));
        assert!(gate.admits(&segment(564, TcpControl::Syn, true)), "SYN-ACK");
        assert!(
            gate.admits(&segment(5641, TcpControl::Syn, false)),
            "another port"
        );
        assert!(gate.admits(&[0u8; 10]), "not a frame smoltcp would take");
        // The listener refilled its pool.
        gate.arm(564, 1, 4);
        assert!(gate.admits(&syn));
        assert!(!gate.admits(&syn));
        assert_eq!(gate.held(), 2);
    }

    #[test]
    fn no_socket_listening_holds_and_an_open_gate_refuses_at_once() {
        let gate = SynGate::default();
        let syn = segment(564, TcpControl::Syn, false);
        // Every socket of the pool mid-handshake: the client retransmits, and a socket
        // listens by then (smoltcp would refuse it).
        gate.arm(564, 0, 4);
        assert!(!gate.admits(&syn));
        assert_eq!((gate.held(), gate.take_held()), (1, 1));
        // No pool at all (the hard cap, a shutdown): through, and smoltcp answers RST,
        // so the client learns at once.
        gate.open();
        assert!(gate.admits(&syn));
        assert!(gate.admits(&syn));
        assert_eq!(gate.held(), 1);
    }
}

//! [`Sockets`]: the stack's socket table, every socket in a smoltcp `SocketSet` of its
//! own, so that a poll visits only the sockets that have something to do, and behind a
//! lock of its own ([`SocketCell`]), so that a connection served on another CPU uses its
//! socket while the stack polls the others.
//!
//! smoltcp's `Interface` walks the whole set it is given: every sending pass asks every
//! socket whether it has a segment to send (one segment per socket per pass, so a reply
//! of k segments costs k + 1 passes), every received segment is matched against every
//! socket, and the next wake-up is the minimum over every socket. With one set holding
//! all connections, a poll cost grew with the number of connections: at 64 the sending
//! passes were a third of the appliance's CPU under load (docs/benchmarks.md, "One set
//! per socket"). Here:
//!
//! - a received frame is routed by its TCP 4-tuple ([`Sockets::route`], a map kept in
//!   step with the sockets' endpoints) to the one set whose socket takes it, or to a
//!   listening socket on its port (a connection request), or else to an empty set, where
//!   smoltcp answers it with a reset as it would have; frames other than TCP go to the
//!   fallback set (the DHCP client's, if any), and ARP frames make every socket due,
//!   because an ARP reply may unblock a socket waiting for its neighbour;
//! - a set is polled for sending ([`Sockets::egress`]) when it is *due*: it received a
//!   frame, a user changed its socket (data queued, window reopened, state changed), or
//!   the time smoltcp last asked to be polled at has come;
//! - the next wake-up is the earliest of the sets' own.
//!
//! **Sharing.** The table itself belongs to the stack's poll task (the stack keeps it
//! behind a lock for the few changes others make: adding and removing sockets). Each
//! socket lives in a [`SocketCell`]: its set under a spin lock, and a *dirty* flag. The
//! socket's user — a connection task on any CPU — holds the cell ([`Sockets::cell`]) and
//! works on the socket through [`SocketCell::with`], which raises the flag; the poll task
//! locks the cell for each frame it hands the socket and for each sending pass. Both
//! critical sections are short copies between buffers, never an `await`, and no other
//! lock is taken inside one (lock order: the table, then a cell). Interrupt handlers
//! never touch sockets, so the locks leave interrupts on.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::{tcp, AnySocket};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpEndpoint, IpProtocol, Ipv4Packet, TcpPacket,
};

/// A socket in [`Sockets`]. Like smoltcp's handles, an id is reused once its socket is
/// removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SockId(usize);

/// Where a received frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The set of this socket.
    Socket(SockId),
    /// The set without sockets: smoltcp answers a TCP segment there with a reset.
    Nowhere,
}

/// A connection's endpoints: (local, remote).
type Tuple = (IpEndpoint, IpEndpoint);

/// One socket, in a set of its own, shared by the stack's poll task and the socket's user
/// (see the module documentation).
pub struct SocketCell {
    owned: spin::Mutex<Owned>,
    /// A user changed the socket since the poll task last polled it for sending: it may
    /// have something to send.
    dirty: AtomicBool,
}

/// What a [`SocketCell`]'s lock guards.
struct Owned {
    set: SocketSet<'static>,
    handle: SocketHandle,
}

impl core::fmt::Debug for SocketCell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SocketCell")
            .field("dirty", &self.dirty.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SocketCell {
    fn new<T: AnySocket<'static>>(socket: T) -> SocketCell {
        let mut set = SocketSet::new(Vec::with_capacity(1));
        let handle = set.add(socket);
        SocketCell {
            owned: spin::Mutex::new(Owned { set, handle }),
            // New: due at once.
            dirty: AtomicBool::new(true),
        }
    }

    /// Runs `f` on the socket, which becomes due (whatever `f` does may give it
    /// something to send).
    ///
    /// # Panics
    /// If the socket is not a `T`.
    pub fn with<T: AnySocket<'static>, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let r = self.with_quiet(f);
        // Raised after the change, so a sending pass that clears it sees the change.
        self.dirty.store(true, Ordering::Release);
        r
    }

    /// Runs `f` on the socket for calls that cannot give it anything to send (taking a
    /// DHCP client's events): it does not become due.
    ///
    /// # Panics
    /// As [`SocketCell::with`].
    pub fn with_quiet<T: AnySocket<'static>, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut owned = self.owned.lock();
        let Owned { set, handle } = &mut *owned;
        f(set.get_mut(*handle))
    }

    /// Runs `f` on the socket's set (the poll task hands it to smoltcp).
    fn with_set<R>(&self, f: impl FnOnce(&mut SocketSet<'static>) -> R) -> R {
        f(&mut self.owned.lock().set)
    }

    /// Makes the socket due.
    fn mark_due(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Whether the socket was due, clearing it.
    fn take_due(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// The socket, if it is a TCP one, given to `f`.
    fn tcp<R>(&self, f: impl FnOnce(&tcp::Socket<'static>) -> R) -> Option<R> {
        let owned = self.owned.lock();
        let (_, socket) = owned.set.iter().next()?;
        tcp::Socket::downcast(socket).map(f)
    }
}

struct Slot {
    cell: Arc<SocketCell>,
    /// The 4-tuple it is filed under in `by_tuple`, if any.
    tuple: Option<Tuple>,
    /// When smoltcp last asked for this set to be polled again.
    due: Option<Instant>,
}

/// The socket table. See the module documentation.
pub struct Sockets {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    by_tuple: BTreeMap<Tuple, SockId>,
    /// Where frames other than TCP go.
    fallback: Option<SockId>,
    nowhere: SocketSet<'static>,
}

impl core::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sockets")
            .field("sockets", &self.len())
            .field("connections", &self.by_tuple.len())
            .finish()
    }
}

impl Default for Sockets {
    fn default() -> Self {
        Self::new()
    }
}

/// What routing needs of a TCP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    tuple: Tuple,
    /// It may open a connection (no ACK, no RST): smoltcp lets a listening socket take
    /// only those.
    opens: bool,
}

/// The TCP segment in an Ethernet frame, if it carries one (IPv4, not a fragment).
fn segment(frame: &[u8]) -> Option<Segment> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp || ip.more_frags() || ip.frag_offset() != 0 {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let local = IpEndpoint::new(IpAddress::Ipv4(ip.dst_addr()), tcp.dst_port());
    let remote = IpEndpoint::new(IpAddress::Ipv4(ip.src_addr()), tcp.src_port());
    Some(Segment {
        tuple: (local, remote),
        opens: !tcp.ack() && !tcp.rst(),
    })
}

/// Whether an Ethernet frame carries ARP.
fn is_arp(frame: &[u8]) -> bool {
    EthernetFrame::new_checked(frame).is_ok_and(|eth| eth.ethertype() == EthernetProtocol::Arp)
}

impl Sockets {
    /// An empty table.
    pub fn new() -> Self {
        Sockets {
            slots: Vec::new(),
            free: Vec::new(),
            by_tuple: BTreeMap::new(),
            fallback: None,
            nowhere: SocketSet::new(Vec::new()),
        }
    }

    /// Sockets in the table.
    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// The table has no socket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `socket` (due at once).
    pub fn add<T: AnySocket<'static>>(&mut self, socket: T) -> SockId {
        let slot = Slot {
            cell: Arc::new(SocketCell::new(socket)),
            tuple: None,
            due: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        let id = SockId(i);
        self.file(id);
        id
    }

    /// Frames other than TCP go to `id`'s set (the DHCP client's).
    pub fn set_fallback(&mut self, id: SockId) {
        self.fallback = Some(id);
    }

    /// Removes socket `id`. Its cell lives on while a user still holds it, but the stack
    /// no longer polls it.
    ///
    /// # Panics
    /// If there is no such socket.
    pub fn remove(&mut self, id: SockId) {
        let slot = self.slots[id.0].take().expect("removing a socket twice");
        self.unfile(id, slot.tuple);
        if self.fallback == Some(id) {
            self.fallback = None;
        }
        self.free.push(id.0);
    }

    /// Socket `id`'s cell, for its user.
    ///
    /// # Panics
    /// If there is no such socket.
    pub fn cell(&self, id: SockId) -> &Arc<SocketCell> {
        &self.slot(id).cell
    }

    /// Runs `f` on socket `id`, which becomes due ([`SocketCell::with`]).
    ///
    /// # Panics
    /// If there is no such socket or it is not a `T`.
    pub fn with<T: AnySocket<'static>, R>(&self, id: SockId, f: impl FnOnce(&mut T) -> R) -> R {
        self.cell(id).with(f)
    }

    /// Runs `f` on socket `id` without making it due ([`SocketCell::with_quiet`]).
    ///
    /// # Panics
    /// As [`Sockets::with`].
    pub fn with_quiet<T: AnySocket<'static>, R>(
        &self,
        id: SockId,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        self.cell(id).with_quiet(f)
    }

    /// Where the received `frame` goes (see the module documentation).
    pub fn route(&mut self, frame: &[u8]) -> Route {
        let Some(seg) = segment(frame) else {
            if is_arp(frame) {
                for slot in self.slots.iter().flatten() {
                    slot.cell.mark_due();
                }
            }
            return self.fallback.map_or(Route::Nowhere, Route::Socket);
        };
        if let Some(&id) = self.by_tuple.get(&seg.tuple) {
            // Filed when last polled; it may have been reset since. smoltcp's own test:
            // a closed socket takes nothing (it keeps its tuple until its reset is sent).
            let live = self
                .cell(id)
                .tcp(|s| endpoints(s) == Some(seg.tuple) && s.state() != tcp::State::Closed);
            if live == Some(true) {
                return Route::Socket(id);
            }
        }
        if seg.opens {
            let (local, _) = seg.tuple;
            let listening = self.slots.iter().enumerate().find(|(_, slot)| {
                slot.as_ref()
                    .and_then(|s| s.cell.tcp(|s| listens_on(s, local)))
                    .unwrap_or(false)
            });
            if let Some((i, _)) = listening {
                return Route::Socket(SockId(i));
            }
        }
        Route::Nowhere
    }

    /// Runs `f` (smoltcp's ingress) on the set a frame routed to `route` goes to; its
    /// socket is then due (an ACK to send, say), and filed under its endpoints if it has
    /// just got them.
    pub fn ingress<R>(&mut self, route: Route, f: impl FnOnce(&mut SocketSet<'static>) -> R) -> R {
        match route {
            Route::Socket(id) => {
                let r = self.cell(id).with_set(f);
                if let Some(slot) = self.slots[id.0].as_ref() {
                    slot.cell.mark_due();
                }
                self.file(id);
                r
            }
            Route::Nowhere => f(&mut self.nowhere),
        }
    }

    /// Runs `send` on the set of every due socket (see the module documentation): it
    /// sends what the set has to send and returns when smoltcp wants it polled again.
    /// Returns the earliest such time over every set.
    pub fn egress(
        &mut self,
        now: Instant,
        mut send: impl FnMut(&mut SocketSet<'static>) -> Option<Instant>,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for i in 0..self.slots.len() {
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            // Cleared before the pass: a change made during it raises it again.
            let changed = slot.cell.take_due();
            if changed || slot.due.is_some_and(|t| t <= now) {
                slot.due = slot.cell.with_set(&mut send);
                self.file(SockId(i));
            }
            let due = self.slots[i].as_ref().and_then(|s| s.due);
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        next
    }

    /// Runs `send` on socket `id`'s set now, whether or not it is due (its user just
    /// queued data on it); returns when smoltcp wants it polled again. `None` too if the
    /// socket is gone.
    pub fn egress_one(
        &mut self,
        id: SockId,
        send: impl FnOnce(&mut SocketSet<'static>) -> Option<Instant>,
    ) -> Option<Instant> {
        let slot = self.slots.get_mut(id.0)?.as_mut()?;
        // Cleared before sending: a change made meanwhile raises it again.
        slot.cell.take_due();
        slot.due = slot.cell.with_set(send);
        let due = slot.due;
        self.file(id);
        due
    }

    fn slot(&self, id: SockId) -> &Slot {
        self.slots[id.0].as_ref().expect("no such socket")
    }

    /// The endpoints of socket `id`, if it is a TCP socket that has a peer.
    fn tuple_of(&self, id: SockId) -> Option<Tuple> {
        self.slots[id.0].as_ref()?.cell.tcp(endpoints)?
    }

    /// Files socket `id` under its current endpoints (and no longer under old ones).
    fn file(&mut self, id: SockId) {
        let now = self.tuple_of(id);
        let Some(slot) = self.slots[id.0].as_mut() else {
            return;
        };
        let before = core::mem::replace(&mut slot.tuple, now);
        if before != now {
            self.unfile(id, before);
            if let Some(t) = now {
                self.by_tuple.insert(t, id);
            }
        }
    }

    fn unfile(&mut self, id: SockId, tuple: Option<Tuple>) {
        if let Some(t) = tuple {
            if self.by_tuple.get(&t) == Some(&id) {
                self.by_tuple.remove(&t);
            }
        }
    }
}

/// A TCP socket's endpoints, once it has a peer.
fn endpoints(s: &tcp::Socket) -> Option<Tuple> {
    Some((s.local_endpoint()?, s.remote_endpoint()?))
}

/// Whether listening socket `s` takes a connection request to `local` (smoltcp's own
/// test: state, port, and address if it listens on one).
fn listens_on(s: &tcp::Socket, local: IpEndpoint) -> bool {
    let listen = s.listen_endpoint();
    s.state() == tcp::State::Listen
        && listen.port == local.port
        && listen.addr.is_none_or(|a| a == local.addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{EthernetAddress, TcpControl};

    use super::super::test_frames::{LOCAL, REMOTE};

    fn socket() -> tcp::Socket<'static> {
        tcp::Socket::new(
            tcp::SocketBuffer::new(alloc::vec![0; 1024]),
            tcp::SocketBuffer::new(alloc::vec![0; 1024]),
        )
    }

    /// An Ethernet frame with a TCP segment from REMOTE:`from` to LOCAL:`to`.
    fn frame(from: u16, to: u16, control: TcpControl, ack: bool) -> Vec<u8> {
        super::super::test_frames::tcp(from, to, control, ack)
    }

    #[test]
    fn a_segment_is_read_from_its_frame() {
        let f = frame(40000, 564, TcpControl::Syn, false);
        let seg = segment(&f).expect("a TCP segment");
        assert_eq!(seg.tuple.0, IpEndpoint::new(LOCAL.into(), 564));
        assert_eq!(seg.tuple.1, IpEndpoint::new(REMOTE.into(), 40000));
        assert!(seg.opens);
        assert!(
            !segment(&frame(40000, 564, TcpControl::None, true))
                .unwrap()
                .opens
        );
        assert!(
            !segment(&frame(40000, 564, TcpControl::Rst, false))
                .unwrap()
                .opens
        );
        assert_eq!(segment(&f[..20]), None, "a truncated frame");
    }

    #[test]
    fn a_connection_request_goes_to_a_listening_socket_on_its_port() {
        let mut t = Sockets::new();
        let other = t.add(socket());
        t.with(other, |s: &mut tcp::Socket| s.listen(80)).unwrap();
        let listener = t.add(socket());
        t.with(listener, |s: &mut tcp::Socket| s.listen(564))
            .unwrap();
        let syn = frame(40000, 564, TcpControl::Syn, false);
        assert_eq!(t.route(&syn), Route::Socket(listener));
        // Not a request: no listening socket takes it, smoltcp resets it.
        assert_eq!(
            t.route(&frame(40000, 564, TcpControl::None, true)),
            Route::Nowhere
        );
        assert_eq!(
            t.route(&frame(40000, 81, TcpControl::Syn, false)),
            Route::Nowhere
        );
    }

    #[test]
    fn arp_frames_go_to_the_fallback_and_make_every_socket_due() {
        let mut t = Sockets::new();
        let a = t.add(socket());
        let b = t.add(socket());
        let mut arp = frame(1, 2, TcpControl::None, true);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(t.route(&arp), Route::Nowhere);
        t.set_fallback(b);
        assert_eq!(t.route(&arp), Route::Socket(b));
        let mut polled = Vec::new();
        let now = Instant::from_millis(0);
        t.egress(now, |s| {
            polled.push(s.iter().count());
            None
        });
        assert_eq!(polled.len(), 2, "{a:?} and {b:?} were due");
    }

    #[test]
    fn other_frames_go_to_the_fallback_without_making_sockets_due() {
        let mut t = Sockets::new();
        let a = t.add(socket());
        let b = t.add(socket());
        t.set_fallback(b);
        t.egress(Instant::from_millis(0), |_| None);
        // An IPv4 datagram that is not TCP (UDP: a DHCP reply, say).
        let mut udp = frame(1, 2, TcpControl::None, true);
        udp[14 + 9] = 17;
        assert_eq!(t.route(&udp), Route::Socket(b));
        let mut polled = 0;
        t.egress(Instant::from_millis(0), |_| {
            polled += 1;
            None
        });
        assert_eq!(polled, 0, "neither {a:?} nor {b:?} became due");
    }

    #[test]
    fn a_change_made_on_another_thread_makes_the_socket_due() {
        let mut t = Sockets::new();
        let id = t.add(socket());
        t.egress(Instant::from_millis(0), |_| None);
        let cell = t.cell(id).clone();
        std::thread::spawn(move || cell.with(|s: &mut tcp::Socket| s.set_nagle_enabled(false)))
            .join()
            .unwrap();
        let mut polled = 0;
        t.egress(Instant::from_millis(0), |_| {
            polled += 1;
            None
        });
        assert_eq!(polled, 1);
    }

    #[test]
    fn sending_one_socket_now_clears_its_due_flag_and_keeps_its_deadline() {
        let mut t = Sockets::new();
        let a = t.add(socket());
        let b = t.add(socket());
        t.egress(Instant::from_millis(0), |_| None);
        // A connection on another CPU queued data on `a` and sends it at once.
        t.with(a, |s: &mut tcp::Socket| s.set_nagle_enabled(false));
        let mut sent = 0;
        let due = t.egress_one(a, |_| {
            sent += 1;
            Some(Instant::from_millis(300))
        });
        assert_eq!((sent, due), (1, Some(Instant::from_millis(300))));
        // The poll task's next pass need not visit it, but wakes for its deadline.
        let mut polled = 0;
        let next = t.egress(Instant::from_millis(10), |_| {
            polled += 1;
            None
        });
        assert_eq!((polled, next), (0, Some(Instant::from_millis(300))));
        t.remove(b);
        t.remove(a);
        assert_eq!(t.egress_one(a, |_| unreachable!("a removed socket")), None);
    }

    #[test]
    fn only_due_sockets_are_polled_and_the_earliest_wake_up_wins() {
        let mut t = Sockets::new();
        let ids: Vec<SockId> = (0..4).map(|_| t.add(socket())).collect();
        let now = Instant::from_millis(100);
        // Every new socket is due once; each asks for a later poll at 200 + its index.
        let mut n = 0;
        let next = t.egress(now, |_| {
            n += 1;
            Some(Instant::from_millis(200 + n))
        });
        assert_eq!((n, next), (4, Some(Instant::from_millis(201))));
        // Nothing happened: nothing is polled.
        let mut polled = 0;
        t.egress(now, |s| {
            polled += 1;
            s.iter().count();
            None
        });
        assert_eq!(polled, 0);
        // A user touched one socket: only that one.
        t.with(ids[2], |s: &mut tcp::Socket| s.set_nagle_enabled(false));
        let mut polled = 0;
        let next = t.egress(now, |_| {
            polled += 1;
            None
        });
        assert_eq!(polled, 1);
        assert_eq!(
            next,
            Some(Instant::from_millis(201)),
            "socket 2 no longer asks"
        );
        // Time passes: the due ones are polled.
        let mut polled = 0;
        t.egress(Instant::from_millis(202), |_| {
            polled += 1;
            None
        });
        assert_eq!(polled, 2, "the sockets due at 201 and 202");
        // A quiet borrow does not make a socket due.
        t.with_quiet(ids[0], |s: &mut tcp::Socket| s.set_nagle_enabled(false));
        let mut polled = 0;
        t.egress(Instant::from_millis(202), |_| {
            polled += 1;
            None
        });
        assert_eq!(polled, 0);
    }

    /// A device that receives the frames queued in it and drops what it sends.
    struct Frames(alloc::collections::VecDeque<Vec<u8>>);

    struct Rx(Vec<u8>);
    struct Tx;

    impl smoltcp::phy::RxToken for Rx {
        fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
            f(&self.0)
        }
    }

    impl smoltcp::phy::TxToken for Tx {
        fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
            f(&mut alloc::vec![0; len])
        }
    }

    impl smoltcp::phy::Device for Frames {
        type RxToken<'a> = Rx;
        type TxToken<'a> = Tx;

        fn receive(&mut self, _: Instant) -> Option<(Rx, Tx)> {
            Some((Rx(self.0.pop_front()?), Tx))
        }

        fn transmit(&mut self, _: Instant) -> Option<Tx> {
            Some(Tx)
        }

        fn capabilities(&self) -> smoltcp::phy::DeviceCapabilities {
            let mut caps = smoltcp::phy::DeviceCapabilities::default();
            caps.medium = smoltcp::phy::Medium::Ethernet;
            caps.max_transmission_unit = 1514;
            caps
        }
    }

    #[test]
    fn a_connection_is_filed_under_its_tuple_once_its_socket_took_the_request() {
        use smoltcp::iface::{Config, Interface};
        use smoltcp::wire::{HardwareAddress, IpCidr};
        let now = Instant::from_millis(0);
        let mut dev = Frames(Default::default());
        let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
        let mut iface = Interface::new(Config::new(HardwareAddress::Ethernet(mac)), &mut dev, now);
        iface.update_ip_addrs(|a| a.push(IpCidr::new(LOCAL.into(), 24)).unwrap());
        let mut t = Sockets::new();
        let first = t.add(socket());
        let second = t.add(socket());
        for id in [first, second] {
            t.with(id, |s: &mut tcp::Socket| s.listen(564)).unwrap();
        }
        // A client's SYN: the first listening socket takes it and gets the client's tuple.
        let syn = frame(40000, 564, TcpControl::Syn, false);
        let route = t.route(&syn);
        assert_eq!(route, Route::Socket(first));
        dev.0.push_back(syn);
        t.ingress(route, |set| iface.poll_ingress_single(now, &mut dev, set));
        assert_eq!(
            t.with(first, |s: &mut tcp::Socket| s.state()),
            tcp::State::SynReceived
        );
        // Its next segments go to it by the tuple; another client's SYN to the socket
        // still listening; a segment of an unknown connection nowhere.
        assert_eq!(
            t.route(&frame(40000, 564, TcpControl::None, true)),
            Route::Socket(first)
        );
        assert_eq!(
            t.route(&frame(40001, 564, TcpControl::Syn, false)),
            Route::Socket(second)
        );
        assert_eq!(
            t.route(&frame(40002, 564, TcpControl::None, true)),
            Route::Nowhere
        );
        // Reset, its reset not sent yet (no neighbour): it takes nothing more, and a new
        // request from the same port goes to the socket still listening.
        t.with(first, |s: &mut tcp::Socket| s.abort());
        assert_eq!(
            t.route(&frame(40000, 564, TcpControl::None, true)),
            Route::Nowhere
        );
        assert_eq!(
            t.route(&frame(40000, 564, TcpControl::Syn, false)),
            Route::Socket(second)
        );
        // Removed: unfiled.
        t.remove(first);
        assert!(t.by_tuple.is_empty());
    }

    #[test]
    fn ids_are_reused_and_a_removed_socket_is_unfiled() {
        let mut t = Sockets::new();
        let a = t.add(socket());
        let b = t.add(socket());
        t.remove(a);
        assert_eq!(t.len(), 1);
        let c = t.add(socket());
        assert_eq!(c, a, "the free slot is reused");
        t.remove(b);
        t.remove(c);
        assert!(t.is_empty());
        assert!(t.by_tuple.is_empty());
    }
}

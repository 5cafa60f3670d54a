//! The IPv4/TCP stack: one smoltcp [`Interface`] on the NIC, its sockets, DHCP, and the
//! task that polls them.
//!
//! The [`Stack`] is shared by every CPU (`Arc<Stack>`): the interface and the NIC (the
//! *engine*, behind a spin lock), the socket table (behind another), the kick that asks
//! the poll task to run, the address, the counters. Each socket is behind a lock of its
//! own (`super::sockets::SocketCell`), so a connection served on another CPU copies its
//! data while the stack polls other sockets. No lock is held across an `await`: every
//! access is a closure. Lock order: the engine, the table, a socket.
//!
//! Received frames are taken in by the poll task ([`Poller::run`], on the CPU that takes
//! the NIC's interrupt). Sending happens where the data is made: a connection that queued
//! a reply sends it at once on its own CPU ([`Stack::transmit`]) when no other CPU holds
//! the engine, and otherwise leaves it to the poll task, which is running then (so asking
//! it costs no wake-up IPI). The poll task sleeps until one of: the NIC's interrupt, a
//! socket user's [`Stack::kick`] (data queued while the engine was busy, a socket closed
//! or reset), or the earliest deadline smoltcp asks for over every socket
//! (retransmission, delayed ACK, keep-alive, DHCP renewal): a send on another CPU that
//! asks for an earlier one kicks it. Without MSI-X it also wakes every [`POLL_FALLBACK`].

use alloc::sync::Arc;
use core::future::poll_fn;
use core::future::Future;
use core::net::Ipv4Addr;
use core::pin::{pin, Pin};
use core::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use core::task::Poll;
use core::time::Duration;

use smoltcp::iface::{Config as IfaceConfig, Interface, PollIngressSingleResult, PollResult};
use smoltcp::socket::{dhcpv4, tcp, AnySocket};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Cidr};

use super::nic::{Interrupts, Nic};
use super::offload::Offloads;
use super::sockets::{Route, SockId, SocketCell, Sockets};
use super::stats::NicStats;
use super::syn_gate::SynGate;
use crate::config::IpConfig;
use crate::exec::IrqEvent;
use crate::{clock, task};

/// How often the stack polls a NIC without interrupts.
pub const POLL_FALLBACK: Duration = Duration::from_millis(1);
/// Frames taken in before the sockets may send (ACKs, window updates): see `poll`. Each
/// sending pass visits every due socket, so passes cost more with more connections: 16
/// gave 64 KiB write + fsync at 16 connections 1.6x the ops/s of 2, and 1 MiB writes
/// 1.5x the MiB/s (docs/benchmarks.md, "Fewer sending passes").
pub const ACK_EVERY_FRAMES: usize = 16;

/// The current time on smoltcp's clock (the kernel's monotonic clock).
pub fn now() -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_micros((clock::now().as_nanos() / 1_000) as i64)
}

/// The stack as every CPU shares it. See the module documentation.
pub struct Stack {
    /// The interface and the NIC: the poll task holds them for a pass, a connection for
    /// sending its reply ([`Stack::transmit`]).
    engine: spin::Mutex<Engine>,
    /// The sockets; users work on them by id or through their cell, in closures.
    sockets: spin::Mutex<Sockets>,
    /// When the poll task will poll next if nothing wakes it (smoltcp microseconds;
    /// `i64::MAX`: not before something does). Written under the engine lock.
    next_poll: AtomicI64,
    /// The NIC's gate for connection requests (the 9P listener arms it).
    syn_gate: Arc<SynGate>,
    kick: IrqEvent,
    /// The address once configured.
    address: spin::Mutex<Option<Ipv4Cidr>>,
    /// Signalled when an address is (re)configured.
    configured: IrqEvent,
    polls: AtomicU64,
    /// The NIC's counters, and the event its interrupt signals (counts interrupts).
    nic_stats: Arc<NicStats>,
    nic_event: Arc<IrqEvent>,
    nic_offloads: Offloads,
}

impl core::fmt::Debug for Stack {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Stack")
            .field("address", &self.address())
            .field("polls", &self.polls())
            .finish()
    }
}

/// The interface and the NIC, and the DHCP client's socket.
struct Engine {
    iface: Interface,
    nic: Nic,
    dhcp: Option<SockId>,
}

/// The poll task: takes in received frames and sends what is due. See the module
/// documentation.
#[derive(Debug)]
pub struct Poller {
    stack: Arc<Stack>,
    /// The NIC's interrupt event, and whether it has no interrupt (polled).
    nic_event: Arc<IrqEvent>,
    polling: bool,
}

impl Stack {
    /// An interface on `nic` with a static address (and gateway) or a DHCP client: the
    /// shared stack, and the poller to run ([`Poller::run`]) on the CPU of the NIC's
    /// interrupt.
    pub fn new(mut nic: Nic, ip: IpConfig, gateway: Option<Ipv4Addr>) -> (Arc<Stack>, Poller) {
        let mac = EthernetAddress(nic.mac());
        let mut config = IfaceConfig::new(HardwareAddress::Ethernet(mac));
        // Initial sequence numbers and DHCP transaction ids: the TSC is as good a seed as
        // this machine has.
        config.random_seed = crate::hal::cpu::rdtsc();
        let mut iface = Interface::new(config, &mut nic, now());
        let mut sockets = Sockets::new();
        let (dhcp, address) = match ip {
            IpConfig::Dhcp => {
                let id = sockets.add(dhcpv4::Socket::new());
                sockets.set_fallback(id);
                (Some(id), None)
            }
            IpConfig::Static { addr, prefix } => {
                let cidr = Ipv4Cidr::new(addr, prefix);
                iface.update_ip_addrs(|a| {
                    a.push(IpCidr::Ipv4(cidr)).expect("one address fits");
                });
                if let Some(gw) = gateway {
                    iface
                        .routes_mut()
                        .add_default_ipv4_route(gw)
                        .expect("one route fits");
                }
                log::info!(
                    "net: static address {cidr}, gateway {}",
                    gateway.map_or("none".into(), |g| alloc::format!("{g}"))
                );
                (None, Some(cidr))
            }
        };
        let o = nic.offloads();
        log::info!(
            "net: {} MAC {mac}, {}; offloads: {}",
            nic.pci().address(),
            match nic.interrupts() {
                Interrupts::MsiX { vector } => alloc::format!("MSI-X vector {vector:#x}"),
                Interrupts::Polling => alloc::format!("polled every {POLL_FALLBACK:?}"),
            },
            match [
                (o.csum, "transmit checksums"),
                (o.guest_csum, "receive checksums"),
                (o.tso4, "TSO"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, what)| *what)
            .collect::<alloc::vec::Vec<_>>()
            {
                v if v.is_empty() => alloc::string::String::from("none"),
                v => v.join(", "),
            }
        );
        let poller_event = (nic.event(), nic.interrupts() == Interrupts::Polling);
        let stack = Arc::new(Stack {
            sockets: spin::Mutex::new(sockets),
            next_poll: AtomicI64::new(i64::MAX),
            syn_gate: nic.syn_gate(),
            kick: IrqEvent::new(),
            address: spin::Mutex::new(address),
            configured: IrqEvent::new(),
            polls: AtomicU64::new(0),
            nic_stats: nic.stats(),
            nic_event: nic.event(),
            nic_offloads: nic.offloads(),
            engine: spin::Mutex::new(Engine { iface, nic, dhcp }),
        });
        let poller = Poller {
            stack: stack.clone(),
            nic_event: poller_event.0,
            polling: poller_event.1,
        };
        (stack, poller)
    }

    /// Asks the poll task to run soon (a socket has data to send or room to receive).
    pub fn kick(&self) {
        self.kick.signal();
    }

    /// Sends what socket `h` has queued, here and now, if no other CPU holds the engine;
    /// otherwise kicks the poll task, which holds it (see the module documentation).
    pub fn transmit(&self, h: SockId) {
        let Some(mut engine) = self.engine.try_lock() else {
            self.kick();
            return;
        };
        let now = now();
        let Engine { iface, nic, .. } = &mut *engine;
        let due = self.sockets.lock().egress_one(h, |set| {
            while iface.poll_egress(now, nic, set) != PollResult::None {}
            nic.flush();
            iface.poll_at(now, set)
        });
        // The poll task sleeps until the earliest time a socket asked for when it last
        // looked; an earlier one must wake it (to retransmit, say).
        let earlier =
            due.is_some_and(|t| t.total_micros() < self.next_poll.load(Ordering::Relaxed));
        drop(engine);
        if earlier {
            self.kick();
        }
    }

    /// Adds `socket` to the stack.
    pub fn add<T: AnySocket<'static>>(&self, socket: T) -> SockId {
        self.sockets.lock().add(socket)
    }

    /// Removes socket `h` from the stack.
    ///
    /// # Panics
    /// If there is no such socket.
    pub fn remove(&self, h: SockId) {
        self.sockets.lock().remove(h);
    }

    /// Socket `h`'s cell, for its user on any CPU.
    ///
    /// # Panics
    /// If there is no such socket.
    pub fn cell(&self, h: SockId) -> Arc<SocketCell> {
        self.sockets.lock().cell(h).clone()
    }

    /// Runs `f` on TCP socket `h`, which becomes due for sending.
    ///
    /// # Panics
    /// If there is no such socket or it is not a TCP one.
    pub fn with_tcp<R>(&self, h: SockId, f: impl FnOnce(&mut tcp::Socket<'static>) -> R) -> R {
        self.sockets.lock().with(h, f)
    }

    /// Runs `f` on TCP socket `h` to look at it or register a waker: it does not become
    /// due for sending, so `f` must not change what it has to send.
    ///
    /// # Panics
    /// As [`Stack::with_tcp`].
    pub fn peek_tcp<R>(&self, h: SockId, f: impl FnOnce(&mut tcp::Socket<'static>) -> R) -> R {
        self.sockets.lock().with_quiet(h, f)
    }

    /// The NIC's gate for connection requests.
    pub fn syn_gate(&self) -> &SynGate {
        &self.syn_gate
    }

    /// Resets the connection on socket `h` and waits (at most [`RESET_TIMEOUT`]) until
    /// the reset has gone out. smoltcp sends it at the stack's next poll, and only while
    /// the socket is in the set (it then forgets its peer): a socket freed before that
    /// leaves its client believing the connection is open — one that has nothing to send
    /// never learns.
    pub async fn reset(&self, h: SockId) {
        let cell = self.cell(h);
        cell.with(|s: &mut tcp::Socket| s.abort());
        self.kick();
        let sent = poll_fn(|cx| {
            cell.with_quiet(|s: &mut tcp::Socket| {
                if s.remote_endpoint().is_none() {
                    Poll::Ready(())
                } else {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
            })
        });
        // A NIC that cannot send must not keep the socket forever.
        let _ = task::timeout(RESET_TIMEOUT, sent).await;
    }

    /// Resets the connection on socket `h` ([`Stack::reset`]) and frees the socket.
    pub async fn reset_and_remove(&self, h: SockId) {
        self.reset(h).await;
        self.remove(h);
    }

    /// The interface's address, once configured.
    pub fn address(&self) -> Option<Ipv4Cidr> {
        *self.address.lock()
    }

    /// Waits until the interface has an address.
    pub async fn wait_configured(&self) -> Ipv4Cidr {
        loop {
            if let Some(a) = self.address() {
                return a;
            }
            self.configured.wait().await;
        }
    }

    /// The NIC's counters, as a line.
    pub fn nic_stats(&self) -> alloc::string::String {
        alloc::format!(
            "{}, {} interrupts",
            self.nic_stats,
            self.nic_event.signal_count()
        )
    }

    /// The NIC's counters.
    pub fn nic_counters(&self) -> &NicStats {
        &self.nic_stats
    }

    /// The offloads in effect on the NIC.
    pub fn nic_offloads(&self) -> Offloads {
        self.nic_offloads
    }

    /// Times the interface was polled.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    fn set_address(&self, address: Option<Ipv4Cidr>) {
        *self.address.lock() = address;
    }
}

impl Poller {
    /// Polls the interface once; returns how long until it wants polling again.
    fn poll(&mut self) -> Option<Duration> {
        let now = now();
        let stack = &*self.stack;
        let mut engine = stack.engine.lock();
        let Engine { iface, nic, dhcp } = &mut *engine;
        let mut sockets = stack.sockets.lock();
        // smoltcp's `poll` takes in every frame waiting before it sends anything, so a
        // burst of data segments gets one ACK at the end (a stretch ACK). Sending what
        // the sockets want after every few frames keeps the ACKs (and window updates) of
        // a bulk transfer flowing, which is what clocks the client's sender.
        iface.poll_maintenance(now);
        let next = loop {
            let mut ingress = 0;
            while ingress < ACK_EVERY_FRAMES {
                let Some(frame) = nic.peek() else {
                    break;
                };
                let route = sockets.route(frame);
                if route == Route::Nowhere {
                    stack.syn_gate.unrouted(frame);
                }
                let taken = sockets.ingress(route, |set| iface.poll_ingress_single(now, nic, set));
                debug_assert!(taken != PollIngressSingleResult::None, "the peeked frame");
                ingress += 1;
            }
            let next = sockets.egress(now, |set| {
                while iface.poll_egress(now, nic, set) != PollResult::None {}
                // The end of a socket's pass: its segments are joined, and sent.
                nic.flush();
                iface.poll_at(now, set)
            });
            // Nothing is held past a pass (a reply smoltcp made while taking frames in).
            nic.flush();
            if ingress < ACK_EVERY_FRAMES {
                break next;
            }
        };
        stack.polls.fetch_add(1, Ordering::Relaxed);
        stack.next_poll.store(
            next.map_or(i64::MAX, |t| t.total_micros()),
            Ordering::Relaxed,
        );
        if let Some(h) = *dhcp {
            // The event borrows the client: it is handled under its lock (rarely: a
            // lease gained or lost).
            sockets.with_quiet(h, |dhcp: &mut dhcpv4::Socket| match dhcp.poll() {
                Some(dhcpv4::Event::Configured(c)) => {
                    iface.update_ip_addrs(|a| {
                        a.clear();
                        a.push(IpCidr::Ipv4(c.address)).expect("one address fits");
                    });
                    match c.router {
                        Some(r) => {
                            iface
                                .routes_mut()
                                .add_default_ipv4_route(r)
                                .expect("one route fits");
                        }
                        None => {
                            iface.routes_mut().remove_default_ipv4_route();
                        }
                    }
                    log::info!(
                        "net: dhcp: address {}, gateway {}, from {}",
                        c.address,
                        c.router.map_or("none".into(), |g| alloc::format!("{g}")),
                        c.server.address
                    );
                    stack.set_address(Some(c.address));
                    stack.configured.signal();
                }
                Some(dhcpv4::Event::Deconfigured) => {
                    // The client starts deconfigured; only a lost lease is news.
                    if stack.address().is_some() {
                        log::warn!("net: dhcp: lease lost; no address");
                    }
                    iface.update_ip_addrs(|a| a.clear());
                    iface.routes_mut().remove_default_ipv4_route();
                    stack.set_address(None);
                }
                None => {}
            });
        }
        // smoltcp's `Instant - Instant` is the distance either way: a time already past
        // (a socket that could not send everything) means at once.
        next.map(|t| match t > now {
            true => Duration::from_micros((t - now).total_micros()),
            false => Duration::ZERO,
        })
    }

    /// The poll task: runs for as long as the appliance does.
    pub async fn run(mut self) {
        let (nic_event, polling) = (self.nic_event.clone(), self.polling);
        let stack = self.stack.clone();
        loop {
            // Consume pending wake-ups first: what they announce is handled by this poll.
            stack.kick.take();
            nic_event.take();
            let mut delay = self.poll();
            if polling {
                delay = Some(delay.map_or(POLL_FALLBACK, |d| d.min(POLL_FALLBACK)));
            }
            if delay == Some(Duration::ZERO) {
                // smoltcp has more to do now (a full transmit queue, say): let the other
                // tasks run first.
                yield_now().await;
                continue;
            }
            let mut irq = pin!(nic_event.wait());
            let mut kick = pin!(stack.kick.wait());
            let mut sleep = delay.map(task::sleep);
            poll_fn(|cx| {
                let woken = irq.as_mut().poll(cx).is_ready()
                    | kick.as_mut().poll(cx).is_ready()
                    | sleep
                        .as_mut()
                        .is_some_and(|s| Pin::new(s).poll(cx).is_ready());
                if woken {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }
}

/// Longest a reset may take to go out before its socket is freed anyway.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(1);

/// Lets every other ready task run once (the one definition, in the block crate).
pub use block::yield_now;

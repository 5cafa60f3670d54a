//! Host tests of TCP loss recovery as the appliance configures smoltcp (Reno, no Nagle,
//! the vendored retransmission floor: `kernel/vendor/README.md`): two smoltcp
//! interfaces joined by a link that drops chosen frames, on a clock the test moves.

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, HardwareAddress, IpAddress, IpCidr,
    IpProtocol, Ipv4Packet, TcpPacket,
};

use super::test_frames::{LOCAL, REMOTE};

/// One end of the link: frames it sent wait in `out` until the test carries them over.
#[derive(Debug, Default)]
struct End {
    inbox: VecDeque<Vec<u8>>,
    out: Vec<Vec<u8>>,
}

/// A received frame.
struct Rx(Vec<u8>);
/// Room for a frame to send.
struct Tx<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0; len];
        let r = f(&mut frame);
        self.0.push(frame);
        r
    }
}

impl Device for End {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: Instant) -> Option<(Rx, Tx<'_>)> {
        let frame = self.inbox.pop_front()?;
        Some((Rx(frame), Tx(&mut self.out)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.out))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        caps
    }
}

/// A host on the link: its device, interface and one TCP socket.
struct Host {
    dev: End,
    iface: Interface,
    sockets: SocketSet<'static>,
    tcp: SocketHandle,
}

impl Host {
    fn new(mac: u8, addr: smoltcp::wire::Ipv4Address) -> Host {
        let mut dev = End::default();
        let hw = HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, mac]));
        let mut iface = Interface::new(Config::new(hw), &mut dev, Instant::ZERO);
        iface.update_ip_addrs(|a| a.push(IpCidr::new(IpAddress::Ipv4(addr), 24)).unwrap());
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 256 << 10]),
            tcp::SocketBuffer::new(vec![0; 256 << 10]),
        );
        // As the 9P listener sets its sockets.
        s.set_nagle_enabled(false);
        s.set_congestion_control(tcp::CongestionControl::Reno);
        let mut sockets = SocketSet::new(Vec::new());
        let tcp = sockets.add(s);
        Host {
            dev,
            iface,
            sockets,
            tcp,
        }
    }

    fn poll(&mut self, now: Instant) {
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
    }

    fn socket(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut(self.tcp)
    }
}

/// The end sequence number (`seq + payload length`) of the TCP segment in `frame`, if
/// it carries data.
fn data_end(frame: &[u8]) -> Option<u32> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let len = tcp.payload().len();
    (len > 0).then(|| (tcp.seq_number() + len).0 as u32)
}

/// The appliance (LOCAL:564) sends `data` to a client (REMOTE) that reads all of it;
/// `drop` decides, for each data frame the appliance sends (with its end sequence
/// number), whether the link loses it. Returns the milliseconds until the client had
/// everything and how many frames were dropped.
fn transfer(data: &[u8], mut drop: impl FnMut(u32) -> bool) -> (u64, usize) {
    let mut server = Host::new(1, LOCAL);
    let mut client = Host::new(2, REMOTE);
    server.socket().listen(564).unwrap();
    let cx = client.iface.context();
    client
        .sockets
        .get_mut::<tcp::Socket>(client.tcp)
        .connect(cx, (IpAddress::Ipv4(LOCAL), 564), 40000)
        .unwrap();
    let (mut sent, mut received, mut dropped) = (0, Vec::new(), 0);
    let mut started = None;
    for ms in 0..10_000u64 {
        let now = Instant::from_millis(ms as i64);
        server.poll(now);
        client.poll(now);
        let s = server.socket();
        if s.may_send() {
            started.get_or_insert(ms);
            sent += s.send_slice(&data[sent..]).unwrap();
        }
        let c = client.socket();
        if c.can_recv() {
            c.recv(|b| {
                received.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        if received.len() == data.len() {
            assert_eq!(received, data, "the client read what was sent");
            return (ms - started.unwrap(), dropped);
        }
        for frame in server.dev.out.drain(..) {
            if data_end(&frame).is_some_and(&mut drop) {
                dropped += 1;
                continue;
            }
            client.dev.inbox.push_back(frame);
        }
        for frame in client.dev.out.drain(..) {
            server.dev.inbox.push_back(frame);
        }
    }
    panic!("{} of {} bytes arrived in 10 s", received.len(), data.len());
}

/// A reply's tail lost on the way (the loss no duplicate ACK can report: nothing
/// follows it) is sent again when the retransmission timer fires, at the vendored
/// 200 ms floor rather than smoltcp's 1 s: a read of 1 MiB that loses its tail stalls
/// for a fifth of a second, not a second.
#[test]
fn a_lost_tail_is_sent_again_within_the_retransmission_floor() {
    let data: Vec<u8> = (0..48 << 10).map(|i| (i * 7 % 251) as u8).collect();
    // Interfaces seeded alike choose the same initial sequence numbers, so the tail's
    // end seen in a clean run names the same frame in the next.
    let mut tail_end = 0;
    let (clean, none) = transfer(&data, |end| {
        tail_end = tail_end.max(end);
        false
    });
    assert_eq!(none, 0);
    let mut once = true;
    let (lossy, dropped) = transfer(&data, |end| {
        let hit = once && end == tail_end;
        once &= !hit;
        hit
    });
    assert_eq!(dropped, 1, "the tail was lost once");
    assert!(clean < 50, "without loss the transfer takes {clean} ms");
    assert!(
        (150..400).contains(&lossy),
        "the lost tail arrived after {lossy} ms: the timer's floor is 200 ms"
    );
}

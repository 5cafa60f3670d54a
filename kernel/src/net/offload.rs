//! Checksum and segmentation offload on virtio-net: which offloads the device and the
//! appliance agreed on, what smoltcp is told to leave out, and the work on each frame
//! that takes its place (pure, host-tested; `nic.rs` runs it on the device's buffers).
//!
//! smoltcp's [`ChecksumCapabilities`] hold for a whole device, not a frame, so the NIC
//! layer makes every frame right whatever the device does:
//! - **Transmit, `VIRTIO_NET_F_CSUM`**: smoltcp leaves the TCP checksum of every segment
//!   it builds at zero; [`prepare_tx`] (or [`Gso::finish`]) puts the pseudo-header sum
//!   in its place and asks the device to finish it (`NEEDS_CSUM`, `csum_start` at the
//!   TCP header, `csum_offset` 16), as Linux does. Other protocols (DHCP's UDP, ICMP)
//!   keep the checksums smoltcp computes. Without the feature smoltcp computes every
//!   checksum, as before.
//! - **Transmit, `VIRTIO_NET_F_HOST_TSO4`** (only with CSUM): smoltcp never builds a
//!   segment longer than the peer's MSS, so the NIC layer joins the segments it emits in
//!   one sending pass for one connection: a [`Gso`] frame starts with a full segment
//!   carrying only ACK, and takes each next segment that continues it — the same
//!   headers but for the IP length, id and checksum and the TCP sequence number, flags
//!   and checksum; its sequence number where the last one ended; ACK, and PSH only on
//!   the last; no longer than the first — up to [`GSO_MAX_FRAME`] bytes. It goes to the
//!   device as one frame with a GSO header (`gso_type` TCPV4, `gso_size` the first
//!   segment's payload, `hdr_len` the headers), which the device (the host's network
//!   stack behind a tap) cuts back into those segments, each with its own IP length, id
//!   and checksums and the flags where they were. The NIC sends it when the next
//!   segment does not continue it, when it is full or ended (PSH, a short segment), and
//!   at the end of every sending pass.
//! - **Receive, `VIRTIO_NET_F_GUEST_CSUM`**: smoltcp no longer verifies TCP checksums;
//!   [`check_rx`] does, for the frames the device did not vouch for (`DATA_VALID`: it
//!   checked them; `NEEDS_CSUM`: a partial checksum from a sender inside the host, which
//!   never crossed a wire, as Linux's `CHECKSUM_PARTIAL`). A partial checksum on another
//!   protocol is completed here, since smoltcp still verifies those. Without the feature
//!   the device delivers complete checksums and smoltcp verifies them, as before.
//!
//! Nothing is negotiated that the device does not offer: QEMU offers these only with a
//! backend that carries the virtio-net header (a tap with `vnet_hdr`); user networking
//! (slirp) and `-netdev dgram|stream` offer none, and there every checksum is computed
//! and verified in software exactly as without this module.

use serde::Serialize;
use smoltcp::phy::{Checksum, ChecksumCapabilities};
use smoltcp::wire::{checksum, EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};

/// `VIRTIO_NET_F_CSUM`: the device completes checksums of frames we send.
pub const F_CSUM: u64 = 1 << 0;
/// `VIRTIO_NET_F_GUEST_CSUM`: the device may deliver frames whose checksum it checked
/// (`DATA_VALID`) or left partial (`NEEDS_CSUM`).
pub const F_GUEST_CSUM: u64 = 1 << 1;
/// `VIRTIO_NET_F_HOST_TSO4`: the device segments TCP/IPv4 frames we send (needs CSUM).
pub const F_HOST_TSO4: u64 = 1 << 11;

/// Header flag: the checksum at `csum_start + csum_offset` is to be completed.
pub const NEEDS_CSUM: u8 = 1;
/// Header flag (receive): the device validated the frame's checksum.
pub const DATA_VALID: u8 = 2;
/// `gso_type` of a TCP/IPv4 frame to segment.
pub const GSO_TCPV4: u8 = 1;

/// Ethernet header length (no VLAN tag).
const ETHERNET_HEADER: usize = 14;
/// Offset of the checksum in a TCP header.
const TCP_CHECKSUM_OFFSET: u16 = 16;

/// The longest frame (from the destination MAC address on) a [`Gso`] frame may grow
/// to: one 64 KiB transmit buffer (16 pages) less room for the virtio-net header (16
/// bytes), so an IP packet of at most 65,506 bytes (its length field holds 65,535).
pub const GSO_MAX_FRAME: usize = 65536 - 16;
/// The longest headers a [`Gso`] frame repeats: Ethernet, IPv4 without options, TCP
/// with the most options.
pub const GSO_MAX_HEADERS: usize = ETHERNET_HEADER + 20 + 60;

/// The offloads in effect on the NIC: offered by the device, wanted by the appliance
/// (`offload=on`, the default) and negotiated. Reported in the counters document
/// (`nic.offloads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Offloads {
    /// `VIRTIO_NET_F_CSUM`: the device completes our TCP checksums.
    pub csum: bool,
    /// `VIRTIO_NET_F_GUEST_CSUM`: received frames may come with their checksum
    /// validated (or partial) by the device.
    pub guest_csum: bool,
    /// `VIRTIO_NET_F_HOST_TSO4`: the device segments our large TCP/IPv4 frames, and
    /// transmit buffers for them were set aside.
    pub tso4: bool,
}

impl Offloads {
    /// The feature bits to offer the device when offloads are `enabled` (`offload=`):
    /// it accepts those it offers too.
    pub fn wanted(enabled: bool) -> u64 {
        if enabled {
            F_CSUM | F_GUEST_CSUM | F_HOST_TSO4
        } else {
            0
        }
    }

    /// The feature bits to write to the device, of those it `offered`, when the
    /// appliance wants `wanted`: HOST_TSO4 only with CSUM (virtio 1.1, 5.1.3.1).
    pub fn negotiate(offered: u64, wanted: u64) -> u64 {
        let mut bits = offered & wanted & (F_CSUM | F_GUEST_CSUM | F_HOST_TSO4);
        if bits & F_CSUM == 0 {
            bits &= !F_HOST_TSO4;
        }
        bits
    }

    /// The offloads the negotiated feature bits give.
    pub fn from_features(bits: u64) -> Offloads {
        let csum = bits & F_CSUM != 0;
        Offloads {
            csum,
            guest_csum: bits & F_GUEST_CSUM != 0,
            tso4: csum && bits & F_HOST_TSO4 != 0,
        }
    }

    /// What smoltcp computes and verifies itself: everything but what the device (or
    /// [`prepare_tx`] and [`check_rx`] around it) does instead.
    pub fn checksum_caps(&self) -> ChecksumCapabilities {
        let mut caps = ChecksumCapabilities::default();
        caps.tcp = match (self.csum, self.guest_csum) {
            (false, false) => Checksum::Both,
            (true, false) => Checksum::Rx,
            (false, true) => Checksum::Tx,
            (true, true) => Checksum::None,
        };
        caps
    }
}

/// The fields of the virtio-net header the driver reads and writes (virtio 1.1, 5.1.6:
/// the first 10 bytes of it, common to every layout; `num_buffers` follows with
/// VERSION_1 and is the device's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHeader {
    /// `NEEDS_CSUM`, `DATA_VALID`.
    pub flags: u8,
    /// `GSO_TCPV4` or 0 (none).
    pub gso_type: u8,
    /// Length of the headers repeated in each segment (GSO).
    pub hdr_len: u16,
    /// Payload bytes per segment (GSO).
    pub gso_size: u16,
    /// Where the checksummed data starts, from the frame's first byte.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
}

impl NetHeader {
    /// Bytes of the header these fields take.
    pub const LEN: usize = 10;

    /// Writes the fields to the start of `buf` (little-endian, as VERSION_1 says).
    ///
    /// # Panics
    /// If `buf` is shorter than [`NetHeader::LEN`].
    pub fn write(&self, buf: &mut [u8]) {
        buf[0] = self.flags;
        buf[1] = self.gso_type;
        buf[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        buf[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        buf[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        buf[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }

    /// The fields at the start of `buf`; all zero (nothing to say) if it is too short.
    pub fn read(buf: &[u8]) -> NetHeader {
        let Some(b) = buf.get(..Self::LEN) else {
            return NetHeader::default();
        };
        let word = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHeader {
            flags: b[0],
            gso_type: b[1],
            hdr_len: word(2),
            gso_size: word(4),
            csum_start: word(6),
            csum_offset: word(8),
        }
    }
}

/// What [`prepare_tx`] or [`Gso::finish`] made of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOffload {
    /// Sent as smoltcp built it (every checksum computed).
    None,
    /// The device completes its TCP checksum.
    Checksum,
    /// The device cuts it into this many segments (and completes their checksums).
    Segments(u16),
}

/// Why [`prepare_tx`] refused a frame (it is dropped and counted: it would have gone
/// out with a checksum nobody computes; smoltcp never builds one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxRefused {
    /// An IPv4 TCP segment that does not parse, or an IP fragment of one.
    Malformed,
}

/// The IPv4 TCP segment in `frame`, if it is one: the IP header's length and the TCP
/// segment's (header and payload); an error for one that is malformed or a fragment.
fn tcp_in(frame: &[u8]) -> Option<Result<(usize, usize), TxRefused>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
        return (eth.payload().get(9) == Some(&6)).then_some(Err(TxRefused::Malformed));
    };
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Some(Err(TxRefused::Malformed));
    }
    let ihl = usize::from(ip.header_len());
    let Some(tcp_len) = usize::from(ip.total_len()).checked_sub(ihl) else {
        return Some(Err(TxRefused::Malformed));
    };
    if TcpPacket::new_checked(&ip.payload()[..tcp_len]).is_err() {
        return Some(Err(TxRefused::Malformed));
    }
    Some(Ok((ihl, tcp_len)))
}

/// Puts the pseudo-header sum in the TCP checksum field of the segment at `start`
/// (`tcp_len` bytes) of `frame` and returns the header asking the device to complete it.
fn offload_checksum(frame: &mut [u8], start: usize, tcp_len: usize) -> NetHeader {
    let ip = Ipv4Packet::new_unchecked(&frame[ETHERNET_HEADER..]);
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let pseudo = checksum::pseudo_header_v4(&src, &dst, IpProtocol::Tcp, tcp_len as u32);
    TcpPacket::new_unchecked(&mut frame[start..start + tcp_len]).set_checksum(pseudo);
    NetHeader {
        flags: NEEDS_CSUM,
        csum_start: start as u16,
        csum_offset: TCP_CHECKSUM_OFFSET,
        ..NetHeader::default()
    }
}

/// Readies a single `frame` for the device: the virtio-net header to send it with, and
/// what the device will do. With CSUM, smoltcp left its TCP checksum out. See the
/// module documentation.
pub fn prepare_tx(
    frame: &mut [u8],
    offloads: Offloads,
) -> Result<(NetHeader, TxOffload), TxRefused> {
    if !offloads.csum {
        return Ok((NetHeader::default(), TxOffload::None));
    }
    match tcp_in(frame) {
        None => Ok((NetHeader::default(), TxOffload::None)),
        Some(Err(e)) => Err(e),
        Some(Ok((ihl, tcp_len))) => Ok((
            offload_checksum(frame, ETHERNET_HEADER + ihl, tcp_len),
            TxOffload::Checksum,
        )),
    }
}

/// TCP header flags.
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
/// Offsets in the IPv4 header of the fields a segment of a [`Gso`] frame may change.
const IP_LENGTH: usize = 2;
const IP_IDENT: usize = 4;
const IP_CHECKSUM: usize = 10;
/// Offsets in the TCP header of those fields.
const TCP_SEQ: usize = 4;
const TCP_FLAGS: usize = 13;
const TCP_CHECKSUM: usize = 16;

/// A TCP segment as the coalescer reads it.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// Ethernet, IP and TCP headers.
    hdr_len: usize,
    payload: usize,
    seq: u32,
    flags: u8,
}

/// `frame` as a segment a [`Gso`] frame may hold: IPv4 without options and unfragmented,
/// TCP, the frame exactly the packet (no padding), the headers within
/// [`GSO_MAX_HEADERS`].
fn segment(frame: &[u8]) -> Option<Segment> {
    let Some(Ok((ihl, tcp_len))) = tcp_in(frame) else {
        return None;
    };
    if ihl != 20 || ETHERNET_HEADER + ihl + tcp_len != frame.len() {
        return None;
    }
    let tcp = TcpPacket::new_unchecked(&frame[ETHERNET_HEADER + ihl..]);
    let header = usize::from(tcp.header_len());
    Some(Segment {
        hdr_len: ETHERNET_HEADER + ihl + header,
        payload: tcp_len - header,
        seq: tcp.seq_number().0 as u32,
        flags: frame[ETHERNET_HEADER + ihl + TCP_FLAGS],
    })
}

/// A TCP/IPv4 frame for the device to segment (TSO), being built from the segments
/// smoltcp emits in one sending pass: see the module documentation. The frame itself
/// lies in a transmit buffer the NIC holds: the first segment as smoltcp built it, and
/// each next one's payload after the last (smoltcp builds the next segment at
/// [`Gso::next_at`], over the last bytes of the payload before it, which the NIC keeps
/// and puts back if [`Gso::accepts`] it).
#[derive(Clone, Copy, Debug)]
pub struct Gso {
    /// The first segment's headers.
    header: [u8; GSO_MAX_HEADERS],
    hdr_len: usize,
    /// The first segment's payload: every segment's but the last.
    mss: usize,
    /// Bytes of the frame so far.
    len: usize,
    segments: u16,
    /// The sequence number the next segment must have.
    next_seq: u32,
    /// The last segment carried PSH.
    psh: bool,
    /// No segment may follow (PSH, or one shorter than the first).
    ended: bool,
}

impl Gso {
    /// The shortest first segment (from the destination MAC address on) a frame to
    /// segment starts with: full segments are near the MTU; below this, merging would
    /// spend a large buffer on a frame that will not grow.
    pub const MIN_START: usize = 512;

    /// A frame to segment that starts with `frame`, if a segment could follow it: an
    /// IPv4 TCP segment (see [`segment`]) with only ACK set and at least
    /// [`Gso::MIN_START`] bytes, whose payload is longer than its headers (the next
    /// segment's headers are written over the payload's end).
    pub fn start(frame: &[u8]) -> Option<Gso> {
        let seg = segment(frame)?;
        if seg.flags != ACK || frame.len() < Self::MIN_START || seg.payload <= seg.hdr_len {
            return None;
        }
        let mut header = [0u8; GSO_MAX_HEADERS];
        header[..seg.hdr_len].copy_from_slice(&frame[..seg.hdr_len]);
        Some(Gso {
            header,
            hdr_len: seg.hdr_len,
            mss: seg.payload,
            len: frame.len(),
            segments: 1,
            next_seq: seg.seq.wrapping_add(seg.payload as u32),
            psh: false,
            ended: false,
        })
    }

    /// Bytes of the frame so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing (never: it starts with a segment).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Length of the headers each segment repeats.
    pub fn hdr_len(&self) -> usize {
        self.hdr_len
    }

    /// Where, in the frame, the next segment is to be built: over the last
    /// [`Gso::hdr_len`] bytes, so that its payload follows the frame's.
    pub fn next_at(&self) -> usize {
        self.len - self.hdr_len
    }

    /// Whether a segment `len` bytes long (as smoltcp announces it) could still be
    /// added: the frame is not ended and has room for its payload.
    pub fn has_room(&self, len: usize) -> bool {
        !self.ended && len > self.hdr_len && self.len + (len - self.hdr_len) <= GSO_MAX_FRAME
    }

    /// Whether no segment may follow.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Takes the segment smoltcp just built, `next` (written at [`Gso::next_at`]), if it
    /// continues the frame: then its payload is the frame's next bytes, and the bytes
    /// its headers were written over are the caller's to put back. False if it does
    /// not: the caller moves it out and sends it on its own after this frame.
    pub fn accepts(&mut self, next: &[u8]) -> bool {
        let Some(seg) = segment(next) else {
            return false;
        };
        let h = self.hdr_len;
        let ip = ETHERNET_HEADER;
        let tcp = ETHERNET_HEADER + 20;
        let varies = |i: usize| {
            (ip + IP_LENGTH..ip + IP_LENGTH + 2).contains(&i)
                || (ip + IP_IDENT..ip + IP_IDENT + 2).contains(&i)
                || (ip + IP_CHECKSUM..ip + IP_CHECKSUM + 2).contains(&i)
                || (tcp + TCP_SEQ..tcp + TCP_SEQ + 4).contains(&i)
                || i == tcp + TCP_FLAGS
                || (tcp + TCP_CHECKSUM..tcp + TCP_CHECKSUM + 2).contains(&i)
        };
        let same_headers =
            seg.hdr_len == h && (0..h).all(|i| varies(i) || next[i] == self.header[i]);
        let continues = same_headers
            && seg.seq == self.next_seq
            && seg.flags & !PSH == ACK
            && (1..=self.mss).contains(&seg.payload)
            && self.has_room(next.len());
        if continues {
            self.len += seg.payload;
            self.segments += 1;
            self.next_seq = self.next_seq.wrapping_add(seg.payload as u32);
            self.psh = seg.flags & PSH != 0;
            self.ended = self.psh || seg.payload < self.mss;
        }
        continues
    }

    /// Completes the frame's headers in `frame` (its [`Gso::len`] bytes): the IP length
    /// and checksum for the whole, PSH if the last segment had it, the pseudo-header
    /// sum; returns the virtio-net header for it. A frame of one segment is sent as
    /// [`prepare_tx`] would.
    pub fn finish(&self, frame: &mut [u8]) -> (NetHeader, TxOffload) {
        let start = ETHERNET_HEADER + 20;
        let tcp_len = self.len - start;
        if self.segments > 1 {
            let mut ip = Ipv4Packet::new_unchecked(&mut frame[ETHERNET_HEADER..]);
            ip.set_total_len((20 + tcp_len) as u16);
            ip.fill_checksum();
            if self.psh {
                frame[start + TCP_FLAGS] |= PSH;
            }
        }
        let mut header = offload_checksum(frame, start, tcp_len);
        if self.segments == 1 {
            return (header, TxOffload::Checksum);
        }
        header.gso_type = GSO_TCPV4;
        header.gso_size = self.mss as u16;
        header.hdr_len = self.hdr_len as u16;
        (header, TxOffload::Segments(self.segments))
    }
}

/// What [`check_rx`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxCheck {
    /// Left to smoltcp (without GUEST_CSUM, or not TCP: it verifies those).
    Smoltcp,
    /// The device vouched for it (`DATA_VALID`, or a partial TCP checksum).
    Validated,
    /// Its TCP checksum was verified here, and is right.
    Verified,
    /// Its partial checksum (not TCP) was completed here.
    Completed,
    /// Its TCP checksum is wrong, or its partial checksum lies outside it: drop it.
    Bad,
}

/// Checks a received `frame` that came with `header`, as smoltcp no longer does: see
/// the module documentation.
pub fn check_rx(frame: &mut [u8], header: &NetHeader, offloads: Offloads) -> RxCheck {
    if !offloads.guest_csum {
        return RxCheck::Smoltcp;
    }
    if header.flags & DATA_VALID != 0 {
        return RxCheck::Validated;
    }
    let tcp = tcp_in(frame);
    if header.flags & NEEDS_CSUM != 0 {
        if matches!(tcp, Some(Ok(_))) {
            return RxCheck::Validated;
        }
        return complete(frame, header);
    }
    let Some(Ok((ihl, tcp_len))) = tcp else {
        // Not TCP: smoltcp verifies it; a malformed or fragmented one: it drops it.
        return RxCheck::Smoltcp;
    };
    let ip = Ipv4Packet::new_unchecked(&frame[ETHERNET_HEADER..]);
    let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
    let start = ETHERNET_HEADER + ihl;
    if TcpPacket::new_unchecked(&frame[start..start + tcp_len]).verify_checksum(&src, &dst) {
        RxCheck::Verified
    } else {
        RxCheck::Bad
    }
}

/// Completes the partial checksum `header` describes in `frame` (as Linux's
/// `skb_checksum_help`: the sum from `csum_start` on, the pseudo-header's already in
/// the field, complemented; 0 sent as 0xffff).
fn complete(frame: &mut [u8], header: &NetHeader) -> RxCheck {
    let start = usize::from(header.csum_start);
    let at = start + usize::from(header.csum_offset);
    if at + 2 > frame.len() {
        return RxCheck::Bad;
    }
    let sum = !checksum::data(&frame[start..]);
    let sum = if sum == 0 { 0xffff } else { sum };
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    RxCheck::Completed
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, IpAddress, Ipv4Address, Ipv4Repr, TcpControl, TcpRepr,
        TcpSeqNumber, UdpPacket, UdpRepr,
    };

    use super::*;

    const A: Ipv4Address = Ipv4Address::new(10, 9, 0, 2);
    const B: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);
    const MSS: usize = 1460;

    /// A segment as smoltcp emits it: from A:564 to B:40000, acknowledging 77.
    #[derive(Clone, Copy)]
    struct Seg<'a> {
        seq: u32,
        payload: &'a [u8],
        control: TcpControl,
        ident: u16,
        window: u16,
    }

    impl<'a> Seg<'a> {
        fn data(seq: u32, payload: &'a [u8]) -> Seg<'a> {
            Seg {
                seq,
                payload,
                control: TcpControl::None,
                ident: 0x1000,
                window: 1024,
            }
        }
    }

    /// The frame of `seg`, checksums per `caps` (the TCP checksum left at zero when
    /// smoltcp is told the device computes it).
    fn frame_of(seg: Seg, caps: &ChecksumCapabilities) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 564,
            dst_port: 40000,
            control: seg.control,
            seq_number: TcpSeqNumber(seg.seq as i32),
            ack_number: Some(TcpSeqNumber(77)),
            window_len: seg.window,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: seg.payload,
        };
        let ip = Ipv4Repr {
            src_addr: A,
            dst_addr: B,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut frame = vec![0u8; ETHERNET_HEADER + ip.buffer_len() + tcp.buffer_len()];
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            ethertype: EthernetProtocol::Ipv4,
        }
        .emit(&mut eth);
        let mut ipp = Ipv4Packet::new_unchecked(eth.payload_mut());
        ip.emit(&mut ipp, caps);
        ipp.set_ident(seg.ident);
        ipp.fill_checksum();
        if !caps.ipv4.tx() {
            ipp.set_checksum(0);
        }
        let mut tcpp = TcpPacket::new_unchecked(ipp.payload_mut());
        tcp.emit(&mut tcpp, &A.into(), &B.into(), caps);
        frame
    }

    fn tcp_frame(payload: &[u8], control: TcpControl, caps: &ChecksumCapabilities) -> Vec<u8> {
        frame_of(
            Seg {
                control,
                ..Seg::data(1000, payload)
            },
            caps,
        )
    }

    /// A UDP/IPv4 frame from B to A, checksums computed.
    fn udp_frame(payload: &[u8]) -> Vec<u8> {
        let udp = UdpRepr {
            src_port: 67,
            dst_port: 68,
        };
        let ip = Ipv4Repr {
            src_addr: B,
            dst_addr: A,
            next_header: IpProtocol::Udp,
            payload_len: udp.header_len() + payload.len(),
            hop_limit: 64,
        };
        let mut frame = vec![0u8; ETHERNET_HEADER + ip.buffer_len() + ip.payload_len];
        let caps = ChecksumCapabilities::default();
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_ethertype(EthernetProtocol::Ipv4);
        let mut ipp = Ipv4Packet::new_unchecked(eth.payload_mut());
        ip.emit(&mut ipp, &caps);
        let mut udpp = UdpPacket::new_unchecked(ipp.payload_mut());
        udp.emit(
            &mut udpp,
            &B.into(),
            &A.into(),
            payload.len(),
            |p| p.copy_from_slice(payload),
            &caps,
        );
        frame
    }

    /// What the device does with `NEEDS_CSUM`: the sum from `csum_start`, complemented,
    /// at `csum_offset`.
    fn device_completes(frame: &mut [u8], h: &NetHeader) {
        assert_eq!(h.flags & NEEDS_CSUM, NEEDS_CSUM);
        assert_eq!(complete(frame, h), RxCheck::Completed);
    }

    fn tcp_verifies(frame: &[u8]) -> bool {
        let ip = Ipv4Packet::new_checked(&frame[ETHERNET_HEADER..]).unwrap();
        let (src, dst): (IpAddress, IpAddress) = (ip.src_addr().into(), ip.dst_addr().into());
        TcpPacket::new_checked(ip.payload())
            .unwrap()
            .verify_checksum(&src, &dst)
    }

    /// What the device does with a TCPV4 GSO frame (Linux's `tcp_gso_segment`):
    /// `gso_size` segments, each with the headers (IP length, consecutive ids and
    /// checksum; TCP sequence number; PSH and FIN only on the last), each checksum
    /// computed.
    fn device_segments(frame: &[u8], h: &NetHeader) -> Vec<Vec<u8>> {
        assert_eq!(h.gso_type, GSO_TCPV4);
        assert_eq!(h.flags, NEEDS_CSUM);
        let hdr = usize::from(h.hdr_len);
        let chunks: Vec<&[u8]> = frame[hdr..].chunks(usize::from(h.gso_size)).collect();
        let last = chunks.len() - 1;
        chunks
            .iter()
            .enumerate()
            .map(|(i, chunk)| {
                let mut seg = frame[..hdr].to_vec();
                seg.extend_from_slice(chunk);
                let mut ip = Ipv4Packet::new_unchecked(&mut seg[ETHERNET_HEADER..]);
                ip.set_total_len((hdr - ETHERNET_HEADER + chunk.len()) as u16);
                ip.set_ident(ip.ident().wrapping_add(i as u16));
                ip.fill_checksum();
                let (src, dst) = (ip.src_addr(), ip.dst_addr());
                let mut tcp = TcpPacket::new_unchecked(ip.payload_mut());
                let seq = tcp.seq_number() + i * usize::from(h.gso_size);
                tcp.set_seq_number(seq);
                if i != last {
                    tcp.set_psh(false);
                    tcp.set_fin(false);
                }
                tcp.fill_checksum(&src.into(), &dst.into());
                seg
            })
            .collect()
    }

    /// What the NIC does with the segments smoltcp emits in one pass (`nic.rs`): in one
    /// buffer, each next segment built over the end of the frame and its payload kept if
    /// it continues, else moved out; the frames in the order they go to the device, each
    /// with its header.
    fn coalesce(segments: &[Vec<u8>], o: Offloads) -> Vec<(Vec<u8>, NetHeader, TxOffload)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; GSO_MAX_FRAME];
        let mut pending: Option<Gso> = None;
        let send = |frame: &mut [u8], gso: Option<Gso>, out: &mut Vec<_>| {
            let (h, what) = match gso {
                Some(g) => g.finish(frame),
                None => prepare_tx(frame, o).unwrap(),
            };
            out.push((frame.to_vec(), h, what));
        };
        for seg in segments {
            if let Some(mut g) = pending.take() {
                if g.has_room(seg.len()) {
                    let at = g.next_at();
                    let saved = buf[at..at + g.hdr_len()].to_vec();
                    buf[at..at + seg.len()].copy_from_slice(seg);
                    if g.accepts(&buf[at..at + seg.len()]) {
                        buf[at..at + saved.len()].copy_from_slice(&saved);
                        if g.is_ended() {
                            send(&mut buf[..g.len()], Some(g), &mut out);
                        } else {
                            pending = Some(g);
                        }
                        continue;
                    }
                    let mut moved = buf[at..at + seg.len()].to_vec();
                    buf[at..at + saved.len()].copy_from_slice(&saved);
                    send(&mut buf[..g.len()], Some(g), &mut out);
                    send(&mut moved, None, &mut out);
                    continue;
                }
                send(&mut buf[..g.len()], Some(g), &mut out);
            }
            buf[..seg.len()].copy_from_slice(seg);
            match Gso::start(&buf[..seg.len()]).filter(|_| o.tso4) {
                Some(g) => pending = Some(g),
                None => send(&mut buf[..seg.len()], None, &mut out),
            }
        }
        if let Some(g) = pending {
            send(&mut buf[..g.len()], Some(g), &mut out);
        }
        out
    }

    /// What reaches the wire from the frames the NIC sent: each cut and completed by
    /// the device as its header says.
    fn on_the_wire(sent: Vec<(Vec<u8>, NetHeader, TxOffload)>) -> Vec<Vec<u8>> {
        let mut wire = Vec::new();
        for (mut frame, h, what) in sent {
            match what {
                TxOffload::None => wire.push(frame),
                TxOffload::Checksum => {
                    device_completes(&mut frame, &h);
                    wire.push(frame);
                }
                TxOffload::Segments(n) => {
                    let segs = device_segments(&frame, &h);
                    assert_eq!(segs.len(), usize::from(n));
                    wire.extend(segs);
                }
            }
        }
        wire
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn negotiation_takes_only_what_both_sides_want_and_tso_only_with_csum() {
        let all = Offloads::wanted(true);
        assert_eq!(Offloads::negotiate(0, all), 0, "slirp offers nothing");
        assert_eq!(Offloads::negotiate(!0, 0), 0, "offload=off");
        assert_eq!(Offloads::negotiate(!0, all), all);
        assert_eq!(
            Offloads::negotiate(F_HOST_TSO4 | F_GUEST_CSUM, all),
            F_GUEST_CSUM
        );
        let o = Offloads::from_features(F_HOST_TSO4);
        assert!(!o.tso4 && !o.csum);
        let o = Offloads::from_features(all);
        assert!(o.csum && o.guest_csum && o.tso4);
        assert!(Offloads::default().checksum_caps().tcp.tx());
        assert!(Offloads::default().checksum_caps().tcp.rx());
        let caps = o.checksum_caps();
        assert!(!caps.tcp.tx() && !caps.tcp.rx());
        assert!(caps.udp.tx() && caps.udp.rx() && caps.ipv4.tx());
        let caps = Offloads::from_features(F_CSUM).checksum_caps();
        assert!(!caps.tcp.tx() && caps.tcp.rx());
    }

    #[test]
    fn header_round_trips() {
        let h = NetHeader {
            flags: NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1460,
            csum_start: 34,
            csum_offset: 16,
        };
        let mut buf = [0xaau8; 12];
        h.write(&mut buf);
        assert_eq!(&buf[..10], &[1, 1, 54, 0, 0xb4, 0x05, 34, 0, 16, 0]);
        assert_eq!(buf[10..], [0xaa, 0xaa], "num_buffers is the device's");
        assert_eq!(NetHeader::read(&buf), h);
        assert_eq!(NetHeader::read(&buf[..4]), NetHeader::default());
    }

    #[test]
    fn without_offloads_frames_go_as_built() {
        let caps = ChecksumCapabilities::default();
        let mut frame = tcp_frame(b"hello", TcpControl::Psh, &caps);
        let before = frame.clone();
        let (h, what) = prepare_tx(&mut frame, Offloads::default()).unwrap();
        assert_eq!((h, what), (NetHeader::default(), TxOffload::None));
        assert_eq!(frame, before);
        assert!(tcp_verifies(&frame));
    }

    #[test]
    fn checksum_offload_leaves_a_sum_the_device_completes_right() {
        let o = Offloads::from_features(F_CSUM);
        for len in [0, 1, 2, 3, 1000, 1459, 1460] {
            let payload = pattern(len, 3);
            let mut frame = tcp_frame(&payload, TcpControl::Psh, &o.checksum_caps());
            assert!(!tcp_verifies(&frame), "smoltcp left it out");
            let (h, what) = prepare_tx(&mut frame, o).unwrap();
            assert_eq!(what, TxOffload::Checksum);
            assert_eq!((h.csum_start, h.csum_offset, h.gso_type), (34, 16, 0));
            device_completes(&mut frame, &h);
            assert!(tcp_verifies(&frame), "{len} bytes");
        }
        // Not TCP: as built.
        let mut udp = udp_frame(b"dhcp");
        let (h, what) = prepare_tx(&mut udp, o).unwrap();
        assert_eq!((h, what), (NetHeader::default(), TxOffload::None));
        // A TCP segment that does not parse is refused, never sent unsummed.
        let mut cut = tcp_frame(b"x", TcpControl::None, &o.checksum_caps());
        let ip_len = cut.len() - ETHERNET_HEADER;
        cut[ETHERNET_HEADER + 2..ETHERNET_HEADER + 4]
            .copy_from_slice(&((ip_len - 10) as u16).to_be_bytes());
        let mut ip = Ipv4Packet::new_unchecked(&mut cut[ETHERNET_HEADER..]);
        ip.fill_checksum();
        assert_eq!(prepare_tx(&mut cut, o), Err(TxRefused::Malformed));
    }

    #[test]
    fn a_burst_becomes_gso_frames_that_the_device_cuts_back_into_the_same_segments() {
        let o = Offloads::from_features(Offloads::wanted(true));
        let caps = o.checksum_caps();
        let data = pattern(200_000, 9);
        // smoltcp's pass: full segments, the last shorter with PSH; ids one apart.
        let mut segs = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let end = (at + MSS).min(data.len());
            let seg = Seg {
                control: if end == data.len() {
                    TcpControl::Psh
                } else {
                    TcpControl::None
                },
                ident: 0x1000 + segs.len() as u16,
                ..Seg::data(7 + at as u32, &data[at..end])
            };
            segs.push(seg);
            at = end;
        }
        let built: Vec<Vec<u8>> = segs.iter().map(|s| frame_of(*s, &caps)).collect();
        let sent = coalesce(&built, o);
        // 137 segments: 44 per 64 KiB frame, the rest in a fourth.
        let counts: Vec<TxOffload> = sent.iter().map(|s| s.2).collect();
        assert_eq!(
            counts,
            [
                TxOffload::Segments(44),
                TxOffload::Segments(44),
                TxOffload::Segments(44),
                TxOffload::Segments(5)
            ]
        );
        for (frame, h, _) in &sent {
            assert_eq!((h.hdr_len, h.gso_size), (54, MSS as u16));
            assert!(frame.len() <= GSO_MAX_FRAME);
        }
        // What the device sends is exactly what smoltcp would have sent, checksums and
        // all.
        let expected: Vec<Vec<u8>> = segs
            .iter()
            .map(|s| frame_of(*s, &ChecksumCapabilities::default()))
            .collect();
        assert!(on_the_wire(sent) == expected, "not the same segments");
    }

    #[test]
    fn segments_that_do_not_continue_the_frame_go_on_their_own_in_order() {
        let o = Offloads::from_features(Offloads::wanted(true));
        let caps = o.checksum_caps();
        let a = pattern(MSS, 1);
        let seg = |seq: u32, payload: &'static [u8]| Seg::data(seq, payload);
        let a: &'static [u8] = a.leak();
        let cases: Vec<(&str, Vec<Seg>, Vec<TxOffload>)> = vec![
            // A gap in the sequence numbers.
            (
                "gap",
                vec![seg(0, a), seg(1460, a), seg(5000, a)],
                vec![TxOffload::Segments(2), TxOffload::Checksum],
            ),
            // FIN ends the data but is not merged (Linux would keep it last; smoltcp sends
            // it with the last data or alone).
            (
                "fin",
                vec![
                    seg(0, a),
                    Seg {
                        control: TcpControl::Fin,
                        ..seg(1460, a)
                    },
                ],
                vec![TxOffload::Checksum, TxOffload::Checksum],
            ),
            // A changed window (another header) starts over.
            (
                "window",
                vec![
                    seg(0, a),
                    seg(1460, a),
                    Seg {
                        window: 2048,
                        ..seg(2920, a)
                    },
                    seg(4380, a),
                ],
                vec![
                    TxOffload::Segments(2),
                    TxOffload::Checksum,
                    TxOffload::Checksum,
                ],
            ),
            // After a short segment nothing follows.
            (
                "short",
                vec![seg(0, a), seg(1460, &a[..100]), seg(1560, a)],
                vec![TxOffload::Segments(2), TxOffload::Checksum],
            ),
            // A pure ACK or a first segment with PSH never starts one.
            (
                "ack",
                vec![
                    seg(0, &[]),
                    Seg {
                        control: TcpControl::Psh,
                        ..seg(0, a)
                    },
                    seg(1460, a),
                ],
                vec![
                    TxOffload::Checksum,
                    TxOffload::Checksum,
                    TxOffload::Checksum,
                ],
            ),
        ];
        for (name, segs, want) in cases {
            // smoltcp gives each packet the next IP id.
            let segs: Vec<Seg> = (segs.iter().enumerate())
                .map(|(i, s)| Seg {
                    ident: 0x1000 + i as u16,
                    ..*s
                })
                .collect();
            let built: Vec<Vec<u8>> = segs.iter().map(|s| frame_of(*s, &caps)).collect();
            let sent = coalesce(&built, o);
            let got: Vec<TxOffload> = sent.iter().map(|s| s.2).collect();
            assert_eq!(got, want, "{name}");
            let expected: Vec<Vec<u8>> = segs
                .iter()
                .map(|s| frame_of(*s, &ChecksumCapabilities::default()))
                .collect();
            assert!(
                on_the_wire(sent) == expected,
                "{name}: not the same segments"
            );
        }
        // Without TSO nothing is merged; every checksum still offloaded.
        let csum = Offloads::from_features(F_CSUM);
        let built: Vec<Vec<u8>> = (0..3).map(|i| frame_of(seg(i * 1460, a), &caps)).collect();
        let sent = coalesce(&built, csum);
        assert!(sent.iter().all(|s| s.2 == TxOffload::Checksum));
    }

    #[test]
    fn received_checksums_are_checked_unless_the_device_vouched() {
        let o = Offloads::from_features(F_GUEST_CSUM);
        let good = tcp_frame(
            b"payload",
            TcpControl::Psh,
            &ChecksumCapabilities::default(),
        );
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        let none = NetHeader::default();
        let valid = NetHeader {
            flags: DATA_VALID,
            ..none
        };
        assert_eq!(check_rx(&mut good.clone(), &none, o), RxCheck::Verified);
        assert_eq!(check_rx(&mut bad.clone(), &none, o), RxCheck::Bad);
        assert_eq!(check_rx(&mut bad.clone(), &valid, o), RxCheck::Validated);
        // Without GUEST_CSUM smoltcp verifies (and the device never sets flags).
        assert_eq!(
            check_rx(&mut bad.clone(), &none, Offloads::default()),
            RxCheck::Smoltcp
        );
        // A partial TCP checksum from inside the host is taken as it is.
        let partial = NetHeader {
            flags: NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..none
        };
        assert_eq!(check_rx(&mut bad.clone(), &partial, o), RxCheck::Validated);
        // Not TCP: smoltcp verifies.
        assert_eq!(check_rx(&mut udp_frame(b"x"), &none, o), RxCheck::Smoltcp);
    }

    #[test]
    fn a_partial_udp_checksum_is_completed_for_smoltcp() {
        let o = Offloads::from_features(F_GUEST_CSUM);
        let good = udp_frame(b"a lease");
        // The sender left the pseudo-header sum in the field.
        let mut partial = good.clone();
        let len = (partial.len() - 34) as u32;
        let pseudo = checksum::pseudo_header_v4(&B, &A, IpProtocol::Udp, len);
        partial[34 + 6..34 + 8].copy_from_slice(&pseudo.to_be_bytes());
        let h = NetHeader {
            flags: NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 6,
            ..NetHeader::default()
        };
        assert_eq!(check_rx(&mut partial, &h, o), RxCheck::Completed);
        assert_eq!(partial, good);
        // Offsets past the frame: dropped, never read past it.
        let h = NetHeader {
            csum_offset: 4000,
            ..h
        };
        assert_eq!(check_rx(&mut partial, &h, o), RxCheck::Bad);
    }
}

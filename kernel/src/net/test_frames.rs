//! Ethernet frames for the host tests of the network code (`sockets`, `syn_gate`): one
//! builder, so each test says only what its frame is.

use alloc::vec;
use alloc::vec::Vec;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
    Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
};

/// The appliance's address in the tests (QEMU user networking's guest).
pub const LOCAL: Ipv4Address = Ipv4Address::new(10, 0, 2, 15);
/// The client's address in the tests (QEMU user networking's host).
pub const REMOTE: Ipv4Address = Ipv4Address::new(10, 0, 2, 2);

/// An Ethernet frame carrying an empty TCP segment from REMOTE:`from` to LOCAL:`to`
/// with `control` (and an ACK number when `ack`), checksums valid.
pub fn tcp(from: u16, to: u16, control: TcpControl, ack: bool) -> Vec<u8> {
    let segment = TcpRepr {
        src_port: from,
        dst_port: to,
        control,
        seq_number: TcpSeqNumber(1),
        ack_number: ack.then_some(TcpSeqNumber(1)),
        window_len: 1024,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip = Ipv4Repr {
        src_addr: REMOTE,
        dst_addr: LOCAL,
        next_header: IpProtocol::Tcp,
        payload_len: segment.buffer_len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
        ethertype: EthernetProtocol::Ipv4,
    };
    let caps = ChecksumCapabilities::default();
    let mut buf = vec![0u8; eth.buffer_len() + ip.buffer_len() + segment.buffer_len()];
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut frame);
    let mut packet = Ipv4Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut packet, &caps);
    let mut tcp = TcpPacket::new_unchecked(packet.payload_mut());
    segment.emit(
        &mut tcp,
        &IpAddress::Ipv4(REMOTE),
        &IpAddress::Ipv4(LOCAL),
        &caps,
    );
    buf
}

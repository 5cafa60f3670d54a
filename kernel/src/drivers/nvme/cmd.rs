//! NVMe commands and completions on the wire: 64-byte submission queue entries and
//! 16-byte completion queue entries. Pure encoding and decoding, no hardware.

use core::fmt;

/// Admin command opcodes.
pub mod admin {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Doorbell Buffer Config (shadow doorbells, for emulated controllers).
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
}

/// NVM command set opcodes.
pub mod io {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Dataset Management (deallocate = discard).
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Feature identifiers for Set Features.
pub mod feature {
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
}

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace (for NSID).
    pub const NAMESPACE: u32 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u32 = 0x01;
    /// Active namespace ID list.
    pub const ACTIVE_NAMESPACES: u32 = 0x02;
}

/// Write CDW12 bit: Force Unit Access.
const FUA: u32 = 1 << 30;
/// Dataset Management CDW11 bit: deallocate the ranges.
const DSM_DEALLOCATE: u32 = 1 << 2;

/// One submission queue entry, as sixteen little-endian dwords.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// The dwords (CDW0..CDW15).
    pub dw: [u32; 16],
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Command(op {:#04x} cid {} nsid {} cdw10-12 {:#x} {:#x} {:#x})",
            self.opcode(),
            self.cid(),
            self.dw[1],
            self.dw[10],
            self.dw[11],
            self.dw[12]
        )
    }
}

impl Command {
    /// A command with this opcode and everything else zero.
    pub fn new(opcode: u8) -> Command {
        let mut dw = [0; 16];
        dw[0] = u32::from(opcode);
        Command { dw }
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.dw[0] as u8
    }

    /// The command identifier.
    pub fn cid(&self) -> u16 {
        (self.dw[0] >> 16) as u16
    }

    /// Sets the command identifier (the driver's slot number).
    pub fn set_cid(&mut self, cid: u16) {
        self.dw[0] = (self.dw[0] & 0xffff) | (u32::from(cid) << 16);
    }

    /// Sets the namespace.
    pub fn with_nsid(mut self, nsid: u32) -> Command {
        self.dw[1] = nsid;
        self
    }

    /// Sets the data pointer (PRP entries 1 and 2).
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.dw[6] = prp1 as u32;
        self.dw[7] = (prp1 >> 32) as u32;
        self.dw[8] = prp2 as u32;
        self.dw[9] = (prp2 >> 32) as u32;
    }

    /// Sets PRP1 alone (single-page data such as Identify's).
    pub fn with_prp(mut self, addr: u64) -> Command {
        self.set_prps(addr, 0);
        self
    }

    /// PRP entry 1.
    pub fn prp1(&self) -> u64 {
        u64::from(self.dw[6]) | u64::from(self.dw[7]) << 32
    }

    /// PRP entry 2.
    pub fn prp2(&self) -> u64 {
        u64::from(self.dw[8]) | u64::from(self.dw[9]) << 32
    }

    fn with_cdw(mut self, index: usize, value: u32) -> Command {
        self.dw[index] = value;
        self
    }

    /// Read or Write of `blocks` logical blocks at `lba` (blocks is 1..=65536).
    fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Command {
        assert!((1..=1 << 16).contains(&blocks), "bad block count {blocks}");
        Command::new(opcode)
            .with_nsid(nsid)
            .with_cdw(10, lba as u32)
            .with_cdw(11, (lba >> 32) as u32)
            .with_cdw(12, blocks - 1)
    }

    /// Read.
    pub fn read(nsid: u32, lba: u64, blocks: u32) -> Command {
        Command::rw(io::READ, nsid, lba, blocks)
    }

    /// Write; with `fua` the data is on stable media when the command completes.
    pub fn write(nsid: u32, lba: u64, blocks: u32, fua: bool) -> Command {
        let mut c = Command::rw(io::WRITE, nsid, lba, blocks);
        if fua {
            c.dw[12] |= FUA;
        }
        c
    }

    /// Flush the volatile write cache.
    pub fn flush(nsid: u32) -> Command {
        Command::new(io::FLUSH).with_nsid(nsid)
    }

    /// Dataset Management, deallocate `ranges` (1..=256) ranges from the data buffer.
    pub fn deallocate(nsid: u32, ranges: usize) -> Command {
        assert!((1..=256).contains(&ranges), "bad range count {ranges}");
        Command::new(io::DATASET_MANAGEMENT)
            .with_nsid(nsid)
            .with_cdw(10, ranges as u32 - 1)
            .with_cdw(11, DSM_DEALLOCATE)
    }

    /// Identify (`cns`, for `nsid`); the 4 KiB result goes to the data pointer.
    pub fn identify(cns: u32, nsid: u32) -> Command {
        Command::new(admin::IDENTIFY)
            .with_nsid(nsid)
            .with_cdw(10, cns)
    }

    /// Set Features Number of Queues: ask for `sq` submission and `cq` completion queues.
    pub fn set_queue_count(sq: u16, cq: u16) -> Command {
        Command::new(admin::SET_FEATURES)
            .with_cdw(10, u32::from(feature::NUMBER_OF_QUEUES))
            .with_cdw(11, u32::from(cq - 1) << 16 | u32::from(sq - 1))
    }

    /// Create I/O Completion Queue `qid` of `entries` entries at the data pointer
    /// (physically contiguous); `vector` is its MSI-X entry, `None` for no interrupts.
    pub fn create_io_cq(qid: u16, entries: u16, vector: Option<u16>) -> Command {
        let (iv, ien) = match vector {
            Some(v) => (u32::from(v), 1 << 1),
            None => (0, 0),
        };
        Command::new(admin::CREATE_IO_CQ)
            .with_cdw(10, u32::from(entries - 1) << 16 | u32::from(qid))
            .with_cdw(11, iv << 16 | ien | 1)
    }

    /// Create I/O Submission Queue `qid` of `entries` entries at the data pointer,
    /// completing into completion queue `cqid`.
    pub fn create_io_sq(qid: u16, entries: u16, cqid: u16) -> Command {
        Command::new(admin::CREATE_IO_SQ)
            .with_cdw(10, u32::from(entries - 1) << 16 | u32::from(qid))
            .with_cdw(11, u32::from(cqid) << 16 | 1)
    }

    /// Delete I/O Submission Queue `qid`.
    pub fn delete_io_sq(qid: u16) -> Command {
        Command::new(admin::DELETE_IO_SQ).with_cdw(10, u32::from(qid))
    }

    /// Delete I/O Completion Queue `qid`.
    pub fn delete_io_cq(qid: u16) -> Command {
        Command::new(admin::DELETE_IO_CQ).with_cdw(10, u32::from(qid))
    }

    /// Abort command `cid` on submission queue `sqid`.
    pub fn abort(sqid: u16, cid: u16) -> Command {
        Command::new(admin::ABORT).with_cdw(10, u32::from(cid) << 16 | u32::from(sqid))
    }

    /// Doorbell Buffer Config: shadow doorbells at PRP1, event indexes at PRP2.
    pub fn doorbell_buffer_config(shadow: u64, event_idx: u64) -> Command {
        let mut c = Command::new(admin::DOORBELL_BUFFER_CONFIG);
        c.set_prps(shadow, event_idx);
        c
    }
}

/// A command's completion status: Status Code Type, Status Code and flags.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status(u16);

impl Status {
    /// Success.
    pub const SUCCESS: Status = Status(0);

    /// From the upper half of completion dword 3 without the phase bit (bits 31:17).
    pub fn from_field(field: u16) -> Status {
        Status(field)
    }

    /// Status Code Type (0 generic, 1 command specific, 2 media and data integrity, ...).
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Status Code.
    pub fn sc(self) -> u8 {
        self.0 as u8
    }

    /// Do Not Retry: the same command would fail again.
    pub fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// The command succeeded.
    pub fn is_success(self) -> bool {
        self.sct() == 0 && self.sc() == 0
    }

    /// `(sct << 8) | sc`, the value `IoError::Device` carries.
    pub fn code(self) -> u16 {
        u16::from(self.sct()) << 8 | u16::from(self.sc())
    }

    /// A short name for the statuses a driver meets, for logs.
    pub fn name(self) -> &'static str {
        match (self.sct(), self.sc()) {
            (0, 0x00) => "success",
            (0, 0x01) => "invalid opcode",
            (0, 0x02) => "invalid field",
            (0, 0x04) => "data transfer error",
            (0, 0x06) => "internal error",
            (0, 0x07) => "abort requested",
            (0, 0x0b) => "invalid namespace",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (1, 0x01) => "invalid queue id",
            (1, 0x02) => "invalid queue size",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            _ => "other",
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({:#05x} {}", self.code(), self.name())?;
        if self.dnr() {
            f.write_str(", do not retry")?;
        }
        f.write_str(")")
    }
}

/// One completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Command-specific result (dword 0).
    pub result: u32,
    /// How far the controller has consumed the submission queue.
    pub sq_head: u16,
    /// The submission queue the command came from.
    pub sq_id: u16,
    /// The command identifier.
    pub cid: u16,
    /// The phase tag: flips each time the controller wraps around the queue.
    pub phase: bool,
    /// The status.
    pub status: Status,
}

impl Completion {
    /// Decodes the four dwords of an entry.
    pub fn from_dwords(dw: [u32; 4]) -> Completion {
        Completion {
            result: dw[0],
            sq_head: dw[2] as u16,
            sq_id: (dw[2] >> 16) as u16,
            cid: dw[3] as u16,
            phase: dw[3] & (1 << 16) != 0,
            status: Status((dw[3] >> 17) as u16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_commands_encode() {
        let mut w = Command::write(1, 0x1_2345_6789, 8, true);
        w.set_cid(0x42);
        w.set_prps(0x1000, 0x2000);
        assert_eq!(w.dw[0], 0x0042_0001);
        assert_eq!(w.dw[1], 1);
        assert_eq!(
            (w.dw[10], w.dw[11], w.dw[12]),
            (0x2345_6789, 1, 7 | 1 << 30)
        );
        assert_eq!((w.prp1(), w.prp2()), (0x1000, 0x2000));
        assert_eq!(w.cid(), 0x42);
        let r = Command::read(1, 5, 1);
        assert_eq!((r.opcode(), r.dw[12]), (io::READ, 0));
        assert_eq!(Command::write(1, 0, 1, false).dw[12], 0);
        let d = Command::deallocate(1, 3);
        assert_eq!((d.opcode(), d.dw[10], d.dw[11]), (0x09, 2, 4));
        assert_eq!(Command::flush(7).dw[..2], [0, 7]);
    }

    #[test]
    #[should_panic(expected = "bad block count")]
    fn too_many_blocks_panic() {
        Command::read(1, 0, (1 << 16) + 1);
    }

    #[test]
    fn admin_commands_encode() {
        let cq = Command::create_io_cq(1, 256, Some(1));
        assert_eq!((cq.dw[10], cq.dw[11]), (0x00ff_0001, 0x0001_0003));
        let polled = Command::create_io_cq(1, 64, None);
        assert_eq!(polled.dw[11], 1);
        let sq = Command::create_io_sq(1, 256, 1);
        assert_eq!((sq.dw[10], sq.dw[11]), (0x00ff_0001, 0x0001_0001));
        assert_eq!(Command::set_queue_count(1, 1).dw[11], 0);
        assert_eq!(Command::set_queue_count(4, 2).dw[11], 0x0001_0003);
        assert_eq!(Command::abort(1, 9).dw[10], 0x0009_0001);
        assert_eq!(Command::identify(cns::CONTROLLER, 0).dw[10], 1);
        let db = Command::doorbell_buffer_config(0x5000, 0x6000);
        assert_eq!((db.opcode(), db.prp1(), db.prp2()), (0x7c, 0x5000, 0x6000));
    }

    #[test]
    fn completions_decode() {
        // Success, phase 1, cid 3, sq 1 head 17.
        let c = Completion::from_dwords([0xabcd, 0, 0x0001_0011, 0x0001_0003]);
        assert_eq!((c.result, c.sq_head, c.sq_id, c.cid), (0xabcd, 17, 1, 3));
        assert!(c.phase && c.status.is_success());
        // LBA out of range (SCT 0, SC 0x80), do-not-retry, phase 0.
        let field: u32 = 0x80 | 1 << 14;
        let e = Completion::from_dwords([0, 0, 0, field << 17 | 5]);
        assert!(!e.phase && !e.status.is_success() && e.status.dnr());
        assert_eq!(e.status.code(), 0x0080);
        assert_eq!(e.status.name(), "LBA out of range");
        // Write fault: SCT 2, SC 0x80.
        let wf = Status::from_field(2 << 8 | 0x80);
        assert_eq!((wf.sct(), wf.sc(), wf.code()), (2, 0x80, 0x0280));
        assert_eq!(alloc::format!("{wf:?}"), "Status(0x280 write fault)");
    }
}

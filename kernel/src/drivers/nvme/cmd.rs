//! NVMe commands and completions on the wire: 64-byte submission queue entries and
//! 16-byte completion queue entries, laid out as the specification draws them. Pure, no
//! hardware.

use core::fmt;
use core::mem::{offset_of, size_of};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

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
/// Create I/O Queue CDW11 bit: the queue is physically contiguous.
const QUEUE_CONTIGUOUS: u32 = 1 << 0;
/// Create I/O Completion Queue CDW11 bit: interrupts enabled.
const QUEUE_INTERRUPTS: u32 = 1 << 1;

/// One submission queue entry (64 bytes, little-endian), as the controller reads it.
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Command {
    /// Opcode (CDW0 bits 7:0).
    pub opcode: u8,
    /// Fused operation and PRP-or-SGL selection (CDW0 bits 15:8): always 0, not fused,
    /// PRPs.
    pub flags: u8,
    /// Command identifier (CDW0 bits 31:16): the driver's slot number.
    pub cid: U16,
    /// Namespace (CDW1).
    pub nsid: U32,
    /// CDW2 and CDW3: reserved by the commands we send.
    pub reserved: [U32; 2],
    /// Metadata pointer (CDW4-5): unused, namespaces are formatted without metadata.
    pub mptr: U64,
    /// PRP entry 1 (CDW6-7).
    pub prp1: U64,
    /// PRP entry 2 (CDW8-9).
    pub prp2: U64,
    /// Command dword 10.
    pub cdw10: U32,
    /// Command dword 11.
    pub cdw11: U32,
    /// Command dword 12.
    pub cdw12: U32,
    /// Command dword 13.
    pub cdw13: U32,
    /// Command dword 14.
    pub cdw14: U32,
    /// Command dword 15.
    pub cdw15: U32,
}

/// Bytes of a submission queue entry.
pub const SQE_SIZE: usize = size_of::<Command>();
const _: () = assert!(SQE_SIZE == 64);

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Command(op {:#04x} cid {} nsid {} cdw10-12 {:#x} {:#x} {:#x})",
            self.opcode, self.cid, self.nsid, self.cdw10, self.cdw11, self.cdw12
        )
    }
}

impl Command {
    /// A command with this opcode and everything else zero.
    pub fn new(opcode: u8) -> Command {
        Command {
            opcode,
            ..Command::new_zeroed()
        }
    }

    /// Sets the command identifier (the driver's slot number).
    pub fn set_cid(&mut self, cid: u16) {
        self.cid = cid.into();
    }

    /// Sets the namespace.
    pub fn with_nsid(mut self, nsid: u32) -> Command {
        self.nsid = nsid.into();
        self
    }

    /// Sets the data pointer (PRP entries 1 and 2).
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.prp1 = prp1.into();
        self.prp2 = prp2.into();
    }

    /// Sets PRP1 alone (single-page data such as Identify's).
    pub fn with_prp(mut self, addr: u64) -> Command {
        self.set_prps(addr, 0);
        self
    }

    /// Sets command dwords 10 and 11.
    fn with_cdw10_11(mut self, cdw10: u32, cdw11: u32) -> Command {
        self.cdw10 = cdw10.into();
        self.cdw11 = cdw11.into();
        self
    }

    /// Read or Write of `blocks` logical blocks at `lba` (blocks is 1..=65536).
    fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Command {
        assert!((1..=1 << 16).contains(&blocks), "bad block count {blocks}");
        let mut c = Command::new(opcode)
            .with_nsid(nsid)
            .with_cdw10_11(lba as u32, (lba >> 32) as u32);
        c.cdw12 = (blocks - 1).into();
        c
    }

    /// Read.
    pub fn read(nsid: u32, lba: u64, blocks: u32) -> Command {
        Command::rw(io::READ, nsid, lba, blocks)
    }

    /// Write; with `fua` the data is on stable media when the command completes.
    pub fn write(nsid: u32, lba: u64, blocks: u32, fua: bool) -> Command {
        let mut c = Command::rw(io::WRITE, nsid, lba, blocks);
        if fua {
            c.cdw12 |= FUA;
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
            .with_cdw10_11(ranges as u32 - 1, DSM_DEALLOCATE)
    }

    /// Identify (`cns`, for `nsid`); the 4 KiB result goes to the data pointer.
    pub fn identify(cns: u32, nsid: u32) -> Command {
        Command::new(admin::IDENTIFY)
            .with_nsid(nsid)
            .with_cdw10_11(cns, 0)
    }

    /// Set Features Number of Queues: ask for `sq` submission and `cq` completion queues.
    pub fn set_queue_count(sq: u16, cq: u16) -> Command {
        Command::new(admin::SET_FEATURES).with_cdw10_11(
            u32::from(feature::NUMBER_OF_QUEUES),
            u32::from(cq - 1) << 16 | u32::from(sq - 1),
        )
    }

    /// Create I/O Completion Queue `qid` of `entries` entries at the data pointer
    /// (physically contiguous); `vector` is its MSI-X entry, `None` for no interrupts.
    pub fn create_io_cq(qid: u16, entries: u16, vector: Option<u16>) -> Command {
        let (iv, ien) = match vector {
            Some(v) => (u32::from(v), QUEUE_INTERRUPTS),
            None => (0, 0),
        };
        Command::new(admin::CREATE_IO_CQ).with_cdw10_11(
            u32::from(entries - 1) << 16 | u32::from(qid),
            iv << 16 | ien | QUEUE_CONTIGUOUS,
        )
    }

    /// Create I/O Submission Queue `qid` of `entries` entries at the data pointer,
    /// completing into completion queue `cqid`.
    pub fn create_io_sq(qid: u16, entries: u16, cqid: u16) -> Command {
        Command::new(admin::CREATE_IO_SQ).with_cdw10_11(
            u32::from(entries - 1) << 16 | u32::from(qid),
            u32::from(cqid) << 16 | QUEUE_CONTIGUOUS,
        )
    }

    /// Delete I/O Submission Queue `qid`.
    pub fn delete_io_sq(qid: u16) -> Command {
        Command::new(admin::DELETE_IO_SQ).with_cdw10_11(u32::from(qid), 0)
    }

    /// Delete I/O Completion Queue `qid`.
    pub fn delete_io_cq(qid: u16) -> Command {
        Command::new(admin::DELETE_IO_CQ).with_cdw10_11(u32::from(qid), 0)
    }

    /// Abort command `cid` on submission queue `sqid`.
    pub fn abort(sqid: u16, cid: u16) -> Command {
        Command::new(admin::ABORT).with_cdw10_11(u32::from(cid) << 16 | u32::from(sqid), 0)
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

/// One completion queue entry (16 bytes, little-endian), as the controller writes it.
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Completion {
    result: U32,
    reserved: U32,
    sq_head: U16,
    sq_id: U16,
    cid: U16,
    /// The phase tag (bit 0) and the [`Status`] (bits 15:1).
    status_phase: U16,
}

/// Bytes of a completion queue entry.
pub const CQE_SIZE: usize = size_of::<Completion>();
const _: () = assert!(CQE_SIZE == 16);

impl Completion {
    /// Where an entry's status and phase tag are, as a `u16`: a driver reads them first,
    /// to learn whether the controller has posted the entry.
    pub const STATUS_PHASE_OFFSET: usize = offset_of!(Completion, status_phase);

    /// The phase tag in an entry's status-and-phase field (at
    /// [`Completion::STATUS_PHASE_OFFSET`]): flips each time the controller wraps around
    /// the queue.
    pub fn phase_of(status_phase: u16) -> bool {
        status_phase & 1 != 0
    }

    /// Command-specific result (dword 0).
    pub fn result(&self) -> u32 {
        self.result.get()
    }

    /// How far the controller has consumed the submission queue.
    pub fn sq_head(&self) -> u16 {
        self.sq_head.get()
    }

    /// The submission queue the command came from.
    pub fn sq_id(&self) -> u16 {
        self.sq_id.get()
    }

    /// The command identifier.
    pub fn cid(&self) -> u16 {
        self.cid.get()
    }

    /// The phase tag.
    pub fn phase(&self) -> bool {
        Self::phase_of(self.status_phase.get())
    }

    /// The status.
    pub fn status(&self) -> Status {
        Status(self.status_phase.get() >> 1)
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("result", &self.result())
            .field("sq_head", &self.sq_head())
            .field("sq_id", &self.sq_id())
            .field("cid", &self.cid())
            .field("phase", &self.phase())
            .field("status", &self.status())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// The entry as the controller reads it: sixteen little-endian dwords.
    fn dwords(c: &Command) -> [u32; 16] {
        let mut dw = [0; 16];
        for (d, bytes) in dw.iter_mut().zip(c.as_bytes().chunks_exact(4)) {
            *d = u32::from_le_bytes(bytes.try_into().unwrap());
        }
        dw
    }

    /// An entry from its four dwords, as the controller writes them.
    fn completion(dw: [u32; 4]) -> Completion {
        let bytes: Vec<u8> = dw.iter().flat_map(|d| d.to_le_bytes()).collect();
        Completion::read_from_bytes(&bytes).unwrap()
    }

    #[test]
    fn io_commands_encode() {
        let mut w = Command::write(1, 0x1_2345_6789, 8, true);
        w.set_cid(0x42);
        w.set_prps(0x1000, 0x2000);
        let dw = dwords(&w);
        assert_eq!(dw[0], 0x0042_0001);
        assert_eq!(dw[1], 1);
        assert_eq!((dw[10], dw[11], dw[12]), (0x2345_6789, 1, 7 | 1 << 30));
        assert_eq!((dw[6], dw[7], dw[8], dw[9]), (0x1000, 0, 0x2000, 0));
        assert_eq!(dwords(&Command::read(1, 5, 1))[..1], [u32::from(io::READ)]);
        assert_eq!(dwords(&Command::read(1, 5, 1))[12], 0);
        assert_eq!(dwords(&Command::write(1, 0, 1, false))[12], 0);
        let d = dwords(&Command::deallocate(1, 3));
        assert_eq!((d[0], d[10], d[11]), (0x09, 2, 4));
        assert_eq!(dwords(&Command::flush(7))[..2], [0, 7]);
    }

    #[test]
    #[should_panic(expected = "bad block count")]
    fn too_many_blocks_panic() {
        Command::read(1, 0, (1 << 16) + 1);
    }

    #[test]
    fn admin_commands_encode() {
        let cq = dwords(&Command::create_io_cq(1, 256, Some(1)));
        assert_eq!((cq[10], cq[11]), (0x00ff_0001, 0x0001_0003));
        let polled = dwords(&Command::create_io_cq(1, 64, None));
        assert_eq!(polled[11], 1);
        let sq = dwords(&Command::create_io_sq(1, 256, 1));
        assert_eq!((sq[10], sq[11]), (0x00ff_0001, 0x0001_0001));
        assert_eq!(dwords(&Command::set_queue_count(1, 1))[11], 0);
        assert_eq!(dwords(&Command::set_queue_count(4, 2))[11], 0x0001_0003);
        assert_eq!(dwords(&Command::abort(1, 9))[10], 0x0009_0001);
        assert_eq!(dwords(&Command::identify(cns::CONTROLLER, 0))[10], 1);
        let db = dwords(&Command::doorbell_buffer_config(0x5000, 0x6000));
        assert_eq!((db[0], db[6], db[8]), (0x7c, 0x5000, 0x6000));
    }

    #[test]
    fn completions_decode() {
        // Success, phase 1, cid 3, sq 1 head 17.
        let c = completion([0xabcd, 0, 0x0001_0011, 0x0001_0003]);
        assert_eq!(
            (c.result(), c.sq_head(), c.sq_id(), c.cid()),
            (0xabcd, 17, 1, 3)
        );
        assert!(c.phase() && c.status().is_success());
        // LBA out of range (SCT 0, SC 0x80), do-not-retry, phase 0.
        let field: u32 = 0x80 | 1 << 14;
        let e = completion([0, 0, 0, field << 17 | 5]);
        assert!(!e.phase() && !e.status().is_success() && e.status().dnr());
        assert_eq!(e.status().code(), 0x0080);
        assert_eq!(e.status().name(), "LBA out of range");
        // Write fault: SCT 2, SC 0x80.
        let wf = Status::from_field(2 << 8 | 0x80);
        assert_eq!((wf.sct(), wf.sc(), wf.code()), (2, 0x80, 0x0280));
        assert_eq!(alloc::format!("{wf:?}"), "Status(0x280 write fault)");
    }
}

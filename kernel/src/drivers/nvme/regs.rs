//! NVMe controller registers (BAR0): offsets and the fields the driver reads and writes.
//! NVMe base specification 2.0, section 3.1.

use core::time::Duration;

/// Controller Capabilities (64-bit).
pub const CAP: usize = 0x00;
/// Version.
pub const VS: usize = 0x08;
/// Controller Configuration.
pub const CC: usize = 0x14;
/// Controller Status.
pub const CSTS: usize = 0x1c;
/// Admin Queue Attributes.
pub const AQA: usize = 0x24;
/// Admin Submission Queue base address (64-bit).
pub const ASQ: usize = 0x28;
/// Admin Completion Queue base address (64-bit).
pub const ACQ: usize = 0x30;
/// First doorbell register.
pub const DOORBELLS: usize = 0x1000;

/// CSTS.RDY: the controller is ready to process commands.
pub const CSTS_RDY: u32 = 1 << 0;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;

/// The decoded CAP register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Maximum entries per I/O queue (MQES + 1).
    pub max_queue_entries: u32,
    /// Queues must be physically contiguous.
    pub contiguous_queues_required: bool,
    /// Worst-case time for CSTS.RDY to follow CC.EN.
    pub timeout: Duration,
    /// Doorbell stride in bytes (4 << DSTRD).
    pub doorbell_stride: usize,
    /// The NVM command set is supported.
    pub nvm_command_set: bool,
    /// Smallest memory page size the controller supports, in bytes.
    pub min_page_size: usize,
    /// Largest memory page size, in bytes.
    pub max_page_size: usize,
}

impl Capabilities {
    /// Decodes the register value.
    pub fn from_register(cap: u64) -> Capabilities {
        let field = |shift: u32, bits: u32| (cap >> shift) & ((1 << bits) - 1);
        Capabilities {
            max_queue_entries: field(0, 16) as u32 + 1,
            contiguous_queues_required: field(16, 1) == 1,
            // CAP.TO counts 500 ms units; 0 would be nonsense, so allow at least one unit.
            timeout: Duration::from_millis(500 * field(24, 8).max(1)),
            doorbell_stride: 4 << field(32, 4),
            nvm_command_set: field(37, 8) & 1 == 1,
            min_page_size: 1 << (12 + field(48, 4)),
            max_page_size: 1 << (12 + field(52, 4)),
        }
    }

    /// Offset of the submission queue `qid` tail doorbell.
    pub fn sq_doorbell(&self, qid: u16) -> usize {
        DOORBELLS + 2 * usize::from(qid) * self.doorbell_stride
    }

    /// Offset of the completion queue `qid` head doorbell.
    pub fn cq_doorbell(&self, qid: u16) -> usize {
        DOORBELLS + (2 * usize::from(qid) + 1) * self.doorbell_stride
    }
}

/// CC value that enables the controller: NVM command set, 4 KiB pages, round-robin
/// arbitration, 64-byte submission and 16-byte completion entries.
pub fn cc_enable() -> u32 {
    const IOSQES_64: u32 = 6 << 16;
    const IOCQES_16: u32 = 4 << 20;
    IOSQES_64 | IOCQES_16 | 1
}

/// AQA value for admin queues of `entries` entries each.
pub fn aqa(entries: u16) -> u32 {
    let n = u32::from(entries) - 1;
    (n << 16) | n
}

/// Shadow doorbells: whether the controller asked to be told that a doorbell value moved
/// from `old` to `new` (it wants an MMIO write once the value passes `event`, its event
/// index). Indexes wrap as `u16`.
pub fn doorbell_needed(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_index_arithmetic() {
        // The controller saw up to 5 and wants to hear of anything after it.
        assert!(doorbell_needed(5, 6, 5));
        assert!(doorbell_needed(5, 9, 5));
        // It is still working through what it was told: no write needed.
        assert!(!doorbell_needed(10, 9, 5));
        // The event index lies inside the published range.
        assert!(doorbell_needed(7, 9, 5));
        // Wrapping u16 arithmetic.
        assert!(doorbell_needed(u16::MAX, 1, u16::MAX - 1));
    }

    #[test]
    fn qemu_capabilities_decode() {
        // QEMU 7.2's nvme: MQES 0x7ff, CQR, TO 0xf, DSTRD 0, CSS NVM, MPSMIN 0, MPSMAX 4.
        let cap = 0x7ff | 1 << 16 | 0xf << 24 | 1 << 37 | 4 << 52;
        let c = Capabilities::from_register(cap);
        assert_eq!(c.max_queue_entries, 2048);
        assert!(c.contiguous_queues_required && c.nvm_command_set);
        assert_eq!(c.timeout, Duration::from_millis(7500));
        assert_eq!((c.min_page_size, c.max_page_size), (4096, 65536));
        assert_eq!(c.sq_doorbell(0), 0x1000);
        assert_eq!(c.cq_doorbell(0), 0x1004);
        assert_eq!(c.sq_doorbell(1), 0x1008);
        let wide = Capabilities::from_register(2 << 32);
        assert_eq!(wide.doorbell_stride, 16);
        assert_eq!(wide.cq_doorbell(1), 0x1000 + 3 * 16);
        assert_eq!(wide.timeout, Duration::from_millis(500));
    }

    #[test]
    fn configuration_values() {
        assert_eq!(cc_enable(), 0x0046_0001);
        assert_eq!(aqa(32), 0x001f_001f);
    }
}

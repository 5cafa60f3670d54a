//! One NVMe queue pair: a submission ring the driver fills and a completion ring the
//! controller fills, each in physically contiguous DMA memory, plus their doorbells.
//!
//! Doorbells are MMIO writes, and under emulation every MMIO write is an exit to the
//! hypervisor, so the pair batches them: [`QueuePair::push`] only advances the software
//! tail, [`QueuePair::ring_sq`] publishes it once for everything pushed since; completions
//! are consumed one by one with [`QueuePair::pop`] and the head is published once with
//! [`QueuePair::ring_cq`]. With *shadow doorbells* (Doorbell Buffer Config, offered by
//! emulated controllers such as QEMU's), the new values go to a memory page the controller
//! reads, and the MMIO write happens only when the controller's event index says it is
//! waiting for one.

use core::sync::atomic::{fence, Ordering};

use super::cmd::{Command, Completion, CQE_SIZE, SQE_SIZE};
use super::regs::{self, Capabilities};
use crate::hal::mmio::MmioRegion;
use crate::mm::frames::OutOfFrames;
use crate::mm::{DmaCoherent, DmaDevice};

/// The shadow doorbell and event index pages (one of each per controller).
#[derive(Debug)]
pub struct ShadowPages {
    /// Where the driver writes doorbell values.
    pub doorbells: DmaCoherent,
    /// Where the controller writes the values it wants to be told about.
    pub event_idx: DmaCoherent,
}

impl ShadowPages {
    /// Two zeroed pages for the controller behind `dma`.
    pub fn new(dma: &DmaDevice) -> Result<ShadowPages, OutOfFrames> {
        Ok(ShadowPages {
            doorbells: DmaCoherent::alloc(dma, 4096)?,
            event_idx: DmaCoherent::alloc(dma, 4096)?,
        })
    }
}

/// Doorbell write counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoorbellStats {
    /// Commands pushed.
    pub submitted: u64,
    /// Completions popped.
    pub completed: u64,
    /// Submission doorbell MMIO writes.
    pub sq_mmio: u64,
    /// Completion doorbell MMIO writes.
    pub cq_mmio: u64,
    /// Doorbell updates that went only to the shadow page.
    pub shadow_only: u64,
}

impl DoorbellStats {
    /// Adds another queue's counters to these (a controller's totals over its queues).
    pub fn merge(&mut self, other: &DoorbellStats) {
        self.submitted += other.submitted;
        self.completed += other.completed;
        self.sq_mmio += other.sq_mmio;
        self.cq_mmio += other.cq_mmio;
        self.shadow_only += other.shadow_only;
    }
}

/// A submission/completion queue pair.
#[derive(Debug)]
pub struct QueuePair {
    entries: u16,
    sq: DmaCoherent,
    cq: DmaCoherent,
    sq_tail: u16,
    /// The tail value the controller was last told.
    sq_published: u16,
    cq_head: u16,
    cq_published: u16,
    /// The phase tag that marks a new completion entry.
    phase: bool,
    regs: MmioRegion,
    sq_doorbell: usize,
    cq_doorbell: usize,
    /// Byte offsets of this pair's shadow entries, once shadow doorbells are on.
    shadow: Option<(usize, usize)>,
    stats: DoorbellStats,
}

impl QueuePair {
    /// Queue pair `id` with `entries` entries per ring, in zeroed memory of the
    /// controller behind `dma`.
    pub fn new(
        id: u16,
        entries: u16,
        regs: MmioRegion,
        cap: &Capabilities,
        dma: &DmaDevice,
    ) -> Result<QueuePair, OutOfFrames> {
        assert!(entries >= 2, "an NVMe queue needs at least two entries");
        Ok(QueuePair {
            entries,
            sq: DmaCoherent::alloc(dma, usize::from(entries) * SQE_SIZE)?,
            cq: DmaCoherent::alloc(dma, usize::from(entries) * CQE_SIZE)?,
            sq_tail: 0,
            sq_published: 0,
            cq_head: 0,
            cq_published: 0,
            phase: true,
            regs,
            sq_doorbell: cap.sq_doorbell(id),
            cq_doorbell: cap.cq_doorbell(id),
            shadow: None,
            stats: DoorbellStats::default(),
        })
    }

    /// Entries per ring.
    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// Device address of the submission ring.
    pub fn sq_addr(&self) -> u64 {
        self.sq.device_addr()
    }

    /// Device address of the completion ring.
    pub fn cq_addr(&self) -> u64 {
        self.cq.device_addr()
    }

    /// The counters.
    pub fn stats(&self) -> DoorbellStats {
        self.stats
    }

    /// Forgets all ring state, as the controller does when it is reset. Only while the
    /// controller is disabled.
    pub fn reset(&mut self) {
        self.cq.zero(0, self.cq.len());
        self.sq_tail = 0;
        self.sq_published = 0;
        self.cq_head = 0;
        self.cq_published = 0;
        self.phase = true;
        self.shadow = None;
    }

    /// Switches this pair to shadow doorbells in `pages` (after the controller accepted
    /// Doorbell Buffer Config). The entries mirror the doorbell registers' layout.
    pub fn use_shadow(&mut self, pages: &ShadowPages) {
        let sq = self.sq_doorbell - regs::DOORBELLS;
        let cq = self.cq_doorbell - regs::DOORBELLS;
        pages.doorbells.write::<u32>(sq, u32::from(self.sq_tail));
        pages.doorbells.write::<u32>(cq, u32::from(self.cq_head));
        self.shadow = Some((sq, cq));
    }

    /// Writes `cmd` into the next submission slot. The caller guarantees a free entry
    /// (at most `entries - 1` commands outstanding). The controller sees it after
    /// [`QueuePair::ring_sq`].
    pub fn push(&mut self, cmd: &Command) {
        let base = usize::from(self.sq_tail) * SQE_SIZE;
        // Eight volatile stores of the entry's bytes, as they are.
        let words: [u64; SQE_SIZE / 8] = zerocopy::transmute!(*cmd);
        for (i, word) in words.into_iter().enumerate() {
            self.sq.write::<u64>(base + 8 * i, word);
        }
        self.sq_tail = (self.sq_tail + 1) % self.entries;
        self.stats.submitted += 1;
    }

    /// Tells the controller about every command pushed so far.
    pub fn ring_sq(&mut self, shadow: Option<&ShadowPages>) {
        if self.sq_tail == self.sq_published {
            return;
        }
        // The entries must be in memory before the controller can learn of them.
        fence(Ordering::SeqCst);
        let (old, new) = (self.sq_published, self.sq_tail);
        self.sq_published = new;
        if self.notify(shadow, 0, old, new) {
            self.regs.write32(self.sq_doorbell, u32::from(new));
            self.stats.sq_mmio += 1;
        }
    }

    /// The next completion, if the controller has posted one.
    pub fn pop(&mut self) -> Option<Completion> {
        let base = usize::from(self.cq_head) * CQE_SIZE;
        let status_phase: u16 = self.cq.read(base + Completion::STATUS_PHASE_OFFSET);
        if Completion::phase_of(status_phase) != self.phase {
            return None;
        }
        // Read the entry only after seeing the phase bit flip.
        fence(Ordering::Acquire);
        let words: [u64; CQE_SIZE / 8] = [self.cq.read(base), self.cq.read(base + 8)];
        let c: Completion = zerocopy::transmute!(words);
        self.cq_head += 1;
        if self.cq_head == self.entries {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        self.stats.completed += 1;
        Some(c)
    }

    /// Tells the controller how far the completion ring has been consumed.
    pub fn ring_cq(&mut self, shadow: Option<&ShadowPages>) {
        if self.cq_head == self.cq_published {
            return;
        }
        let (old, new) = (self.cq_published, self.cq_head);
        self.cq_published = new;
        if self.notify(shadow, 1, old, new) {
            self.regs.write32(self.cq_doorbell, u32::from(new));
            self.stats.cq_mmio += 1;
        }
    }

    /// With shadow doorbells: stores `new` in the shadow entry (`which` 0 = SQ, 1 = CQ)
    /// and returns whether the controller also needs the MMIO write. Without: true.
    fn notify(&mut self, shadow: Option<&ShadowPages>, which: usize, old: u16, new: u16) -> bool {
        let (Some(offsets), Some(pages)) = (self.shadow, shadow) else {
            return true;
        };
        let at = if which == 0 { offsets.0 } else { offsets.1 };
        pages.doorbells.write::<u32>(at, u32::from(new));
        // The shadow value must be visible before we read what the controller wants.
        fence(Ordering::SeqCst);
        let event = pages.event_idx.read::<u32>(at) as u16;
        if regs::doorbell_needed(event, new, old) {
            true
        } else {
            self.stats.shadow_only += 1;
            false
        }
    }
}

//! Controller bring-up and the admin queue: reset and enable with CAP.TO timeouts, and
//! admin commands one at a time, completed by MSI-X entry 0 or by polling.
//!
//! Stopping the controller ([`Controller::halt`]) never waits: it clears CC.EN and turns
//! bus mastering off, which ends the controller's DMA at once whatever state its reset is
//! in; [`Controller::enable`] waits for the reset to finish before letting it master the
//! bus again.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::sync::atomic::{AtomicU16, Ordering};
use core::time::Duration;

use super::cmd::{Command, Completion, Status};
use super::queue::QueuePair;
use super::regs::{self, Capabilities};
use super::NvmeError;
use crate::drivers::inflight::{acquire, SlotQueue, Slots};
use crate::drivers::yield_now;
use crate::exec::IrqEvent;
use crate::hal::mmio::MmioRegion;
use crate::mm::{DmaCoherent, DmaDevice};
use crate::pci::device::PciDevice;
use crate::sync::IrqLock;
use crate::task;

/// Entries in each admin ring.
pub const ADMIN_ENTRIES: u16 = 32;
/// How long an admin command may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of an admin command's data (Identify).
pub const ADMIN_DATA: usize = 4096;

/// Why an admin command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminError {
    /// The controller reported this status.
    Status(Status),
    /// No completion within the admin timeout (the controller has been disabled).
    Timeout,
}

/// A controller's registers and admin queue.
#[derive(Debug)]
pub struct Controller {
    /// The PCI function.
    pub pci: PciDevice,
    /// BAR0.
    pub regs: MmioRegion,
    /// The decoded CAP register.
    pub cap: Capabilities,
    /// The controller's bus mastering and DMA memory.
    pub dma: DmaDevice,
    admin: IrqLock<QueuePair>,
    /// One admin command at a time: a single slot used as an async lock.
    turn: IrqLock<Slots<()>>,
    /// The data page of admin commands (Identify), shared with the controller for its
    /// whole life, so an abandoned command can only ever write here.
    data: DmaCoherent,
    /// Signalled by MSI-X entry 0; `None` when admin completions are polled.
    event: Option<Arc<IrqEvent>>,
    next_cid: AtomicU16,
}

impl Controller {
    /// Maps BAR0 and reads the capabilities; does not touch the controller's state.
    /// Its queues and data page are DMA memory of `dma`.
    pub fn new(pci: PciDevice, dma: DmaDevice) -> Result<Controller, NvmeError> {
        let regs = pci.map_bar(0).map_err(NvmeError::Bar)?;
        let cap = Capabilities::from_register(regs.read64(regs::CAP));
        if !cap.nvm_command_set {
            return Err(NvmeError::Unsupported("the NVM command set"));
        }
        if cap.min_page_size > 4096 || cap.max_page_size < 4096 {
            return Err(NvmeError::Unsupported("4 KiB memory pages"));
        }
        let oom = |_| NvmeError::NoMemory;
        let admin = QueuePair::new(0, ADMIN_ENTRIES, regs.clone(), &cap, &dma).map_err(oom)?;
        Ok(Controller {
            pci,
            admin: IrqLock::new(admin),
            regs,
            cap,
            turn: IrqLock::new(Slots::new(1)),
            data: DmaCoherent::alloc(&dma, ADMIN_DATA).map_err(oom)?,
            dma,
            event: None,
            next_cid: AtomicU16::new(0),
        })
    }

    /// Completes admin commands by interrupt: `event` is signalled by MSI-X entry 0.
    pub fn set_admin_event(&mut self, event: Arc<IrqEvent>) {
        self.event = Some(event);
    }

    fn ready(&self) -> bool {
        self.regs.read32(regs::CSTS) & regs::CSTS_RDY != 0
    }

    async fn wait_ready(&self, ready: bool, stage: &'static str) -> Result<(), NvmeError> {
        let end = task::now() + self.cap.timeout;
        loop {
            let csts = self.regs.read32(regs::CSTS);
            if ready && csts & regs::CSTS_CFS != 0 {
                return Err(NvmeError::Fatal);
            }
            if (csts & regs::CSTS_RDY != 0) == ready {
                return Ok(());
            }
            if task::now() > end {
                return Err(NvmeError::Timeout(stage));
            }
            task::sleep(Duration::from_micros(200)).await;
        }
    }

    /// Disables the controller and waits (up to CAP.TO) until it says so.
    pub async fn disable(&self) -> Result<(), NvmeError> {
        let cc = self.regs.read32(regs::CC);
        if cc & 1 == 1 && !self.ready() {
            // Still enabling: the spec asks to let it finish before disabling.
            let _ = self.wait_ready(true, "enable before reset").await;
        }
        self.regs.write32(regs::CC, cc & !1);
        self.wait_ready(false, "disable").await
    }

    /// Stops the controller at once, without waiting (for drop paths and recovery):
    /// clears CC.EN and turns bus mastering off, so from here on it touches no memory and
    /// raises no interrupt, whether or not its reset has finished. [`Controller::enable`]
    /// brings it back.
    pub fn halt(&self) {
        let cc = self.regs.read32(regs::CC);
        self.regs.write32(regs::CC, cc & !1);
        self.dma.stop();
    }

    /// Waits (up to CAP.TO) for the controller to be disabled, lets it master the bus, sets
    /// up the admin queue and enables it.
    pub async fn enable(&self) -> Result<(), NvmeError> {
        // Only a controller whose reset has finished has forgotten the queues it was
        // given before: only then may it reach memory again.
        self.wait_ready(false, "reset").await?;
        self.dma.start();
        self.admin.lock(|admin| {
            admin.reset();
            self.regs.write32(regs::AQA, regs::aqa(ADMIN_ENTRIES));
            self.regs.write64(regs::ASQ, admin.sq_addr());
            self.regs.write64(regs::ACQ, admin.cq_addr());
        });
        self.regs.write32(regs::CC, regs::cc_enable());
        self.wait_ready(true, "enable").await
    }

    /// Runs an Identify command (`cns`, namespace `nsid`) and returns its data page.
    pub async fn identify(&self, cns: u32, nsid: u32) -> Result<Box<[u8]>, AdminError> {
        let cmd = Command::identify(cns, nsid).with_prp(self.data.device_addr());
        self.admin(cmd).await?;
        let mut page = alloc::vec![0u8; ADMIN_DATA].into_boxed_slice();
        self.data.read_bytes(0, &mut page);
        Ok(page)
    }

    /// Runs one admin command and returns its completion (dword 0 in `result`).
    pub async fn admin(&self, mut cmd: Command) -> Result<Completion, AdminError> {
        let turn = acquire(&self.turn).await;
        let _release = Release(&self.turn, turn);
        let cid = self.next_cid.fetch_add(1, Ordering::Relaxed);
        cmd.set_cid(cid);
        self.admin.lock(|q| {
            q.push(&cmd);
            q.ring_sq(None);
        });
        let end = task::now() + ADMIN_TIMEOUT;
        loop {
            let found = self.admin.lock(|q| {
                let mut found = None;
                while let Some(c) = q.pop() {
                    if c.cid() == cid {
                        found = Some(c);
                        break;
                    }
                    log::warn!("nvme: stray admin completion {c:?}");
                }
                q.ring_cq(None);
                found
            });
            if let Some(c) = found {
                return if c.status().is_success() {
                    Ok(c)
                } else {
                    Err(AdminError::Status(c.status()))
                };
            }
            let now = task::now();
            if now > end {
                log::error!("nvme: admin command {cmd:?} timed out; disabling the controller");
                self.halt();
                return Err(AdminError::Timeout);
            }
            match &self.event {
                Some(e) => {
                    let _ = task::timeout(end - now, e.wait()).await;
                }
                None => yield_now().await,
            }
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Never leave a controller running over freed queues (also on failed bring-ups).
        self.halt();
    }
}

/// Gives the admin turn back when the command is done (or its future dropped).
struct Release<'a>(&'a IrqLock<Slots<()>>, u16);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let turn = self.1;
        self.0.with_slots(|s| s.release(turn));
    }
}

//! Controller bring-up and the admin queue: reset and enable with CAP.TO timeouts, and
//! admin commands one at a time, completed by MSI-X entry 0 or by polling.

use alloc::sync::Arc;
use core::cell::{Cell, RefCell};
use core::time::Duration;

use super::cmd::{Command, Completion, Status};
use super::queue::QueuePair;
use super::regs::{self, Capabilities};
use super::NvmeError;
use crate::drivers::inflight::{acquire, Slots};
use crate::drivers::yield_now;
use crate::exec::IrqEvent;
use crate::hal::mmio::MmioRegion;
use crate::mm::DmaBuffer;
use crate::pci::device::PciDevice;
use crate::task;

/// Entries in each admin ring.
pub const ADMIN_ENTRIES: u16 = 32;
/// How long an admin command may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

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
    admin: RefCell<QueuePair>,
    /// One admin command at a time: a single slot used as an async lock.
    turn: RefCell<Slots<()>>,
    /// The data page of admin commands (Identify). The controller owns it for as long
    /// as it may still be written, so an abandoned command cannot write into freed memory.
    pub data: DmaBuffer,
    /// Signalled by MSI-X entry 0; `None` when admin completions are polled.
    event: Option<Arc<IrqEvent>>,
    next_cid: Cell<u16>,
}

impl Controller {
    /// Maps BAR0 and reads the capabilities; does not touch the controller's state.
    pub fn new(pci: PciDevice) -> Result<Controller, NvmeError> {
        let regs = pci.map_bar(0).map_err(NvmeError::Bar)?;
        let cap = Capabilities::from_register(regs.read64(regs::CAP));
        if !cap.nvm_command_set {
            return Err(NvmeError::Unsupported("the NVM command set"));
        }
        if cap.min_page_size > 4096 || cap.max_page_size < 4096 {
            return Err(NvmeError::Unsupported("4 KiB memory pages"));
        }
        let oom = |_| NvmeError::NoMemory;
        Ok(Controller {
            pci,
            admin: RefCell::new(QueuePair::new(0, ADMIN_ENTRIES, regs.clone(), &cap).map_err(oom)?),
            regs,
            cap,
            turn: RefCell::new(Slots::new(1)),
            data: DmaBuffer::new(4096).map_err(oom)?,
            event: None,
            next_cid: Cell::new(0),
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

    /// Disables the controller without yielding (for drop paths and recovery): after it
    /// returns true, the controller has stopped processing commands and touching memory.
    pub fn disable_now(&self) -> bool {
        let cc = self.regs.read32(regs::CC);
        self.regs.write32(regs::CC, cc & !1);
        let end = task::now() + self.cap.timeout;
        while self.ready() {
            if task::now() > end {
                return false;
            }
            core::hint::spin_loop();
        }
        true
    }

    /// Sets up the admin queue and enables the controller (which must be disabled).
    pub async fn enable(&self) -> Result<(), NvmeError> {
        {
            let mut admin = self.admin.borrow_mut();
            admin.reset();
            self.regs.write32(regs::AQA, regs::aqa(ADMIN_ENTRIES));
            self.regs.write64(regs::ASQ, admin.sq_addr());
            self.regs.write64(regs::ACQ, admin.cq_addr());
        }
        self.regs.write32(regs::CC, regs::cc_enable());
        self.wait_ready(true, "enable").await
    }

    /// Runs one admin command and returns its completion (dword 0 in `result`). Commands
    /// that transfer data use [`Controller::data`] (set PRP1 to its address).
    pub async fn admin(&self, mut cmd: Command) -> Result<Completion, AdminError> {
        let turn = acquire(&self.turn).await;
        let _release = Release(&self.turn, turn);
        let cid = self.next_cid.get();
        self.next_cid.set(cid.wrapping_add(1));
        cmd.set_cid(cid);
        {
            let mut q = self.admin.borrow_mut();
            q.push(&cmd);
            q.ring_sq(None);
        }
        let end = task::now() + ADMIN_TIMEOUT;
        loop {
            {
                let mut q = self.admin.borrow_mut();
                let mut found = None;
                while let Some(c) = q.pop() {
                    if c.cid == cid {
                        found = Some(c);
                        break;
                    }
                    log::warn!("nvme: stray admin completion {c:?}");
                }
                q.ring_cq(None);
                if let Some(c) = found {
                    return if c.status.is_success() {
                        Ok(c)
                    } else {
                        Err(AdminError::Status(c.status))
                    };
                }
            }
            let now = task::now();
            if now > end {
                log::error!("nvme: admin command {cmd:?} timed out; disabling the controller");
                self.disable_now();
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
        self.disable_now();
    }
}

/// Gives the admin turn back when the command is done (or its future dropped).
struct Release<'a>(&'a RefCell<Slots<()>>, u16);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.borrow_mut().release(self.1);
    }
}

//! The NVMe driver (decision D2 in `docs/decisions.md`: our own, not the `nvme-driver`
//! crate).
//!
//! - [`regs`], [`cmd`], [`identify`], [`prp`]: registers, command/completion encoding,
//!   Identify parsing and PRP construction, pure and host-tested;
//! - [`queues`]: how many I/O queue pairs to create and which MSI-X entry each uses, pure
//!   and host-tested;
//! - `queue`: one submission/completion ring pair with batched (and, where the
//!   controller offers them, shadow) doorbells;
//! - `controller`: reset/enable with CAP.TO timeouts, the admin queue;
//! - `disk`: [`NvmeDisk`], the [`block::BlockDevice`] over the first active
//!   namespace, shared by every CPU: up to [`MAX_IO_QUEUES`] I/O queue pairs (a request
//!   goes to the pair of the CPU it is submitted on; each pair's interrupt and reaper are
//!   on the CPU it belongs to), data bounced through DMA streams the requests own, a
//!   supervisor for timeouts with abort and reset.

pub mod cmd;
pub mod identify;
pub mod prp;
pub mod queues;
pub mod regs;

#[cfg(target_os = "none")]
mod controller;
#[cfg(target_os = "none")]
mod disk;
#[cfg(target_os = "none")]
mod queue;

#[cfg(target_os = "none")]
pub use disk::{NvmeDisk, NvmeStats, QueueStats};
#[cfg(target_os = "none")]
pub use queue::DoorbellStats;

use core::fmt;
use core::time::Duration;

use super::{CompletionMode, DEFAULT_BOUNCE_POOL};
pub use queues::MAX_IO_QUEUES;

/// The CPU a request is submitted on, by [`Options::current_cpu`]'s default: 0.
pub fn boot_cpu() -> usize {
    0
}

/// How to run a controller. (Not comparable: [`Options::current_cpu`] is a function.)
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Interrupts or polling for I/O completions.
    pub mode: CompletionMode,
    /// Entries per I/O ring (capped by CAP.MQES); one fewer requests can be in flight.
    pub queue_entries: u16,
    /// Use shadow doorbells when the controller offers Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// How long a request may take before it is aborted (and, if that fails, the
    /// controller reset).
    pub timeout: Duration,
    /// Bytes of finished requests' DMA streams kept for the next requests.
    pub bounce_pool: usize,
    /// I/O queue pairs to ask the controller for (1..=[`MAX_IO_QUEUES`]; it may grant
    /// fewer): one per CPU.
    pub io_queues: u16,
    /// The index of the CPU the caller runs on: a request goes to I/O queue pair
    /// `current_cpu() % pairs`.
    pub current_cpu: fn() -> usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: CompletionMode::Interrupt,
            queue_entries: 256,
            shadow_doorbells: true,
            timeout: Duration::from_secs(30),
            bounce_pool: DEFAULT_BOUNCE_POOL,
            io_queues: 1,
            current_cpu: boot_cpu,
        }
    }
}

/// Why a controller could not be brought up.
#[derive(Clone, Copy, Debug)]
pub enum NvmeError {
    /// BAR0 could not be mapped.
    #[cfg(target_os = "none")]
    Bar(crate::pci::device::MapBarError),
    /// The controller lacks something we need.
    Unsupported(&'static str),
    /// MSI-X is missing or has too few entries for interrupt mode.
    NoMsix,
    /// No interrupt vector left.
    NoVector,
    /// No memory for queues or buffers.
    NoMemory,
    /// CSTS.RDY did not follow CC.EN within CAP.TO.
    Timeout(&'static str),
    /// The controller reported a fatal status (CSTS.CFS).
    Fatal,
    /// An admin command failed (`status` is `(sct << 8) | sc`, 0 for a timeout).
    Admin {
        /// What the command was for.
        what: &'static str,
        /// Its status.
        status: u16,
    },
    /// Identify data did not make sense.
    Identify(identify::IdentifyError),
    /// The controller has no active namespace.
    NoNamespace,
    /// Another driver instance still holds the controller's DMA.
    InUse,
}

impl fmt::Display for NvmeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(target_os = "none")]
            NvmeError::Bar(e) => write!(f, "mapping BAR0: {e:?}"),
            NvmeError::Unsupported(what) => write!(f, "controller does not support {what}"),
            NvmeError::NoMsix => f.write_str("no MSI-X with at least two entries"),
            NvmeError::NoVector => f.write_str("no free interrupt vector"),
            NvmeError::NoMemory => f.write_str("out of DMA memory"),
            NvmeError::Timeout(stage) => write!(f, "controller {stage} timed out (CAP.TO)"),
            NvmeError::Fatal => f.write_str("controller fatal status (CSTS.CFS)"),
            NvmeError::Admin { what, status: 0 } => write!(f, "{what}: admin command timed out"),
            NvmeError::Admin { what, status } => {
                write!(f, "{what}: admin command failed with status {status:#05x}")
            }
            NvmeError::Identify(e) => write!(f, "bad Identify data: {e:?}"),
            NvmeError::NoNamespace => f.write_str("no active namespace"),
            NvmeError::InUse => f.write_str("already in use by another driver instance"),
        }
    }
}

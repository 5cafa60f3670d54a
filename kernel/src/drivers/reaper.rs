//! The reapers: the tasks that do everything a request should not have to.
//!
//! A device has one *queue reaper* per queue ([`serve_queue`]), running on the CPU the
//! queue belongs to (NVMe: the CPU whose requests use the I/O queue pair, whose MSI-X
//! entry interrupts that CPU), and one *supervisor* ([`supervise`]) for what concerns the
//! whole device, on the CPU that opened it:
//!
//! - a queue reaper's pass lets the driver consume the queue's completions and publish
//!   its queued submissions ([`Reaped::reap`]); between passes it sleeps on the queue's
//!   event, which submitters signal (a *kick*: the doorbell is rung on the next pass,
//!   together with every request queued meanwhile) and so does the queue's interrupt.
//!   In polling mode it only yields while requests are outstanding;
//! - the supervisor looks for late requests every [`SCAN_INTERVAL`] while any are
//!   outstanding ([`Reaped::check_timeouts`]), and brings a device that was stopped
//!   after a timeout up again ([`Reaped::restart`]). While it does, the device's health
//!   is [`Health::Restarting`] and the queue reapers leave the queues alone; the driver
//!   signals their events once it is back (or dead) so they look again (or end).
//!
//! The tasks hold only a weak reference to the driver, so dropping the device handle
//! ends them (the handle's drop signals their events).

use alloc::sync::{Arc, Weak};
use core::sync::atomic::{AtomicU8, Ordering};
use core::time::Duration;

use block::IoError;

use super::yield_now;
use crate::exec::IrqEvent;
use crate::task;
use crate::time::Instant;

/// How often outstanding requests are checked against their deadlines.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);

/// Whether a device takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Working.
    Running,
    /// Stopped after a timeout; the supervisor is bringing it up again.
    Restarting,
    /// Gone for good: every request fails with [`IoError::Dead`].
    Dead,
}

/// A device's [`Health`], read and set from any CPU.
#[derive(Debug)]
pub struct SharedHealth(AtomicU8);

impl SharedHealth {
    /// A running device.
    pub const fn new() -> SharedHealth {
        SharedHealth(AtomicU8::new(Health::Running as u8))
    }

    /// The health now.
    pub fn get(&self) -> Health {
        match self.0.load(Ordering::SeqCst) {
            0 => Health::Running,
            1 => Health::Restarting,
            _ => Health::Dead,
        }
    }

    /// Sets it.
    pub fn set(&self, health: Health) {
        self.0.store(health as u8, Ordering::SeqCst);
    }

    /// Stops a running device (it will be restarted); true if it was running.
    pub fn stop(&self) -> bool {
        self.0
            .compare_exchange(
                Health::Running as u8,
                Health::Restarting as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Waits while the device is being restarted; fails once it is dead.
    pub async fn running(&self) -> Result<(), IoError> {
        loop {
            match self.get() {
                Health::Running => return Ok(()),
                Health::Dead => return Err(IoError::Dead),
                Health::Restarting => task::sleep(Duration::from_millis(1)).await,
            }
        }
    }
}

impl Default for SharedHealth {
    fn default() -> Self {
        SharedHealth::new()
    }
}

/// What the reapers need from a driver. Shared between CPUs: its queue reapers may run
/// anywhere.
#[allow(async_fn_in_trait)]
pub trait Reaped: Send + Sync {
    /// The device's health.
    fn health(&self) -> Health;

    /// Processes every completion the device has posted on queue `queue` (completing
    /// slots), and publishes the queue's queued submissions; returns how many requests
    /// the device still holds on that queue. Does nothing unless the device is running.
    fn reap(&self, queue: usize) -> usize;

    /// Requests the device owns now, over all its queues.
    fn in_device(&self) -> usize;

    /// Brings a stopped device up again (health is [`Health::Restarting`]); sets the
    /// health to the outcome and signals every queue's event.
    async fn restart(&self);

    /// Deals with requests whose deadline is before `now`.
    async fn check_timeouts(&self, now: Instant);
}

/// The reaper of queue `queue` of a device (see the module documentation): `event` is
/// signalled by submitters, by the queue's interrupt (if it has one) and by the driver
/// when the device's health changes; with `poll` it spins (yielding) while the queue has
/// requests outstanding.
pub async fn serve_queue<D: Reaped>(
    device: Weak<D>,
    queue: usize,
    event: Arc<IrqEvent>,
    poll: bool,
) {
    loop {
        let busy = {
            let Some(d) = device.upgrade() else { return };
            match d.health() {
                Health::Dead => return,
                // The supervisor signals the event when the device is back.
                Health::Restarting => false,
                Health::Running => d.reap(queue) > 0,
            }
        };
        if busy && poll {
            yield_now().await;
        } else {
            event.wait().await;
        }
    }
}

/// The supervisor of a device (see the module documentation): checks for late requests
/// every [`SCAN_INTERVAL`] while some are outstanding and restarts the device after a
/// timeout stopped it. `kick` is signalled when the device is stopped and by the
/// handle's drop.
pub async fn supervise<D: Reaped>(device: Weak<D>, kick: Arc<IrqEvent>) {
    let mut next_scan = task::now() + SCAN_INTERVAL;
    loop {
        {
            let Some(d) = device.upgrade() else { return };
            match d.health() {
                Health::Dead => return,
                Health::Restarting => d.restart().await,
                Health::Running => {}
            }
            let now = task::now();
            if d.in_device() == 0 {
                next_scan = now + SCAN_INTERVAL;
            } else if now >= next_scan {
                d.check_timeouts(now).await;
                next_scan = task::now() + SCAN_INTERVAL;
            }
        }
        let _ = task::timeout(SCAN_INTERVAL, kick.wait()).await;
    }
}

//! The reaper: one task per device that does everything a request should not have to.
//!
//! Each pass it lets the driver consume completions and publish queued submissions on
//! every queue of the device ([`Reaped::reap`]), and, while requests are outstanding, looks for late ones every
//! [`SCAN_INTERVAL`] ([`Reaped::check_timeouts`]). Between passes it sleeps until a
//! *kick* (a request was queued: its doorbell is rung on the next pass, together with
//! every other request queued meanwhile), an interrupt, or the next timeout scan; in
//! polling mode it only yields while requests are outstanding.
//!
//! The task holds only a weak reference to the driver, so dropping the device handle
//! ends it (the handle's drop kicks it).

use alloc::rc::Weak;
use alloc::sync::Arc;
use core::cell::Cell;
use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;

use block::IoError;

use super::yield_now;
use crate::exec::{IrqEvent, Sleep};
use crate::task;
use crate::time::Instant;

/// How often outstanding requests are checked against their deadlines.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);

/// Whether a device takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Working.
    Running,
    /// Stopped after a timeout; the reaper is bringing it up again.
    Restarting,
    /// Gone for good: every request fails with [`IoError::Dead`].
    Dead,
}

/// Waits while the device is being restarted; fails once it is dead.
pub async fn running(health: &Cell<Health>) -> Result<(), IoError> {
    loop {
        match health.get() {
            Health::Running => return Ok(()),
            Health::Dead => return Err(IoError::Dead),
            Health::Restarting => task::sleep(Duration::from_millis(1)).await,
        }
    }
}

/// What the reaper needs from a driver.
#[allow(async_fn_in_trait)]
pub trait Reaped {
    /// The device's health.
    fn health(&self) -> Health;

    /// Processes every completion the device has posted, on every queue (completing
    /// slots), and publishes queued submissions.
    fn reap(&self);

    /// Requests the device owns now, over all its queues.
    fn in_device(&self) -> usize;

    /// Brings a stopped device up again (health is [`Health::Restarting`]); sets the
    /// health to the outcome.
    async fn restart(&self);

    /// Deals with requests whose deadline is before `now`.
    async fn check_timeouts(&self, now: Instant);
}

/// Waits for the first of: a kick, an interrupt, the timeout-scan tick.
fn wake_up<'a>(
    kick: &'a IrqEvent,
    irq: Option<&'a IrqEvent>,
    mut tick: Option<&'a mut Sleep>,
) -> impl Future<Output = ()> + 'a {
    poll_fn(move |cx| {
        let mut ready = Pin::new(&mut kick.wait()).poll(cx).is_ready();
        if let Some(e) = irq {
            ready |= Pin::new(&mut e.wait()).poll(cx).is_ready();
        }
        if let Some(t) = tick.as_deref_mut() {
            ready |= Pin::new(t).poll(cx).is_ready();
        }
        if ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

/// The reaper task of a device (see the module documentation). `kick` is signalled by
/// submitters and by the handle's drop; `irq` by the device's interrupt, if it has one;
/// with `poll` it spins (yielding) while requests are outstanding.
pub async fn run<D: Reaped>(
    device: Weak<D>,
    kick: Arc<IrqEvent>,
    irq: Option<Arc<IrqEvent>>,
    poll: bool,
) {
    let mut next_scan = task::now() + SCAN_INTERVAL;
    let mut tick: Option<Sleep> = None;
    loop {
        let busy = {
            let Some(d) = device.upgrade() else { return };
            match d.health() {
                Health::Dead => return,
                Health::Restarting => d.restart().await,
                Health::Running => {}
            }
            d.reap();
            let busy = d.in_device() > 0;
            let now = task::now();
            if !busy {
                next_scan = now + SCAN_INTERVAL;
            } else if now >= next_scan {
                d.check_timeouts(now).await;
                next_scan = task::now() + SCAN_INTERVAL;
            }
            busy
        };
        if busy && poll {
            yield_now().await;
            continue;
        }
        if !busy {
            tick = None;
        } else if tick.as_ref().is_none_or(|t| t.deadline() != next_scan) {
            tick = Some(task::sleep_until(next_scan));
        }
        wake_up(&kick, irq.as_deref(), tick.as_mut()).await;
    }
}

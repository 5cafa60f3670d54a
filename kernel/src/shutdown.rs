//! The clean shutdown a press of the ACPI power button starts (QEMU's
//! `system_powerdown`, libvirt's `virsh shutdown`, `make run`'s Ctrl-C), as a task on
//! the executor. Each step is logged as `shutdown: ...` and emitted as a `shutdown` event
//! ([`crate::event`]):
//!
//! 1. The 9P listener closes: no new connection.
//! 2. Every 9P connection is asked to close politely: no new request is read, the
//!    requests in flight finish and their replies are sent, then FIN. Connections still
//!    open after half of the limit are shed; their requests still run to their end.
//!    When every connection task has ended, no operation runs on the filesystem.
//! 3. The filesystem is made durable and marked clean (`NineFs::remount_read_only`: a
//!    final checkpoint, superblock clean, log empty); it stays mounted, read-only.
//! 4. The counters are logged, and the machine powers off (`power::off`, ACPI S5).
//!
//! The whole is bounded by `shutdown_timeout=` (default 30 s): past it the appliance
//! logs the step that hung and powers off anyway. Nothing acknowledged is lost then:
//! every fsync a client saw answered is in the log, which the next mount replays (it
//! reports "NOT cleanly unmounted"). A press while the shutdown runs is ignored
//! (counted: `power.shutdown.ignored_presses`).

use alloc::rc::Rc;
use core::cell::Cell;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;

use log::{error, info, warn};

use crate::event::{self, Event};
use crate::net::listener::{Listener, Tasks};
use crate::report::ShutdownReport;
use crate::storage::ServedVolume;
use crate::{clock, power, task};
use ninep::admin::AdminFs;
use ninep::service::stats::ServiceStats;

static STARTED: AtomicBool = AtomicBool::new(false);
static IGNORED_PRESSES: AtomicU64 = AtomicU64::new(0);
static TIMED_OUT: AtomicBool = AtomicBool::new(false);

/// The shutdown's counters; `service` has the connections it closed.
pub fn report(service: &ServiceStats) -> ShutdownReport {
    ShutdownReport {
        started: STARTED.load(Ordering::Relaxed),
        ignored_presses: IGNORED_PRESSES.load(Ordering::Relaxed),
        connections_closed: service.shutdown_closed.get(),
        connections_reset: service.shutdown_shed.get(),
        timed_out: TIMED_OUT.load(Ordering::Relaxed),
    }
}

/// The step under way, for the log when the limit passes.
#[derive(Clone, Copy, Debug)]
enum Step {
    Listener,
    Connections,
    Unmount,
}

impl Step {
    /// Its name in the `shutdown` event.
    fn name(self) -> &'static str {
        match self {
            Step::Listener => "listener",
            Step::Connections => "connections",
            Step::Unmount => "unmount",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Listener => "closing the 9P listener",
            Step::Connections => "closing the 9P connections",
            Step::Unmount => "unmounting the filesystem",
        })
    }
}

/// Waits for the power button, then shuts the listener's service and its filesystem down cleanly
/// within `limit` (see the module documentation). Returns when the machine may be
/// powered off.
pub async fn on_power_button<V: ServedVolume>(listener: Rc<Listener<AdminFs<V>>>, limit: Duration) {
    power::pressed().await;
    let started = begin();
    info!(
        "shutdown: power button pressed; closing the 9P service, unmounting, powering off (limit {} s)",
        limit.as_secs()
    );
    event::emit(Event::Shutdown(event::Shutdown {
        step: "started",
        limit_secs: Some(limit.as_secs()),
        serving: Some(true),
        ..Default::default()
    }));
    let step = Cell::new(Step::Listener);
    let end = match task::timeout(limit, steps(&listener, limit, &step)).await {
        Ok(Ok(())) => {
            let ms = (clock::now() - started).as_millis() as u64;
            info!("shutdown: done in {ms} ms");
            event::Shutdown {
                step: "done",
                ms: Some(ms),
                ..Default::default()
            }
        }
        Ok(Err(e)) => {
            error!(
                "shutdown: unmount failed ({e}); powering off anyway: the log keeps every acknowledged fsync and the next mount replays it"
            );
            event::Shutdown {
                step: "failed",
                error: Some(event::Text::display(e)),
                ..Default::default()
            }
        }
        Err(_) => {
            TIMED_OUT.store(true, Ordering::Relaxed);
            error!(
                "shutdown: still {} after {} s (shutdown_timeout=); powering off anyway: the log keeps every acknowledged fsync and the next mount replays it",
                step.get(),
                limit.as_secs()
            );
            event::Shutdown {
                step: "timed_out",
                during: Some(step.get().name()),
                limit_secs: Some(limit.as_secs()),
                ..Default::default()
            }
        }
    };
    event::emit(Event::Shutdown(end));
    listener.log_stats();
}

/// Waits for the power button when nothing is being served (no disk, no network):
/// there is nothing to close. Returns when the machine may be powered off.
pub async fn on_power_button_idle() {
    power::pressed().await;
    begin();
    info!("shutdown: power button pressed; nothing is served: powering off");
    event::emit(Event::Shutdown(event::Shutdown {
        step: "started",
        serving: Some(false),
        ..Default::default()
    }));
}

/// Marks the shutdown started and counts (and ignores) the presses after this one.
fn begin() -> crate::time::Instant {
    STARTED.store(true, Ordering::Relaxed);
    task::spawn(async {
        loop {
            power::pressed().await;
            IGNORED_PRESSES.fetch_add(1, Ordering::Relaxed);
            warn!("shutdown: power button pressed again; already shutting down (ignored)");
            event::emit(Event::Shutdown(event::Shutdown {
                step: "press_ignored",
                ..Default::default()
            }));
        }
    });
    clock::now()
}

/// Steps 1 to 3; `step` says which one runs.
async fn steps<V: ServedVolume>(
    listener: &Listener<AdminFs<V>>,
    limit: Duration,
    step: &Cell<Step>,
) -> vfs::FsResult<()> {
    let service = listener.service();
    step.set(Step::Listener);
    service.stop_listening();
    let open = service.stats().active();
    info!("shutdown: 9P: accepting no new connections; {open} open");
    event::emit(Event::Shutdown(event::Shutdown {
        step: "listener_closed",
        open: Some(open),
        ..Default::default()
    }));

    step.set(Step::Connections);
    let grace = limit / 2;
    let drained = service.drain(&Tasks, grace).await;
    if drained.shed > 0 {
        warn!(
            "shutdown: 9P: {} connection(s) had not finished after {} s: reset",
            drained.shed,
            grace.as_secs()
        );
    }
    info!(
        "shutdown: 9P: every connection closed ({} asked to close, {} reset); no request is running",
        drained.asked, drained.shed
    );
    event::emit(Event::Shutdown(event::Shutdown {
        step: "connections_closed",
        asked: Some(drained.asked),
        reset: Some(drained.shed),
        grace_secs: Some(grace.as_secs()),
        ..Default::default()
    }));

    step.set(Step::Unmount);
    let started = clock::now();
    service.server().fs().inner().unmount_clean().await?;
    let ms = (clock::now() - started).as_millis() as u64;
    info!("shutdown: fs: everything durable, unmounted cleanly in {ms} ms (read-only until power off)");
    event::emit(Event::Shutdown(event::Shutdown {
        step: "unmounted",
        ms: Some(ms),
        ..Default::default()
    }));
    Ok(())
}

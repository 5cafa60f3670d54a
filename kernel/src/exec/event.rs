//! The bridge from interrupt handlers to tasks.

use atomic_waker::AtomicWaker;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::task::{Context, Poll};

/// A flag an interrupt handler raises and one task awaits.
///
/// [`IrqEvent::signal`] is safe to call from an interrupt handler: it neither allocates nor
/// takes a lock that task code holds with interrupts enabled. Signals coalesce: several
/// signals before the task runs wake it once, and the task should then look at the device
/// for everything that happened (as drivers do with completion queues anyway).
#[derive(Debug, Default)]
pub struct IrqEvent {
    pending: AtomicBool,
    waker: AtomicWaker,
    signals: AtomicU64,
}

impl IrqEvent {
    /// An event that has not been signalled.
    pub const fn new() -> IrqEvent {
        IrqEvent {
            pending: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            signals: AtomicU64::new(0),
        }
    }

    /// Raises the event and wakes the waiting task, if any.
    pub fn signal(&self) {
        self.signals.fetch_add(1, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Consumes a pending signal without waiting; true if there was one.
    pub fn take(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }

    /// Waits for a signal (returns at once if one is pending) and consumes it.
    pub fn wait(&self) -> Wait<'_> {
        Wait { event: self }
    }

    /// How many times [`IrqEvent::signal`] was called.
    pub fn signal_count(&self) -> u64 {
        self.signals.load(Ordering::Relaxed)
    }
}

/// The future of [`IrqEvent::wait`].
#[derive(Debug)]
pub struct Wait<'a> {
    event: &'a IrqEvent,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.take() {
            return Poll::Ready(());
        }
        self.event.waker.register(cx.waker());
        // A signal between the first check and the registration would otherwise be missed.
        if self.event.take() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

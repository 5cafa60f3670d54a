//! Device drivers: NVMe (our own) and virtio-blk (over the `virtio-drivers` crate), both
//! implementing the filesystem's [`block::BlockDevice`], [`disk`], which picks the
//! device named by `disk=` on the command line, and virtio-net's buffer handling
//! (`virtio_net`, under the network stack's NIC). All of it is safe code on the `hal`'s
//! DMA types.
//!
//! Shared design (details in `docs/drivers.md`):
//! - every request takes a slot in an [`inflight::Slots`] table (back-pressure when the
//!   device queue is full) and holds it through an [`inflight::Request`] guard; dropping
//!   the request abandons the slot, never waits;
//! - a request's data goes to the device through a DMA stream the request owns (`bounce`),
//!   never as the caller's buffer; the slot (or the virtqueue) keeps the lent stream until
//!   the completion hands it back, so a dropped or forgotten future cannot leave the
//!   device writing into memory that something else owns;
//! - a *reaper* task per queue, on the CPU the queue belongs to, consumes completions
//!   (woken by the queue's MSI-X vector, aimed at that CPU, or polling while requests
//!   are outstanding) and rings the submission doorbell once for all requests queued
//!   since it last ran; a *supervisor* per device enforces request timeouts and restarts
//!   the device after one;
//! - the block devices are `Send + Sync`: every CPU submits, each queue's state under its
//!   own `IrqLock`, counters atomic.
//!
//! The wire formats and the slot table are pure and host-tested; the rest runs only on
//! the appliance.

#[cfg(target_os = "none")]
pub mod bounce;
pub mod inflight;
pub mod nvme;
#[cfg(target_os = "none")]
pub mod reaper;
pub mod select;
pub mod virtio_blk;
#[cfg(target_os = "none")]
pub mod virtio_net;
pub mod virtq;

#[cfg(target_os = "none")]
pub mod disk;

#[cfg(target_os = "none")]
mod glue {
    use alloc::boxed::Box;
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::future::{poll_fn, Future};
    use core::pin::Pin;
    use core::task::Poll;

    use crate::exec::IrqEvent;
    use crate::irq::{self, IrqHandle, NoFreeVector};

    /// An interrupt vector whose handler signals an event a driver task awaits.
    pub fn irq_event() -> Result<(IrqHandle, Arc<IrqEvent>), NoFreeVector> {
        let event = Arc::new(IrqEvent::new());
        let e = event.clone();
        let handle = irq::allocate(move || e.signal())?;
        Ok((handle, event))
    }

    /// Runs `futures` concurrently on the current task; their outputs in order.
    pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
        let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
        let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
        poll_fn(|cx| {
            let mut pending = false;
            for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
                if o.is_none() {
                    match f.as_mut().poll(cx) {
                        Poll::Ready(v) => *o = Some(v),
                        Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        out.into_iter()
            .map(|o| o.expect("every future finished"))
            .collect()
    }
}

/// Lets every other ready task run once before continuing (used by polling loops).
#[cfg(target_os = "none")]
pub use block::yield_now;
#[cfg(target_os = "none")]
pub use glue::{irq_event, join_all};

/// Bytes of finished requests' DMA streams a block driver keeps for the next requests,
/// by default (its `bounce_pool` option; see `bounce`).
pub const DEFAULT_BOUNCE_POOL: usize = 2 << 20;

/// How a driver learns that the device completed requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionMode {
    /// MSI-X interrupts wake the queues' reapers.
    Interrupt,
    /// The reaper polls the completion queue while requests are outstanding (the CPU
    /// spins; lowest latency under emulation, where interrupt delivery is slow).
    Poll,
}

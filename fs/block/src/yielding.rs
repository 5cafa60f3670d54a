//! [`YieldDisk`]: every request yields to the executor once before it is passed on, so
//! futures polled together (several fsyncs joined on one thread) really overlap: while
//! one waits for "the device", the others run. Without it a memory disk completes every
//! request at its first poll and nothing ever runs concurrently. [`yield_now`] is the
//! one yield the filesystem and the kernel share.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use crate::{BlockDevice, Geometry, IoError, WriteFlags};

/// A device whose requests each yield once (see the module documentation).
#[derive(Debug)]
pub struct YieldDisk<D> {
    inner: D,
}

impl<D: BlockDevice> YieldDisk<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> YieldDisk<D> {
        YieldDisk { inner }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

/// Lets every other ready task run once before continuing: pending once (after waking
/// itself), then ready. The one definition the filesystem, its tests and the kernel's
/// polling loops share.
pub async fn yield_now() {
    YieldOnce::default().await
}

/// Pending once (after waking itself), then ready.
#[derive(Debug, Default)]
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<D: BlockDevice> BlockDevice for YieldDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        yield_now().await;
        self.inner.read(lba, buf).await
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        yield_now().await;
        self.inner.write(lba, buf, flags).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        yield_now().await;
        self.inner.flush().await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        yield_now().await;
        self.inner.discard(lba, blocks).await
    }
}

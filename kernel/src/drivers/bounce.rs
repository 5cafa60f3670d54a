//! Bounce buffers: how a request's data reaches the device.
//!
//! The filesystem lends a driver its buffer for one call (`&[u8]`, `&mut [u8]`), and the
//! call's future may be dropped, or forgotten, at any `await`. A device given that buffer
//! could then write into memory that has since been freed or reused, and nothing in the
//! future's destructor could prevent it (a forgotten future runs none). So no device is
//! ever given a caller's buffer: every transfer is copied through a [`DmaStream`] that the
//! request owns, into it before a write and out of it after a read. The stream goes to
//! the device lent and comes back with the completion; if the request was abandoned
//! meanwhile, the driver frees it then.
//!
//! Streams come from the frame allocator. When it runs short, a request waits for the
//! device to complete others (which frees their streams) instead of failing; with nothing
//! lent to the device to wait for, it fails with [`IoError::NoMemory`].

use core::time::Duration;

use fs::block::IoError;

use crate::mm::{DmaDevice, DmaStream};
use crate::task;

/// How long a request waits before trying again for DMA memory.
const MEMORY_RETRY: Duration = Duration::from_millis(1);

/// A zeroed stream of `len` bytes for the device to read into.
pub async fn for_read(dma: &DmaDevice, len: usize) -> Result<DmaStream, IoError> {
    retry(dma, || DmaStream::alloc(dma, len)).await
}

/// A copy of `data` for the device to write out.
pub async fn for_write(dma: &DmaDevice, data: &[u8]) -> Result<DmaStream, IoError> {
    retry(dma, || DmaStream::copy_of(dma, data)).await
}

async fn retry<E>(
    dma: &DmaDevice,
    mut alloc: impl FnMut() -> Result<DmaStream, E>,
) -> Result<DmaStream, IoError> {
    loop {
        match alloc() {
            Ok(stream) => return Ok(stream),
            // Streams the device holds come back (and are freed) as it completes them.
            Err(_) if dma.stats().lent > 0 => task::sleep(MEMORY_RETRY).await,
            Err(_) => return Err(IoError::NoMemory),
        }
    }
}

//! [`TraceDisk`]: logs every request and its result through the `log` crate.

use crate::{BlockDevice, Geometry, IoError, WriteFlags};

/// A device that logs requests to `D` (target `ninefold::disk`, level `trace`; failures
/// at `warn`), tagged with a name to tell stacked devices apart.
#[derive(Debug)]
pub struct TraceDisk<D> {
    inner: D,
    name: &'static str,
}

impl<D: BlockDevice> TraceDisk<D> {
    /// Wraps `inner`; `name` prefixes every line.
    pub fn new(inner: D, name: &'static str) -> TraceDisk<D> {
        TraceDisk { inner, name }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn done(
        &self,
        what: core::fmt::Arguments<'_>,
        result: Result<(), IoError>,
    ) -> Result<(), IoError> {
        match result {
            Ok(()) => log::trace!(target: "ninefold::disk", "{}: {what} ok", self.name),
            Err(e) => log::warn!(target: "ninefold::disk", "{}: {what} failed: {e}", self.name),
        }
        result
    }
}

impl<D: BlockDevice> BlockDevice for TraceDisk<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoError> {
        log::trace!(target: "ninefold::disk", "{}: read lba {lba} len {}", self.name, buf.len());
        let result = self.inner.read(lba, buf).await;
        self.done(format_args!("read lba {lba}"), result)
    }

    async fn write(&self, lba: u64, buf: &[u8], flags: WriteFlags) -> Result<(), IoError> {
        let fua = if flags.fua { " fua" } else { "" };
        log::trace!(target: "ninefold::disk", "{}: write lba {lba} len {}{fua}", self.name, buf.len());
        let result = self.inner.write(lba, buf, flags).await;
        self.done(format_args!("write lba {lba}{fua}"), result)
    }

    async fn flush(&self) -> Result<(), IoError> {
        log::trace!(target: "ninefold::disk", "{}: flush", self.name);
        let result = self.inner.flush().await;
        self.done(format_args!("flush"), result)
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), IoError> {
        log::trace!(target: "ninefold::disk", "{}: discard lba {lba} blocks {blocks}", self.name);
        let result = self.inner.discard(lba, blocks).await;
        self.done(format_args!("discard lba {lba}"), result)
    }
}

//! [`LogBuilder`]: writes a dm-log-writes log the way QEMU's `blklogwrites` does.

use zerocopy::IntoBytes;

use crate::format::{
    EntryHeader, SuperEntry, FLAG_DISCARD, FLAG_FLUSH, FLAG_FUA, FLAG_MARK, MAGIC, VERSION,
};

/// Builds a log entry by entry (for tests: hand-built traces). Like QEMU, the super
/// entry's count is updated only at a FLUSH, so entries after the last FLUSH are found by
/// reading on.
#[derive(Clone, Debug)]
pub struct LogBuilder {
    sector_size: u32,
    bytes: Vec<u8>,
    entries: u64,
}

impl LogBuilder {
    /// An empty log with `sector_size`-byte log sectors.
    pub fn new(sector_size: u32) -> LogBuilder {
        let mut b = LogBuilder {
            sector_size,
            bytes: vec![0; sector_size as usize],
            entries: 0,
        };
        b.write_super();
        b
    }

    fn write_super(&mut self) {
        let sup = SuperEntry {
            magic: MAGIC.into(),
            version: VERSION.into(),
            nr_entries: self.entries.into(),
            sectorsize: self.sector_size.into(),
        };
        let raw = sup.as_bytes();
        self.bytes[..raw.len()].copy_from_slice(raw);
    }

    fn entry(&mut self, offset: u64, len: u64, flags: u64, data: &[u8], data_len: u64) {
        let ss = u64::from(self.sector_size);
        assert!(
            offset.is_multiple_of(ss) && len.is_multiple_of(ss),
            "unaligned request"
        );
        let header = EntryHeader {
            sector: (offset / ss).into(),
            nr_sectors: (len / ss).into(),
            flags: flags.into(),
            data_len: data_len.into(),
        };
        let start = self.bytes.len();
        self.bytes.resize(start + self.sector_size as usize, 0);
        self.bytes[start..start + header.as_bytes().len()].copy_from_slice(header.as_bytes());
        let data_start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        let padded = data.len().div_ceil(self.sector_size as usize) * self.sector_size as usize;
        self.bytes.resize(data_start + padded, 0);
        self.entries += 1;
    }

    /// A write of `data` at byte `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> &mut Self {
        let flags = if fua { FLAG_FUA } else { 0 };
        self.entry(offset, data.len() as u64, flags, data, 0);
        self
    }

    /// A completed FLUSH (updates the super entry's count).
    pub fn flush(&mut self) -> &mut Self {
        self.entry(0, 0, FLAG_FLUSH, &[], 0);
        self.write_super();
        self
    }

    /// A discard of `len` bytes at `offset`.
    pub fn discard(&mut self, offset: u64, len: u64) -> &mut Self {
        self.entry(offset, len, FLAG_DISCARD, &[], 0);
        self
    }

    /// A mark named `name` (as the kernel's dm-log-writes writes them).
    pub fn mark(&mut self, name: &str) -> &mut Self {
        self.entry(0, 0, FLAG_MARK, name.as_bytes(), name.len() as u64);
        self
    }

    /// The log's bytes so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

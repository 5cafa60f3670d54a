//! [`Trace`]: a parsed dm-log-writes log.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use zerocopy::FromBytes;

use crate::format::{
    EntryHeader, SuperEntry, FLAG_DISCARD, FLAG_FLUSH, FLAG_FUA, FLAG_MARK, KNOWN_FLAGS, MAGIC,
    VERSION,
};

/// Why a log could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than a super entry.
    NoSuper,
    /// The super entry's magic is wrong: not a dm-log-writes log.
    BadMagic(u64),
    /// A version this reader does not know.
    BadVersion(u64),
    /// The log sector size is not a power of two in 32 B..16 MiB.
    BadSectorSize(u32),
    /// Entry `index`, which the super entry counts, is cut short or malformed.
    BadEntry {
        /// Entry number.
        index: u64,
        /// What is wrong.
        why: &'static str,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::NoSuper => f.write_str("too short for a dm-log-writes super entry"),
            ParseError::BadMagic(m) => write!(f, "not a dm-log-writes log (magic {m:#x})"),
            ParseError::BadVersion(v) => write!(f, "unknown dm-log-writes version {v}"),
            ParseError::BadSectorSize(s) => write!(f, "invalid log sector size {s}"),
            ParseError::BadEntry { index, why } => write!(f, "log entry {index}: {why}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// What an entry records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A write of [`Entry::data`]; `fua`: durable on completion.
    Write {
        /// Written with FUA.
        fua: bool,
    },
    /// A completed cache FLUSH: every write logged before it is durable.
    Flush,
    /// A discard (no data in the log).
    Discard,
    /// A named mark (kernel dm-log-writes only); the name is the entry's data.
    Mark,
}

/// One logged request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Position in the log (completion order).
    pub index: usize,
    /// What it was.
    pub kind: EntryKind,
    /// First byte on the device.
    pub offset: u64,
    /// Bytes written or discarded.
    pub len: u64,
    /// Where its data is in [`Trace::bytes`] (empty for flushes and discards).
    pub data: Range<usize>,
    /// Log bytes up to and including this entry: the entry was complete once the log file
    /// was this long.
    pub log_end: u64,
}

/// A parsed log: the entries, in completion order, over the log's bytes.
#[derive(Clone, Debug)]
pub struct Trace {
    bytes: Arc<[u8]>,
    sector_size: u32,
    entries: Vec<Entry>,
    /// Entries the super entry counts (those up to the last FLUSH it saw).
    counted: u64,
}

impl Trace {
    /// Reads the log in `bytes`: the entries the super entry counts (an error if one of
    /// them is damaged), then any complete, well-formed entries after them (written after
    /// the last FLUSH, which is when the super entry is updated). Reading stops at the
    /// first header that is cut short, zero or has unknown flags.
    pub fn parse(bytes: impl Into<Arc<[u8]>>) -> Result<Trace, ParseError> {
        let bytes: Arc<[u8]> = bytes.into();
        let (sup, _) = SuperEntry::read_from_prefix(&bytes).map_err(|_| ParseError::NoSuper)?;
        if sup.magic.get() != MAGIC {
            return Err(ParseError::BadMagic(sup.magic.get()));
        }
        if sup.version.get() != VERSION {
            return Err(ParseError::BadVersion(sup.version.get()));
        }
        let sector_size = sup.sectorsize.get();
        let header_size = core::mem::size_of::<EntryHeader>() as u32;
        if !sector_size.is_power_of_two() || !(header_size..1 << 24).contains(&sector_size) {
            return Err(ParseError::BadSectorSize(sector_size));
        }
        let counted = sup.nr_entries.get();
        let mut trace = Trace {
            bytes,
            sector_size,
            entries: Vec::new(),
            counted,
        };
        let mut at = u64::from(sector_size);
        loop {
            let index = trace.entries.len() as u64;
            match trace.entry_at(index, at) {
                Ok(entry) => {
                    at = entry.log_end;
                    trace.entries.push(entry);
                }
                Err(why) if index < counted => return Err(ParseError::BadEntry { index, why }),
                Err(_) => break,
            }
        }
        Ok(trace)
    }

    /// Reads the log file at `path`.
    pub fn open(path: &std::path::Path) -> Result<Trace, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Trace::parse(bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Decodes the entry whose header is at log byte `at`.
    fn entry_at(&self, index: u64, at: u64) -> Result<Entry, &'static str> {
        let ss = u64::from(self.sector_size);
        let start = usize::try_from(at).map_err(|_| "beyond the log")?;
        let sector = self.bytes.get(start..).ok_or("beyond the log")?;
        if sector.len() < self.sector_size as usize {
            return Err("header cut short");
        }
        let (h, _) = EntryHeader::read_from_prefix(sector).map_err(|_| "header cut short")?;
        let flags = h.flags.get();
        if flags & !KNOWN_FLAGS != 0 {
            return Err("unknown flags");
        }
        if h.sector.get() == 0 && h.nr_sectors.get() == 0 && flags == 0 {
            return Err("empty header");
        }
        let len = h.nr_sectors.get().checked_mul(ss).ok_or("size overflows")?;
        let offset = h.sector.get().checked_mul(ss).ok_or("offset overflows")?;
        let kind = if flags & FLAG_FLUSH != 0 {
            EntryKind::Flush
        } else if flags & FLAG_DISCARD != 0 {
            EntryKind::Discard
        } else if flags & FLAG_MARK != 0 {
            EntryKind::Mark
        } else {
            EntryKind::Write {
                fua: flags & FLAG_FUA != 0,
            }
        };
        // Flushes and discards carry no data; marks carry their name (data_len bytes).
        let data_bytes = match kind {
            EntryKind::Write { .. } => len,
            EntryKind::Mark => h.data_len.get().div_ceil(ss) * ss,
            EntryKind::Flush | EntryKind::Discard => 0,
        };
        let data_start = at + ss;
        let log_end = data_start.checked_add(data_bytes).ok_or("size overflows")?;
        if log_end > self.bytes.len() as u64 {
            return Err("data cut short");
        }
        let (data_len, len) = match kind {
            EntryKind::Mark => (h.data_len.get(), 0),
            _ => (data_bytes, len),
        };
        Ok(Entry {
            index: index as usize,
            kind,
            offset,
            len,
            data: data_start as usize..(data_start + data_len) as usize,
            log_end,
        })
    }

    /// The log's sector size (`log-sector-size=`).
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// Every entry, in completion order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Entries the super entry counts: those logged up to the last FLUSH it recorded.
    pub fn counted_entries(&self) -> u64 {
        self.counted
    }

    /// The log's bytes (entries' [`Entry::data`] index them).
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }

    /// The data of `entry` (a write's bytes, a mark's name).
    pub fn data(&self, entry: &Entry) -> &[u8] {
        &self.bytes[entry.data.clone()]
    }

    /// Entries already complete when the log was `log_len` bytes long (a client that
    /// notes the log's length when a reply arrives learns which requests preceded it).
    pub fn entries_within(&self, log_len: u64) -> usize {
        self.entries.partition_point(|e| e.log_end <= log_len)
    }

    /// The entries up to and including the last FLUSH among the first `entries`: what a
    /// disk without a volatile cache loss keeps after a power cut at that moment.
    pub fn durable_prefix(&self, entries: usize) -> usize {
        self.entries[..entries.min(self.entries.len())]
            .iter()
            .rposition(|e| e.kind == EntryKind::Flush)
            .map_or(0, |i| i + 1)
    }

    /// Counts of writes, FUA writes, flushes, discards and marks.
    pub fn summary(&self) -> String {
        let (mut w, mut fua, mut fl, mut d, mut m, mut bytes) = (0, 0, 0, 0, 0, 0);
        for e in &self.entries {
            match e.kind {
                EntryKind::Write { fua: f } => {
                    w += 1;
                    fua += usize::from(f);
                    bytes += e.len;
                }
                EntryKind::Flush => fl += 1,
                EntryKind::Discard => d += 1,
                EntryKind::Mark => m += 1,
            }
        }
        format!(
            "{} entries: {w} writes ({fua} FUA, {bytes} bytes), {fl} flushes, {d} discards, {m} marks",
            self.entries.len()
        )
    }
}

//! A trace applied to a disk image, and a trace as a [`block::Recording`].
//!
//! The log has the completion order and nothing else: when each request was issued is
//! lost. The conversion assumes each request was issued after the one before it
//! completed, so overlapping writes land in log order (a device never reorders an
//! overwrite of a block behind an earlier write it already completed), and a FLUSH makes
//! every write logged before it durable. Between FLUSHes, any subset of the writes may
//! have reached the media: the crash-state enumeration explores exactly that.

use std::sync::Arc;

use block::{Recording, Request, RequestKind};

use crate::trace::{EntryKind, Trace};

/// The logical time at which the first `entries` entries have completed (entry `i` is
/// issued at `2i + 1` and completes at `2i + 2`).
pub fn time_after(entries: usize) -> u64 {
    2 * entries as u64
}

/// Entries completed by logical time `time` (the inverse of [`time_after`]).
pub fn entries_by(time: u64) -> usize {
    (time / 2) as usize
}

/// Applies the first `entries` entries of `trace` to `image`: writes, and discards as
/// zeros (what QEMU's raw files read back after `discard=unmap`).
pub fn apply(trace: &Trace, image: &mut [u8], entries: usize) -> Result<(), String> {
    for e in trace.entries().iter().take(entries) {
        let range = || -> Result<std::ops::Range<usize>, String> {
            let start = usize::try_from(e.offset).map_err(|_| "offset".to_string())?;
            let end = start.saturating_add(e.len as usize);
            if end > image.len() {
                return Err(format!(
                    "entry {} reaches byte {end}, past the image's {}",
                    e.index,
                    image.len()
                ));
            }
            Ok(start..end)
        };
        match e.kind {
            EntryKind::Write { .. } => {
                let r = range()?;
                image[r].copy_from_slice(trace.data(e));
            }
            EntryKind::Discard => {
                let r = range()?;
                image[r].fill(0);
            }
            EntryKind::Flush | EntryKind::Mark => {}
        }
    }
    Ok(())
}

/// What a power cut after the first `entries` entries leaves: every entry up to the last
/// FLUSH among them, then the FUA writes after it (those the log marks FUA and those wholly
/// inside `fua_blocks`, blocks of `block_size` bytes: see [`to_recording`]). Returns how
/// many entries were applied.
pub fn apply_durable(
    trace: &Trace,
    image: &mut [u8],
    entries: usize,
    block_size: u32,
    fua_blocks: &[u64],
) -> Result<usize, String> {
    let flushed = trace.durable_prefix(entries);
    apply(trace, image, flushed)?;
    let mut applied = flushed;
    let bs = u64::from(block_size);
    for e in &trace.entries()[flushed..entries.min(trace.entries().len())] {
        let EntryKind::Write { fua } = e.kind else {
            continue;
        };
        let first = e.offset / bs;
        let last = (e.offset + e.len).div_ceil(bs);
        let always_fua = (first..last).all(|b| fua_blocks.contains(&b));
        if fua || always_fua {
            let start = e.offset as usize;
            let end = start + e.len as usize;
            if end > image.len() {
                return Err(format!("entry {} reaches past the image", e.index));
            }
            image[start..end].copy_from_slice(trace.data(e));
            applied += 1;
        }
    }
    Ok(applied)
}

/// `trace` as a recording of a device with `block_size`-byte blocks (every request must
/// be block-aligned: record with `log-sector-size` a multiple of the block size, or with
/// a driver that only writes whole blocks). Marks become nothing but keep their time.
///
/// A write that lies wholly inside `fua_blocks` is taken as FUA even if the log does not
/// say so: QEMU 7.2's `blklogwrites` never sets the FUA flag (it does not advertise FUA,
/// and the block layer's emulation, a flush right after the write, is skipped when no
/// earlier write is unflushed), so a writer's FUA writes look like plain ones. Name the
/// blocks the writer only ever writes with FUA (ninefs: its superblock copies).
pub fn to_recording(
    trace: &Trace,
    block_size: u32,
    fua_blocks: &[u64],
) -> Result<Recording, String> {
    let bs = u64::from(block_size);
    let mut requests = Vec::with_capacity(trace.entries().len());
    for e in trace.entries() {
        if !e.offset.is_multiple_of(bs) || !e.len.is_multiple_of(bs) {
            return Err(format!(
                "entry {}: {} bytes at byte {} are not whole {bs}-byte blocks",
                e.index, e.len, e.offset
            ));
        }
        let kind = match e.kind {
            EntryKind::Write { fua } => {
                let lba = e.offset / bs;
                let always_fua = (lba..lba + e.len / bs).all(|b| fua_blocks.contains(&b));
                RequestKind::Write {
                    lba,
                    data: Arc::from(trace.data(e)),
                    fua: fua || always_fua,
                }
            }
            EntryKind::Flush => RequestKind::Flush,
            EntryKind::Discard => RequestKind::Discard {
                lba: e.offset / bs,
                blocks: e.len / bs,
            },
            EntryKind::Mark => continue,
        };
        requests.push(Request {
            kind,
            issued: time_after(e.index) + 1,
            completed: Some(time_after(e.index + 1)),
            ok: true,
        });
    }
    Ok(Recording {
        requests,
        now: time_after(trace.entries().len()),
        ..Recording::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LogBuilder, ParseError};

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; 4096]
    }

    /// Two writes, a FLUSH, an overwrite, a FUA write, a discard, a mark; 512-byte log
    /// sectors.
    fn sample() -> LogBuilder {
        let mut b = LogBuilder::new(512);
        b.write(0, &block(1), false)
            .write(8192, &[block(2), block(3)].concat(), false)
            .flush()
            .write(0, &block(4), false)
            .write(4096, &block(5), true)
            .discard(8192, 4096)
            .mark("end");
        b
    }

    #[test]
    fn parses_every_entry_including_those_after_the_last_flush() {
        let t = Trace::parse(sample().bytes().to_vec()).unwrap();
        assert_eq!(t.sector_size(), 512);
        // The super entry was last written at the FLUSH (entry 2).
        assert_eq!(t.counted_entries(), 3);
        let kinds: Vec<EntryKind> = t.entries().iter().map(|e| e.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                EntryKind::Write { fua: false },
                EntryKind::Write { fua: false },
                EntryKind::Flush,
                EntryKind::Write { fua: false },
                EntryKind::Write { fua: true },
                EntryKind::Discard,
                EntryKind::Mark,
            ]
        );
        let e = &t.entries()[1];
        assert_eq!((e.offset, e.len), (8192, 8192));
        assert_eq!(t.data(e), [block(2), block(3)].concat().as_slice());
        assert_eq!(t.data(&t.entries()[6]), b"end");
        assert_eq!(t.entries()[5].len, 4096);
        assert!(t.data(&t.entries()[5]).is_empty());
        // Log layout: super, header + 8 sectors, header + 16, header, ...
        assert_eq!(t.entries()[0].log_end, 512 * 10);
        assert_eq!(t.entries()[2].log_end, 512 * (10 + 17 + 1));
        assert_eq!(t.entries_within(512 * 28), 3);
        assert_eq!(t.entries_within(512 * 28 - 1), 2);
        assert_eq!(t.durable_prefix(7), 3);
        assert_eq!(t.durable_prefix(2), 0);
    }

    #[test]
    fn damage_inside_the_counted_entries_is_an_error_after_them_the_end() {
        let bytes = sample().bytes().to_vec();
        // Cut inside entry 1's data: entry 1 is counted by the super entry.
        let err = Trace::parse(bytes[..512 * 15].to_vec()).unwrap_err();
        assert_eq!(
            err,
            ParseError::BadEntry {
                index: 1,
                why: "data cut short"
            }
        );
        // Cut inside entry 3's data (after the last FLUSH): the log ends at entry 2.
        let t = Trace::parse(bytes[..512 * 30].to_vec()).unwrap();
        assert_eq!(t.entries().len(), 3);
        // Unknown flags end the uncounted tail too.
        let mut odd = bytes.clone();
        odd[512 * 28 + 16] = 0x80;
        assert_eq!(Trace::parse(odd).unwrap().entries().len(), 3);
    }

    #[test]
    fn rejects_what_is_not_a_log() {
        assert_eq!(
            Trace::parse(vec![0u8; 10]).unwrap_err(),
            ParseError::NoSuper
        );
        assert!(matches!(
            Trace::parse(vec![0u8; 512]).unwrap_err(),
            ParseError::BadMagic(0)
        ));
        let mut b = LogBuilder::new(512).bytes().to_vec();
        b[24] = 3; // sector size 515
        assert_eq!(Trace::parse(b).unwrap_err(), ParseError::BadSectorSize(515));
    }

    #[test]
    fn apply_replays_writes_and_discards_in_order() {
        let t = Trace::parse(sample().bytes().to_vec()).unwrap();
        let mut image = vec![9u8; 4 * 4096];
        apply(&t, &mut image, 3).unwrap();
        assert_eq!(&image[..4096], block(1).as_slice());
        assert_eq!(&image[4096..8192], block(9).as_slice());
        assert_eq!(&image[12288..], block(3).as_slice());
        apply(&t, &mut image, 7).unwrap();
        assert_eq!(&image[..4096], block(4).as_slice());
        assert_eq!(&image[4096..8192], block(5).as_slice());
        assert_eq!(&image[8192..12288], block(0).as_slice());
        let mut small = vec![0u8; 4096];
        assert!(apply(&t, &mut small, 2).is_err());
    }

    #[test]
    fn a_power_cut_keeps_the_flushed_prefix_and_later_fua_writes() {
        let t = Trace::parse(sample().bytes().to_vec()).unwrap();
        let mut image = vec![9u8; 4 * 4096];
        // Entries 3 (plain) and 4 (FUA) follow the FLUSH: only the FUA one lands.
        assert_eq!(apply_durable(&t, &mut image, 7, 4096, &[]).unwrap(), 4);
        assert_eq!(&image[..4096], block(1).as_slice());
        assert_eq!(&image[4096..8192], block(5).as_slice());
        assert_eq!(&image[12288..], block(3).as_slice());
        // Block 0 named as always-FUA: the plain overwrite lands too.
        let mut image = vec![9u8; 4 * 4096];
        assert_eq!(apply_durable(&t, &mut image, 7, 4096, &[0]).unwrap(), 5);
        assert_eq!(&image[..4096], block(4).as_slice());
    }

    #[test]
    fn recording_has_serial_times_and_block_units() {
        let t = Trace::parse(sample().bytes().to_vec()).unwrap();
        let r = to_recording(&t, 4096, &[]).unwrap();
        assert_eq!(r.requests.len(), 6, "the mark is dropped");
        assert_eq!(r.now, 14);
        assert!(matches!(
            &r.requests[1].kind,
            RequestKind::Write { lba: 2, data, fua: false } if data.len() == 8192
        ));
        assert_eq!(r.requests[2].kind, RequestKind::Flush);
        assert_eq!(
            (r.requests[2].issued, r.requests[2].completed),
            (5, Some(6))
        );
        assert!(matches!(
            r.requests[4].kind,
            RequestKind::Write {
                lba: 1,
                fua: true,
                ..
            }
        ));
        assert_eq!(
            r.requests[5].kind,
            RequestKind::Discard { lba: 2, blocks: 1 }
        );
        assert_eq!(entries_by(time_after(5) + 1), 5);
        // Block 0 always written with FUA: the first write becomes FUA, the one that
        // also covers block 1 does not.
        let r = to_recording(&t, 4096, &[0, 2]).unwrap();
        assert!(matches!(
            r.requests[0].kind,
            RequestKind::Write { fua: true, .. }
        ));
        assert!(matches!(
            r.requests[1].kind,
            RequestKind::Write { fua: false, .. }
        ));
        assert!(matches!(
            r.requests[3].kind,
            RequestKind::Write {
                lba: 0,
                fua: true,
                ..
            }
        ));
        // 512-byte writes cannot be 4 KiB blocks.
        let mut b = LogBuilder::new(512);
        b.write(512, &[1; 512], false);
        assert!(to_recording(&Trace::parse(b.bytes().to_vec()).unwrap(), 4096, &[]).is_err());
    }
}

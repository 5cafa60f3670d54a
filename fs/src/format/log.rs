//! The fsync log: block framing and records (pure encoding and decoding).
//!
//! The log region (fixed blocks, see [`super::Layout`]) is a ring of 4 KiB blocks. Block
//! sequence number `s` lives at `log_start + s % log_blocks`. A *commit* (one group
//! commit: the records of one batch of fsyncs) is `commit_blocks` consecutive blocks;
//! each block carries a header and a slice of the commit's payload (its records, one
//! after another). A reader accepts a block only if its magic, checksum, epoch and
//! sequence number are the expected ones, and a commit only if all its blocks are there:
//! a torn, stale or missing block ends the log.
//!
//! ```text
//! block header (64 bytes):
//!  0 magic "NFLG"      4 crc32c of bytes 8..4096
//!  8 epoch u64          (the mount's log epoch; blocks of other epochs are stale)
//! 16 seq u64            (this block's sequence number)
//! 24 commit_seq u64     (sequence number of the commit's first block)
//! 32 commit_blocks u32  36 payload_len u32 (payload bytes used in this block)
//! 40 fs_seq u64         (checkpoint interval the commit was made in; informational)
//! 48..64 reserved (zero)
//! payload: LOG_PAYLOAD bytes, the first payload_len used, the rest zero
//! ```
//!
//! Records: `kind u8, len u32, body[len]`. Bodies are listed at [`Record`].

use alloc::vec::Vec;
use core::mem::{offset_of, size_of};

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::items::{FileExtent, INODE_ITEM_LEN};
use super::{Corrupt, BLOCK_SIZE};
use crate::util::bytes::Reader;
use crate::util::crc::{crc32c, crc32c_parts};
use crate::util::scratch::Scratch;
use vfs::FileType;

/// Magic at the start of every log block.
pub const LOG_MAGIC: [u8; 4] = *b"NFLG";
/// Bytes of a log block header.
pub const LOG_HEADER_LEN: usize = size_of::<LogBlockHeaderDisk>();
/// Payload bytes per log block.
pub const LOG_PAYLOAD: usize = BLOCK_SIZE - LOG_HEADER_LEN;
/// Bytes of a record's kind and length.
pub const RECORD_HEADER_LEN: usize = 5;

/// The header of one log block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBlockHeader {
    /// The log epoch (chosen at mount; recorded in the superblock).
    pub epoch: u64,
    /// This block's sequence number.
    pub seq: u64,
    /// Sequence number of the first block of the commit.
    pub commit_seq: u64,
    /// Blocks in the commit.
    pub commit_blocks: u32,
    /// Payload bytes used in this block.
    pub payload_len: u32,
    /// Checkpoint interval the commit was made in.
    pub fs_seq: u64,
}

/// A log block header on disk: the layout in the module documentation.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct LogBlockHeaderDisk {
    magic: [u8; 4],
    /// crc32c of the block from `epoch` to its end.
    crc: U32,
    epoch: U64,
    seq: U64,
    commit_seq: U64,
    commit_blocks: U32,
    payload_len: U32,
    fs_seq: U64,
    reserved: [u8; 16],
}

/// Where a log block's checksum starts: everything after the magic and the checksum.
const CRC_START: usize = offset_of!(LogBlockHeaderDisk, epoch);

impl LogBlockHeader {
    /// Encodes a block: this header and `payload` (at most [`LOG_PAYLOAD`] bytes) into
    /// `out` (one block).
    pub fn encode_block(&self, payload: &[u8], out: &mut [u8]) {
        assert!(payload.len() <= LOG_PAYLOAD && out.len() == BLOCK_SIZE);
        assert_eq!(payload.len(), self.payload_len as usize);
        out[LOG_HEADER_LEN..LOG_HEADER_LEN + payload.len()].copy_from_slice(payload);
        out[LOG_HEADER_LEN + payload.len()..].fill(0);
        self.frame_in_place(out);
    }

    /// Writes the header and checksum into `b`, whose payload area already holds
    /// `payload_len` bytes (the rest of the block must be zero).
    pub fn frame_in_place(&self, b: &mut [u8]) {
        assert!(self.payload_len as usize <= LOG_PAYLOAD && b.len() == BLOCK_SIZE);
        let (header, payload) = LogBlockHeaderDisk::mut_from_prefix(b).expect("a block");
        *header = LogBlockHeaderDisk {
            magic: LOG_MAGIC,
            crc: U32::ZERO,
            epoch: self.epoch.into(),
            seq: self.seq.into(),
            commit_seq: self.commit_seq.into(),
            commit_blocks: self.commit_blocks.into(),
            payload_len: self.payload_len.into(),
            fs_seq: self.fs_seq.into(),
            reserved: [0; 16],
        };
        header.crc = crc32c_parts(&[&header.as_bytes()[CRC_START..], payload]).into();
    }

    /// Decodes one block; returns the header and the used payload.
    pub fn decode_block(b: &[u8]) -> Result<(LogBlockHeader, &[u8]), Corrupt> {
        if b.len() != BLOCK_SIZE {
            return Err(Corrupt::Truncated);
        }
        let (d, payload) =
            LogBlockHeaderDisk::ref_from_prefix(b).map_err(|_| Corrupt::Truncated)?;
        if d.magic != LOG_MAGIC {
            return Err(Corrupt::Magic);
        }
        if d.crc.get() != crc32c(&b[CRC_START..]) {
            return Err(Corrupt::Checksum);
        }
        let h = LogBlockHeader {
            epoch: d.epoch.get(),
            seq: d.seq.get(),
            commit_seq: d.commit_seq.get(),
            commit_blocks: d.commit_blocks.get(),
            payload_len: d.payload_len.get(),
            fs_seq: d.fs_seq.get(),
        };
        if h.payload_len as usize > LOG_PAYLOAD
            || h.commit_blocks == 0
            || h.seq < h.commit_seq
            || h.seq - h.commit_seq >= u64::from(h.commit_blocks)
        {
            return Err(Corrupt::Field("log block header"));
        }
        Ok((h, &payload[..h.payload_len as usize]))
    }
}

/// Blocks a commit of `payload` bytes occupies.
pub fn commit_blocks(payload: usize) -> u64 {
    payload.div_ceil(LOG_PAYLOAD).max(1) as u64
}

/// Encodes one commit: the concatenated `records` framed into blocks starting at
/// sequence number `first_seq`, appended to `out` (whole blocks). Returns the number of
/// blocks.
pub fn encode_commit(
    records: &[Vec<u8>],
    first_seq: u64,
    epoch: u64,
    fs_seq: u64,
    out: &mut Vec<u8>,
) -> u64 {
    let total: usize = records.iter().map(Vec::len).sum();
    let blocks = commit_blocks(total);
    let base = out.len();
    out.resize(base + blocks as usize * BLOCK_SIZE, 0);
    let mut block = 0usize;
    let mut fill = 0usize;
    let finish = |out: &mut Vec<u8>, block: usize, fill: usize| {
        let at = base + block * BLOCK_SIZE;
        let h = LogBlockHeader {
            epoch,
            seq: first_seq + block as u64,
            commit_seq: first_seq,
            commit_blocks: blocks as u32,
            payload_len: fill as u32,
            fs_seq,
        };
        h.frame_in_place(&mut out[at..at + BLOCK_SIZE]);
    };
    for rec in records {
        let mut r = &rec[..];
        while !r.is_empty() {
            if fill == LOG_PAYLOAD {
                finish(out, block, fill);
                block += 1;
                fill = 0;
            }
            let n = r.len().min(LOG_PAYLOAD - fill);
            let at = base + block * BLOCK_SIZE + LOG_HEADER_LEN + fill;
            out[at..at + n].copy_from_slice(&r[..n]);
            fill += n;
            r = &r[n..];
        }
    }
    finish(out, block, fill);
    debug_assert_eq!(block as u64 + 1, blocks);
    blocks
}

/// Record kinds.
pub mod rec {
    /// `ino u64, item[128]`: the inode item.
    pub const INODE: u8 = 1;
    /// `ino u64, n u32, n × (parent u64, index u64, type u8, name)`: every name of the
    /// inode (replay makes its names exactly these).
    pub const NAMES: u8 = 2;
    /// `ino u64, n u32, n × (kind u8, offset u64, len u32, value)`: every xattr item of
    /// the inode (replay deletes the others).
    pub const XATTRS: u8 = 3;
    /// `ino u64, start u64, end u64, n u32, n × (file block u64, extent[24])`: the file
    /// blocks `start..end` are mapped exactly by these pieces.
    pub const EXTENTS: u8 = 4;
    /// `disk_block u64, n u32, n × crc32c`: the checksums of a data extent.
    pub const CSUM: u8 = 5;
    /// `ino u64, len u32, target`: a symlink's target.
    pub const SYMLINK: u8 = 6;
    /// `dir u64, n u32, n × (index u64, ino u64, type u8, name), m u32, m × (hash u64,
    /// ino u64)`: entries the directory has, and removed entries (by name hash and
    /// inode) it no longer has.
    pub const DENTRIES: u8 = 7;
}

/// One name of an inode, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedName {
    /// The directory.
    pub parent: u64,
    /// The entry's readdir index in that directory.
    pub index: u64,
    /// The child's type.
    pub file_type: FileType,
    /// The name.
    pub name: Vec<u8>,
}

/// A directory entry, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedEntry {
    /// Readdir index.
    pub index: u64,
    /// The child.
    pub ino: u64,
    /// Its type.
    pub file_type: FileType,
    /// The name.
    pub name: Vec<u8>,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// [`rec::INODE`].
    Inode {
        /// Inode.
        ino: u64,
        /// The encoded inode item.
        item: Vec<u8>,
    },
    /// [`rec::NAMES`].
    Names {
        /// Inode.
        ino: u64,
        /// All its names.
        names: Vec<LoggedName>,
    },
    /// [`rec::XATTRS`].
    Xattrs {
        /// Inode.
        ino: u64,
        /// `(key kind, key offset, value)` of every xattr item.
        items: Vec<(u8, u64, Vec<u8>)>,
    },
    /// [`rec::EXTENTS`].
    Extents {
        /// Inode.
        ino: u64,
        /// First file block covered.
        start: u64,
        /// End (exclusive) of the covered file blocks.
        end: u64,
        /// `(file block, extent)` pieces inside `start..end`.
        pieces: Vec<(u64, FileExtent)>,
    },
    /// [`rec::CSUM`].
    Csum {
        /// First block of the data extent.
        disk_block: u64,
        /// One crc32c per block of the extent.
        csums: Vec<u32>,
    },
    /// [`rec::SYMLINK`].
    Symlink {
        /// Inode.
        ino: u64,
        /// Target.
        target: Vec<u8>,
    },
    /// [`rec::DENTRIES`].
    Dentries {
        /// The directory.
        dir: u64,
        /// Entries it has.
        entries: Vec<LoggedEntry>,
        /// `(name hash, inode)` of entries it no longer has.
        removed: Vec<(u64, u64)>,
    },
}

/// Appends record headers and fields to a [`Scratch`] buffer.
#[derive(Debug)]
pub struct RecordWriter<'a> {
    buf: &'a mut Scratch,
    start: usize,
}

impl<'a> RecordWriter<'a> {
    /// Starts a record of `kind`.
    pub fn begin(buf: &'a mut Scratch, kind: u8) -> RecordWriter<'a> {
        let start = buf.len();
        buf.u8(kind).u32(0);
        RecordWriter { buf, start }
    }

    /// The buffer, to append fields.
    pub fn buf(&mut self) -> &mut Scratch {
        self.buf
    }

    /// Ends the record (patches its length; nothing to patch once the buffer
    /// overflowed, as its content is then thrown away).
    pub fn end(self) {
        if !self.buf.overflowed() {
            let body = self.buf.len() - self.start - RECORD_HEADER_LEN;
            self.buf.patch(self.start + 1, &(body as u32).to_le_bytes());
        }
    }
}

/// Appends a name: length byte and bytes.
pub fn put_name(buf: &mut Scratch, name: &[u8]) {
    buf.u8(name.len() as u8).bytes(name);
}

fn get_name(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u8()? as usize;
    (n > 0).then_some(())?;
    Some(r.bytes(n)?.to_vec())
}

fn get_type(r: &mut Reader<'_>) -> Option<FileType> {
    super::items::file_type_from_dt(r.u8()?)
}

/// Decodes the records of one commit's payload.
pub fn decode_records(payload: &[u8]) -> Result<Vec<Record>, Corrupt> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let kind = r.u8().ok_or(Corrupt::Truncated)?;
        let len = r.u32().ok_or(Corrupt::Truncated)? as usize;
        let body = r.bytes(len).ok_or(Corrupt::Truncated)?;
        let rec = decode_body(kind, body).ok_or(Corrupt::Field("log record"))?;
        out.push(rec);
    }
    Ok(out)
}

/// Decodes the body of a record of `kind`; `None` if it is malformed or has bytes left.
fn decode_body(kind: u8, body: &[u8]) -> Option<Record> {
    let mut r = Reader::new(body);
    let rec = match kind {
        rec::INODE => Record::Inode {
            ino: r.u64()?,
            item: r.bytes(INODE_ITEM_LEN)?.to_vec(),
        },
        rec::NAMES => Record::Names {
            ino: r.u64()?,
            names: counted(&mut r, |r| {
                Some(LoggedName {
                    parent: r.u64()?,
                    index: r.u64()?,
                    file_type: get_type(r)?,
                    name: get_name(r)?,
                })
            })?,
        },
        rec::XATTRS => Record::Xattrs {
            ino: r.u64()?,
            items: counted(&mut r, |r| {
                let kind = r.u8()?;
                let offset = r.u64()?;
                let len = r.u32()? as usize;
                Some((kind, offset, r.bytes(len)?.to_vec()))
            })?,
        },
        rec::EXTENTS => decode_extents(&mut r)?,
        rec::CSUM => {
            let disk_block = r.u64()?;
            let n = r.u32()? as usize;
            if n == 0 || n > super::MAX_EXTENT_BLOCKS as usize {
                return None;
            }
            let csums = (0..n).map(|_| r.u32()).collect::<Option<_>>()?;
            Record::Csum { disk_block, csums }
        }
        rec::SYMLINK => {
            let ino = r.u64()?;
            let len = r.u32()? as usize;
            Record::Symlink {
                ino,
                target: r.bytes(len)?.to_vec(),
            }
        }
        rec::DENTRIES => Record::Dentries {
            dir: r.u64()?,
            entries: counted(&mut r, |r| {
                Some(LoggedEntry {
                    index: r.u64()?,
                    ino: r.u64()?,
                    file_type: get_type(r)?,
                    name: get_name(r)?,
                })
            })?,
            removed: counted(&mut r, |r| Some((r.u64()?, r.u64()?)))?,
        },
        _ => return None,
    };
    (r.remaining() == 0).then_some(rec)
}

/// A `u32` count, then that many elements read by `element`. The count comes from the
/// disk, so it does not size the allocation beyond what a sane record holds.
fn counted<T>(
    r: &mut Reader<'_>,
    mut element: impl FnMut(&mut Reader<'_>) -> Option<T>,
) -> Option<Vec<T>> {
    let n = r.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(element(r)?);
    }
    Some(out)
}

/// The body of an [`rec::EXTENTS`] record: every piece lies inside `start..end` and
/// within the largest extent.
fn decode_extents(r: &mut Reader<'_>) -> Option<Record> {
    let ino = r.u64()?;
    let start = r.u64()?;
    let end = r.u64()?;
    let pieces = counted(r, |r| {
        let fb = r.u64()?;
        let fe = FileExtent::decode(r.bytes(FileExtent::LEN)?)?;
        let inside = fb >= start
            && fb.checked_add(u64::from(fe.num_blocks))? <= end
            && fe.disk_blocks <= super::MAX_EXTENT_BLOCKS;
        inside.then_some((fb, fe))
    })?;
    (start < end).then_some(Record::Extents {
        ino,
        start,
        end,
        pieces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::crc::crc32c;

    const GOLDEN_LOG_BLOCK_CRC: u32 = 2_348_774_869;

    fn header(seq: u64, len: usize) -> LogBlockHeader {
        LogBlockHeader {
            epoch: 7,
            seq,
            commit_seq: seq,
            commit_blocks: 1,
            payload_len: len as u32,
            fs_seq: 3,
        }
    }

    #[test]
    fn block_round_trip_and_tears() {
        let payload = alloc::vec![0xabu8; 1000];
        let mut b = alloc::vec![0u8; BLOCK_SIZE];
        header(5, payload.len()).encode_block(&payload, &mut b);
        let (h, p) = LogBlockHeader::decode_block(&b).unwrap();
        assert_eq!(h, header(5, 1000));
        assert_eq!(p, &payload[..]);
        // A torn 512-byte sector anywhere is detected.
        for sector in 0..8 {
            let mut torn = b.clone();
            torn[sector * 512..(sector + 1) * 512].fill(0x5a);
            assert!(
                LogBlockHeader::decode_block(&torn).is_err(),
                "sector {sector}"
            );
        }
        // A zeroed (never written) block is not a log block.
        assert_eq!(
            LogBlockHeader::decode_block(&alloc::vec![0u8; BLOCK_SIZE]),
            Err(Corrupt::Magic)
        );
    }

    #[test]
    fn commits_span_blocks() {
        let records: Vec<Vec<u8>> = (0..5u8).map(|i| alloc::vec![i; 3000]).collect();
        let mut out = Vec::new();
        let blocks = encode_commit(&records, 40, 9, 2, &mut out);
        assert_eq!(blocks, 4);
        assert_eq!(out.len(), 4 * BLOCK_SIZE);
        let mut payload = Vec::new();
        for (i, b) in out.chunks(BLOCK_SIZE).enumerate() {
            let (h, p) = LogBlockHeader::decode_block(b).unwrap();
            assert_eq!(
                (h.seq, h.commit_seq, h.commit_blocks),
                (40 + i as u64, 40, 4)
            );
            payload.extend_from_slice(p);
        }
        assert_eq!(payload, records.concat());
    }

    #[test]
    fn records_round_trip() {
        let mut s = Scratch::with_capacity(4096);
        let mut w = RecordWriter::begin(&mut s, rec::CSUM);
        w.buf().u64(100).u32(2).u32(1).u32(2);
        w.end();
        let mut w = RecordWriter::begin(&mut s, rec::NAMES);
        w.buf()
            .u64(9)
            .u32(1)
            .u64(1)
            .u64(4)
            .u8(FileType::Regular.dirent_type());
        put_name(w.buf(), b"foo");
        w.end();
        let mut w = RecordWriter::begin(&mut s, rec::EXTENTS);
        let fe = FileExtent {
            disk_block: 100,
            disk_blocks: 2,
            offset_blocks: 0,
            num_blocks: 2,
        };
        w.buf().u64(9).u64(0).u64(u64::MAX / 4096).u32(1).u64(0);
        w.buf().bytes(&fe.encode());
        w.end();
        assert!(!s.overflowed());
        let recs = decode_records(s.as_slice()).unwrap();
        assert_eq!(
            recs,
            alloc::vec![
                Record::Csum {
                    disk_block: 100,
                    csums: alloc::vec![1, 2]
                },
                Record::Names {
                    ino: 9,
                    names: alloc::vec![LoggedName {
                        parent: 1,
                        index: 4,
                        file_type: FileType::Regular,
                        name: b"foo".to_vec()
                    }]
                },
                Record::Extents {
                    ino: 9,
                    start: 0,
                    end: u64::MAX / 4096,
                    pieces: alloc::vec![(0, fe)]
                },
            ]
        );
        // Truncated payloads and unknown kinds are corruption, never a panic.
        for cut in 1..s.len() {
            let _ = decode_records(&s.as_slice()[..cut]);
        }
        assert!(decode_records(&[99, 0, 0, 0, 0]).is_err());
    }

    /// The framing is the on-disk format: this pins every byte of a block.
    #[test]
    fn framing_is_pinned() {
        let h = LogBlockHeader {
            epoch: 0x0102_0304_0506_0708,
            seq: 41,
            commit_seq: 40,
            commit_blocks: 2,
            payload_len: 3,
            fs_seq: 0x1112_1314_1516_1718,
        };
        let mut b = alloc::vec![0u8; BLOCK_SIZE];
        h.encode_block(b"abc", &mut b);
        assert_eq!(&b[..4], b"NFLG");
        assert_eq!(b[8..16], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(b[32..36], 2u32.to_le_bytes());
        assert_eq!(&b[LOG_HEADER_LEN..LOG_HEADER_LEN + 3], b"abc");
        assert_eq!(crc32c(&b), GOLDEN_LOG_BLOCK_CRC, "log block bytes changed");
        assert_eq!(LogBlockHeader::decode_block(&b), Ok((h, &b"abc"[..])));
    }
}

//! Snapshot streams (`ninefold send` / `receive`): the wire format, pure encoding and
//! decoding (`docs/format.md`, "Snapshot streams").
//!
//! A stream is [`MAGIC`], a version, then records `kind u8, len u32, body, crc u32`. Each
//! record's crc32c covers the previous record's crc, its kind, length and body, so a
//! dropped, repeated or reordered record fails its own check; the last record is
//! [`END`](kind::END) with the number of records before it, so a truncated stream is
//! refused too. [`Decoder`] checks records as their bytes arrive, a chunk at a time;
//! [`decode`] checks a whole stream in memory.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::format::items::{get_time, put_time};
use crate::util::bytes::{Reader, Writer};
use crate::util::crc::crc32c_parts;
use vfs::{Ino, Timespec};

/// First bytes of every stream.
pub const MAGIC: [u8; 8] = *b"NFSTREAM";
/// Stream version this code writes and reads.
pub const VERSION: u32 = 1;
/// Most data bytes one [`Record::Data`] carries.
pub const DATA_CHUNK: usize = 256 * 1024;
/// Largest record body accepted (a data chunk, or the largest xattr set, with room).
pub const MAX_RECORD: usize = 4 << 20;

/// Record kinds.
pub mod kind {
    /// [`Record::Begin`](super::Record::Begin).
    pub const BEGIN: u8 = 1;
    /// [`Record::Inode`](super::Record::Inode).
    pub const INODE: u8 = 2;
    /// [`Record::Xattrs`](super::Record::Xattrs).
    pub const XATTRS: u8 = 3;
    /// [`Record::Data`](super::Record::Data).
    pub const DATA: u8 = 4;
    /// [`Record::Unlink`](super::Record::Unlink).
    pub const UNLINK: u8 = 5;
    /// [`Record::Link`](super::Record::Link).
    pub const LINK: u8 = 6;
    /// The trailer: the number of records before it.
    pub const END: u8 = 7;
}

/// How a stream names an inode.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InodeRef {
    /// An inode of the base snapshot, by one of its paths there (names from the root;
    /// empty: the root). The receiver resolves it in its copy of the base, whose inode
    /// numbers are those of its live tree when the receive starts.
    Base(Vec<Vec<u8>>),
    /// An inode the base does not have, by its inode number on the sender.
    New(Ino),
}

impl InodeRef {
    /// The root directory.
    pub fn root() -> InodeRef {
        InodeRef::Base(Vec::new())
    }
}

/// A snapshot as a stream names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotId {
    /// Its name on the sender.
    pub name: String,
    /// The checkpoint it keeps on the sender (unique per filesystem).
    pub seq: u64,
    /// When it was taken.
    pub created: Timespec,
}

/// What a stream carries, from its first record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sending filesystem's uuid.
    pub source: [u8; 16],
    /// The snapshot the stream reproduces.
    pub snapshot: SnapshotId,
    /// For an incremental stream, the snapshot it starts from.
    pub base: Option<SnapshotId>,
}

/// How a regular file's data is carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataMode {
    /// Unchanged (or not a regular file).
    Keep,
    /// Every data range follows; everything else is a hole (truncate to 0 first).
    Whole,
    /// Only the rewritten ranges follow; the rest is as in the base.
    Patch,
}

/// An inode's state in the sent snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeState {
    /// The inode.
    pub ino: InodeRef,
    /// Full mode (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of device nodes.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// Access time.
    pub atime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Status change time.
    pub ctime: Timespec,
    /// Creation time.
    pub btime: Timespec,
    /// How its data follows.
    pub data: DataMode,
    /// A symlink's target (empty otherwise).
    pub target: Vec<u8>,
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The first record.
    Begin(Header),
    /// A changed or new inode's attributes.
    Inode(InodeState),
    /// The complete set of an inode's xattrs (name, value), replacing what it had.
    Xattrs(InodeRef, Vec<(Vec<u8>, Vec<u8>)>),
    /// File data at a byte offset.
    Data(InodeRef, u64, Vec<u8>),
    /// Entry `name` of a directory is gone (or names another inode now).
    Unlink(InodeRef, Vec<u8>),
    /// Entry `name` of a directory (first) names an inode (second).
    Link(InodeRef, Vec<u8>, InodeRef),
}

/// Why a stream is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// Not a snapshot stream.
    BadMagic,
    /// A version this code does not read.
    Version(u32),
    /// The stream ends before its trailer (in record `.0`).
    Truncated(u64),
    /// Record `.0` fails its checksum (damaged, or records missing or out of order).
    Checksum(u64),
    /// Record `.0` passes its checksum but does not decode.
    Malformed(u64),
    /// The trailer's count disagrees with the records seen.
    Count,
    /// Bytes follow the trailer.
    TrailingBytes,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::BadMagic => write!(f, "not a ninefold snapshot stream"),
            StreamError::Version(v) => write!(f, "stream version {v} not supported"),
            StreamError::Truncated(n) => write!(f, "stream truncated (in record {n})"),
            StreamError::Checksum(n) => write!(f, "stream damaged: record {n} checksum"),
            StreamError::Malformed(n) => write!(f, "stream damaged: record {n} malformed"),
            StreamError::Count => write!(f, "stream damaged: trailer count"),
            StreamError::TrailingBytes => write!(f, "stream damaged: bytes after trailer"),
        }
    }
}

fn put_bytes16(w: &mut Writer, b: &[u8]) {
    w.u16(b.len() as u16).bytes(b);
}

fn get_bytes16(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u16()? as usize;
    Some(r.bytes(n)?.to_vec())
}

fn put_bytes32(w: &mut Writer, b: &[u8]) {
    w.u32(b.len() as u32).bytes(b);
}

fn get_bytes32(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u32()? as usize;
    Some(r.bytes(n)?.to_vec())
}

fn put_ref(w: &mut Writer, r: &InodeRef) {
    match r {
        InodeRef::Base(path) => {
            w.u8(0).u32(path.len() as u32);
            for name in path {
                put_bytes16(w, name);
            }
        }
        InodeRef::New(ino) => {
            w.u8(1).u64(*ino);
        }
    }
}

fn get_ref(r: &mut Reader<'_>) -> Option<InodeRef> {
    Some(match r.u8()? {
        0 => {
            let n = r.u32()? as usize;
            // Each name takes at least two bytes: a hostile count cannot allocate much.
            let mut path = Vec::with_capacity(n.min(r.remaining() / 2));
            for _ in 0..n {
                path.push(get_bytes16(r)?);
            }
            InodeRef::Base(path)
        }
        1 => InodeRef::New(r.u64()?),
        _ => return None,
    })
}

fn put_snapshot(w: &mut Writer, s: &SnapshotId) {
    put_bytes16(w, s.name.as_bytes());
    w.u64(s.seq);
    put_time(w, s.created);
}

fn get_snapshot(r: &mut Reader<'_>) -> Option<SnapshotId> {
    Some(SnapshotId {
        name: String::from_utf8(get_bytes16(r)?).ok()?,
        seq: r.u64()?,
        created: get_time(r)?,
    })
}

impl Record {
    fn kind(&self) -> u8 {
        match self {
            Record::Begin(_) => kind::BEGIN,
            Record::Inode(_) => kind::INODE,
            Record::Xattrs(..) => kind::XATTRS,
            Record::Data(..) => kind::DATA,
            Record::Unlink(..) => kind::UNLINK,
            Record::Link(..) => kind::LINK,
        }
    }

    fn body(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Record::Begin(h) => {
                w.bytes(&h.source);
                put_snapshot(&mut w, &h.snapshot);
                match &h.base {
                    Some(b) => {
                        w.u8(1);
                        put_snapshot(&mut w, b);
                    }
                    None => {
                        w.u8(0);
                    }
                }
            }
            Record::Inode(s) => {
                put_ref(&mut w, &s.ino);
                w.u32(s.mode).u32(s.uid).u32(s.gid).u64(s.rdev).u64(s.size);
                for t in [s.atime, s.mtime, s.ctime, s.btime] {
                    put_time(&mut w, t);
                }
                w.u8(match s.data {
                    DataMode::Keep => 0,
                    DataMode::Whole => 1,
                    DataMode::Patch => 2,
                });
                put_bytes32(&mut w, &s.target);
            }
            Record::Xattrs(ino, list) => {
                put_ref(&mut w, ino);
                w.u32(list.len() as u32);
                for (name, value) in list {
                    put_bytes16(&mut w, name);
                    put_bytes32(&mut w, value);
                }
            }
            Record::Data(ino, offset, data) => {
                put_ref(&mut w, ino);
                w.u64(*offset);
                put_bytes32(&mut w, data);
            }
            Record::Unlink(dir, name) => {
                put_ref(&mut w, dir);
                put_bytes16(&mut w, name);
            }
            Record::Link(dir, name, child) => {
                put_ref(&mut w, dir);
                put_bytes16(&mut w, name);
                put_ref(&mut w, child);
            }
        }
        w.finish()
    }

    fn decode(kind: u8, body: &[u8]) -> Option<Record> {
        let mut r = Reader::new(body);
        let rec = match kind {
            kind::BEGIN => Record::Begin(Header {
                source: r.array()?,
                snapshot: get_snapshot(&mut r)?,
                base: match r.u8()? {
                    0 => None,
                    1 => Some(get_snapshot(&mut r)?),
                    _ => return None,
                },
            }),
            kind::INODE => Record::Inode(InodeState {
                ino: get_ref(&mut r)?,
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                rdev: r.u64()?,
                size: r.u64()?,
                atime: get_time(&mut r)?,
                mtime: get_time(&mut r)?,
                ctime: get_time(&mut r)?,
                btime: get_time(&mut r)?,
                data: match r.u8()? {
                    0 => DataMode::Keep,
                    1 => DataMode::Whole,
                    2 => DataMode::Patch,
                    _ => return None,
                },
                target: get_bytes32(&mut r)?,
            }),
            kind::XATTRS => {
                let ino = get_ref(&mut r)?;
                let n = r.u32()? as usize;
                let mut list = Vec::with_capacity(n.min(r.remaining() / 6));
                for _ in 0..n {
                    list.push((get_bytes16(&mut r)?, get_bytes32(&mut r)?));
                }
                Record::Xattrs(ino, list)
            }
            kind::DATA => Record::Data(get_ref(&mut r)?, r.u64()?, get_bytes32(&mut r)?),
            kind::UNLINK => Record::Unlink(get_ref(&mut r)?, get_bytes16(&mut r)?),
            kind::LINK => Record::Link(get_ref(&mut r)?, get_bytes16(&mut r)?, get_ref(&mut r)?),
            _ => return None,
        };
        (r.remaining() == 0).then_some(rec)
    }
}

fn record_crc(prev: u32, kind: u8, body: &[u8]) -> u32 {
    crc32c_parts(&[
        &prev.to_le_bytes(),
        &[kind],
        &(body.len() as u32).to_le_bytes(),
        body,
    ])
}

/// Writes a stream record by record (each call returns the bytes to emit), chaining the
/// checksums and counting the records for the trailer.
#[derive(Debug, Default)]
pub struct Encoder {
    prev: u32,
    records: u64,
}

impl Encoder {
    /// A new stream: returns the encoder and the stream's first bytes (magic, version).
    pub fn start() -> (Encoder, Vec<u8>) {
        let mut w = Writer::new();
        w.bytes(&MAGIC).u32(VERSION);
        (Encoder::default(), w.finish())
    }

    fn frame(&mut self, kind: u8, body: &[u8]) -> Vec<u8> {
        let crc = record_crc(self.prev, kind, body);
        self.prev = crc;
        let mut w = Writer::with_capacity(body.len() + 9);
        w.u8(kind).u32(body.len() as u32).bytes(body).u32(crc);
        w.finish()
    }

    /// The bytes of one record.
    pub fn record(&mut self, rec: &Record) -> Vec<u8> {
        self.records += 1;
        self.frame(rec.kind(), &rec.body())
    }

    /// The trailer.
    pub fn finish(mut self) -> Vec<u8> {
        let count = self.records.to_le_bytes();
        self.frame(kind::END, &count)
    }
}

/// Reads a stream a chunk at a time, checking each record as it completes: what it
/// holds is at most one record, whatever the stream's size.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    started: bool,
    ended: bool,
    prev: u32,
    records: u64,
}

/// Length of the stream's start: magic and version.
const START_LEN: usize = MAGIC.len() + 4;

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Takes the stream's next bytes; returns the records they complete, checked (the
    /// first of the stream is a [`Record::Begin`]).
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Record>, StreamError> {
        if self.ended {
            return match data.is_empty() {
                true => Ok(Vec::new()),
                false => Err(StreamError::TrailingBytes),
            };
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        if !self.started {
            let seen = self.buf.len().min(MAGIC.len());
            if self.buf[..seen] != MAGIC[..seen] {
                return Err(StreamError::BadMagic);
            }
            if self.buf.len() < START_LEN {
                return Ok(Vec::new());
            }
            let mut r = Reader::new(&self.buf[MAGIC.len()..START_LEN]);
            let version = r.u32().ok_or(StreamError::BadMagic)?;
            if version != VERSION {
                return Err(StreamError::Version(version));
            }
            self.started = true;
            at = START_LEN;
        }
        let mut out = Vec::new();
        while let Some(head) = self.buf.get(at..at + 5) {
            let n = self.records;
            let kind = head[0];
            let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if len > MAX_RECORD {
                return Err(StreamError::Checksum(n));
            }
            let Some(frame) = self.buf.get(at..at + len + 9) else {
                break;
            };
            let body = &frame[5..5 + len];
            let crc = u32::from_le_bytes([
                frame[5 + len],
                frame[6 + len],
                frame[7 + len],
                frame[8 + len],
            ]);
            if crc != record_crc(self.prev, kind, body) {
                return Err(StreamError::Checksum(n));
            }
            self.prev = crc;
            at += len + 9;
            if kind == kind::END {
                if body != n.to_le_bytes() {
                    return Err(StreamError::Count);
                }
                self.ended = true;
                if at != self.buf.len() {
                    return Err(StreamError::TrailingBytes);
                }
                break;
            }
            let rec = Record::decode(kind, body).ok_or(StreamError::Malformed(n))?;
            if matches!(rec, Record::Begin(_)) != (n == 0) {
                return Err(StreamError::Malformed(n));
            }
            out.push(rec);
            self.records += 1;
        }
        self.buf.drain(..at);
        Ok(out)
    }

    /// The stream ended: refused unless its trailer was read.
    pub fn finish(&self) -> Result<(), StreamError> {
        match (self.started, self.ended) {
            (_, true) => Ok(()),
            (false, false) => Err(StreamError::BadMagic),
            (true, false) => Err(StreamError::Truncated(self.records)),
        }
    }
}

/// Checks a whole stream and decodes it: its header and the records after it. Nothing
/// is returned unless every record's checksum, the trailer and the count are right.
pub fn decode(stream: &[u8]) -> Result<(Header, Vec<Record>), StreamError> {
    let mut d = Decoder::new();
    let mut records = d.push(stream)?;
    d.finish()?;
    match records.first() {
        Some(Record::Begin(h)) => {
            let h = h.clone();
            records.remove(0);
            Ok((h, records))
        }
        _ => Err(StreamError::Malformed(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn sample() -> Vec<u8> {
        let (mut e, mut out) = Encoder::start();
        let header = Header {
            source: [3; 16],
            snapshot: SnapshotId {
                name: "b".into(),
                seq: 9,
                created: Timespec { sec: 5, nsec: 7 },
            },
            base: None,
        };
        out.extend(e.record(&Record::Begin(header)));
        out.extend(e.record(&Record::Link(
            InodeRef::root(),
            b"f".to_vec(),
            InodeRef::New(5),
        )));
        out.extend(e.record(&Record::Data(InodeRef::New(5), 4096, vec![1; 100])));
        out.extend(e.finish());
        out
    }

    #[test]
    fn round_trips() {
        let (h, recs) = decode(&sample()).unwrap();
        assert_eq!(h.snapshot.seq, 9);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1], Record::Data(InodeRef::New(5), 4096, vec![1; 100]));
    }

    #[test]
    fn a_stream_fed_a_byte_at_a_time_decodes_the_same() {
        let s = sample();
        let mut d = Decoder::new();
        let mut recs = Vec::new();
        for b in &s {
            recs.extend(d.push(core::slice::from_ref(b)).unwrap());
        }
        d.finish().unwrap();
        let (h, rest) = decode(&s).unwrap();
        assert_eq!(recs[0], Record::Begin(h));
        assert_eq!(recs[1..], rest[..]);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let s = sample();
        for n in 0..s.len() {
            assert!(decode(&s[..n]).is_err(), "truncated at {n}");
            let mut d = s.clone();
            d[n] ^= 0x10;
            assert!(decode(&d).is_err(), "flipped byte {n}");
        }
        let mut longer = s.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(StreamError::TrailingBytes));
    }
}

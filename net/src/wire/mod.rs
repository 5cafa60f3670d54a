//! The 9P2000.L wire format: message types, encoding and decoding. No server logic.
//!
//! A frame is `size[4] type[1] tag[2] body`, little-endian, `size` counting the whole
//! frame. [`Tmsg`] and [`Rmsg`] are the requests and replies; both borrow names and data
//! from the frame they were decoded from, so a `Twrite`'s payload is never copied by the
//! codec. [`ReadReply`] builds an `Rread` in place so the filesystem reads straight into
//! the reply frame.
//!
//! Decoding is strict: a size that disagrees with the frame, a field running past the end,
//! trailing bytes, an unknown type or more than [`MAX_WELEM`] walk elements are a
//! [`DecodeError`], never a panic. What names may contain (`/`, NUL, `.`) is the server's
//! business, not the codec's.
//!
//! Field layouts follow the de-facto specification: diod's protocol notes and the Linux
//! client (`include/net/9p/9p.h`, `net/9p/client.c`).

mod bound;
mod buf;
mod dirent;
mod msg;
mod read;

pub use bound::{reply_bound, MIN_DIRENT, READDIR_BATCH, SMALL_REPLY};
pub use buf::{Reader, Writer};
pub use dirent::{Dirent, DirentIter};
pub use msg::{Data, Rmsg, RmsgType, Tmsg, TmsgType};
pub use read::{ReadReply, ReaddirReply};

use alloc::vec::Vec;
use core::fmt;

/// Bytes of `size[4] type[1] tag[2]`.
pub const HEADER_LEN: usize = 7;
/// The Linux client's allowance for `Twrite`/`Rread` headers (`P9_IOHDRSZ`): a request's
/// payload is at most `msize - IOHDR_LEN`.
pub const IOHDR_LEN: usize = 24;
/// Header of an `Rread` or `Rreaddir`: `size[4] type[1] tag[2] count[4]`.
pub const RDATA_HEADER_LEN: usize = HEADER_LEN + 4;
/// The tag `Tversion` uses (`NOTAG`).
pub const NOTAG: u16 = 0xffff;
/// "No fid" (`NOFID`), e.g. the `afid` of an unauthenticated `Tattach`.
pub const NOFID: u32 = 0xffff_ffff;
/// "No numeric user" (`P9_NONUNAME`) in `Tattach`'s `n_uname`: use `uname` instead.
pub const NONUNAME: u32 = 0xffff_ffff;
/// Most path elements in one `Twalk` (and qids in one `Rwalk`).
pub const MAX_WELEM: usize = 16;
/// The only protocol version this codec speaks.
pub const VERSION_9P2000_L: &[u8] = b"9P2000.L";
/// What `Rversion` says when the client's version is not supported.
pub const VERSION_UNKNOWN: &[u8] = b"unknown";

/// Qid type bits (`QTDIR` and friends).
pub mod qid_type {
    /// Directory.
    pub const DIR: u8 = 0x80;
    /// Append-only file.
    pub const APPEND: u8 = 0x40;
    /// Exclusive-use file.
    pub const EXCL: u8 = 0x20;
    /// Authentication file.
    pub const AUTH: u8 = 0x08;
    /// Symbolic link.
    pub const SYMLINK: u8 = 0x02;
    /// Plain file.
    pub const FILE: u8 = 0x00;
}

/// `Tgetattr` request mask / `Rgetattr` valid bits (`P9_GETATTR_*`).
pub mod getattr {
    /// `mode`.
    pub const MODE: u64 = 0x1;
    /// `nlink`.
    pub const NLINK: u64 = 0x2;
    /// `uid`.
    pub const UID: u64 = 0x4;
    /// `gid`.
    pub const GID: u64 = 0x8;
    /// `rdev`.
    pub const RDEV: u64 = 0x10;
    /// `atime`.
    pub const ATIME: u64 = 0x20;
    /// `mtime`.
    pub const MTIME: u64 = 0x40;
    /// `ctime`.
    pub const CTIME: u64 = 0x80;
    /// `qid.path`.
    pub const INO: u64 = 0x100;
    /// `size`.
    pub const SIZE: u64 = 0x200;
    /// `blocks`.
    pub const BLOCKS: u64 = 0x400;
    /// `btime`.
    pub const BTIME: u64 = 0x800;
    /// `gen`.
    pub const GEN: u64 = 0x1000;
    /// `data_version`.
    pub const DATA_VERSION: u64 = 0x2000;
    /// Everything up to `blocks` (what `stat(2)` needs).
    pub const BASIC: u64 = 0x7ff;
    /// Every field.
    pub const ALL: u64 = 0x3fff;
}

/// `Tsetattr` valid bits (`P9_SETATTR_*`).
pub mod setattr {
    /// Set `mode`.
    pub const MODE: u32 = 0x1;
    /// Set `uid`.
    pub const UID: u32 = 0x2;
    /// Set `gid`.
    pub const GID: u32 = 0x4;
    /// Set `size`.
    pub const SIZE: u32 = 0x8;
    /// Set `atime` (to now unless [`ATIME_SET`]).
    pub const ATIME: u32 = 0x10;
    /// Set `mtime` (to now unless [`MTIME_SET`]).
    pub const MTIME: u32 = 0x20;
    /// Set `ctime` (to now).
    pub const CTIME: u32 = 0x40;
    /// `atime` is the given value, not now.
    pub const ATIME_SET: u32 = 0x80;
    /// `mtime` is the given value, not now.
    pub const MTIME_SET: u32 = 0x100;
}

/// `Tlopen`/`Tlcreate` flags (`P9_DOTL_*`, the Linux x86 `O_*` values).
pub mod open_flags {
    /// Access mode mask.
    pub const ACCMODE: u32 = 0o3;
    /// Read only.
    pub const RDONLY: u32 = 0o0;
    /// Write only.
    pub const WRONLY: u32 = 0o1;
    /// Read and write.
    pub const RDWR: u32 = 0o2;
    /// Create if missing.
    pub const CREATE: u32 = 0o100;
    /// With `CREATE`: fail if it exists.
    pub const EXCL: u32 = 0o200;
    /// Truncate on open.
    pub const TRUNC: u32 = 0o1000;
    /// Append on every write.
    pub const APPEND: u32 = 0o2000;
    /// Must be a directory.
    pub const DIRECTORY: u32 = 0o200000;
}

/// `Tlock`/`Tgetlock` constants.
pub mod lock {
    /// Shared lock (`F_RDLCK`).
    pub const RDLCK: u8 = 0;
    /// Exclusive lock (`F_WRLCK`).
    pub const WRLCK: u8 = 1;
    /// Unlock (`F_UNLCK`).
    pub const UNLCK: u8 = 2;
    /// `Tlock` flag: the client would block (it retries on `BLOCKED`).
    pub const FLAGS_BLOCK: u32 = 1;
    /// `Tlock` flag: reclaim (unused).
    pub const FLAGS_RECLAIM: u32 = 2;
    /// `Rlock` status: granted.
    pub const SUCCESS: u8 = 0;
    /// `Rlock` status: a conflicting lock is held.
    pub const BLOCKED: u8 = 1;
    /// `Rlock` status: failed.
    pub const ERROR: u8 = 2;
    /// `Rlock` status: server in grace period.
    pub const GRACE: u8 = 3;
}

/// `Tunlinkat` flag: remove a directory (`AT_REMOVEDIR`).
pub const AT_REMOVEDIR: u32 = 0x200;
/// `Txattrcreate` flag: fail if the attribute exists (`XATTR_CREATE`).
pub const XATTR_CREATE: u32 = 1;
/// `Txattrcreate` flag: fail if the attribute is missing (`XATTR_REPLACE`).
pub const XATTR_REPLACE: u32 = 2;
/// `Rstatfs` type the Linux client expects (`V9FS_MAGIC`).
pub const V9FS_MAGIC: u32 = 0x0102_1997;

/// A server's unique identification of a file: type bits, version and path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Qid {
    /// [`qid_type`] bits.
    pub ty: u8,
    /// Version (changes when the identity behind `path` changes).
    pub version: u32,
    /// Unique per file within a server.
    pub path: u64,
}

/// Length of an encoded [`Qid`].
pub const QID_LEN: usize = 13;

impl Qid {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Qid, DecodeError> {
        Ok(Qid {
            ty: r.u8()?,
            version: r.u32()?,
            path: r.u64()?,
        })
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.ty);
        w.u32(self.version);
        w.u64(self.path);
    }
}

/// Why a frame could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the 7-byte header.
    Short,
    /// The `size` field disagrees with the frame's length.
    SizeMismatch {
        /// What `size` says.
        declared: u32,
        /// The frame's length.
        actual: usize,
    },
    /// A type byte this codec does not know (or one that is not a request/reply).
    UnknownType(u8),
    /// A field (or a count or string length) runs past the end of the frame.
    Truncated,
    /// Bytes left over after the last field.
    TrailingBytes(usize),
    /// More than [`MAX_WELEM`] walk names or qids.
    TooManyWalkElements(u16),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short => write!(f, "frame shorter than its header"),
            DecodeError::SizeMismatch { declared, actual } => {
                write!(f, "size field {declared} but frame has {actual} bytes")
            }
            DecodeError::UnknownType(t) => write!(f, "unknown message type {t}"),
            DecodeError::Truncated => write!(f, "field runs past the end of the frame"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} trailing bytes"),
            DecodeError::TooManyWalkElements(n) => write!(f, "{n} walk elements (max 16)"),
        }
    }
}

/// Why a message could not be encoded (its fields exceed 9P's limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// A string longer than 65535 bytes.
    StringTooLong(usize),
    /// More than [`MAX_WELEM`] walk names or qids.
    TooManyWalkElements(usize),
    /// A frame or data field longer than `u32::MAX` bytes.
    TooLarge(usize),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::StringTooLong(n) => write!(f, "string of {n} bytes (max 65535)"),
            EncodeError::TooManyWalkElements(n) => write!(f, "{n} walk elements (max 16)"),
            EncodeError::TooLarge(n) => write!(f, "{n} bytes exceed a 32-bit count"),
        }
    }
}

/// The fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Whole frame length.
    pub size: u32,
    /// Message type.
    pub ty: u8,
    /// Tag.
    pub tag: u16,
}

impl Header {
    /// Reads the header at the start of `bytes` (which may hold more or less than the
    /// frame); `None` if fewer than [`HEADER_LEN`] bytes are there.
    pub fn peek(bytes: &[u8]) -> Option<Header> {
        let mut r = Reader::new(bytes);
        Some(Header {
            size: r.u32().ok()?,
            ty: r.u8().ok()?,
            tag: r.u16().ok()?,
        })
    }
}

/// The length a stream's next frame claims: the first four bytes, if present.
pub fn frame_size(prefix: &[u8]) -> Option<u32> {
    Reader::new(prefix).u32().ok()
}

/// Checks a whole frame's header and returns its type, tag and body reader.
fn open_frame(frame: &[u8]) -> Result<(u8, u16, Reader<'_>), DecodeError> {
    let header = Header::peek(frame).ok_or(DecodeError::Short)?;
    if usize::try_from(header.size).ok() != Some(frame.len()) {
        return Err(DecodeError::SizeMismatch {
            declared: header.size,
            actual: frame.len(),
        });
    }
    Ok((header.ty, header.tag, Reader::new(&frame[HEADER_LEN..])))
}

/// Starts a frame in `out`: a size placeholder, the type and the tag. Returns the frame's
/// start offset for [`end_frame`].
fn begin_frame(out: &mut Vec<u8>, ty: u8, tag: u16) -> usize {
    let start = out.len();
    let mut w = Writer::new(out);
    w.u32(0);
    w.u8(ty);
    w.u16(tag);
    start
}

/// Patches the size of the frame begun at `start`; returns its length.
fn end_frame(out: &mut [u8], start: usize) -> Result<usize, EncodeError> {
    let len = out.len() - start;
    let size = u32::try_from(len).map_err(|_| EncodeError::TooLarge(len))?;
    out[start..start + 4].copy_from_slice(&size.to_le_bytes());
    Ok(len)
}

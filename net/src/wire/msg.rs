//! Requests ([`Tmsg`]) and replies ([`Rmsg`]), declared once as field lists from which
//! the enums, encoders and decoders are generated, so layout and code cannot drift apart.

use alloc::vec::Vec;

use super::{
    begin_frame, end_frame, open_frame, DecodeError, EncodeError, Qid, Reader, Writer, MAX_WELEM,
};

/// A field type that knows its 9P encoding.
trait Field<'a>: Sized {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError>;
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError>;
}

macro_rules! int_field {
    ($($t:ident),*) => {$(
        impl<'a> Field<'a> for $t {
            fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
                r.$t()
            }
            fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
                w.$t(*self);
                Ok(())
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64);

/// Strings (`len[2]` + bytes) borrow from the frame.
impl<'a> Field<'a> for &'a [u8] {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        r.string()
    }
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.string(self)
    }
}

impl<'a> Field<'a> for Qid {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        Qid::decode(r)
    }
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        Qid::encode(self, w);
        Ok(())
    }
}

/// Counted payload (`count[4]` + bytes) of `Twrite`, `Rread` and `Rreaddir`, borrowed from
/// the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Data<'a>(pub &'a [u8]);

impl<'a> Field<'a> for Data<'a> {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        r.data().map(Data)
    }
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.data(self.0)
    }
}

/// `nwname[2] nwname*(wname[s])`, at most [`MAX_WELEM`] names.
impl<'a> Field<'a> for Vec<&'a [u8]> {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let n = r.u16()?;
        if usize::from(n) > MAX_WELEM {
            return Err(DecodeError::TooManyWalkElements(n));
        }
        (0..n).map(|_| r.string()).collect()
    }
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.len() > MAX_WELEM {
            return Err(EncodeError::TooManyWalkElements(self.len()));
        }
        w.u16(self.len() as u16);
        self.iter().try_for_each(|name| w.string(name))
    }
}

/// `nwqid[2] nwqid*(qid[13])`, at most [`MAX_WELEM`] qids.
impl<'a> Field<'a> for Vec<Qid> {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let n = r.u16()?;
        if usize::from(n) > MAX_WELEM {
            return Err(DecodeError::TooManyWalkElements(n));
        }
        (0..n).map(|_| Qid::decode(r)).collect()
    }
    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.len() > MAX_WELEM {
            return Err(EncodeError::TooManyWalkElements(self.len()));
        }
        w.u16(self.len() as u16);
        self.iter().for_each(|q| q.encode(w));
        Ok(())
    }
}

macro_rules! messages {
    (
        $(#[$meta:meta])*
        pub enum $name:ident, types: $types:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $ty:literal { $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)? }
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum $name<'a> {
            $(
                $(#[$vmeta])*
                $variant { $( $(#[$fmeta])* $field: $fty ),* },
            )*
        }

        #[doc = concat!("The type byte of each [`", stringify!($name), "`] on the wire.")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $types {
            $(
                $(#[$vmeta])*
                $variant = $ty,
            )*
        }

        impl $types {
            /// The message type of a type byte, if it is one of these.
            pub fn from_byte(ty: u8) -> Option<$types> {
                match ty {
                    $( $ty => Some($types::$variant), )*
                    _ => None,
                }
            }
        }

        impl<'a> $name<'a> {
            /// Every message's type byte and variant name, in declaration order.
            pub const TYPES: &'static [(u8, &'static str)] =
                &[ $( ($ty, stringify!($variant)), )* ];

            /// The type byte on the wire.
            pub fn msg_type(&self) -> u8 {
                match self {
                    $( Self::$variant { .. } => $types::$variant as u8, )*
                }
            }

            /// Decodes a whole frame (`size[4] type[1] tag[2] body`) into its tag and
            /// message. Names and data borrow from `frame`.
            pub fn decode(frame: &'a [u8]) -> Result<(u16, Self), DecodeError> {
                let (ty, tag, mut r) = open_frame(frame)?;
                let msg = match ty {
                    $( $ty => Self::$variant { $( $field: Field::decode(&mut r)? ),* }, )*
                    other => return Err(DecodeError::UnknownType(other)),
                };
                if r.remaining() != 0 {
                    return Err(DecodeError::TrailingBytes(r.remaining()));
                }
                Ok((tag, msg))
            }

            /// Appends the frame for this message with `tag` to `out`; returns its length.
            /// On error `out` is left as it was.
            pub fn encode(&self, tag: u16, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
                let start = begin_frame(out, self.msg_type(), tag);
                let body = (|| {
                    let mut w = Writer::new(out);
                    match self {
                        $( Self::$variant { $( $field ),* } => {
                            let _ = &mut w;
                            $( Field::encode($field, &mut w)?; )*
                        } )*
                    }
                    Ok(())
                })();
                match body.and_then(|()| end_frame(out, start)) {
                    Ok(len) => Ok(len),
                    Err(e) => {
                        out.truncate(start);
                        Err(e)
                    }
                }
            }
        }
    };
}

messages! {
    /// A request (T-message) of 9P2000.L.
    pub enum Tmsg, types: TmsgType {
        /// Negotiate msize and version; resets the session.
        Version = 100 { msize: u32, version: &'a [u8] },
        /// Start authentication (this server needs none and answers `Rlerror`).
        Auth = 102 { afid: u32, uname: &'a [u8], aname: &'a [u8], n_uname: u32 },
        /// Attach `fid` to the root of export `aname` as user `n_uname` (or `uname`).
        Attach = 104 { fid: u32, afid: u32, uname: &'a [u8], aname: &'a [u8], n_uname: u32 },
        /// Abort request `oldtag`.
        Flush = 108 { oldtag: u16 },
        /// Walk `names` from `fid`, binding the result to `newfid`.
        Walk = 110 { fid: u32, newfid: u32, names: Vec<&'a [u8]> },
        /// Read `count` bytes at `offset`.
        Read = 116 { fid: u32, offset: u64, count: u32 },
        /// Write `data` at `offset`.
        Write = 118 { fid: u32, offset: u64, data: Data<'a> },
        /// Forget `fid`.
        Clunk = 120 { fid: u32 },
        /// Remove the file of `fid` and forget `fid`.
        Remove = 122 { fid: u32 },
        /// Filesystem statistics.
        Statfs = 8 { fid: u32 },
        /// Open `fid` with Linux open `flags`.
        Lopen = 12 { fid: u32, flags: u32 },
        /// Create and open regular file `name` in directory `fid`; `fid` becomes the file.
        Lcreate = 14 { fid: u32, name: &'a [u8], flags: u32, mode: u32, gid: u32 },
        /// Create symlink `name` to `target` in directory `fid`.
        Symlink = 16 { fid: u32, name: &'a [u8], target: &'a [u8], gid: u32 },
        /// Create a device node, FIFO or socket.
        Mknod = 18 { dfid: u32, name: &'a [u8], mode: u32, major: u32, minor: u32, gid: u32 },
        /// Move `fid`'s file to `dfid/name`.
        Rename = 20 { fid: u32, dfid: u32, name: &'a [u8] },
        /// Read a symlink's target.
        Readlink = 22 { fid: u32 },
        /// Attributes; `request_mask` holds [`super::getattr`] bits.
        Getattr = 24 { fid: u32, request_mask: u64 },
        /// Change attributes selected by `valid` ([`super::setattr`] bits).
        Setattr = 26 {
            fid: u32, valid: u32, mode: u32, uid: u32, gid: u32, size: u64,
            atime_sec: u64, atime_nsec: u64, mtime_sec: u64, mtime_nsec: u64,
        },
        /// Bind `newfid` to xattr `name` of `fid` for reading (empty name: the list).
        Xattrwalk = 30 { fid: u32, newfid: u32, name: &'a [u8] },
        /// Turn `fid` into a writer of xattr `name` of `attr_size` bytes.
        Xattrcreate = 32 { fid: u32, name: &'a [u8], attr_size: u64, flags: u32 },
        /// Read directory entries from `offset`, at most `count` bytes.
        Readdir = 40 { fid: u32, offset: u64, count: u32 },
        /// Make the file durable (`datasync` != 0: data only).
        Fsync = 50 { fid: u32, datasync: u32 },
        /// Take or release a POSIX byte-range lock (never blocks).
        Lock = 52 {
            fid: u32, lock_type: u8, flags: u32, start: u64, length: u64, proc_id: u32,
            client_id: &'a [u8],
        },
        /// Test for a conflicting POSIX lock.
        Getlock = 54 {
            fid: u32, lock_type: u8, start: u64, length: u64, proc_id: u32,
            client_id: &'a [u8],
        },
        /// Hard-link `fid`'s file as `dfid/name`.
        Link = 70 { dfid: u32, fid: u32, name: &'a [u8] },
        /// Create directory `name` in `dfid`.
        Mkdir = 72 { dfid: u32, name: &'a [u8], mode: u32, gid: u32 },
        /// Rename `olddirfid/oldname` to `newdirfid/newname`.
        Renameat = 74 { olddirfid: u32, oldname: &'a [u8], newdirfid: u32, newname: &'a [u8] },
        /// Remove `dirfid/name` (`flags` may hold [`super::AT_REMOVEDIR`]).
        Unlinkat = 76 { dirfid: u32, name: &'a [u8], flags: u32 },
    }
}

messages! {
    /// A reply (R-message) of 9P2000.L.
    pub enum Rmsg, types: RmsgType {
        /// The request failed with Linux errno `ecode`.
        Lerror = 7 { ecode: u32 },
        /// Negotiated msize and version (`"unknown"` if unsupported).
        Version = 101 { msize: u32, version: &'a [u8] },
        /// Authentication fid's qid (never sent by this server).
        Auth = 103 { aqid: Qid },
        /// Root qid of the attached export.
        Attach = 105 { qid: Qid },
        /// The flushed request is finished or cancelled.
        Flush = 109 {},
        /// Qids of the names walked (fewer than asked: the walk stopped there).
        Walk = 111 { qids: Vec<Qid> },
        /// Data read.
        Read = 117 { data: Data<'a> },
        /// Bytes written.
        Write = 119 { count: u32 },
        /// Fid forgotten.
        Clunk = 121 {},
        /// File removed, fid forgotten.
        Remove = 123 {},
        /// Filesystem statistics.
        Statfs = 9 {
            fs_type: u32, bsize: u32, blocks: u64, bfree: u64, bavail: u64, files: u64,
            ffree: u64, fsid: u64, namelen: u32,
        },
        /// Opened; `iounit` 0 means "msize minus headers".
        Lopen = 13 { qid: Qid, iounit: u32 },
        /// Created and opened.
        Lcreate = 15 { qid: Qid, iounit: u32 },
        /// Symlink created.
        Symlink = 17 { qid: Qid },
        /// Node created.
        Mknod = 19 { qid: Qid },
        /// Renamed.
        Rename = 21 {},
        /// Symlink target.
        Readlink = 23 { target: &'a [u8] },
        /// Attributes; `valid` says which fields mean something.
        Getattr = 25 {
            valid: u64, qid: Qid, mode: u32, uid: u32, gid: u32, nlink: u64, rdev: u64,
            size: u64, blksize: u64, blocks: u64, atime_sec: u64, atime_nsec: u64,
            mtime_sec: u64, mtime_nsec: u64, ctime_sec: u64, ctime_nsec: u64,
            btime_sec: u64, btime_nsec: u64, gen: u64, data_version: u64,
        },
        /// Attributes changed.
        Setattr = 27 {},
        /// Size of the xattr value (or name list) now readable through the new fid.
        Xattrwalk = 31 { size: u64 },
        /// The fid now collects the xattr value.
        Xattrcreate = 33 {},
        /// Packed directory entries ([`super::DirentIter`] reads them).
        Readdir = 41 { data: Data<'a> },
        /// Durable.
        Fsync = 51 {},
        /// Lock status ([`super::lock`] `SUCCESS`, `BLOCKED`, ...).
        Lock = 53 { status: u8 },
        /// The conflicting lock, or `lock_type` `UNLCK` if none.
        Getlock = 55 { lock_type: u8, start: u64, length: u64, proc_id: u32, client_id: &'a [u8] },
        /// Linked.
        Link = 71 {},
        /// Directory created.
        Mkdir = 73 { qid: Qid },
        /// Renamed.
        Renameat = 75 {},
        /// Removed.
        Unlinkat = 77 {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HEADER_LEN;

    #[test]
    fn twalk_layout_matches_the_spec() {
        let msg = Tmsg::Walk {
            fid: 1,
            newfid: 2,
            names: alloc::vec![&b"ab"[..], &b"c"[..]],
        };
        let mut out = Vec::new();
        let len = msg.encode(0x1234, &mut out).unwrap();
        let expect: &[u8] = &[
            24, 0, 0, 0, 110, 0x34, 0x12, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 2, 0, b'a', b'b', 1, 0,
            b'c',
        ];
        assert_eq!(out, expect);
        assert_eq!(len, expect.len());
        assert_eq!(Tmsg::decode(&out), Ok((0x1234, msg)));
    }

    #[test]
    fn seventeen_walk_names_are_rejected_both_ways() {
        let names = alloc::vec![&b"x"[..]; 17];
        let msg = Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names,
        };
        assert_eq!(
            msg.encode(1, &mut Vec::new()),
            Err(EncodeError::TooManyWalkElements(17))
        );
        let mut frame = alloc::vec![0u8, 0, 0, 0, 110, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 17, 0];
        for _ in 0..17 {
            frame.extend_from_slice(&[1, 0, b'x']);
        }
        let len = frame.len() as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(
            Tmsg::decode(&frame),
            Err(DecodeError::TooManyWalkElements(17))
        );
    }

    #[test]
    fn strict_framing() {
        let mut out = Vec::new();
        Tmsg::Clunk { fid: 7 }.encode(3, &mut out).unwrap();
        assert_eq!(out.len(), HEADER_LEN + 4);
        // One byte too many, declared and actual.
        let mut longer = out.clone();
        longer.push(0);
        longer[0] += 1;
        assert_eq!(Tmsg::decode(&longer), Err(DecodeError::TrailingBytes(1)));
        // Size lies.
        let mut lying = out.clone();
        lying[0] = 200;
        assert_eq!(
            Tmsg::decode(&lying),
            Err(DecodeError::SizeMismatch {
                declared: 200,
                actual: 11
            })
        );
        // Truncated body.
        let mut short = out[..9].to_vec();
        short[0] = 9;
        assert_eq!(Tmsg::decode(&short), Err(DecodeError::Truncated));
        // A reply type is not a request.
        let mut reply = out.clone();
        reply[4] = 121;
        assert_eq!(Tmsg::decode(&reply), Err(DecodeError::UnknownType(121)));
        assert_eq!(Tmsg::decode(&out[..3]), Err(DecodeError::Short));
    }

    #[test]
    fn failed_encode_leaves_output_untouched() {
        let mut out = alloc::vec![9u8];
        let long = alloc::vec![0u8; 70000];
        let msg = Rmsg::Readlink { target: &long };
        assert!(msg.encode(1, &mut out).is_err());
        assert_eq!(out, [9]);
    }

    #[test]
    fn type_bytes_name_their_messages() {
        assert_eq!(TmsgType::from_byte(100), Some(TmsgType::Version));
        assert_eq!(TmsgType::from_byte(108), Some(TmsgType::Flush));
        assert_eq!(TmsgType::from_byte(101), None, "Rversion is not a request");
        assert_eq!(RmsgType::from_byte(7), Some(RmsgType::Lerror));
        assert_eq!(RmsgType::Lerror as u8, 7);
        let flush = Tmsg::Flush { oldtag: 3 };
        assert_eq!(TmsgType::from_byte(flush.msg_type()), Some(TmsgType::Flush));
    }
}

//! A small synchronous 9P2000.L client over the codec, for tests (feature `testing`).
//!
//! It is generic over an [`Exchange`] — how one request frame gets to a server and its
//! reply back — so the same client drives a [`crate::conn::Connection`] in memory and a
//! server over real TCP. Each call sends one request and waits for its reply; tests that
//! need several requests in flight build frames with [`crate::wire::Tmsg`] directly.
//! [`corpus`] has the request frames of whole sessions, for tests that damage them and
//! for fuzzing.

pub mod corpus;

use alloc::vec::Vec;

use vfs::Errno;

use crate::wire::{self, getattr, DirentIter, Qid, Rmsg, Tmsg};

/// Carries one request frame to a server and returns its reply frame.
pub trait Exchange {
    /// Sends `request` and returns the reply frame.
    fn exchange(&mut self, request: &[u8]) -> Vec<u8>;
}

/// Attributes from an `Rgetattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Qid.
    pub qid: Qid,
    /// Full mode.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u64,
    /// Size.
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (u64, u64),
    /// Device number.
    pub rdev: u64,
}

/// One entry of an `Rreaddir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Qid.
    pub qid: Qid,
    /// Offset after this entry.
    pub offset: u64,
    /// `DT_*` type.
    pub dtype: u8,
    /// Name.
    pub name: Vec<u8>,
}

/// A test client. Tags count up from 1; every call returns the reply or the `Rlerror`
/// errno.
#[derive(Debug)]
pub struct Client<X> {
    /// The transport.
    pub io: X,
    tag: u16,
}

impl<X: Exchange> Client<X> {
    /// A client over `io` (not yet versioned).
    pub fn new(io: X) -> Self {
        Client { io, tag: 0 }
    }

    /// Sends `msg`; returns the reply frame, or the errno of an `Rlerror`.
    pub fn rpc(&mut self, msg: &Tmsg<'_>) -> Result<Vec<u8>, Errno> {
        self.tag = self.tag % 0xfffe + 1;
        let mut frame = Vec::new();
        msg.encode(self.tag, &mut frame).expect("request encodes");
        let reply = self.io.exchange(&frame);
        let (tag, r) = Rmsg::decode(&reply).expect("reply decodes");
        assert_eq!(tag, self.tag, "reply tag");
        if let Rmsg::Lerror { ecode } = r {
            return Err(Errno(ecode));
        }
        assert_eq!(r.msg_type(), msg.msg_type() + 1, "reply type for {msg:?}");
        Ok(reply)
    }

    fn call<T>(&mut self, msg: &Tmsg<'_>, pick: impl FnOnce(Rmsg<'_>) -> T) -> Result<T, Errno> {
        let frame = self.rpc(msg)?;
        let (_, r) = Rmsg::decode(&frame).expect("reply decodes");
        Ok(pick(r))
    }

    /// `Tversion`; returns the negotiated msize and version.
    pub fn version(&mut self, msize: u32, version: &[u8]) -> Result<(u32, Vec<u8>), Errno> {
        self.call(&Tmsg::Version { msize, version }, |r| match r {
            Rmsg::Version { msize, version } => (msize, version.to_vec()),
            _ => unreachable!(),
        })
    }

    /// `Tattach` as numeric user `uid` to export `aname`.
    pub fn attach(&mut self, fid: u32, uid: u32, aname: &str) -> Result<Qid, Errno> {
        self.attach_named(fid, b"", uid, aname)
    }

    /// `Tattach` with an explicit `uname` (and `n_uname`, possibly [`wire::NONUNAME`]).
    pub fn attach_named(
        &mut self,
        fid: u32,
        uname: &[u8],
        n_uname: u32,
        aname: &str,
    ) -> Result<Qid, Errno> {
        let msg = Tmsg::Attach {
            fid,
            afid: wire::NOFID,
            uname,
            aname: aname.as_bytes(),
            n_uname,
        };
        self.call(&msg, |r| match r {
            Rmsg::Attach { qid } => qid,
            _ => unreachable!(),
        })
    }

    /// `Twalk` along `/`-separated `path` (empty: clone).
    pub fn walk(&mut self, fid: u32, newfid: u32, path: &str) -> Result<Vec<Qid>, Errno> {
        let names: Vec<&[u8]> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::as_bytes)
            .collect();
        self.walk_names(fid, newfid, names)
    }

    /// `Twalk` with raw names.
    pub fn walk_names(
        &mut self,
        fid: u32,
        newfid: u32,
        names: Vec<&[u8]>,
    ) -> Result<Vec<Qid>, Errno> {
        self.call(&Tmsg::Walk { fid, newfid, names }, |r| match r {
            Rmsg::Walk { qids } => qids,
            _ => unreachable!(),
        })
    }

    /// `Tlopen`.
    pub fn lopen(&mut self, fid: u32, flags: u32) -> Result<Qid, Errno> {
        self.call(&Tmsg::Lopen { fid, flags }, |r| match r {
            Rmsg::Lopen { qid, .. } => qid,
            _ => unreachable!(),
        })
    }

    /// `Tlcreate` (gid 0).
    pub fn lcreate(&mut self, fid: u32, name: &str, flags: u32, mode: u32) -> Result<Qid, Errno> {
        let msg = Tmsg::Lcreate {
            fid,
            name: name.as_bytes(),
            flags,
            mode,
            gid: 0,
        };
        self.call(&msg, |r| match r {
            Rmsg::Lcreate { qid, .. } => qid,
            _ => unreachable!(),
        })
    }

    /// `Tread`.
    pub fn read(&mut self, fid: u32, offset: u64, count: u32) -> Result<Vec<u8>, Errno> {
        self.call(&Tmsg::Read { fid, offset, count }, |r| match r {
            Rmsg::Read { data } => data.0.to_vec(),
            _ => unreachable!(),
        })
    }

    /// `Twrite`; returns the count written.
    pub fn write(&mut self, fid: u32, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let msg = Tmsg::Write {
            fid,
            offset,
            data: wire::Data(data),
        };
        self.call(&msg, |r| match r {
            Rmsg::Write { count } => count,
            _ => unreachable!(),
        })
    }

    /// `Tclunk`.
    pub fn clunk(&mut self, fid: u32) -> Result<(), Errno> {
        self.rpc(&Tmsg::Clunk { fid }).map(drop)
    }

    /// `Tremove`.
    pub fn remove(&mut self, fid: u32) -> Result<(), Errno> {
        self.rpc(&Tmsg::Remove { fid }).map(drop)
    }

    /// `Tfsync`.
    pub fn fsync(&mut self, fid: u32, datasync: bool) -> Result<(), Errno> {
        let datasync = u32::from(datasync);
        self.rpc(&Tmsg::Fsync { fid, datasync }).map(drop)
    }

    /// `Tgetattr` of everything.
    pub fn getattr(&mut self, fid: u32) -> Result<Stat, Errno> {
        let msg = Tmsg::Getattr {
            fid,
            request_mask: getattr::ALL,
        };
        self.call(&msg, |r| match r {
            Rmsg::Getattr {
                qid,
                mode,
                uid,
                gid,
                nlink,
                size,
                mtime_sec,
                mtime_nsec,
                rdev,
                ..
            } => Stat {
                qid,
                mode,
                uid,
                gid,
                nlink,
                size,
                mtime: (mtime_sec, mtime_nsec),
                rdev,
            },
            _ => unreachable!(),
        })
    }

    /// `Tsetattr` with raw fields (times zero).
    pub fn setattr(
        &mut self,
        fid: u32,
        valid: u32,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
    ) -> Result<(), Errno> {
        let msg = Tmsg::Setattr {
            fid,
            valid,
            mode,
            uid,
            gid,
            size,
            atime_sec: 0,
            atime_nsec: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
        };
        self.rpc(&msg).map(drop)
    }

    /// One `Treaddir`.
    pub fn readdir(&mut self, fid: u32, offset: u64, count: u32) -> Result<Vec<Entry>, Errno> {
        self.call(&Tmsg::Readdir { fid, offset, count }, |r| match r {
            Rmsg::Readdir { data } => DirentIter::new(data.0)
                .map(|e| {
                    let e = e.expect("entry decodes");
                    Entry {
                        qid: e.qid,
                        offset: e.offset,
                        dtype: e.dtype,
                        name: e.name.to_vec(),
                    }
                })
                .collect(),
            _ => unreachable!(),
        })
    }

    /// The whole directory, in `count`-byte `Treaddir`s.
    pub fn readdir_all(&mut self, fid: u32, count: u32) -> Result<Vec<Entry>, Errno> {
        let mut all: Vec<Entry> = Vec::new();
        loop {
            let offset = all.last().map_or(0, |e| e.offset);
            let batch = self.readdir(fid, offset, count)?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.extend(batch);
        }
    }

    /// `Tmkdir` (gid 0).
    pub fn mkdir(&mut self, dfid: u32, name: &str, mode: u32) -> Result<Qid, Errno> {
        let msg = Tmsg::Mkdir {
            dfid,
            name: name.as_bytes(),
            mode,
            gid: 0,
        };
        self.call(&msg, |r| match r {
            Rmsg::Mkdir { qid } => qid,
            _ => unreachable!(),
        })
    }

    /// `Tsymlink` (gid 0).
    pub fn symlink(&mut self, fid: u32, name: &str, target: &str) -> Result<Qid, Errno> {
        let msg = Tmsg::Symlink {
            fid,
            name: name.as_bytes(),
            target: target.as_bytes(),
            gid: 0,
        };
        self.call(&msg, |r| match r {
            Rmsg::Symlink { qid } => qid,
            _ => unreachable!(),
        })
    }

    /// `Tmknod` (gid 0).
    pub fn mknod(
        &mut self,
        dfid: u32,
        name: &str,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<Qid, Errno> {
        let msg = Tmsg::Mknod {
            dfid,
            name: name.as_bytes(),
            mode,
            major,
            minor,
            gid: 0,
        };
        self.call(&msg, |r| match r {
            Rmsg::Mknod { qid } => qid,
            _ => unreachable!(),
        })
    }

    /// `Treadlink`.
    pub fn readlink(&mut self, fid: u32) -> Result<Vec<u8>, Errno> {
        self.call(&Tmsg::Readlink { fid }, |r| match r {
            Rmsg::Readlink { target } => target.to_vec(),
            _ => unreachable!(),
        })
    }

    /// `Tlink`.
    pub fn link(&mut self, dfid: u32, fid: u32, name: &str) -> Result<(), Errno> {
        let name = name.as_bytes();
        self.rpc(&Tmsg::Link { dfid, fid, name }).map(drop)
    }

    /// `Trename`.
    pub fn rename(&mut self, fid: u32, dfid: u32, name: &str) -> Result<(), Errno> {
        let name = name.as_bytes();
        self.rpc(&Tmsg::Rename { fid, dfid, name }).map(drop)
    }

    /// `Trenameat`.
    pub fn renameat(
        &mut self,
        olddirfid: u32,
        oldname: &str,
        newdirfid: u32,
        newname: &str,
    ) -> Result<(), Errno> {
        let msg = Tmsg::Renameat {
            olddirfid,
            oldname: oldname.as_bytes(),
            newdirfid,
            newname: newname.as_bytes(),
        };
        self.rpc(&msg).map(drop)
    }

    /// `Tunlinkat`.
    pub fn unlinkat(&mut self, dirfid: u32, name: &str, flags: u32) -> Result<(), Errno> {
        let name = name.as_bytes();
        self.rpc(&Tmsg::Unlinkat {
            dirfid,
            name,
            flags,
        })
        .map(drop)
    }

    /// `Txattrwalk`; returns the value size.
    pub fn xattrwalk(&mut self, fid: u32, newfid: u32, name: &str) -> Result<u64, Errno> {
        let name = name.as_bytes();
        self.call(&Tmsg::Xattrwalk { fid, newfid, name }, |r| match r {
            Rmsg::Xattrwalk { size } => size,
            _ => unreachable!(),
        })
    }

    /// `Txattrcreate`.
    pub fn xattrcreate(
        &mut self,
        fid: u32,
        name: &str,
        attr_size: u64,
        flags: u32,
    ) -> Result<(), Errno> {
        let msg = Tmsg::Xattrcreate {
            fid,
            name: name.as_bytes(),
            attr_size,
            flags,
        };
        self.rpc(&msg).map(drop)
    }

    /// `Tlock` over `start..start+length` for process `proc_id`; returns the status.
    pub fn lock(
        &mut self,
        fid: u32,
        lock_type: u8,
        start: u64,
        length: u64,
        proc_id: u32,
    ) -> Result<u8, Errno> {
        let msg = Tmsg::Lock {
            fid,
            lock_type,
            flags: 0,
            start,
            length,
            proc_id,
            client_id: b"test",
        };
        self.call(&msg, |r| match r {
            Rmsg::Lock { status } => status,
            _ => unreachable!(),
        })
    }

    /// `Tgetlock`; returns `(type, start, length, proc_id)` of the conflicting lock (type
    /// `UNLCK` if none).
    pub fn getlock(
        &mut self,
        fid: u32,
        lock_type: u8,
        start: u64,
        length: u64,
        proc_id: u32,
    ) -> Result<(u8, u64, u64, u32), Errno> {
        let msg = Tmsg::Getlock {
            fid,
            lock_type,
            start,
            length,
            proc_id,
            client_id: b"test",
        };
        self.call(&msg, |r| match r {
            Rmsg::Getlock {
                lock_type,
                start,
                length,
                proc_id,
                ..
            } => (lock_type, start, length, proc_id),
            _ => unreachable!(),
        })
    }

    /// `Tstatfs`; returns `(bsize, blocks, namelen)`.
    pub fn statfs(&mut self, fid: u32) -> Result<(u32, u64, u32), Errno> {
        self.call(&Tmsg::Statfs { fid }, |r| match r {
            Rmsg::Statfs {
                bsize,
                blocks,
                namelen,
                ..
            } => (bsize, blocks, namelen),
            _ => unreachable!(),
        })
    }
}

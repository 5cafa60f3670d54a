//! `Tgetattr`, `Tsetattr` and `Tstatfs`.

use alloc::vec::Vec;

use vfs::{Errno, FileSystem, FileType, FsResult, SetAttr, SetTime, Timespec};

use super::fid::FidState;
use super::perm::{without_set_id, User, MAY_WRITE, S_ISGID};
use super::session::Session;
use super::{qid_of, reply, Server};
use crate::wire::{getattr, setattr, Rmsg, V9FS_MAGIC};

/// The fields of a `Tsetattr`.
#[derive(Debug)]
pub(super) struct SetattrReq {
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: (u64, u64),
    pub mtime: (u64, u64),
}

/// What `Rgetattr` fills in.
const GETATTR_VALID: u64 = getattr::BASIC | getattr::BTIME | getattr::GEN;

impl<F: FileSystem> Server<F> {
    pub(super) async fn getattr(&self, s: &Session, tag: u16, fid: u32) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let a = self.fs.getattr(f.ino).await?;
        let time = |t: Timespec| (t.sec as u64, u64::from(t.nsec));
        let (atime_sec, atime_nsec) = time(a.atime);
        let (mtime_sec, mtime_nsec) = time(a.mtime);
        let (ctime_sec, ctime_nsec) = time(a.ctime);
        let (btime_sec, btime_nsec) = time(a.btime);
        Ok(reply(
            tag,
            &Rmsg::Getattr {
                valid: GETATTR_VALID,
                qid: qid_of(&a),
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                nlink: u64::from(a.nlink),
                rdev: a.rdev,
                size: a.size,
                blksize: u64::from(a.blksize),
                blocks: a.blocks,
                atime_sec,
                atime_nsec,
                mtime_sec,
                mtime_nsec,
                ctime_sec,
                ctime_nsec,
                btime_sec,
                btime_nsec,
                gen: a.generation,
                data_version: 0,
            },
        ))
    }

    pub(super) async fn setattr(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        req: SetattrReq,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if f.read_only() {
            return Err(Errno::EROFS);
        }
        let attr = self.fs.getattr(f.ino).await?;
        let opened_for_write = matches!(f.state, FidState::Open(m, _) if m.write);
        let ch = SetattrPlan {
            req: &req,
            user: f.user(),
            attr: &attr,
            opened_for_write,
        }
        .changes()?;
        self.fs.setattr(f.ino, ch).await?;
        Ok(reply(tag, &Rmsg::Setattr {}))
    }

    /// `Tstatfs` answers as seen from the fid's inode: inside a project (an export whose
    /// root is a quota root) its limits and usage, as an NFS client of an XFS project
    /// quota or a ZFS dataset sees them; elsewhere the whole filesystem.
    pub(super) async fn statfs(&self, s: &Session, tag: u16, fid: u32) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let st = self.fs.statfs_at(f.ino).await?;
        Ok(reply(
            tag,
            &Rmsg::Statfs {
                fs_type: V9FS_MAGIC,
                bsize: st.block_size,
                blocks: st.blocks,
                bfree: st.blocks_free,
                bavail: st.blocks_avail,
                files: st.files,
                ffree: st.files_free,
                fsid: st.fsid,
                namelen: st.name_max,
            },
        ))
    }
}

/// The permission checks of one `Tsetattr`, as Linux's `notify_change` makes them, turning
/// the request into the [`SetAttr`] the filesystem applies.
struct SetattrPlan<'a> {
    req: &'a SetattrReq,
    user: &'a User,
    attr: &'a vfs::Attr,
    /// The fid is open for writing: truncation and timestamps need no further permission.
    opened_for_write: bool,
}

impl SetattrPlan<'_> {
    fn changes(&self) -> FsResult<SetAttr> {
        let mut ch = SetAttr::default();
        self.ownership(&mut ch)?;
        self.mode(&mut ch)?;
        self.size(&mut ch)?;
        self.drop_set_id(&mut ch);
        self.times(&mut ch)?;
        Ok(ch)
    }

    /// Ownership as Linux's `chown_ok`/`chgrp_ok`: root, or the owner keeping the uid and
    /// giving the file to a group they are in (or keeping its group).
    fn ownership(&self, ch: &mut SetAttr) -> FsResult<()> {
        let (req, user, attr) = (self.req, self.user, self.attr);
        let owner = user.uid == attr.uid;
        if req.valid & setattr::UID != 0 {
            let allowed = owner && req.uid == attr.uid;
            if !user.is_root() && !allowed {
                return Err(Errno::EPERM);
            }
            ch.uid = Some(req.uid);
        }
        if req.valid & setattr::GID != 0 {
            let allowed = owner && (req.gid == attr.gid || user.in_group(req.gid));
            if !user.is_root() && !allowed {
                return Err(Errno::EPERM);
            }
            ch.gid = Some(req.gid);
        }
        Ok(())
    }

    /// chmod: the owner or root; set-gid only for root or a member of the file's (new)
    /// group, directories included, as Linux's `setattr_prepare` (anyone else's request
    /// goes through without the bit). Whether the user is a member, only a `group=`
    /// entry tells the server; for a user without one the client's own check stands
    /// ([`User::may_keep_set_gid`]).
    fn mode(&self, ch: &mut SetAttr) -> FsResult<()> {
        if self.req.valid & setattr::MODE == 0 {
            return Ok(());
        }
        if !self.user.owns(self.attr) {
            return Err(Errno::EPERM);
        }
        let gid = ch.gid.unwrap_or(self.attr.gid);
        let mut mode = self.req.mode & 0o7777;
        if !self.user.may_keep_set_gid(gid) {
            mode &= !S_ISGID;
        }
        ch.mode = Some(mode);
        Ok(())
    }

    /// truncate: write permission, unless the fid is open for writing (ftruncate).
    fn size(&self, ch: &mut SetAttr) -> FsResult<()> {
        if self.req.valid & setattr::SIZE == 0 {
            return Ok(());
        }
        if self.attr.file_type() == FileType::Directory {
            return Err(Errno::EISDIR);
        }
        if !self.opened_for_write {
            self.user.check(self.attr, MAY_WRITE)?;
        }
        ch.size = Some(self.req.size);
        Ok(())
    }

    /// A file that changes hands, or is truncated by someone other than root, loses its
    /// set-uid bit (and set-gid if group-executable), as on Linux, unless this request
    /// sets the mode itself.
    fn drop_set_id(&self, ch: &mut SetAttr) {
        let changes_hands = ch.uid.is_some() || ch.gid.is_some();
        let truncated = ch.size.is_some() && !self.user.is_root();
        if ch.mode.is_none()
            && self.attr.file_type() != FileType::Directory
            && (changes_hands || truncated)
        {
            ch.mode = without_set_id(self.attr.mode);
        }
    }

    /// utimes: "now" needs ownership or write permission (or the fid open for writing);
    /// an explicit time needs ownership.
    fn times(&self, ch: &mut SetAttr) -> FsResult<()> {
        let owner_or_writer = |user: &User| {
            if user.owns(self.attr) || self.opened_for_write {
                Ok(())
            } else {
                user.check(self.attr, MAY_WRITE)
            }
        };
        let (req, user, attr) = (self.req, self.user, self.attr);
        ch.atime = set_time(
            req.valid,
            setattr::ATIME,
            setattr::ATIME_SET,
            req.atime,
            user,
            attr,
            owner_or_writer,
        )?;
        ch.mtime = set_time(
            req.valid,
            setattr::MTIME,
            setattr::MTIME_SET,
            req.mtime,
            user,
            attr,
            owner_or_writer,
        )?;
        Ok(())
    }
}

/// One timestamp of a `Tsetattr`: to now (owner, or anyone who may write), or to a given
/// time (owner only, as `utimensat(2)`).
fn set_time(
    valid: u32,
    bit: u32,
    set_bit: u32,
    (sec, nsec): (u64, u64),
    user: &User,
    attr: &vfs::Attr,
    owner_or_writer: impl Fn(&User) -> FsResult<()>,
) -> FsResult<Option<SetTime>> {
    if valid & bit == 0 {
        return Ok(None);
    }
    if valid & set_bit == 0 {
        owner_or_writer(user)?;
        return Ok(Some(SetTime::Now));
    }
    if !user.owns(attr) {
        return Err(Errno::EPERM);
    }
    let nsec = u32::try_from(nsec)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or(Errno::EINVAL)?;
    Ok(Some(SetTime::To(Timespec {
        sec: sec as i64,
        nsec,
    })))
}

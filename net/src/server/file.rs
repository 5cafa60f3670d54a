//! Open files: `Tlopen`, `Tlcreate`, `Tread`, `Twrite`, `Tfsync`, `Tclunk`, `Tremove`,
//! and the POSIX lock requests `Tlock`/`Tgetlock`.

use alloc::rc::Rc;
use alloc::vec::Vec;

use fs::vfs::{Attr, Errno, FileSystem, FileType, FsResult, Owner, SetAttr};

use super::fid::{Fid, FidState, OpenMode, Parent};
use super::locks::{range_end, Lock, LockKind, LockOwner};
use super::perm::{MAY_EXEC, MAY_READ, MAY_WRITE};
use super::session::Session;
use super::{check_name, qid_of, reply, Server};
use crate::wire::{lock, open_flags, Data, ReadReply, Rmsg, RDATA_HEADER_LEN};

/// The fields of a `Tlock`/`Tgetlock`.
#[derive(Debug)]
pub(super) struct LockReq<'a> {
    pub lock_type: u8,
    pub start: u64,
    pub length: u64,
    pub proc_id: u32,
    pub client_id: &'a [u8],
}

/// The access an open asks for: `EINVAL` for the access mode 3.
fn open_mode(flags: u32) -> FsResult<OpenMode> {
    let (read, write) = match flags & open_flags::ACCMODE {
        open_flags::RDONLY => (true, false),
        open_flags::WRONLY => (false, true),
        open_flags::RDWR => (true, true),
        _ => return Err(Errno::EINVAL),
    };
    Ok(OpenMode {
        read,
        write,
        append: flags & open_flags::APPEND != 0,
    })
}

impl<F: FileSystem> Server<F> {
    /// Checks and performs the parts of an open that precede `FileSystem::open`:
    /// type rules, read-only export, permissions, `O_TRUNC`.
    async fn prepare_open(&self, f: &Fid, attr: &Attr, flags: u32, mode: OpenMode) -> FsResult<()> {
        let trunc = flags & open_flags::TRUNC != 0;
        let writes = mode.write || trunc;
        match attr.file_type() {
            FileType::Directory if writes => return Err(Errno::EISDIR),
            FileType::Symlink => return Err(Errno::ELOOP),
            t if flags & open_flags::DIRECTORY != 0 && t != FileType::Directory => {
                return Err(Errno::ENOTDIR)
            }
            _ => {}
        }
        if writes && f.read_only() {
            return Err(Errno::EROFS);
        }
        let want = if mode.read { MAY_READ } else { 0 } | if writes { MAY_WRITE } else { 0 };
        f.user().check(attr, want)?;
        if trunc && attr.file_type() == FileType::Regular && attr.size != 0 {
            let changes = SetAttr {
                size: Some(0),
                ..SetAttr::default()
            };
            self.fs.setattr(attr.ino, changes).await?;
        }
        Ok(())
    }

    pub(super) async fn lopen(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        flags: u32,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Path) {
            return Err(Errno::EBADF);
        }
        let mode = open_mode(flags)?;
        let attr = self.fs.getattr(f.ino).await?;
        self.prepare_open(&f, &attr, flags, mode).await?;
        self.fs.open(f.ino).await?;
        if let Err(e) = s.transition(fid, FidState::Open(mode)) {
            self.fs.release(f.ino).await?;
            return Err(e);
        }
        Ok(reply(
            tag,
            &Rmsg::Lopen {
                qid: qid_of(&attr),
                iounit: 0,
            },
        ))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lcreate(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        name: &[u8],
        flags: u32,
        perm: u32,
        gid: u32,
    ) -> FsResult<Vec<u8>> {
        let (dir, _) = self.dir_for_change(s, fid).await?;
        if !matches!(dir.state, FidState::Path) {
            return Err(Errno::EBADF);
        }
        check_name(name)?;
        let mode = open_mode(flags)?;
        let owner = Owner {
            uid: dir.user().uid,
            gid: dir.user().create_gid(gid),
        };
        let attr = match self.fs.create(dir.ino, name, perm & 0o7777, owner).await {
            Ok(attr) => attr,
            // O_CREAT without O_EXCL opens an existing file, as open(2) does.
            Err(Errno::EEXIST) if flags & open_flags::EXCL == 0 => {
                let attr = self.fs.lookup(dir.ino, name).await?;
                self.prepare_open(&dir, &attr, flags, mode).await?;
                attr
            }
            Err(e) => return Err(e),
        };
        self.fs.open(attr.ino).await?;
        let entry = Fid {
            ino: attr.ino,
            file_type: attr.file_type(),
            state: FidState::Open(mode),
            parent: Some(Parent {
                dir: dir.ino,
                name: Rc::from(name),
            }),
            mount: dir.mount,
        };
        if let Err(e) = s.replace(fid, entry) {
            self.fs.release(attr.ino).await?;
            return Err(e);
        }
        Ok(reply(
            tag,
            &Rmsg::Lcreate {
                qid: qid_of(&attr),
                iounit: 0,
            },
        ))
    }

    pub(super) async fn read(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        offset: u64,
        count: u32,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let count = count.min(s.msize() - RDATA_HEADER_LEN as u32);
        match f.state {
            FidState::Open(m) if m.read => {
                if f.file_type == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                let mut out = ReadReply::new(tag, count);
                let n = self.fs.read(f.ino, offset, out.data_mut()).await?;
                Ok(out.finish(n))
            }
            FidState::XattrRead(value) => {
                let start = usize::try_from(offset).map_or(value.len(), |o| o.min(value.len()));
                let end = start.saturating_add(count as usize).min(value.len());
                Ok(reply(
                    tag,
                    &Rmsg::Read {
                        data: Data(&value[start..end]),
                    },
                ))
            }
            _ => Err(Errno::EBADF),
        }
    }

    pub(super) async fn write(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        offset: u64,
        data: &[u8],
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let count = match f.state {
            FidState::Open(m) if m.write => {
                // O_APPEND: the filesystem picks the offset (the size) and writes there
                // in one step, so appends from several clients never overwrite each
                // other.
                let n = if m.append {
                    self.fs.append(f.ino, data).await?.1
                } else {
                    self.fs.write(f.ino, offset, data).await?
                };
                self.counters.writes();
                n
            }
            FidState::XattrWrite(w) => {
                let mut w = w.borrow_mut();
                // The value arrives in order (Linux sends it in one or more writes).
                if offset != w.value.len() as u64 {
                    return Err(Errno::EINVAL);
                }
                if w.value.len() + data.len() > w.size {
                    return Err(Errno::ERANGE);
                }
                w.value.extend_from_slice(data);
                data.len()
            }
            _ => return Err(Errno::EBADF),
        };
        Ok(reply(
            tag,
            &Rmsg::Write {
                count: count as u32,
            },
        ))
    }

    pub(super) async fn fsync(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        datasync: bool,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Open(_) | FidState::Path) {
            return Err(Errno::EBADF);
        }
        self.fs.fsync(f.ino, datasync).await?;
        self.counters.fsyncs();
        if datasync {
            self.counters.datasyncs();
        }
        Ok(reply(tag, &Rmsg::Fsync {}))
    }

    pub(super) async fn clunk(&self, s: &Session, tag: u16, fid: u32) -> FsResult<Vec<u8>> {
        let f = s.remove(fid)?;
        self.finish_fid(s, fid, &f, true).await?;
        Ok(reply(tag, &Rmsg::Clunk {}))
    }

    /// Forgets a fid at teardown (an unfinished xattr write is dropped).
    pub(super) async fn forget_fid(&self, s: &Session, fid: u32, f: &Fid) {
        if let Err(e) = self.finish_fid(s, fid, f, false).await {
            log::debug!("9p: conn {}: releasing fid {fid}: {e}", s.id());
        }
    }

    /// What unbinding a fid does: its locks go, an open file is released, and (when
    /// `commit`) a collected xattr value is stored.
    async fn finish_fid(&self, s: &Session, fid: u32, f: &Fid, commit: bool) -> FsResult<()> {
        self.locks.borrow_mut().release_fid(s.id(), fid);
        match &f.state {
            FidState::Open(_) => {
                self.counters.releases();
                self.fs.release(f.ino).await
            }
            FidState::XattrWrite(w) if commit => {
                // The fid is unbound: nothing else can reach the writer any more.
                let w = w.take();
                if w.value.len() != w.size {
                    Err(Errno::EINVAL)
                } else if w.remove {
                    self.fs.removexattr(f.ino, &w.name).await
                } else {
                    self.fs.setxattr(f.ino, &w.name, &w.value, w.mode).await
                }
            }
            _ => Ok(()),
        }
    }

    pub(super) async fn remove(&self, s: &Session, tag: u16, fid: u32) -> FsResult<Vec<u8>> {
        let f = s.remove(fid)?;
        // The fid is gone whatever the outcome, as 9P says.
        let removed = self.remove_file(&f).await;
        self.finish_fid(s, fid, &f, false).await?;
        removed?;
        Ok(reply(tag, &Rmsg::Remove {}))
    }

    async fn remove_file(&self, f: &Fid) -> FsResult<()> {
        if f.read_only() {
            return Err(Errno::EROFS);
        }
        let parent = f.parent.as_ref().ok_or(Errno::EOPNOTSUPP)?;
        let dir = self.fs.getattr(parent.dir).await?;
        f.user().check(&dir, MAY_WRITE | MAY_EXEC)?;
        let victim = self.fs.lookup(parent.dir, &parent.name).await?;
        if victim.ino != f.ino {
            // Renamed or replaced since the walk.
            return Err(Errno::ENOENT);
        }
        f.user().check_sticky(&dir, &victim)?;
        if victim.file_type() == FileType::Directory {
            self.fs.rmdir(parent.dir, &parent.name).await
        } else {
            self.fs.unlink(parent.dir, &parent.name).await
        }
    }

    pub(super) async fn lock(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        req: LockReq<'_>,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        let FidState::Open(mode) = f.state else {
            return Err(Errno::EBADF);
        };
        let owner = LockOwner {
            conn: s.id(),
            client_id: req.client_id.to_vec(),
            proc_id: req.proc_id,
        };
        let end = range_end(req.start, req.length);
        let kind = match req.lock_type {
            lock::UNLCK => {
                self.locks
                    .borrow_mut()
                    .unlock(f.ino, &owner, req.start, end);
                return Ok(reply(
                    tag,
                    &Rmsg::Lock {
                        status: lock::SUCCESS,
                    },
                ));
            }
            lock::RDLCK if mode.read => LockKind::Read,
            lock::WRLCK if mode.write => LockKind::Write,
            lock::RDLCK | lock::WRLCK => return Err(Errno::EBADF),
            _ => return Err(Errno::EINVAL),
        };
        let new = Lock {
            owner,
            fid,
            kind,
            start: req.start,
            end,
        };
        let granted = self.locks.borrow_mut().lock(f.ino, new);
        let status = if granted {
            lock::SUCCESS
        } else {
            lock::BLOCKED
        };
        Ok(reply(tag, &Rmsg::Lock { status }))
    }

    pub(super) async fn getlock(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        req: LockReq<'_>,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Open(_) | FidState::Path) {
            return Err(Errno::EBADF);
        }
        let kind = match req.lock_type {
            lock::RDLCK => LockKind::Read,
            lock::WRLCK => LockKind::Write,
            _ => return Err(Errno::EINVAL),
        };
        let owner = LockOwner {
            conn: s.id(),
            client_id: req.client_id.to_vec(),
            proc_id: req.proc_id,
        };
        let end = range_end(req.start, req.length);
        let locks = self.locks.borrow();
        let msg = match locks.conflict(f.ino, &owner, kind, req.start, end) {
            Some(held) => {
                let lock_type = match held.kind {
                    LockKind::Read => lock::RDLCK,
                    LockKind::Write => lock::WRLCK,
                };
                let length = if held.end == u64::MAX {
                    0
                } else {
                    held.end - held.start + 1
                };
                Rmsg::Getlock {
                    lock_type,
                    start: held.start,
                    length,
                    proc_id: held.owner.proc_id,
                    client_id: &held.owner.client_id,
                }
            }
            None => Rmsg::Getlock {
                lock_type: lock::UNLCK,
                start: req.start,
                length: req.length,
                proc_id: req.proc_id,
                client_id: req.client_id,
            },
        };
        Ok(reply(tag, &msg))
    }
}

//! Open files: `Tlopen`, `Tlcreate`, `Tread`, `Twrite`, `Tfsync`, `Tclunk`, `Tremove`,
//! and the POSIX lock requests `Tlock`/`Tgetlock`.

use alloc::sync::Arc;
use alloc::vec::Vec;

use vfs::{Attr, Errno, FileSystem, FileType, FsResult, Ino, ReadCtx, SetAttr};

use super::fid::{Fid, FidState, OpenMode, Parent};
use super::locks::{
    range_end, LockError, LockKind, LockOwner, LockTable, CLIENT_ID_OVERHEAD, LOCK_RECORD_BYTES,
};
use super::perm::{without_set_id, MAY_EXEC, MAY_READ, MAY_WRITE};
use super::session::Session;
use super::tenant::Tenant;
use super::{check_name, qid_of, reply, Server};
use crate::memory::Use;
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

impl LockReq<'_> {
    /// The lock owner the request speaks for.
    fn owner(&self, s: &Session) -> LockOwner<'_> {
        LockOwner {
            conn: s.id(),
            client_id: self.client_id,
            proc_id: self.proc_id,
        }
    }
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
        if let Err(e) = s.transition(fid, FidState::opened(mode)) {
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
        let (dir, dattr) = self.dir_for_change(s, fid).await?;
        if !matches!(dir.state, FidState::Path) {
            return Err(Errno::EBADF);
        }
        check_name(name)?;
        let mode = open_mode(flags)?;
        let new = dir.user().new_file(&dattr, gid, perm, FileType::Regular);
        let attr = match self.fs.create(dir.ino, name, new.perm, new.owner).await {
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
            state: FidState::opened(mode),
            parent: Some(Parent {
                dir: dir.ino,
                name: Arc::from(name),
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
            FidState::Open(m, stream) if m.read => {
                if f.file_type == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                let mut out = ReadReply::new(tag, count).map_err(|_| Errno::ENOMEM)?;
                let ctx = ReadCtx {
                    tenant: Some(s.tenant().id()),
                    stream: Some(&stream),
                };
                let n = self
                    .fs
                    .read_with(f.ino, offset, out.data_mut(), ctx)
                    .await?;
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
            FidState::Open(m, _) if m.write => {
                if !f.user().is_root() {
                    self.drop_set_id(f.ino).await?;
                }
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
            FidState::XattrWrite(w) => w.with(|w| {
                // The value arrives in order (Linux sends it in one or more writes).
                if offset != w.value.len() as u64 {
                    return Err(Errno::EINVAL);
                }
                if w.value.len() + data.len() > w.size {
                    return Err(Errno::ERANGE);
                }
                w.value.extend_from_slice(data);
                Ok(data.len())
            })?,
            _ => return Err(Errno::EBADF),
        };
        Ok(reply(
            tag,
            &Rmsg::Write {
                count: count as u32,
            },
        ))
    }

    /// A write by someone other than root drops the file's set-uid bit (and set-gid, if
    /// group-executable), as Linux does: otherwise a user who may write a set-uid file
    /// could put their own program in it. An honest client asks for it itself (a
    /// `Tsetattr` before the write); the server does not rely on that.
    pub(super) async fn drop_set_id(&self, ino: Ino) -> FsResult<()> {
        let attr = self.fs.getattr(ino).await?;
        if let Some(mode) = without_set_id(attr.mode) {
            let changes = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            self.fs.setattr(ino, changes).await?;
        }
        Ok(())
    }

    pub(super) async fn fsync(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        datasync: bool,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Open(..) | FidState::Path) {
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
        let held = self.with_locks(|t| {
            t.release_fid(s.id(), fid);
            t.conn_bytes(s.id())
        });
        self.settle_lock_memory(s, held);
        match &f.state {
            FidState::Open(..) => {
                self.counters.releases();
                self.fs.release(f.ino).await
            }
            FidState::XattrWrite(w) if commit => {
                // The fid is unbound: nothing else can reach the writer any more.
                let w = w.with(core::mem::take);
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
        let FidState::Open(mode, _) = f.state else {
            return Err(Errno::EBADF);
        };
        // The most one request can add to the connection's lock records: a lock split in
        // two plus the new one, and the client id if it is new. Charged before, settled
        // to what the table holds after.
        let growth = 2 * LOCK_RECORD_BYTES + req.client_id.len() + CLIENT_ID_OVERHEAD;
        s.account().take(Use::Locks, growth).map_err(|r| {
            self.refused(s, r);
            Errno::ENOLCK
        })?;
        let owner = req.owner(s);
        let (result, held) = self.with_locks(|t| {
            t.bind_tenant(s.id(), s.tenant().id());
            let result = self.lock_or_unlock(t, s.tenant(), f.ino, fid, mode, &owner, &req);
            (result, t.conn_bytes(s.id()))
        });
        self.settle_lock_memory(s, held);
        let granted = result?;
        let status = if granted {
            lock::SUCCESS
        } else {
            lock::BLOCKED
        };
        Ok(reply(tag, &Rmsg::Lock { status }))
    }

    /// The lock table's part of `Tlock`: whether the lock was granted.
    #[allow(clippy::too_many_arguments)]
    fn lock_or_unlock(
        &self,
        table: &mut LockTable,
        tenant: &Tenant,
        ino: Ino,
        fid: u32,
        mode: OpenMode,
        owner: &LockOwner<'_>,
        req: &LockReq<'_>,
    ) -> FsResult<bool> {
        let end = range_end(req.start, req.length);
        match req.lock_type {
            lock::UNLCK => table.unlock(ino, owner, req.start, end).map(|()| true),
            lock::RDLCK | lock::WRLCK => {
                let kind = match req.lock_type {
                    lock::RDLCK if mode.read => LockKind::Read,
                    lock::WRLCK if mode.write => LockKind::Write,
                    _ => return Err(Errno::EBADF),
                };
                table.lock(ino, owner, fid, kind, req.start, end)
            }
            _ => return Err(Errno::EINVAL),
        }
        .map_err(|e| {
            if e == LockError::TenantLimit {
                tenant.lock_refused();
            }
            self.lock_refused(e)
        })
    }

    /// Brings the connection's memory charge for lock records in line with `held`, what
    /// the lock table holds for it (read under the same lock hold as the lock request,
    /// or the release of a fid's locks, that changed it).
    pub(super) fn settle_lock_memory(&self, s: &Session, held: usize) {
        // Read, then adjusted: only the session's own connection changes its lock
        // records, on its one CPU, and nothing awaits in between.
        let account = s.account();
        let charged = account.charged_for(Use::Locks);
        if held < charged {
            account.release(Use::Locks, charged - held);
        } else if held > charged {
            // Never more than was charged before the request; if the estimate was short,
            // the overshoot is charged even past the share (the records exist).
            account.force(Use::Locks, held - charged);
        }
    }

    /// `Tgetlock`: the lock that stands in the way of the one described, or `UNLCK`.
    /// Linux asks with type `UNLCK` ("is anything in the way?": `v9fs_file_getlock`
    /// has already found no conflict among its own processes' locks and lost the type
    /// `F_GETLK` asked about), which is answered as for a write lock: any lock of another
    /// owner.
    pub(super) async fn getlock(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        req: LockReq<'_>,
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Open(..) | FidState::Path) {
            return Err(Errno::EBADF);
        }
        let kind = match req.lock_type {
            lock::RDLCK => LockKind::Read,
            lock::WRLCK | lock::UNLCK => LockKind::Write,
            _ => return Err(Errno::EINVAL),
        };
        let end = range_end(req.start, req.length);
        let held = self
            .with_locks(|t| t.conflict(f.ino, &req.owner(s), kind, req.start, end))
            .map_err(|e| self.lock_refused(e))?;
        let msg = match &held {
            Some(held) => Rmsg::Getlock {
                lock_type: match held.kind {
                    LockKind::Read => lock::RDLCK,
                    LockKind::Write => lock::WRLCK,
                },
                start: held.start,
                length: if held.end == u64::MAX {
                    0
                } else {
                    held.end - held.start + 1
                },
                proc_id: held.proc_id,
                client_id: &held.client_id,
            },
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

    /// Counts a refused lock request; its errno.
    fn lock_refused(&self, e: LockError) -> Errno {
        match e {
            LockError::ConnLimit => self.counters.conn_lock_limit_hits(),
            LockError::TenantLimit => self.counters.tenant_lock_limit_hits(),
            LockError::TotalLimit => self.counters.lock_limit_hits(),
            LockError::ClientIdTooLong => self.counters.long_client_ids(),
        }
        e.errno()
    }
}

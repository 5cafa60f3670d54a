//! `Tattach` and `Twalk`: binding fids to an export's root and walking names, never
//! leaving the export (`..` at its root stays there).

use alloc::sync::Arc;
use alloc::vec::Vec;

use vfs::{Attr, Errno, FileSystem, FileType, FsResult, ROOT_INO};

use super::export::{self, Export};
use super::fid::{Fid, FidState, Mount, Parent};
use super::perm::{User, MAY_EXEC};
use super::session::{BindError, Session};
use super::{check_name, qid_of, reply, Refusal, Server};
use crate::wire::{Rmsg, NONUNAME};

impl<F: FileSystem> Server<F> {
    /// Binds `fid` (counting fid-limit refusals; `ENOMEM` if its memory cannot be
    /// charged, even after waiting for memory reclaimed from others: see
    /// [`Server::hold`]).
    pub(super) async fn bind(&self, s: &Session, fid: u32, entry: Fid) -> FsResult<()> {
        let mut entry = Some(entry);
        self.hold(s, || {
            let Some(e) = entry.take() else {
                return Err(Refusal::Errno(Errno::EIO));
            };
            match s.insert(fid, e, self.config.max_fids, self.config.tenant.max_fids) {
                Ok(()) => Ok(()),
                Err((BindError::Memory(r), back)) => {
                    entry = back;
                    Err(Refusal::Memory(r))
                }
                Err((BindError::Errno(e), _)) => {
                    self.count_fid_limit(e);
                    Err(Refusal::Errno(e))
                }
                Err((BindError::TenantFids, _)) => {
                    self.counters.tenant_fid_limit_hits();
                    Err(Refusal::Errno(Errno::EMFILE))
                }
            }
        })
        .await
    }

    /// Checks that `fid` could be bound (counting fid-limit refusals).
    pub(super) fn check_free(&self, s: &Session, fid: u32) -> FsResult<()> {
        s.check_free(fid, self.config.max_fids)
            .inspect_err(|e| self.count_fid_limit(*e))
    }

    fn count_fid_limit(&self, e: Errno) {
        if e == Errno::EMFILE {
            self.counters.fid_limit_hits();
        }
    }

    /// The user an attach acts for: `n_uname`, or `uname` when it is [`NONUNAME`]
    /// (`"root"` or a decimal uid; anything else is the export's anonymous user), then
    /// squashed as the export says.
    pub(super) fn user_for(&self, export: &Export, uname: &[u8], n_uname: u32) -> User {
        let uid = if n_uname != NONUNAME {
            Some(n_uname)
        } else if uname == b"root" {
            Some(0)
        } else {
            core::str::from_utf8(uname)
                .ok()
                .and_then(|u| u.parse().ok())
        };
        let (uid, squashed) = match uid {
            Some(uid) => export.map_uid(uid),
            None => (export.anon_uid, true),
        };
        if squashed {
            User {
                uid,
                groups: alloc::vec![export.anon_gid],
                groups_known: true,
                forced_gid: Some(export.anon_gid),
            }
        } else {
            User {
                uid,
                groups: self.config.groups.get(&uid).cloned().unwrap_or_default(),
                groups_known: self.config.groups.contains_key(&uid),
                forced_gid: None,
            }
        }
    }

    pub(super) async fn attach(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        uname: &[u8],
        aname: &[u8],
        n_uname: u32,
    ) -> FsResult<Vec<u8>> {
        let export = export::select(&self.config.exports, aname).ok_or(Errno::ENOENT)?;
        if !self.config.allow_list(export).admits(s.peer()) {
            log::debug!(
                "9p: conn {}: attach to {export} refused for {:?}",
                s.id(),
                s.peer()
            );
            self.counters.refused_attaches();
            return Err(Errno::EACCES);
        }
        self.check_free(s, fid)?;
        let user = self.user_for(export, uname, n_uname);
        // The path to the export is the server's business: no permission checks on it.
        let mut attr = self.fs.getattr(export.root_ino.unwrap_or(ROOT_INO)).await?;
        for component in export.components() {
            attr = self.fs.lookup(attr.ino, component).await?;
        }
        if attr.file_type() != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let mount = Arc::new(Mount {
            export: export.clone(),
            root: attr.ino,
            user,
        });
        let entry = Fid {
            ino: attr.ino,
            file_type: FileType::Directory,
            mount,
            state: FidState::Path,
            parent: None,
        };
        self.bind(s, fid, entry).await?;
        Ok(reply(tag, &Rmsg::Attach { qid: qid_of(&attr) }))
    }

    pub(super) async fn walk(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        newfid: u32,
        names: &[&[u8]],
    ) -> FsResult<Vec<u8>> {
        let start = s.get(fid)?;
        if !matches!(start.state, FidState::Path) {
            return Err(Errno::EBADF);
        }
        if newfid != fid {
            self.check_free(s, newfid)?;
        }
        let mut cur = start;
        let mut cur_attr: Option<Attr> = None;
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            match self.walk_step(&cur, cur_attr.as_ref(), name).await {
                Ok(attr) => {
                    qids.push(qid_of(&attr));
                    let is_dot = *name == b"." || *name == b"..";
                    cur.parent = (!is_dot).then(|| Parent {
                        dir: cur.ino,
                        name: Arc::from(*name),
                    });
                    cur.ino = attr.ino;
                    cur.file_type = attr.file_type();
                    cur_attr = Some(attr);
                }
                Err(e) if i == 0 => return Err(e),
                // A partial walk answers the qids found; newfid stays unbound.
                Err(_) => return Ok(reply(tag, &Rmsg::Walk { qids })),
            }
        }
        if newfid == fid {
            s.replace(fid, cur)?;
        } else {
            self.bind(s, newfid, cur).await?;
        }
        Ok(reply(tag, &Rmsg::Walk { qids }))
    }

    /// One walk step from directory `cur` (whose attributes may already be known).
    async fn walk_step(&self, cur: &Fid, cur_attr: Option<&Attr>, name: &[u8]) -> FsResult<Attr> {
        if cur.file_type != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        check_name(name)?;
        let stays = name == b"." || (name == b".." && cur.ino == cur.mount.root);
        // Root may search any directory: skip fetching attributes just to check that.
        if stays || !cur.user().is_root() {
            let dir_attr = match cur_attr {
                Some(a) => *a,
                None => self.fs.getattr(cur.ino).await?,
            };
            cur.user().check(&dir_attr, MAY_EXEC)?;
            if stays {
                return Ok(dir_attr);
            }
        }
        self.fs.lookup(cur.ino, name).await
    }
}

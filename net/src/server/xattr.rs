//! Extended attributes: `Txattrwalk` binds a new fid that reads a value (or, with an
//! empty name, the NUL-separated name list); `Txattrcreate` turns a fid into a writer
//! whose collected value is stored when the fid is clunked.
//!
//! Namespace rules follow Linux's `xattr_permission`: `trusted.*` is root's alone;
//! `user.*` exists on regular files and directories and needs read/write permission;
//! `system.*` (POSIX ACLs) is readable by all and writable by the owner; `security.*`
//! is readable by all and writable by root. Other prefixes are `EOPNOTSUPP`.

use alloc::sync::Arc;
use alloc::vec::Vec;

use vfs::{Attr, Errno, FileSystem, FileType, FsResult, XattrMode, XATTR_VALUE_MAX};

use super::fid::{Fid, FidState, XattrWrite};
use super::perm::{User, MAY_READ, MAY_WRITE};
use super::session::Session;
use super::{reply, Server};
use crate::memory::{Charged, Use};
use crate::sync::Locked;
use crate::wire::{Rmsg, XATTR_CREATE, XATTR_REPLACE};

/// `E2BIG`: a value larger than the filesystem's xattr limit, or a name list longer
/// than [`XATTR_LIST_MAX`].
const E2BIG: Errno = Errno(7);
/// Longest list of names `Txattrwalk` with an empty name returns (Linux's limit for
/// `listxattr`).
pub const XATTR_LIST_MAX: usize = 65536;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Namespace {
    User,
    Trusted,
    System,
    Security,
}

fn namespace(name: &[u8]) -> FsResult<Namespace> {
    let ns = [
        (&b"user."[..], Namespace::User),
        (b"trusted.", Namespace::Trusted),
        (b"system.", Namespace::System),
        (b"security.", Namespace::Security),
    ];
    ns.iter()
        .find(|(prefix, _)| name.len() > prefix.len() && name.starts_with(prefix))
        .map(|(_, ns)| *ns)
        .ok_or(Errno::EOPNOTSUPP)
}

/// May `user` read (`want` = [`MAY_READ`]) or write ([`MAY_WRITE`]) attribute `name`?
fn check_xattr(user: &User, attr: &Attr, name: &[u8], want: u32) -> FsResult<()> {
    let writing = want == MAY_WRITE;
    // Denials of reads look like a missing attribute, as on Linux.
    let denied = if writing {
        Errno::EPERM
    } else {
        Errno::ENODATA
    };
    match namespace(name)? {
        Namespace::Trusted if !user.is_root() => Err(denied),
        Namespace::Trusted => Ok(()),
        Namespace::User => {
            if !matches!(attr.file_type(), FileType::Regular | FileType::Directory) {
                return Err(denied);
            }
            user.check(attr, want)
        }
        Namespace::System | Namespace::Security if !writing => Ok(()),
        Namespace::System if user.owns(attr) => Ok(()),
        Namespace::Security if user.is_root() => Ok(()),
        Namespace::System | Namespace::Security => Err(Errno::EPERM),
    }
}

impl<F: FileSystem> Server<F> {
    pub(super) async fn xattrwalk(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        newfid: u32,
        name: &[u8],
    ) -> FsResult<Vec<u8>> {
        let f = s.get(fid)?;
        if !matches!(f.state, FidState::Path | FidState::Open(..)) {
            return Err(Errno::EBADF);
        }
        if newfid != fid {
            self.check_free(s, newfid)?;
        }
        // The value stays with the fid until it is clunked: charge the most it can be
        // before the filesystem allocates it, and keep what it turns out to be.
        let mut charge = self
            .hold(s, || {
                Ok(s.account()
                    .charge(Use::Xattrs, XATTR_LIST_MAX.max(XATTR_VALUE_MAX))?)
            })
            .await?;
        let value = if name.is_empty() {
            let hide_trusted = !f.user().is_root();
            let mut list = Vec::new();
            for n in self.fs.listxattr(f.ino).await? {
                if hide_trusted && n.starts_with(b"trusted.") {
                    continue;
                }
                if list.len() + n.len() + 1 > XATTR_LIST_MAX {
                    // As Linux's listxattr: a list that does not fit its limit.
                    return Err(E2BIG);
                }
                list.extend_from_slice(&n);
                list.push(0);
            }
            list
        } else {
            let attr = self.fs.getattr(f.ino).await?;
            check_xattr(f.user(), &attr, name, MAY_READ)?;
            self.fs.getxattr(f.ino, name).await?
        };
        charge.shrink_to(value.capacity());
        let size = value.len() as u64;
        let entry = Fid {
            state: FidState::XattrRead(Arc::new(Charged::new(value, charge))),
            parent: None,
            ..f
        };
        if newfid == fid {
            s.replace(fid, entry)?;
        } else {
            self.bind(s, newfid, entry).await?;
        }
        Ok(reply(tag, &Rmsg::Xattrwalk { size }))
    }

    pub(super) async fn xattrcreate(
        &self,
        s: &Session,
        tag: u16,
        fid: u32,
        name: &[u8],
        attr_size: u64,
        flags: u32,
    ) -> FsResult<Vec<u8>> {
        let f: Fid = s.get(fid)?;
        if !matches!(f.state, FidState::Path) {
            return Err(Errno::EBADF);
        }
        if f.read_only() {
            return Err(Errno::EROFS);
        }
        let mode = match flags {
            0 => XattrMode::Upsert,
            XATTR_CREATE => XattrMode::Create,
            XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let size = usize::try_from(attr_size)
            .ok()
            .filter(|n| *n <= XATTR_VALUE_MAX)
            .ok_or(E2BIG)?;
        let attr = self.fs.getattr(f.ino).await?;
        check_xattr(f.user(), &attr, name, MAY_WRITE)?;
        let charge = self
            .hold(s, || {
                Ok(s.account().charge(Use::Xattrs, size + name.len())?)
            })
            .await?;
        let mut value = Vec::new();
        value.try_reserve_exact(size).map_err(|_| Errno::ENOMEM)?;
        let writer = XattrWrite {
            name: name.to_vec(),
            size,
            value,
            mode,
            remove: size == 0 && mode == XattrMode::Replace,
            _charge: Some(charge),
        };
        s.transition(fid, FidState::XattrWrite(Arc::new(Locked::new(writer))))?;
        Ok(reply(tag, &Rmsg::Xattrcreate {}))
    }
}

//! The checks of each record on its own, which need no tree.

use crate::core::dir::{check_name, MAX_DEPTH};
use crate::core::inode::check_target;
use crate::core::inode::MAX_FILE_SIZE;
use crate::core::xattr::check_xattr_name;
use crate::features::streams::receive::{refuse, ReceiveError, RECEIVED_XATTR};
use crate::format::stream::{DataMode, Header, InodeRef, Record};
use vfs::FileType;

/// Checks, record by record, what the checksums cannot and needs no tree, so that a
/// stream the receiver could not apply is refused in the checking pass, before
/// anything changes ([`Model`](crate::features::streams::receive::model::Model) checks the rest, against the tree):
/// - the records come in the order the receiver applies them in (entries removed, then
///   each inode followed by its xattrs and data, then entries added);
/// - a full stream names nothing by a base path but the root; a path is no deeper than
///   the sender walks ([`MAX_DEPTH`]);
/// - every mode names a type; names, symlink targets (and only symlinks have one),
///   xattr names and values are ones the filesystem takes, and no xattr is the
///   receiver's own mark; data lies within its file and only where data is sent.
pub(super) struct Validator {
    /// A full stream (no base).
    full: bool,
    /// Where the records are: 0 removing entries, 1 describing inodes, 2 adding entries.
    phase: u8,
    /// The last inode described: its ref, size and how its data comes.
    current: Option<(InodeRef, u64, DataMode)>,
}

impl Validator {
    /// The checks for the stream `header` begins.
    pub(super) fn new(header: &Header) -> Validator {
        Validator {
            full: header.base.is_none(),
            phase: 0,
            current: None,
        }
    }

    /// Checks a ref a record uses: no base path in a full stream but the root, none too
    /// deep or with a bad name.
    fn uses(&self, r: &InodeRef) -> Result<(), ReceiveError> {
        match r {
            InodeRef::Base(path) if self.full && !path.is_empty() => {
                Err(refuse("a base path in a full stream"))
            }
            InodeRef::Base(path) if path.len() > MAX_DEPTH => Err(refuse("a base path too deep")),
            InodeRef::Base(path) if path.iter().any(|n| check_name(n).is_err()) => {
                Err(refuse("a bad name in a base path"))
            }
            _ => Ok(()),
        }
    }

    /// `r` must be the inode described last.
    fn of_current(&self, r: &InodeRef) -> Result<(u64, DataMode), ReceiveError> {
        match &self.current {
            Some((ino, size, data)) if ino == r => Ok((*size, *data)),
            _ => Err(refuse("xattrs or data away from their inode")),
        }
    }

    /// Checks record `r`, the next of the stream.
    pub(super) fn check(&mut self, r: &Record) -> Result<(), ReceiveError> {
        let phase = match r {
            Record::Begin(_) | Record::Unlink(..) => 0,
            Record::Inode(_) | Record::Xattrs(..) | Record::Data(..) => 1,
            Record::Link(..) => 2,
        };
        if phase < self.phase {
            return Err(refuse("records out of order"));
        }
        self.phase = phase;
        match r {
            Record::Begin(_) => Ok(()),
            Record::Inode(s) => {
                let ty = FileType::from_mode(s.mode).ok_or(refuse("mode"))?;
                match ty {
                    FileType::Symlink => {
                        check_target(&s.target).map_err(|_| refuse("a bad symlink target"))?
                    }
                    _ if !s.target.is_empty() => {
                        return Err(refuse(
                            "a symlink target for an inode that is not a symlink",
                        ))
                    }
                    _ => {}
                }
                if s.data != DataMode::Keep && ty != FileType::Regular {
                    return Err(refuse("data for an inode that is not a file"));
                }
                if s.size > MAX_FILE_SIZE {
                    return Err(refuse("a file too large"));
                }
                self.current = Some((s.ino.clone(), s.size, s.data));
                self.uses(&s.ino)
            }
            Record::Xattrs(ino, list) => {
                self.of_current(ino)?;
                if list
                    .iter()
                    .any(|(n, v)| check_xattr_name(n).is_err() || v.len() > vfs::XATTR_VALUE_MAX)
                {
                    return Err(refuse("a bad xattr"));
                }
                if list.iter().any(|(n, _)| n == RECEIVED_XATTR) {
                    return Err(refuse("the receiver's own mark as an xattr"));
                }
                Ok(())
            }
            Record::Data(ino, offset, data) => {
                let (size, mode) = self.of_current(ino)?;
                let end = offset.checked_add(data.len() as u64);
                if mode == DataMode::Keep || end.is_none_or(|e| e > size) {
                    return Err(refuse("data outside its file"));
                }
                Ok(())
            }
            Record::Unlink(dir, name) => {
                check_name(name).map_err(|_| refuse("a bad name"))?;
                self.uses(dir)
            }
            Record::Link(dir, name, child) => {
                check_name(name).map_err(|_| refuse("a bad name"))?;
                self.uses(dir).and(self.uses(child))
            }
        }
    }
}

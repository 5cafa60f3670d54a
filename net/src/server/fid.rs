//! Fids: a connection's handles on files, and what state each is in.

use alloc::sync::Arc;
use alloc::vec::Vec;

use vfs::{FileType, Ino, ReadStream, XattrMode};

use super::export::Export;
use super::perm::User;
use crate::memory::{Charge, Charged};
use crate::sync::Locked;

/// The export a fid lives in, resolved at attach.
#[derive(Debug)]
pub struct Mount {
    /// The export's configuration.
    pub export: Export,
    /// Inode of the export's root directory: `..` never leaves it.
    pub root: Ino,
    /// Who the attach was for.
    pub user: User,
}

/// How an open fid may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenMode {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Every write goes to the end of the file.
    pub append: bool,
}

/// An extended attribute being written through a fid (after `Txattrcreate`).
#[derive(Debug, Default)]
pub struct XattrWrite {
    /// The memory charged for the value (given back with the writer).
    pub _charge: Option<Charge>,
    /// Attribute name.
    pub name: Vec<u8>,
    /// Declared value size.
    pub size: usize,
    /// Bytes received so far.
    pub value: Vec<u8>,
    /// Create/replace semantics.
    pub mode: XattrMode,
    /// `XATTR_REPLACE` with size 0: remove the attribute (what Linux sends for
    /// `removexattr`).
    pub remove: bool,
}

/// What a fid currently is.
#[derive(Clone, Debug)]
pub enum FidState {
    /// Walked to a file, not opened: may be walked from, opened, or used by path-based
    /// requests.
    Path,
    /// Opened with `Tlopen`/`Tlcreate`: the filesystem was told with `open`, and is told
    /// `release` at clunk. The stream is how the file is being read through this fid
    /// (the filesystem reads ahead of a sequential reader).
    Open(OpenMode, Arc<ReadStream>),
    /// Reading an xattr value (or the name list) captured at `Txattrwalk`, charged to
    /// the connection.
    XattrRead(Arc<Charged<Vec<u8>>>),
    /// Collecting an xattr value until clunk.
    XattrWrite(Arc<Locked<XattrWrite>>),
}

impl FidState {
    /// Opened in `mode`, not read yet.
    pub fn opened(mode: OpenMode) -> FidState {
        FidState::Open(mode, Arc::new(ReadStream::new()))
    }
}

/// Where a fid's file was found: used by `Tremove` and `Trename`, which name a file by
/// fid alone.
#[derive(Clone, Debug)]
pub struct Parent {
    /// The directory the last walk step looked in.
    pub dir: Ino,
    /// The name it looked up.
    pub name: Arc<[u8]>,
}

/// One fid's entry in a connection's table.
#[derive(Clone, Debug)]
pub struct Fid {
    /// The file.
    pub ino: Ino,
    /// Its type (fixed for an inode's life).
    pub file_type: FileType,
    /// Export and user.
    pub mount: Arc<Mount>,
    /// State.
    pub state: FidState,
    /// How the fid was reached, if by name.
    pub parent: Option<Parent>,
}

impl Fid {
    /// The user this fid acts for.
    pub fn user(&self) -> &User {
        &self.mount.user
    }

    /// Whether the fid's export refuses changes.
    pub fn read_only(&self) -> bool {
        self.mount.export.read_only
    }
}

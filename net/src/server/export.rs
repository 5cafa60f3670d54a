//! Exports: the directory trees a client can attach to by `aname`, and their options.

use alloc::string::String;
use alloc::vec::Vec;

use super::access::AllowList;

/// Which users an export maps to its anonymous identity (like NFS's squash options).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Squash {
    /// Users keep their ids.
    #[default]
    None,
    /// uid 0 becomes the anonymous user (`root_squash`).
    Root,
    /// Every user becomes the anonymous user (`all_squash`).
    All,
}

/// One exported directory tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// The `aname` that selects it (`""` is what Linux sends without `-o aname=`).
    pub name: String,
    /// Path of the exported directory inside the filesystem, `/`-separated (`/` = root).
    pub path: String,
    /// Refuse every change with `EROFS`.
    pub read_only: bool,
    /// Identity mapping.
    pub squash: Squash,
    /// uid of squashed users.
    pub anon_uid: u32,
    /// gid of squashed users.
    pub anon_gid: u32,
    /// The clients that may attach to it; `None`: those of the server's
    /// [`Config::allow`](super::Config::allow).
    pub allow: Option<AllowList>,
    /// Attach at this inode instead of the filesystem's root (then walk `path` from
    /// it): a synthetic tree served beside the filesystem, such as the administration
    /// tree ([`Export::admin`]).
    pub root_ino: Option<vfs::Ino>,
}

/// The `aname` of the administration export.
pub const ADMIN_EXPORT: &str = "ctl";

/// uid/gid of `nobody` on Linux, the default anonymous identity.
pub const NOBODY: u32 = 65534;

impl Export {
    /// The whole filesystem under `name`, read-write, no squashing, for the server's
    /// allow-list.
    pub fn root(name: &str) -> Export {
        Export {
            name: name.into(),
            path: "/".into(),
            read_only: false,
            squash: Squash::None,
            anon_uid: NOBODY,
            anon_gid: NOBODY,
            allow: None,
            root_ino: None,
        }
    }

    /// The administration export ([`crate::admin`]): aname [`ADMIN_EXPORT`], for the
    /// clients of `allow` only.
    pub fn admin(allow: AllowList) -> Export {
        Export {
            path: "/".into(),
            allow: Some(allow),
            root_ino: Some(crate::admin::ADMIN_ROOT),
            ..Export::root(ADMIN_EXPORT)
        }
    }

    /// The path's components (empty for the root).
    pub fn components(&self) -> Vec<&[u8]> {
        self.path
            .as_bytes()
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .collect()
    }

    /// Maps a client's uid through the squash option; returns `(uid, squashed)`.
    pub fn map_uid(&self, uid: u32) -> (u32, bool) {
        match self.squash {
            Squash::All => (self.anon_uid, true),
            Squash::Root if uid == 0 => (self.anon_uid, true),
            _ => (uid, false),
        }
    }
}

/// The export `aname` selects among `exports`: the one of that name, else the first
/// whose path it is (as diod takes paths).
pub fn select<'a>(exports: &'a [Export], aname: &[u8]) -> Option<&'a Export> {
    let by_name = exports.iter().find(|e| e.name.as_bytes() == aname);
    by_name.or_else(|| exports.iter().find(|e| e.path.as_bytes() == aname))
}

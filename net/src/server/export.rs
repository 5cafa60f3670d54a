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
    /// Space and inodes the export's tree may hold (`quota=`, `inodes=`): its directory
    /// is made a quota root at start-up ([`apply_quotas`]); past them `EDQUOT`, and
    /// `Tstatfs` inside it answers with them. `None`: no quota root is made.
    pub quota: Option<vfs::QuotaLimits>,
    /// Its tenant's CPU weight (`weight=`, [`CPU_WEIGHTS`], default
    /// [`DEFAULT_CPU_WEIGHT`]): tenants competing for a CPU get time in proportion to
    /// their weights ([`super::tenant::CpuShare`]). Only an export with its own
    /// allow-list is a tenant; for the others it means nothing.
    pub weight: u32,
    /// The quota project its directory is (the directory's inode number), once
    /// [`apply_quotas`] made it one: reports name the project after the export.
    pub project: Option<vfs::Ino>,
}

/// A tenant's CPU weight when none is given (as cgroup v2's `cpu.weight`).
pub const DEFAULT_CPU_WEIGHT: u32 = 100;

/// The CPU weights an export may have (as cgroup v2's `cpu.weight`).
pub const CPU_WEIGHTS: core::ops::RangeInclusive<u32> = 1..=10_000;

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
            quota: None,
            weight: DEFAULT_CPU_WEIGHT,
            project: None,
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

/// The export whose directory is quota project `root` ([`Export::project`]), if any.
pub fn of_project(exports: &[Export], root: vfs::Ino) -> Option<&Export> {
    exports.iter().find(|e| e.project == Some(root))
}

/// The export `aname` selects among `exports`: the one of that name, else the first
/// whose path it is (as diod takes paths).
pub fn select<'a>(exports: &'a [Export], aname: &[u8]) -> Option<&'a Export> {
    let by_name = exports.iter().find(|e| e.name.as_bytes() == aname);
    by_name.or_else(|| exports.iter().find(|e| e.path.as_bytes() == aname))
}

/// Makes the directory of every export with a quota (`quota=`, `inodes=`) a quota root
/// with its limits (`FileSystem::set_quota`: durable when it returns; an existing tree is
/// labelled and charged first), so the export's usage is what its tree holds, and notes
/// the project in [`Export::project`]. Returns each such export with what its project
/// holds, or the first error with the export it concerns.
pub async fn apply_quotas<F: vfs::FileSystem>(
    fs: &F,
    exports: &mut [Export],
) -> Result<Vec<(String, vfs::QuotaInfo)>, (String, vfs::Errno)> {
    let mut applied = Vec::new();
    for e in exports {
        let Some(limits) = e.quota else {
            continue;
        };
        let fail = |errno| (e.name.clone(), errno);
        let mut dir = e.root_ino.unwrap_or(vfs::ROOT_INO);
        for name in e.components() {
            dir = fs.lookup(dir, name).await.map_err(fail)?.ino;
        }
        let info = fs.set_quota(dir, limits).await.map_err(fail)?;
        e.project = Some(info.root);
        applied.push((e.name.clone(), info));
    }
    Ok(applied)
}

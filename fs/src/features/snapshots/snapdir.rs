//! `.snapshots`: every snapshot, read-only, under a hidden directory at the root.
//!
//! `lookup(ROOT, ".snapshots")` finds a synthetic directory (not listed by `readdir` of
//! the root, so `find`, `du` and backups of the live tree do not descend into every
//! snapshot; as ZFS's `.zfs`) whose entries are the snapshots by name; each is the root
//! of that snapshot's read-only view ([`NineFs::snapshot_view`](crate::volume::NineFs::snapshot_view)). Any client of
//! [`FileSystem`](vfs::FileSystem) — the 9P server, so every mount — reaches them by
//! path: `cat /mnt/.snapshots/nightly/etc/hosts`.
//!
//! Inode numbers keep the namespaces apart: bit 63 set marks `.snapshots` (bits 48..63
//! zero) or an inode of snapshot *id* (bits 48..63 = id, bits 0..48 = its inode number
//! in the snapshot). Live inode numbers never reach bit 48.
//!
//! Views are reached through their engines ([`Engine::run`]) and inherent methods, never
//! through their `FileSystem` methods: those route, and an operation's future would
//! contain itself.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::inode::INNER_BITS;
pub(crate) use crate::core::inode::{is_reserved, is_snapshot_ino};
pub use crate::core::inode::{LIVE_INO_END, MAX_SNAPSHOT_ID, SNAPSHOTS_DIR, SNAPSHOTS_DIR_INO};
use crate::engine::Engine;
use crate::features::snapshots::read_items;
use crate::features::snapshots::Snapshots;
use block::BlockDevice;
use vfs::{mode, Attr, DirEntry, Errno, FileType, FsResult, Ino, ROOT_INO};

/// Where an inode number lives.
pub(crate) enum Place<D: BlockDevice> {
    /// The live filesystem.
    Live,
    /// The snapshots directory itself.
    Dir,
    /// Inode `ino` of snapshot `id`, through its view.
    Snapshot {
        /// The snapshot's read-only view.
        view: Arc<Engine<D>>,
        /// Snapshot id.
        id: u64,
        /// The inode number within the snapshot.
        ino: Ino,
    },
}

/// The outside inode number of inode `ino` of snapshot `id`.
fn outer(id: u64, ino: Ino) -> FsResult<Ino> {
    if ino >> INNER_BITS != 0 {
        return Err(Errno::EOVERFLOW);
    }
    Ok(SNAPSHOTS_DIR_INO | id << INNER_BITS | ino)
}

/// `attr` of snapshot `id`'s inode, as the outside sees it.
fn outer_attr(id: u64, mut attr: Attr) -> FsResult<Attr> {
    attr.ino = outer(id, attr.ino)?;
    Ok(attr)
}

impl<D: BlockDevice> Snapshots<D> {
    /// Where `ino` lives; `ENOENT` for an inode of a snapshot that no longer exists.
    pub(crate) async fn place(&self, ino: Ino) -> FsResult<Place<D>> {
        if self.is_view {
            return Ok(Place::Live);
        }
        if !is_snapshot_ino(ino) {
            return Ok(Place::Live);
        }
        let id = (ino & !SNAPSHOTS_DIR_INO) >> INNER_BITS;
        if id == 0 {
            return if ino == SNAPSHOTS_DIR_INO {
                Ok(Place::Dir)
            } else {
                Err(Errno::ENOENT)
            };
        }
        let view = self.view_by_id(id).await?;
        let inner = ino & ((1 << INNER_BITS) - 1);
        Ok(Place::Snapshot {
            view,
            id,
            ino: inner,
        })
    }

    async fn view_by_id(&self, id: u64) -> FsResult<Arc<Engine<D>>> {
        if let Some(v) = self.views.lock().get(id) {
            return Ok(v);
        }
        let items = self.engine.run(read_items).await?;
        let (_, item) = items
            .into_iter()
            .find(|(i, _)| *i == id)
            .ok_or(Errno::ENOENT)?;
        Ok(self.view_of(id, &item))
    }

    /// The snapshots directory's attributes: the root's, read-only, with its own number.
    async fn snapdir_attr(&self) -> FsResult<Attr> {
        let mut attr = self.engine.run(|c| c.op_getattr(ROOT_INO)).await?;
        attr.ino = SNAPSHOTS_DIR_INO;
        attr.mode = mode::S_IFDIR | 0o555;
        attr.nlink = 2;
        attr.size = 0;
        attr.blocks = 0;
        Ok(attr)
    }

    /// `lookup` under `.snapshots` or in a snapshot; `None` for the live filesystem.
    pub(crate) async fn snap_lookup(&self, dir: Ino, name: &[u8]) -> FsResult<Option<Attr>> {
        if is_reserved(dir, name) && !self.is_view {
            return self.snapdir_attr().await.map(Some);
        }
        match self.place(dir).await? {
            Place::Live => Ok(None),
            Place::Dir => match name {
                b"." => self.snapdir_attr().await.map(Some),
                b".." => self.engine.run(|c| c.op_getattr(ROOT_INO)).await.map(Some),
                _ => {
                    let items = self.engine.run(read_items).await?;
                    let (id, item) = items
                        .into_iter()
                        .find(|(_, i)| i.name == name)
                        .ok_or(Errno::ENOENT)?;
                    let view = self.view_of(id, &item);
                    outer_attr(id, view.run(|c| c.op_getattr(ROOT_INO)).await?).map(Some)
                }
            },
            Place::Snapshot { ino, .. } if ino == ROOT_INO && name == b".." => {
                self.snapdir_attr().await.map(Some)
            }
            Place::Snapshot { view, id, ino } => {
                outer_attr(id, view.run(|c| c.op_lookup(ino, name)).await?).map(Some)
            }
        }
    }

    /// `getattr` under `.snapshots`; `None` for the live filesystem.
    pub(crate) async fn snap_getattr(&self, ino: Ino) -> FsResult<Option<Attr>> {
        match self.place(ino).await? {
            Place::Live => Ok(None),
            Place::Dir => self.snapdir_attr().await.map(Some),
            Place::Snapshot { view, id, ino } => {
                outer_attr(id, view.run(|c| c.op_getattr(ino)).await?).map(Some)
            }
        }
    }

    /// `readdir` under `.snapshots`; `None` for the live filesystem. The snapshots
    /// directory lists `.`, `..` and the snapshots by id (offset of snapshot *id*:
    /// *id* + 1, so offsets stay valid as snapshots come and go).
    pub(crate) async fn snap_readdir(
        &self,
        dir: Ino,
        offset: u64,
        max: usize,
    ) -> FsResult<Option<Vec<DirEntry>>> {
        match self.place(dir).await? {
            Place::Live => Ok(None),
            Place::Dir => {
                if max == 0 {
                    return Err(Errno::EINVAL);
                }
                let items = self.engine.run(read_items).await?;
                let dots = [(0, SNAPSHOTS_DIR_INO, &b"."[..]), (1, ROOT_INO, &b".."[..])];
                let snaps = items
                    .iter()
                    .map(|(id, i)| Ok((id + 1, outer(*id, ROOT_INO)?, &i.name[..])))
                    .collect::<FsResult<Vec<_>>>()?;
                let out = dots
                    .into_iter()
                    .chain(snaps)
                    .filter(|(pos, _, _)| *pos >= offset)
                    .take(max)
                    .map(|(pos, ino, name)| DirEntry {
                        ino,
                        file_type: FileType::Directory,
                        name: name.to_vec(),
                        next_offset: pos + 1,
                    })
                    .collect();
                Ok(Some(out))
            }
            Place::Snapshot { view, id, ino } => {
                let mut entries = view.run(|c| c.op_readdir(ino, offset, max)).await?;
                for e in &mut entries {
                    e.ino = if ino == ROOT_INO && e.name == b".." {
                        SNAPSHOTS_DIR_INO
                    } else {
                        outer(id, e.ino)?
                    };
                }
                Ok(Some(entries))
            }
        }
    }
}

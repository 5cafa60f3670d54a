//! What the snapshot streams need from the filesystem they run on ([`StreamHost`]).

use alloc::sync::Arc;

use crate::engine::Engine;
use crate::features::snapshots::Snapshots;
use block::BlockDevice;

/// What the snapshot streams need from the filesystem they run on: the live tree as a
/// [`vfs::FileSystem`] (a receive and a rollback change it through its own operations),
/// its snapshots (the list, create and delete, and their views, read as
/// `vfs::FileSystem`s of the same type), and the engine under it (the trees a send
/// compares, the checkpoints). The mounted handle is the one host
/// ([`NineFs`](crate::volume::NineFs)); a snapshot view is a host of its own.
pub(crate) trait StreamHost: vfs::FileSystem + Sized {
    /// The block device under the filesystem.
    type Device: BlockDevice;

    /// The engine under the filesystem.
    fn engine(&self) -> &Arc<Engine<Self::Device>>;

    /// The snapshots of the filesystem.
    fn snaps(&self) -> &Snapshots<Self::Device>;

    /// A read-only handle over a snapshot view's engine (one of [`StreamHost::snaps`]'s).
    fn view(&self, view: Arc<Engine<Self::Device>>) -> Arc<Self>;
}

//! Growth: a device larger than the filesystem is put to use.
//!
//! The fixed regions stay where they are (the log keeps its size); blocks past the old
//! end join the last group, and groups added keep their bitmap slots in their own first
//! two blocks ([`Layout::grown`]). The grow is one checkpoint: the new groups' bitmaps
//! are written first, outside the old filesystem, where nothing reads them until a
//! superblock with the new size commits; the old last group's new version goes to its
//! uncommitted slot as any checkpoint's does. A crash leaves the old size or the new.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::core::checkpoint::CheckpointCause;
use crate::engine::Engine;
use crate::format::features;
use crate::format::Layout;
use crate::space::initial_group;
use block::{BlockDevice, WriteFlags};
use vfs::{Errno, FsResult};

/// What a grow did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Growth {
    /// Size before, in blocks.
    pub old_blocks: u64,
    /// Size after, in blocks.
    pub new_blocks: u64,
    /// Groups added.
    pub groups_added: u32,
}

/// Growing onto a larger device, the service (it keeps no state of its own).
pub(crate) struct Grow<D: BlockDevice> {
    pub(crate) engine: Arc<Engine<D>>,
}

impl<D: BlockDevice> Grow<D> {
    /// Grows the filesystem to the device's size; `None` when the device is not larger
    /// (or the filesystem is read-only).
    pub async fn grow(&self) -> FsResult<Option<Growth>> {
        let (old, seq) = {
            let c = self.engine.core.lock();
            if c.read_only {
                return Ok(None);
            }
            (c.sb.layout, c.committed_seq)
        };
        let Some(new) = old.grown(self.engine.dev.blocks()) else {
            return Ok(None);
        };
        let added = self.write_new_groups(&old, &new, seq).await?;
        let gained = self
            .engine
            .run(|c| {
                // A concurrent grow got here first.
                if c.sb.layout != old {
                    return Ok(None);
                }
                let gained = c.space.grow(new, added.clone())?;
                c.sb.layout = new;
                if new.groups > new.fixed_groups() {
                    c.sb.incompat |= features::INCOMPAT_GROWN;
                }
                c.changed = true;
                c.stats.grows += 1;
                c.stats.grown_blocks += new.total_blocks - old.total_blocks;
                Ok(Some(gained))
            })
            .await?;
        let Some(gained) = gained else {
            return Ok(None);
        };
        self.engine.checkpoint(CheckpointCause::Grow).await?;
        let growth = Growth {
            old_blocks: old.total_blocks,
            new_blocks: new.total_blocks,
            groups_added: new.groups - old.groups,
        };
        log::info!(
            "grew from {} to {} blocks ({} groups added, {gained} blocks free gained)",
            growth.old_blocks,
            growth.new_blocks,
            growth.groups_added
        );
        Ok(Some(growth))
    }

    /// Writes both slots of each group `new` adds to `old`, as of checkpoint `seq`
    /// (blocks outside the old filesystem: nothing reads them before the grow commits).
    async fn write_new_groups(
        &self,
        old: &Layout,
        new: &Layout,
        seq: u64,
    ) -> FsResult<Vec<crate::format::bitmap::GroupBlock>> {
        let mut added = Vec::new();
        for g in old.groups..new.groups {
            let mut block = initial_group(new, g, &[]);
            block.seq = seq;
            let data = block.encode();
            for slot in 0..2 {
                let at = new.bitmap_block(g, slot);
                if let Err(e) = self.engine.dev.write(at, &data, WriteFlags::NONE).await {
                    log::error!("grow: writing bitmap group {g} at block {at}: {e}");
                    return Err(Errno::EIO);
                }
            }
            added.push(block);
        }
        Ok(added)
    }
}

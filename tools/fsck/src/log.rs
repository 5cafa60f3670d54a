//! The fsync log: every commit the mount would replay is checked by replaying it, in
//! memory, with the filesystem's own replay (a read-only mount of the image, which
//! writes nothing). So fsck makes exactly the checks replay makes — the rules of
//! `ninefs::synclog::rules`, that a record does only what a live operation
//! would — and a commit the mount would refuse (and then serve the filesystem
//! read-only) is an error here.
//!
//! The trees fsck walks afterwards are the checkpoint's, on the disk: what replay adds
//! in memory is checked by replay's rules, not by the tree checks. The data of the
//! extents replay adds (fsynced since the checkpoint) is checked here against the
//! checksums the log gave it, as the checkpoint's data is against its checksum tree:
//! replay itself verifies only the last commit's data (dropping the commit if it is not
//! on the disk), and a block of an earlier commit that fails its checksum reads as
//! `EIO` once mounted.

use alloc::boxed::Box;
use alloc::format;
use alloc::vec::Vec;

use block::BlockDevice;
use ninefs::format::BLOCK_SIZE;
use ninefs::util::crc::crc32c;
use ninefs::volume::{MountOptions, NineFs};
use vfs::{Clock, Timespec};

use crate::{Checker, FsckOptions};

/// The clock of fsck's read-only mount: nothing it does stamps a time.
struct Stopped;

impl Clock for Stopped {
    fn now(&self) -> Timespec {
        Timespec::default()
    }
}

impl<D: BlockDevice> Checker<D> {
    /// Checks the commits the log holds past the checkpoint (an image not unmounted
    /// cleanly): the log must be readable, replay must accept every commit, and (with
    /// `check_data`) the data it adds must match its logged checksums.
    pub(crate) async fn check_log(&mut self, opts: &FsckOptions) {
        let commits = match self.img.log_commits().await {
            Ok(c) => c,
            Err(e) => {
                self.error(format!("fsync log: {e}; mount will fail"));
                return;
            }
        };
        if commits.commits.is_empty() && commits.undecodable.is_none() {
            return;
        }
        let n = commits.commits.len();
        let records: usize = commits.commits.iter().map(|c| c.records.len()).sum();
        let mount_opts = MountOptions {
            read_only: true,
            data_cache: 0,
            discard: None,
            ..MountOptions::default()
        };
        // What the read-only mount says, gathered before anything is reported (it
        // borrows the device).
        let (refused, added) =
            match NineFs::mount(self.img.device(), mount_opts, Box::new(Stopped)).await {
                Err(e) => {
                    self.error(format!(
                        "fsync log: replaying its {n} commits fails the mount: {e}"
                    ));
                    return;
                }
                Ok(fs) => {
                    let added = if opts.check_data {
                        fs.replayed_extents().await
                    } else {
                        Ok(Vec::new())
                    };
                    (fs.refused_log_commit(), added)
                }
            };
        match refused {
            Some(r) => self.error(format!(
                "fsync log: {r}; the mount serves the filesystem read-only as the {} commits before it leave it",
                r.applied
            )),
            None => self.warn(format!(
                "the fsync log holds {n} commits ({records} records) that mount will replay; replayed here in memory, replay accepts every one; the trees checked are the checkpoint's"
            )),
        }
        match added {
            Ok(extents) => self.check_replayed_data(extents).await,
            Err(e) => self.error(format!(
                "fsync log: the data extents replay adds cannot be listed: {e:?}"
            )),
        }
    }

    /// Reads every block of the data `extents` replay of the log adds (those of the
    /// commits the mount applies: `(first block, checksums)`) and checks it against the
    /// checksum the log gave it.
    async fn check_replayed_data(&mut self, extents: Vec<(u64, Vec<u32>)>) {
        for (start, sums) in extents {
            match self.img.read_blocks(start, sums.len() as u64).await {
                Ok(data) => {
                    for (i, (block, &sum)) in data.chunks(BLOCK_SIZE).zip(&sums).enumerate() {
                        if crc32c(block) != sum {
                            self.error(format!(
                                "fsync log: data block {} (of extent {start}+{} the log adds) fails its logged checksum; the mount reads it as EIO",
                                start + i as u64,
                                sums.len()
                            ));
                        }
                    }
                }
                Err(e) => self.error(format!("fsync log: data the log adds: {e}")),
            }
        }
    }
}

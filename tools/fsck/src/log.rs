//! The fsync log: every commit the mount would replay is checked by replaying it, in
//! memory, with the filesystem's own replay (a read-only mount of the image, which
//! writes nothing). So fsck makes exactly the checks replay makes — the rules of
//! `ninefs::synclog::rules`, that a record does only what a live operation
//! would — and a commit the mount would refuse (and then serve the filesystem
//! read-only) is an error here.
//!
//! The trees fsck walks afterwards are the checkpoint's, on the disk: what replay adds
//! in memory is checked by replay's rules, not by the tree checks.

use alloc::boxed::Box;
use alloc::format;

use block::BlockDevice;
use ninefs::volume::{MountOptions, NineFs};
use vfs::{Clock, Timespec};

use crate::Checker;

/// The clock of fsck's read-only mount: nothing it does stamps a time.
struct Stopped;

impl Clock for Stopped {
    fn now(&self) -> Timespec {
        Timespec::default()
    }
}

impl<D: BlockDevice> Checker<D> {
    /// Checks the commits the log holds past the checkpoint (an image not unmounted
    /// cleanly): the log must be readable, and replay must accept every commit.
    pub(crate) async fn check_log(&mut self) {
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
        let opts = MountOptions {
            read_only: true,
            data_cache: 0,
            discard: None,
            ..MountOptions::default()
        };
        match NineFs::mount(self.img.device(), opts, Box::new(Stopped)).await {
            Err(e) => self.error(format!(
                "fsync log: replaying its {n} commits fails the mount: {e}"
            )),
            Ok(fs) => match fs.refused_log_commit() {
                Some(r) => self.error(format!(
                    "fsync log: {r}; the mount serves the filesystem read-only as the {} commits before it leave it",
                    r.applied
                )),
                None => self.warn(format!(
                    "the fsync log holds {n} commits ({records} records) that mount will replay; replayed here in memory, replay accepts every one; the trees checked are the checkpoint's"
                )),
            },
        }
    }
}

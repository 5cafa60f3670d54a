//! How large a request's reply can be, known before the request is served: the server
//! charges that much to the client's memory account up front (`crate::memory`), so
//! serving a request never allocates memory nobody paid for.

use vfs::{NAME_MAX, SYMLINK_MAX};

use super::{Tmsg, MAX_WELEM, QID_LEN, RDATA_HEADER_LEN};

/// Upper bound of every reply without a variable-size payload (`Rgetattr`, the largest,
/// is 160 bytes).
pub const SMALL_REPLY: usize = 256;

/// Working memory a `Treaddir` may use per entry while it is served: the filesystem's
/// directory entry with its name.
const READDIR_ENTRY_WORK: usize = 64 + NAME_MAX;
/// Smallest packed directory entry (qid, offset, type, a one-byte name).
pub const MIN_DIRENT: usize = QID_LEN + 8 + 1 + 2 + 1;
/// Most entries a `Treaddir` asks the filesystem for at once.
pub const READDIR_BATCH: usize = 512;

/// The largest reply (plus the working memory its server needs) that `msg` can get under
/// `msize`.
pub fn reply_bound(msg: &Tmsg<'_>, msize: u32) -> usize {
    let payload = |count: u32| count.min(msize.saturating_sub(RDATA_HEADER_LEN as u32)) as usize;
    match msg {
        Tmsg::Read { count, .. } => RDATA_HEADER_LEN + payload(*count),
        Tmsg::Readdir { count, .. } => {
            let count = payload(*count);
            let entries = (count / MIN_DIRENT + 1).min(READDIR_BATCH);
            RDATA_HEADER_LEN + count + entries * READDIR_ENTRY_WORK
        }
        Tmsg::Walk { .. } => SMALL_REPLY.max(9 + MAX_WELEM * QID_LEN),
        Tmsg::Readlink { .. } => SMALL_REPLY + SYMLINK_MAX,
        // The conflicting lock's client id can be as long as a 9P string.
        Tmsg::Getlock { .. } => SMALL_REPLY + usize::from(u16::MAX),
        _ => SMALL_REPLY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Data, Rmsg};

    #[test]
    fn reads_are_bounded_by_count_and_msize() {
        let read = |count| Tmsg::Read {
            fid: 1,
            offset: 0,
            count,
        };
        assert_eq!(reply_bound(&read(100), 8192), 111);
        assert_eq!(reply_bound(&read(u32::MAX), 8192), 8192);
        let data = [0u8; 100];
        let mut frame = alloc::vec::Vec::new();
        Rmsg::Read { data: Data(&data) }
            .encode(1, &mut frame)
            .unwrap();
        assert_eq!(frame.len(), reply_bound(&read(100), 8192));
    }

    #[test]
    fn small_replies_fit_the_small_bound() {
        let attr = Rmsg::Getattr {
            valid: 0,
            qid: Default::default(),
            mode: 0,
            uid: 0,
            gid: 0,
            nlink: 0,
            rdev: 0,
            size: 0,
            blksize: 0,
            blocks: 0,
            atime_sec: 0,
            atime_nsec: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            ctime_sec: 0,
            ctime_nsec: 0,
            btime_sec: 0,
            btime_nsec: 0,
            gen: 0,
            data_version: 0,
        };
        let mut frame = alloc::vec::Vec::new();
        attr.encode(1, &mut frame).unwrap();
        assert!(frame.len() <= SMALL_REPLY);
    }
}

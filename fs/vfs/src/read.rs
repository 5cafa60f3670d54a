//! How a read is made: [`ReadCtx`], on whose behalf and through which open file, and
//! [`ReadStream`], an open file's sequential-access state, which tells a filesystem that
//! reads ahead what to read next.

use alloc::sync::Arc;
use core::ops::Range;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a reader tells the filesystem besides the file and the range
/// ([`FileSystem::read_with`](crate::FileSystem::read_with)).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadCtx<'a> {
    /// Whom the read is for: a server's tenant id, to which what the read makes the
    /// filesystem keep in memory is charged. `None`: nobody in particular.
    pub tenant: Option<u64>,
    /// The open file read through (a 9P fid's state), so sequential reading can be
    /// seen and read ahead of. `None`: a read on its own.
    pub stream: Option<&'a Arc<ReadStream>>,
}

/// Bounds of a readahead window (see [`ReadStream::advance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The first window of a sequential reader, in bytes (at least twice its read).
    pub initial: u64,
    /// The largest window, in bytes.
    pub max: u64,
}

/// One open file's access pattern, as the reads through it show it: kept by whoever
/// holds the open file (one per 9P fid), updated by the filesystem on each read.
///
/// A read that starts where the previous one ended (or a first read at offset 0) is
/// sequential; readahead then stays up to a *window* ahead of the reader, the window
/// doubling each time more is asked for, up to [`Window::max`]. Any other read ends
/// the run: the window closes and the *epoch* moves on, so readahead asked for before
/// is known to be stale ([`ReadStream::epoch`]). Concurrent reads through one open file
/// may see each other's updates half done: the state is a heuristic, never a promise.
#[derive(Debug, Default)]
pub struct ReadStream {
    /// Where a sequential reader's next read starts.
    next: AtomicU64,
    /// The readahead window in bytes (0: not sequential).
    window: AtomicU64,
    /// How far (file offset) readahead was asked for.
    ahead: AtomicU64,
    /// Moved on whenever a sequential run ends.
    epoch: AtomicU64,
    /// Whether any read was seen.
    started: AtomicU64,
}

impl ReadStream {
    /// A stream with no read seen yet.
    pub fn new() -> ReadStream {
        ReadStream::default()
    }

    /// The current epoch: readahead asked for in an earlier one is stale.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    /// The readahead window now, in bytes (0: the reader is not sequential).
    pub fn window(&self) -> u64 {
        self.window.load(Relaxed)
    }

    /// Records a read of `len` bytes at `offset` and returns the file range to read
    /// ahead now, with the epoch it belongs to, if any.
    pub fn advance(&self, offset: u64, len: u64, bounds: Window) -> Option<(Range<u64>, u64)> {
        let end = offset.saturating_add(len);
        let first = self.started.swap(1, Relaxed) == 0;
        let sequential = offset == self.next.swap(end, Relaxed) && (!first || offset == 0);
        if !sequential || len == 0 {
            if self.window.swap(0, Relaxed) != 0 {
                self.ahead.store(0, Relaxed);
                self.epoch.fetch_add(1, Relaxed);
            }
            return None;
        }
        let mut window = self.window.load(Relaxed);
        if window == 0 {
            window = bounds.initial.max(len.saturating_mul(2)).min(bounds.max);
        }
        let ahead = self.ahead.load(Relaxed).max(end);
        if ahead - end >= window / 2 {
            // Enough is on its way.
            self.window.store(window, Relaxed);
            return None;
        }
        let to = end.saturating_add(window);
        self.ahead.store(to, Relaxed);
        self.window
            .store(window.saturating_mul(2).min(bounds.max), Relaxed);
        Some((ahead..to, self.epoch()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window {
        initial: 128 << 10,
        max: 4 << 20,
    };
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_sequential_reader_is_read_ahead_of_in_growing_windows() {
        let s = ReadStream::new();
        let (r, epoch) = s.advance(0, MIB, W).unwrap();
        assert_eq!(r, MIB..3 * MIB);
        // Far enough ahead: nothing more until half the window is left.
        let (r, _) = s.advance(MIB, MIB, W).unwrap();
        assert_eq!(r, 3 * MIB..6 * MIB);
        assert!(s.advance(2 * MIB, MIB, W).is_none());
        assert!(s.advance(3 * MIB, MIB, W).is_none());
        let (r, e) = s.advance(4 * MIB, MIB, W).unwrap();
        assert_eq!((r, e), (6 * MIB..9 * MIB, epoch));
        assert_eq!(s.window(), W.max);
    }

    #[test]
    fn small_reads_start_with_the_initial_window() {
        let s = ReadStream::new();
        let (r, _) = s.advance(0, 4096, W).unwrap();
        assert_eq!(r, 4096..4096 + W.initial);
    }

    #[test]
    fn a_random_read_ends_the_run() {
        let s = ReadStream::new();
        let (_, epoch) = s.advance(0, MIB, W).unwrap();
        assert!(s.advance(10 * MIB, 4096, W).is_none());
        assert_eq!(s.window(), 0);
        assert_ne!(s.epoch(), epoch);
        // A first read elsewhere than 0 is no run either; two in a row are.
        let s = ReadStream::new();
        assert!(s.advance(5 * MIB, MIB, W).is_none());
        assert!(s.advance(6 * MIB, MIB, W).is_some());
    }
}

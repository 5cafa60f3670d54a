//! [`Scratch`]: an encode buffer with a fixed capacity that never allocates.
//!
//! The fsync log encodes records while holding the filesystem's core lock. The buffer is
//! reserved before that lock is taken (btrfs's "preallocate the log extent buffer"
//! idea): writes past the capacity are *counted* instead of stored, so the caller learns
//! exactly how much it needs, drops the lock, reserves that much, and tries again. No
//! method here can grow the vector.

use alloc::vec::Vec;

/// A fixed-capacity byte buffer (see the module documentation).
#[derive(Debug, Default)]
pub struct Scratch {
    buf: Vec<u8>,
    limit: usize,
    /// Bytes that did not fit.
    overflow: usize,
}

impl Scratch {
    /// A buffer holding up to `limit` bytes (allocated now).
    pub fn with_capacity(limit: usize) -> Scratch {
        Scratch {
            buf: Vec::with_capacity(limit),
            limit,
            overflow: 0,
        }
    }

    /// Reuses `buf`'s allocation (cleared); its capacity becomes the limit.
    pub fn from_vec(mut buf: Vec<u8>) -> Scratch {
        buf.clear();
        Scratch {
            limit: buf.capacity(),
            buf,
            overflow: 0,
        }
    }

    /// The capacity.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes stored.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.overflow == 0
    }

    /// Whether some writes did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflow > 0
    }

    /// Bytes all writes so far needed (stored and counted).
    pub fn needed(&self) -> usize {
        self.buf.len() + self.overflow
    }

    /// Forgets the content (keeps the allocation).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.overflow = 0;
    }

    /// Drops everything written after `len` bytes (an abandoned record).
    pub fn truncate(&mut self, len: usize) {
        if self.overflow == 0 {
            self.buf.truncate(len);
        }
    }

    /// The stored bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer, to hand on (its capacity is kept).
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    /// Appends `b`, or counts it if it does not fit (then every later write is only
    /// counted too, so the content never has holes).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        if self.overflow == 0 && self.buf.len() + b.len() <= self.limit {
            let cap = self.buf.capacity();
            self.buf.extend_from_slice(b);
            debug_assert_eq!(cap, self.buf.capacity(), "scratch reallocated");
        } else {
            self.overflow += b.len();
        }
        self
    }

    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Overwrites bytes at `at` (no-op once overflowed past `at`).
    pub fn patch(&mut self, at: usize, b: &[u8]) {
        if at + b.len() <= self.buf.len() {
            self.buf[at..at + b.len()].copy_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_instead_of_growing() {
        let mut s = Scratch::with_capacity(8);
        let ptr = s.buf.as_ptr();
        s.u32(1).u32(2);
        assert!(!s.overflowed());
        s.u8(3).u64(4);
        assert!(s.overflowed());
        assert_eq!(s.len(), 8, "nothing stored past the limit");
        assert_eq!(s.needed(), 17);
        assert_eq!(s.buf.as_ptr(), ptr, "never reallocated");
        assert_eq!(s.buf.capacity(), 8);
        s.clear();
        assert!(s.is_empty() && !s.overflowed());
    }
}

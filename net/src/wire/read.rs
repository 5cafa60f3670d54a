//! `Rread` and `Rreaddir` built in place: the reply frame is allocated first (fallibly:
//! a client's request must never abort the server for want of memory) and the filesystem
//! reads, or the server packs directory entries, straight into its payload, so the data
//! is never copied by the server.

use alloc::collections::TryReserveError;
use alloc::vec::Vec;

use super::{Dirent, EncodeError, Writer, RDATA_HEADER_LEN};

/// Type byte of `Rread`.
const RREAD: u8 = 117;
/// Type byte of `Rreaddir`.
const RREADDIR: u8 = 41;

/// An `Rread` frame under construction.
#[derive(Debug)]
pub struct ReadReply {
    frame: Vec<u8>,
    tag: u16,
}

impl ReadReply {
    /// A reply for `tag` with room for `count` bytes of data, or the allocation error.
    pub fn new(tag: u16, count: u32) -> Result<Self, TryReserveError> {
        let len = RDATA_HEADER_LEN + count as usize;
        let mut frame = Vec::new();
        frame.try_reserve_exact(len)?;
        frame.resize(len, 0);
        Ok(ReadReply { frame, tag })
    }

    /// The payload area the data is read into.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.frame[RDATA_HEADER_LEN..]
    }

    /// The finished frame carrying the first `n` payload bytes (`n` is clamped to the
    /// room asked for in [`ReadReply::new`]).
    pub fn finish(mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.frame.len() - RDATA_HEADER_LEN);
        self.frame.truncate(RDATA_HEADER_LEN + n);
        finish_data_frame(&mut self.frame, RREAD, self.tag);
        self.frame
    }
}

/// An `Rreaddir` frame under construction: entries are appended up to a byte count.
#[derive(Debug)]
pub struct ReaddirReply {
    frame: Vec<u8>,
    tag: u16,
    count: usize,
}

impl ReaddirReply {
    /// A reply for `tag` that holds at most `count` bytes of entries, or the allocation
    /// error.
    pub fn new(tag: u16, count: u32) -> Result<Self, TryReserveError> {
        let count = count as usize;
        let mut frame = Vec::new();
        frame.try_reserve_exact(RDATA_HEADER_LEN + count)?;
        frame.resize(RDATA_HEADER_LEN, 0);
        Ok(ReaddirReply { frame, tag, count })
    }

    /// Bytes of entries packed so far.
    pub fn len(&self) -> usize {
        self.frame.len() - RDATA_HEADER_LEN
    }

    /// Whether no entry is packed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of room left.
    pub fn room(&self) -> usize {
        self.count - self.len()
    }

    /// Appends `entry` if it fits; returns whether it did.
    pub fn push(&mut self, entry: &Dirent<'_>) -> Result<bool, EncodeError> {
        if entry.encoded_len() > self.room() {
            return Ok(false);
        }
        entry.encode(&mut self.frame)?;
        Ok(true)
    }

    /// The finished frame.
    pub fn finish(mut self) -> Vec<u8> {
        finish_data_frame(&mut self.frame, RREADDIR, self.tag);
        self.frame
    }
}

/// Writes the `size[4] type[1] tag[2] count[4]` header of a data reply whose payload
/// follows it in `frame`.
fn finish_data_frame(frame: &mut [u8], ty: u8, tag: u16) {
    let mut header = Vec::with_capacity(RDATA_HEADER_LEN);
    let mut w = Writer::new(&mut header);
    w.u32(frame.len() as u32);
    w.u8(ty);
    w.u16(tag);
    w.u32((frame.len() - RDATA_HEADER_LEN) as u32);
    frame[..RDATA_HEADER_LEN].copy_from_slice(&header);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{msg::Data, Qid, Rmsg};

    #[test]
    fn in_place_reply_decodes_as_rread() {
        let mut r = ReadReply::new(9, 10).unwrap();
        r.data_mut()[..3].copy_from_slice(b"abc");
        let frame = r.finish(3);
        assert_eq!(
            Rmsg::decode(&frame),
            Ok((9, Rmsg::Read { data: Data(b"abc") }))
        );
    }

    #[test]
    fn readdir_reply_packs_until_full() {
        let entry = |name: &'static [u8]| Dirent {
            qid: Qid::default(),
            offset: 1,
            dtype: 8,
            name,
        };
        let one = entry(b"abc").encoded_len();
        let mut r = ReaddirReply::new(4, (2 * one + 1) as u32).unwrap();
        assert!(r.push(&entry(b"abc")).unwrap());
        assert!(r.push(&entry(b"def")).unwrap());
        assert!(!r.push(&entry(b"ghi")).unwrap());
        assert_eq!(r.len(), 2 * one);
        let frame = r.finish();
        let Ok((4, Rmsg::Readdir { data })) = Rmsg::decode(&frame) else {
            panic!("not an Rreaddir");
        };
        assert_eq!(data.0.len(), 2 * one);
    }
}

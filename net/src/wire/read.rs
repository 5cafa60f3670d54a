//! `Rread` built in place: the reply frame is allocated first and the filesystem reads
//! straight into its payload, so read data is never copied by the server.

use alloc::vec;
use alloc::vec::Vec;

use super::{Writer, RDATA_HEADER_LEN};

/// Type byte of `Rread`.
const RREAD: u8 = 117;

/// An `Rread` frame under construction.
#[derive(Debug)]
pub struct ReadReply {
    frame: Vec<u8>,
    tag: u16,
}

impl ReadReply {
    /// A reply for `tag` with room for `count` bytes of data.
    pub fn new(tag: u16, count: u32) -> Self {
        ReadReply {
            frame: vec![0; RDATA_HEADER_LEN + count as usize],
            tag,
        }
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
        let size = self.frame.len() as u32;
        let mut header = Vec::with_capacity(RDATA_HEADER_LEN);
        let mut w = Writer::new(&mut header);
        w.u32(size);
        w.u8(RREAD);
        w.u16(self.tag);
        w.u32(n as u32);
        self.frame[..RDATA_HEADER_LEN].copy_from_slice(&header);
        self.frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{msg::Data, Rmsg};

    #[test]
    fn in_place_reply_decodes_as_rread() {
        let mut r = ReadReply::new(9, 10);
        r.data_mut()[..3].copy_from_slice(b"abc");
        let frame = r.finish(3);
        assert_eq!(
            Rmsg::decode(&frame),
            Ok((9, Rmsg::Read { data: Data(b"abc") }))
        );
    }
}

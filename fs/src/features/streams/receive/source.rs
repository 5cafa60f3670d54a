//! Where a stream comes from ([`StreamSource`], read twice) and its records as they are
//! read ([`Records`]).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::features::streams::receive::validate::Validator;
use crate::features::streams::receive::ReceiveError;
use crate::format::stream::{Decoder, Header, Record, StreamError};
use vfs::Errno;

/// A stream the receiver reads twice: once to check it whole, then to apply it.
#[allow(async_fn_in_trait)]
pub trait StreamSource {
    /// Goes back to the stream's start.
    async fn rewind(&mut self) -> Result<(), Errno>;
    /// Reads the next bytes into `buf`; how many (0: the end).
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno>;
}

/// A stream in memory.
#[derive(Debug)]
pub struct InMemory<'a> {
    /// The stream.
    bytes: &'a [u8],
    /// Where the next read starts.
    at: usize,
}

impl<'a> InMemory<'a> {
    /// The stream `bytes`.
    pub fn new(bytes: &'a [u8]) -> InMemory<'a> {
        InMemory { bytes, at: 0 }
    }
}

impl StreamSource for InMemory<'_> {
    async fn rewind(&mut self) -> Result<(), Errno> {
        self.at = 0;
        Ok(())
    }

    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = buf.len().min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The records of a source, read a chunk at a time through a [`Decoder`] and checked
/// by a [`Validator`].
pub(super) struct Records<'a, S: StreamSource> {
    /// The source, to start it again after the pass.
    pub(super) src: &'a mut S,
    /// The framing: checksums and trailer.
    decoder: Decoder,
    /// Records decoded, not yet returned.
    pending: VecDeque<Record>,
    /// Checks every record after BEGIN (which gives the stream's kind).
    validator: Option<Validator>,
    /// The buffer a read fills.
    chunk: Vec<u8>,
}

impl<'a, S: StreamSource> Records<'a, S> {
    /// From the start of `src`: the records and the header.
    pub(super) async fn start(src: &'a mut S) -> Result<(Self, Header), ReceiveError> {
        src.rewind().await?;
        let mut r = Records {
            src,
            decoder: Decoder::new(),
            pending: VecDeque::new(),
            validator: None,
            chunk: alloc::vec![0; 64 * 1024],
        };
        match r.next().await? {
            Some(Record::Begin(h)) => {
                r.validator = Some(Validator::new(&h));
                Ok((r, h))
            }
            _ => Err(ReceiveError::Stream(StreamError::Malformed(0))),
        }
    }

    /// The next record, checked on its own (`None`: the stream ended, whole).
    pub(super) async fn next(&mut self) -> Result<Option<Record>, ReceiveError> {
        while self.pending.is_empty() {
            let n = self.src.read(&mut self.chunk).await?;
            if n == 0 {
                self.decoder.finish().map_err(ReceiveError::Stream)?;
                return Ok(None);
            }
            let recs = self
                .decoder
                .push(&self.chunk[..n])
                .map_err(ReceiveError::Stream)?;
            self.pending.extend(recs);
        }
        let r = self.pending.pop_front();
        if let (Some(v), Some(r)) = (&mut self.validator, &r) {
            v.check(r)?;
        }
        Ok(r)
    }
}

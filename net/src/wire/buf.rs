//! Bounds-checked little-endian cursors over 9P frames.
//!
//! Every read checks the remaining length first and fails with [`DecodeError::Truncated`]
//! instead of panicking; every write checks the 9P field limits (16-bit string lengths,
//! 32-bit counts) and fails with an [`EncodeError`].

use alloc::vec::Vec;

use super::{DecodeError, EncodeError};

/// A read cursor over one frame's bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.bytes.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a 9P string: `len[2]` then `len` bytes (not necessarily UTF-8).
    pub fn string(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// Reads counted data: `count[4]` then `count` bytes.
    pub fn data(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()?;
        let len = usize::try_from(len).map_err(|_| DecodeError::Truncated)?;
        self.take(len)
    }
}

/// An append cursor building one frame.
#[derive(Debug)]
pub struct Writer<'v> {
    out: &'v mut Vec<u8>,
}

impl<'v> Writer<'v> {
    /// Appends to `out`.
    pub fn new(out: &'v mut Vec<u8>) -> Self {
        Writer { out }
    }

    /// Appends a `u8`.
    pub fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.out.extend_from_slice(v);
    }

    /// Appends a 9P string (`len[2]` + bytes).
    pub fn string(&mut self, v: &[u8]) -> Result<(), EncodeError> {
        let len = u16::try_from(v.len()).map_err(|_| EncodeError::StringTooLong(v.len()))?;
        self.u16(len);
        self.bytes(v);
        Ok(())
    }

    /// Appends counted data (`count[4]` + bytes).
    pub fn data(&mut self, v: &[u8]) -> Result<(), EncodeError> {
        let len = u32::try_from(v.len()).map_err(|_| EncodeError::TooLarge(v.len()))?;
        self.u32(len);
        self.bytes(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_fail_without_consuming_garbage() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16(), Ok(0x0201));
        assert_eq!(r.u16(), Err(DecodeError::Truncated));
        assert_eq!(r.u8(), Ok(3));
        assert_eq!(r.u8(), Err(DecodeError::Truncated));
    }

    #[test]
    fn string_length_that_lies_is_truncation() {
        let mut r = Reader::new(&[5, 0, b'a', b'b']);
        assert_eq!(r.string(), Err(DecodeError::Truncated));
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert_eq!(r.data(), Err(DecodeError::Truncated));
    }

    #[test]
    fn overlong_string_is_an_encode_error() {
        let mut v = Vec::new();
        let long = alloc::vec![0u8; 65536];
        assert_eq!(
            Writer::new(&mut v).string(&long),
            Err(EncodeError::StringTooLong(65536))
        );
    }
}

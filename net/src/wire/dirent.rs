//! Directory entries as `Rreaddir` packs them: `qid[13] offset[8] type[1] name[s]`.

use alloc::vec::Vec;

use super::{DecodeError, EncodeError, Qid, Reader, Writer, QID_LEN};

/// One packed directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent<'a> {
    /// The entry's qid.
    pub qid: Qid,
    /// Offset to resume reading *after* this entry.
    pub offset: u64,
    /// `DT_*` type.
    pub dtype: u8,
    /// Entry name.
    pub name: &'a [u8],
}

impl<'a> Dirent<'a> {
    /// Encoded length of this entry.
    pub fn encoded_len(&self) -> usize {
        QID_LEN + 8 + 1 + 2 + self.name.len()
    }

    /// Appends this entry to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut w = Writer::new(out);
        self.qid.encode(&mut w);
        w.u64(self.offset);
        w.u8(self.dtype);
        w.string(self.name)
    }
}

/// Iterates over the entries packed in an `Rreaddir`'s data; yields an error (once) for
/// a truncated entry.
#[derive(Debug, Clone)]
pub struct DirentIter<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> DirentIter<'a> {
    /// Entries in `data`.
    pub fn new(data: &'a [u8]) -> Self {
        DirentIter {
            r: Reader::new(data),
            failed: false,
        }
    }
}

impl<'a> Iterator for DirentIter<'a> {
    type Item = Result<Dirent<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.remaining() == 0 {
            return None;
        }
        let entry = (|| {
            Ok(Dirent {
                qid: Qid::decode(&mut self.r)?,
                offset: self.r.u64()?,
                dtype: self.r.u8()?,
                name: self.r.string()?,
            })
        })();
        self.failed = entry.is_err();
        Some(entry)
    }
}

//! The small envelope every target's input is cut with: a flags byte, then pieces, each
//! a little-endian `u16` length and that many bytes (the last piece may be cut short:
//! it takes what is left). Simple enough that libFuzzer's byte mutations keep most
//! inputs meaningful, and that seeds are easy to write.

/// An input cut into its flags byte and pieces.
#[derive(Debug)]
pub struct Envelope<'a> {
    /// The first byte (0 for an empty input).
    pub flags: u8,
    rest: &'a [u8],
}

impl<'a> Envelope<'a> {
    /// Cuts `data`.
    pub fn new(data: &'a [u8]) -> Envelope<'a> {
        match data.split_first() {
            Some((&flags, rest)) => Envelope { flags, rest },
            None => Envelope {
                flags: 0,
                rest: &[],
            },
        }
    }

    /// What follows the flags byte, whole.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// The pieces, at most `max` of them.
    pub fn pieces(&self, max: usize) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut r = self.rest;
        while r.len() >= 2 && out.len() < max {
            let n = u16::from_le_bytes([r[0], r[1]]) as usize;
            let n = n.min(r.len() - 2);
            out.push(&r[2..2 + n]);
            r = &r[2 + n..];
        }
        out
    }
}

/// Encodes `flags` and `pieces` the way [`Envelope`] cuts them (for seeds).
pub fn encode(flags: u8, pieces: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![flags];
    for p in pieces {
        let n = u16::try_from(p.len()).expect("a piece fits a u16 length");
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// Reads little-endian integers from a byte string, giving zeros past its end.
#[derive(Debug)]
pub struct Bytes<'a> {
    b: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// Reads `b`.
    pub fn new(b: &'a [u8]) -> Bytes<'a> {
        Bytes { b }
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.b.len()
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.b.len());
        let (h, t) = self.b.split_at(n);
        self.b = t;
        h
    }

    /// A `u8` (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        let mut a = [0u8; 2];
        let t = self.take(2);
        a[..t.len()].copy_from_slice(t);
        u16::from_le_bytes(a)
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        let mut a = [0u8; 4];
        let t = self.take(4);
        a[..t.len()].copy_from_slice(t);
        u32::from_le_bytes(a)
    }
}

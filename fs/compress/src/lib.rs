//! Compression of the filesystem's data extents (issue 38; docs/decisions.md, D11):
//! LZ4 (`lz4_flex`, safe Rust only).
//!
//! An extent of at most [`MAX_EXTENT_LOGICAL`] logical bytes is compressed whole, and
//! stored compressed only if that saves at least one filesystem block
//! ([`compress_extent`]); otherwise the caller stores it plain. The stored bytes describe
//! themselves ([`Header`]): magic, algorithm, level, logical and payload lengths, then the
//! payload, zero-padded to whole blocks.
//!
//! Decompression ([`decompress_extent`]) treats the stored bytes as hostile: they come
//! from a disk that may be damaged or forged. Every length is checked against the
//! caller's logical length and the stored length, a stream that decodes past or short
//! of the logical length is an error, and the work and memory spent are bounded by the
//! logical length (at most [`MAX_EXTENT_LOGICAL`]) and the stored length, never by a
//! length read from the input. Errors are [`CorruptExtent`]s, never panics.
//!
//! `no_std` + `alloc`, no `unsafe`, no hardware: tested on the host.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// The largest extent, in logical bytes, that is compressed as one unit: 32 blocks of
/// 4 KiB. A 4 KiB read of a compressed extent decompresses at most this much.
pub const MAX_EXTENT_LOGICAL: usize = 128 * 1024;

/// Identifies compressed extents; an extent whose first bytes differ is corrupt.
pub const MAGIC: [u8; 2] = *b"Nz";

/// A compression algorithm: what an export compresses new data with, and what a stored
/// extent was compressed with.
///
/// Only LZ4 for now: zstd was measured and not taken (D11: the pure-Rust encoder,
/// ruzstd 0.9, has only zstd's level 1, at a fifth to a ninth of LZ4's speed for
/// 3-9% more ratio). Its on-disk code, 2, is reserved for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// LZ4 block format (`lz4_flex`): fast both ways, a modest ratio.
    Lz4,
}

/// On-disk algorithm codes. Stable: stored in every compressed extent's header. Code 0
/// is never used, so a zeroed header is never mistaken for a compressed extent; code 2
/// is reserved for zstd.
const CODE_LZ4: u8 = 1;

impl Algorithm {
    /// The algorithm's stable on-disk code (the header's algorithm byte).
    pub fn code(&self) -> u8 {
        match self {
            Algorithm::Lz4 => CODE_LZ4,
        }
    }

    /// The level stored beside the code: 0 for LZ4, which has none (a byte kept for
    /// algorithms that have levels).
    pub fn level(&self) -> u8 {
        match self {
            Algorithm::Lz4 => 0,
        }
    }

    /// The algorithm a header's code and level name, if this crate knows it.
    pub fn from_code(code: u8, level: u8) -> Option<Self> {
        match (code, level) {
            (CODE_LZ4, 0) => Some(Algorithm::Lz4),
            _ => None,
        }
    }

    /// Parses an export's `compress=` value: `lz4`, or `off` (`Ok(None)`). `zstd` and
    /// `zstd:LEVEL` are recognised and refused as unavailable (D11).
    pub fn parse(text: &str) -> Result<Option<Self>, ParseError> {
        match text {
            "off" => Ok(None),
            "lz4" => Ok(Some(Algorithm::Lz4)),
            "zstd" => Err(ParseError::ZstdUnavailable),
            _ if text.starts_with("zstd:") => Err(ParseError::ZstdUnavailable),
            _ => Err(ParseError::UnknownAlgorithm),
        }
    }
}

impl fmt::Display for Algorithm {
    /// The form [`Algorithm::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::Lz4 => f.write_str("lz4"),
        }
    }
}

/// Why a `compress=` value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Not `lz4` or `off`.
    UnknownAlgorithm,
    /// `zstd` or `zstd:LEVEL`: not offered (D11).
    ZstdUnavailable,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::UnknownAlgorithm => f.write_str("expected lz4 or off"),
            ParseError::ZstdUnavailable => {
                f.write_str("zstd is not available (docs/decisions.md, D11): use lz4")
            }
        }
    }
}

/// What a stored extent was found to be wrong with: a short static reason, for the
/// error the read returns and the corruption counter it bumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorruptExtent(pub &'static str);

impl fmt::Display for CorruptExtent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt compressed extent: {}", self.0)
    }
}

/// The self-describing header at the start of a compressed extent's stored bytes. All
/// integers little-endian.
///
/// | bytes | field |
/// |---|---|
/// | 0..2 | [`MAGIC`] |
/// | 2 | algorithm code ([`Algorithm::code`]) |
/// | 3 | level ([`Algorithm::level`]) |
/// | 4..8 | logical length (bytes the payload decompresses to) |
/// | 8..12 | payload length (compressed bytes after the header) |
///
/// The padding after the payload, to the end of the last block, is zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The algorithm and level the payload was compressed with.
    pub algorithm: Algorithm,
    /// Bytes the payload decompresses to.
    pub logical_len: u32,
    /// Bytes of compressed payload after the header.
    pub payload_len: u32,
}

impl Header {
    /// Encoded size of the header.
    pub const LEN: usize = 12;

    /// The header's bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut bytes = [0u8; Self::LEN];
        bytes[0..2].copy_from_slice(&MAGIC);
        bytes[2] = self.algorithm.code();
        bytes[3] = self.algorithm.level();
        bytes[4..8].copy_from_slice(&self.logical_len.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        bytes
    }

    /// Reads the header at the start of `stored`, checking only what the header alone
    /// can say (magic, a known algorithm); lengths are checked by [`decompress_extent`].
    pub fn decode(stored: &[u8]) -> Result<Self, CorruptExtent> {
        let bytes: &[u8; Self::LEN] = stored
            .get(..Self::LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(CorruptExtent("shorter than its header"))?;
        if bytes[0..2] != MAGIC {
            return Err(CorruptExtent("bad magic"));
        }
        let algorithm = Algorithm::from_code(bytes[2], bytes[3])
            .ok_or(CorruptExtent("unknown algorithm code"))?;
        let le32 = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        Ok(Header {
            algorithm,
            logical_len: le32(4),
            payload_len: le32(8),
        })
    }
}

/// Compresses one extent of `logical` bytes (1..=[`MAX_EXTENT_LOGICAL`]) for storage in
/// blocks of `block_size` bytes.
///
/// Returns the bytes to store — [`Header`], payload, zeros up to a whole number of
/// blocks — only if they take at least one block fewer than `logical` does; `None`
/// means store the extent plain (incompressible, too short to save a block, or an
/// extent or block size out of range).
pub fn compress_extent(algorithm: Algorithm, logical: &[u8], block_size: usize) -> Option<Vec<u8>> {
    if logical.is_empty() || logical.len() > MAX_EXTENT_LOGICAL || block_size == 0 {
        return None;
    }
    let logical_blocks = logical.len().div_ceil(block_size);
    // The most the stored form may take: one block fewer than the plain form.
    let budget = logical_blocks.checked_sub(1)?.checked_mul(block_size)?;
    let payload_budget = budget.checked_sub(Header::LEN)?;
    let mut stored;
    let payload_len = match algorithm {
        Algorithm::Lz4 => {
            // lz4_flex wants room for the worst case before it starts (about 110% of
            // the input), not just the budget.
            stored =
                vec![0u8; Header::LEN + lz4_flex::block::get_maximum_output_size(logical.len())];
            lz4_flex::block::compress_into(logical, &mut stored[Header::LEN..]).ok()?
        }
    };
    if payload_len > payload_budget {
        return None;
    }
    let header = Header {
        algorithm,
        logical_len: u32::try_from(logical.len()).ok()?,
        payload_len: u32::try_from(payload_len).ok()?,
    };
    stored[..Header::LEN].copy_from_slice(&header.encode());
    let stored_len = (Header::LEN + payload_len).div_ceil(block_size) * block_size;
    stored.resize(stored_len, 0);
    Some(stored)
}

/// Decompresses a stored extent (what [`compress_extent`] returned, read back from the
/// disk, possibly damaged or forged) into exactly `out.len()` logical bytes.
///
/// Every length in `stored` is checked: the header's logical length must be
/// `out.len()` (at most [`MAX_EXTENT_LOGICAL`]), its payload must lie within `stored`,
/// and the payload must decompress to exactly `out.len()` bytes.
/// Nothing is allocated: LZ4 decodes straight into `out`, and work is bounded by
/// `stored.len()` and `out.len()`. On error, `out` holds unspecified bytes.
pub fn decompress_extent(stored: &[u8], out: &mut [u8]) -> Result<(), CorruptExtent> {
    if out.is_empty() || out.len() > MAX_EXTENT_LOGICAL {
        return Err(CorruptExtent("logical length out of range"));
    }
    let header = Header::decode(stored)?;
    if usize::try_from(header.logical_len).ok() != Some(out.len()) {
        return Err(CorruptExtent("logical length differs from the extent's"));
    }
    let payload_len = usize::try_from(header.payload_len)
        .map_err(|_| CorruptExtent("payload past the stored bytes"))?;
    let payload_end = Header::LEN
        .checked_add(payload_len)
        .ok_or(CorruptExtent("payload past the stored bytes"))?;
    let payload = stored
        .get(Header::LEN..payload_end)
        .ok_or(CorruptExtent("payload past the stored bytes"))?;
    match header.algorithm {
        Algorithm::Lz4 => decompress_lz4(payload, out),
    }
}

fn decompress_lz4(payload: &[u8], out: &mut [u8]) -> Result<(), CorruptExtent> {
    // checked-decode: lz4_flex bounds every copy by `out` and by `payload`, so a forged
    // stream gives an error; writing past `out` is OutputTooSmall.
    let written = lz4_flex::block::decompress_into(payload, out).map_err(|e| match e {
        lz4_flex::block::DecompressError::OutputTooSmall { .. } => {
            CorruptExtent("payload decompresses past the logical length")
        }
        _ => CorruptExtent("malformed lz4 payload"),
    })?;
    if written != out.len() {
        return Err(CorruptExtent(
            "payload decompresses short of the logical length",
        ));
    }
    Ok(())
}

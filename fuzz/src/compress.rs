//! `compress`: the compressed extents of `ninefold-compress` (`compress_extent`,
//! `decompress_extent`). A compressed extent is read back from the disk, where a
//! damaged or forged one may lie behind a valid checksum (the filesystem checksums the
//! stored bytes, so a forger reseals them).
//!
//! Input: a flags byte, a little-endian `u16` n giving the logical length
//! (`1 + 3n mod 128 KiB`: 1 byte to 128 KiB), then the rest. Flags bit 0: the rest is *logical data*: compressed, and if stored
//! compressed, decompressed again. Otherwise the rest is *stored bytes*, decompressed
//! into the logical length; bit 1 writes a valid header over them first (magic, LZ4,
//! the logical length, and with bit 2 the payload length of what follows), so the
//! mutations reach the LZ4 decoder rather than the header checks.
//!
//! Checked: no panic, no out-of-bounds access, no allocation beyond the output; a
//! round trip gives the data back, in whole blocks that save at least one.

use compress::{compress_extent, decompress_extent, Algorithm, Header, MAX_EXTENT_LOGICAL};

use crate::envelope::Envelope;

const BLOCK: usize = 4096;

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let rest = env.rest();
    let (len, rest) = match rest {
        [a, b, rest @ ..] => (
            1 + usize::from(u16::from_le_bytes([*a, *b])) * 3 % MAX_EXTENT_LOGICAL,
            rest,
        ),
        _ => (1, rest),
    };
    if env.flags & 1 != 0 {
        let logical = &rest[..rest.len().min(MAX_EXTENT_LOGICAL)];
        if let Some(stored) = compress_extent(Algorithm::Lz4, logical, BLOCK) {
            assert_eq!(stored.len() % BLOCK, 0);
            assert!(stored.len() / BLOCK < logical.len().div_ceil(BLOCK));
            let mut out = vec![0; logical.len()];
            decompress_extent(&stored, &mut out).expect("a stored extent decompresses");
            assert!(out == logical, "round trip changed the data");
        }
        return;
    }
    let mut stored = rest.to_vec();
    if env.flags & 2 != 0 && stored.len() >= Header::LEN {
        let payload_len = if env.flags & 4 != 0 {
            (stored.len() - Header::LEN) as u32
        } else {
            Header::decode(&stored).map_or(0, |h| h.payload_len)
        };
        let header = Header {
            algorithm: Algorithm::Lz4,
            logical_len: len as u32,
            payload_len,
        };
        stored[..Header::LEN].copy_from_slice(&header.encode());
    }
    let mut out = vec![0; len];
    let _ = decompress_extent(&stored, &mut out);
}

/// Seeds: compressible, mixed and random extents as logical data, and the stored forms
/// of the compressible ones (whole, truncated, with a forged logical length).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let text: Vec<u8> = (0..64 * 1024)
        .map(|i: u32| {
            b"extent block fsync log the of 9P {};\n"[(i as usize * 7 + i as usize / 37) % 37]
        })
        .collect();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let noise: Vec<u8> = (0..32 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let mut mixed = text[..32 * 1024].to_vec();
    mixed.extend_from_slice(&noise);
    let length_field = |bytes: usize| {
        u16::try_from(bytes.div_ceil(3))
            .expect("fits")
            .to_le_bytes()
    };
    let logical = |name: &str, data: &[u8]| {
        let mut input = vec![1u8];
        input.extend_from_slice(&length_field(data.len()));
        input.extend_from_slice(data);
        (name.to_string(), input)
    };
    let stored = |name: &str, flags: u8, len: usize, bytes: &[u8]| {
        let mut input = vec![flags];
        // `1 + n * 3 % MAX`: n = (len - 1) / 3 gives len when len - 1 is a multiple of 3.
        input.extend_from_slice(&u16::try_from((len - 1) / 3).expect("fits").to_le_bytes());
        input.extend_from_slice(bytes);
        (name.to_string(), input)
    };
    // 64 KiB: a length the formula reaches exactly (n = 21845).
    let len = 1 + 21845 * 3;
    let whole = compress_extent(Algorithm::Lz4, &text[..len], BLOCK).expect("compressible");
    let payload_end = Header::LEN + Header::decode(&whole).expect("header").payload_len as usize;
    vec![
        logical("text", &text),
        logical("mixed", &mixed),
        logical("noise", &noise),
        logical("zeros", &[0; 16 * 1024]),
        stored("stored", 0, len, &whole),
        stored("stored-resealed", 2, len, &whole[..payload_end]),
        stored("stored-truncated", 6, len, &whole[..payload_end / 2]),
        stored("stored-longer", 2, len + 3 * 1024, &whole),
    ]
}

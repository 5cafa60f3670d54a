//! Round trips, the one-block rule, the `compress=` parser and hostile stored extents.

use compress::{
    compress_extent, decompress_extent, Algorithm, CorruptExtent, Header, ParseError,
    MAX_EXTENT_LOGICAL,
};
use proptest::prelude::*;

const BLOCK: usize = 4096;
const ALGORITHMS: [Algorithm; 1] = [Algorithm::Lz4];

/// Deterministic pseudo-random bytes (incompressible).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Text-like bytes: words from a small vocabulary (compressible).
fn words(len: usize, seed: u64) -> Vec<u8> {
    const VOCAB: [&str; 8] = [
        "extent ", "block ", "fsync ", "log\n", "the ", "of ", "9P ", "{}; ",
    ];
    let choices = noise(len, seed);
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(VOCAB[choices[i % len] as usize % VOCAB.len()].as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

fn round_trip(algorithm: Algorithm, logical: &[u8]) -> Option<usize> {
    let stored = compress_extent(algorithm, logical, BLOCK)?;
    assert_eq!(stored.len() % BLOCK, 0, "stored in whole blocks");
    assert!(
        stored.len() / BLOCK < logical.len().div_ceil(BLOCK),
        "saves at least one block"
    );
    let mut out = vec![0xA5; logical.len()];
    decompress_extent(&stored, &mut out).expect("a stored extent decompresses");
    assert!(out == logical, "round trip changed the data");
    Some(stored.len())
}

/// A kind of extent content, and how long (1..=32 blocks, or a byte count).
fn extent_data() -> impl Strategy<Value = Vec<u8>> {
    let len = prop_oneof![
        (1usize..=32).prop_map(|blocks| blocks * BLOCK),
        1usize..=MAX_EXTENT_LOGICAL,
    ];
    (len, any::<u64>(), 0u8..4, 1usize..=31).prop_map(|(len, seed, kind, split)| match kind {
        0 => words(len, seed),
        1 => noise(len, seed),
        2 => vec![0; len],
        // Mixed: compressible blocks, then random ones.
        _ => {
            let at = (split * BLOCK).min(len);
            let mut data = words(at, seed);
            data.extend(noise(len - at, seed));
            data
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trips(data in extent_data()) {
        for algorithm in ALGORITHMS {
            round_trip(algorithm, &data);
        }
    }

    /// Whatever follows a valid header, decompression returns (an error or not) without
    /// panicking, and never says a wrong length is right.
    #[test]
    fn garbage_payload_is_an_error_or_exact(
        payload in proptest::collection::vec(any::<u8>(), 0..2048),
        logical_len in 1usize..=MAX_EXTENT_LOGICAL,
    ) {
        for algorithm in ALGORITHMS {
            let header = Header {
                algorithm,
                logical_len: logical_len as u32,
                payload_len: payload.len() as u32,
            };
            let mut stored = header.encode().to_vec();
            stored.extend_from_slice(&payload);
            let mut out = vec![0; logical_len];
            let _ = decompress_extent(&stored, &mut out);
        }
    }

    /// Any bytes at all, decompressed into any length: no panic.
    #[test]
    fn arbitrary_stored_bytes(
        stored in proptest::collection::vec(any::<u8>(), 0..256),
        logical_len in 0usize..=MAX_EXTENT_LOGICAL + 1,
    ) {
        let mut out = vec![0; logical_len];
        let _ = decompress_extent(&stored, &mut out);
    }
}

#[test]
fn every_size_and_kind_from_one_block_to_thirty_two() {
    for algorithm in ALGORITHMS {
        for blocks in 1..=32 {
            let len = blocks * BLOCK;
            // All zeros: one block holds the header and payload, so it compresses from
            // two blocks up; a one-block extent can never save a block.
            let zeros = round_trip(algorithm, &vec![0; len]);
            assert_eq!(zeros.is_some(), blocks > 1, "{blocks} blocks of zeros");
            if blocks > 1 {
                assert_eq!(zeros, Some(BLOCK));
            }
            let text = round_trip(algorithm, &words(len, blocks as u64));
            assert_eq!(text.is_some(), blocks > 1, "{blocks} blocks of text");
            assert_eq!(round_trip(algorithm, &noise(len, blocks as u64)), None);
        }
    }
}

#[test]
fn incompressible_data_is_stored_plain() {
    for algorithm in ALGORITHMS {
        let random = noise(MAX_EXTENT_LOGICAL, 7);
        assert_eq!(compress_extent(algorithm, &random, BLOCK), None);
        // Half compressible, half random: saves blocks, so it is compressed.
        let mut mixed = vec![0; MAX_EXTENT_LOGICAL / 2];
        mixed.extend(noise(MAX_EXTENT_LOGICAL / 2, 8));
        let stored = compress_extent(algorithm, &mixed, BLOCK).expect("saves blocks");
        assert!(stored.len() <= MAX_EXTENT_LOGICAL / 2 + 2 * BLOCK);
        // Compressible, but not by a whole block: plain.
        let mut almost = noise(8 * BLOCK - 100, 9);
        almost.extend(vec![0; 100]);
        assert_eq!(compress_extent(algorithm, &almost, BLOCK), None);
    }
}

#[test]
fn out_of_range_extents_are_not_compressed() {
    assert_eq!(compress_extent(Algorithm::Lz4, &[], BLOCK), None);
    assert_eq!(
        compress_extent(Algorithm::Lz4, &vec![0; MAX_EXTENT_LOGICAL + 1], BLOCK),
        None
    );
    assert_eq!(compress_extent(Algorithm::Lz4, &[0; 8192], 0), None);
}

#[test]
fn codes_and_parsing() {
    assert_eq!(Algorithm::Lz4.code(), 1);
    assert_eq!(Algorithm::from_code(1, 0), Some(Algorithm::Lz4));
    assert_eq!(Algorithm::from_code(1, 3), None);
    for code in [0, 2, 3, 255] {
        assert_eq!(Algorithm::from_code(code, 0), None, "code {code}");
    }
    assert_eq!(Algorithm::parse("lz4"), Ok(Some(Algorithm::Lz4)));
    assert_eq!(Algorithm::parse("off"), Ok(None));
    assert_eq!(
        Algorithm::parse(&Algorithm::Lz4.to_string()),
        Ok(Some(Algorithm::Lz4))
    );
    for zstd in ["zstd", "zstd:1", "zstd:3", "zstd:99999"] {
        assert_eq!(
            Algorithm::parse(zstd),
            Err(ParseError::ZstdUnavailable),
            "{zstd}"
        );
    }
    for bad in ["", "LZ4", "lz4:1", "gzip", "on", " lz4", "zstd1"] {
        assert_eq!(
            Algorithm::parse(bad),
            Err(ParseError::UnknownAlgorithm),
            "{bad:?}"
        );
    }
}

/// A valid stored extent of `len` compressible bytes, and those bytes.
fn valid(len: usize) -> (Vec<u8>, Vec<u8>) {
    let data = words(len, 42);
    let stored = compress_extent(Algorithm::Lz4, &data, BLOCK).expect("compressible");
    (stored, data)
}

fn header_of(stored: &[u8]) -> Header {
    Header::decode(stored).expect("valid header")
}

fn with_header(stored: &[u8], header: Header) -> Vec<u8> {
    let mut forged = stored.to_vec();
    forged[..Header::LEN].copy_from_slice(&header.encode());
    forged
}

fn decompress(stored: &[u8], len: usize) -> Result<(), CorruptExtent> {
    decompress_extent(stored, &mut vec![0; len])
}

#[test]
fn forged_payload_length_past_the_stored_bytes() {
    let (stored, data) = valid(16 * BLOCK);
    let header = header_of(&stored);
    for payload_len in [stored.len() as u32 - 11, u32::MAX - 11, u32::MAX] {
        let forged = with_header(
            &stored,
            Header {
                payload_len,
                ..header
            },
        );
        assert_eq!(
            decompress(&forged, data.len()),
            Err(CorruptExtent("payload past the stored bytes")),
            "payload_len {payload_len}"
        );
    }
}

#[test]
fn forged_payload_length_cutting_the_stream_short() {
    let (stored, data) = valid(16 * BLOCK);
    let header = header_of(&stored);
    for payload_len in [0, 1, header.payload_len / 2, header.payload_len - 1] {
        let forged = with_header(
            &stored,
            Header {
                payload_len,
                ..header
            },
        );
        assert!(
            decompress(&forged, data.len()).is_err(),
            "payload_len {payload_len}"
        );
    }
}

#[test]
fn forged_logical_length() {
    let (stored, data) = valid(16 * BLOCK);
    let header = header_of(&stored);
    // The header must agree with the extent's logical length.
    for logical_len in [0, 1, data.len() as u32 - 1, data.len() as u32 + 1, u32::MAX] {
        let forged = with_header(
            &stored,
            Header {
                logical_len,
                ..header
            },
        );
        assert_eq!(
            decompress(&forged, data.len()),
            Err(CorruptExtent("logical length differs from the extent's")),
        );
    }
    // The caller's length is bounded too, whatever the header says.
    for len in [0, MAX_EXTENT_LOGICAL + 1] {
        let forged = with_header(
            &stored,
            Header {
                logical_len: len as u32,
                ..header
            },
        );
        assert_eq!(
            decompress(&forged, len),
            Err(CorruptExtent("logical length out of range"))
        );
    }
}

#[test]
fn stream_decompressing_past_the_logical_length() {
    // A real stream of 16 blocks, under a header (and an extent) that says 8.
    let (stored, _) = valid(16 * BLOCK);
    let header = header_of(&stored);
    let forged = with_header(
        &stored,
        Header {
            logical_len: (8 * BLOCK) as u32,
            ..header
        },
    );
    assert_eq!(
        decompress(&forged, 8 * BLOCK),
        Err(CorruptExtent(
            "payload decompresses past the logical length"
        ))
    );
}

#[test]
fn stream_decompressing_short_of_the_logical_length() {
    // A real stream of 8 blocks, under a header (and an extent) that says 16.
    let (stored, _) = valid(8 * BLOCK);
    let header = header_of(&stored);
    let forged = with_header(
        &stored,
        Header {
            logical_len: (16 * BLOCK) as u32,
            ..header
        },
    );
    assert_eq!(
        decompress(&forged, 16 * BLOCK),
        Err(CorruptExtent(
            "payload decompresses short of the logical length"
        ))
    );
}

#[test]
fn truncated_stored_bytes() {
    let (stored, data) = valid(16 * BLOCK);
    let payload_end = Header::LEN + header_of(&stored).payload_len as usize;
    // Cut anywhere in the header or the payload: an error. Only the zero padding after
    // the payload may go.
    for cut in 0..payload_end {
        assert!(
            decompress(&stored[..cut], data.len()).is_err(),
            "cut at {cut}"
        );
    }
    let mut out = vec![0; data.len()];
    decompress_extent(&stored[..payload_end], &mut out).expect("padding is not needed");
    assert!(out == data);
}

#[test]
fn garbage_and_unknown_algorithms() {
    let (stored, data) = valid(16 * BLOCK);
    assert_eq!(
        decompress(&noise(BLOCK, 1), data.len()),
        Err(CorruptExtent("bad magic"))
    );
    assert_eq!(
        decompress(&vec![0; BLOCK], data.len()),
        Err(CorruptExtent("bad magic"))
    );
    for (code, level) in [(0, 0), (2, 0), (2, 3), (3, 0), (255, 255), (1, 1)] {
        let mut forged = stored.clone();
        forged[2] = code;
        forged[3] = level;
        assert_eq!(
            decompress(&forged, data.len()),
            Err(CorruptExtent("unknown algorithm code")),
            "code {code} level {level}"
        );
    }
    // The payload replaced by noise: the header is valid, the stream is not.
    let header = header_of(&stored);
    let mut forged = stored.clone();
    let payload_end = Header::LEN + header.payload_len as usize;
    forged[Header::LEN..payload_end].copy_from_slice(&noise(header.payload_len as usize, 3));
    assert!(decompress(&forged, data.len()).is_err());
    // Every single-byte flip in the payload: an error or (rarely) other data of the same
    // length, never a panic; the filesystem's checksum catches the rest.
    for at in Header::LEN..payload_end {
        let mut flipped = stored.clone();
        flipped[at] ^= 0xFF;
        let _ = decompress(&flipped, data.len());
    }
}

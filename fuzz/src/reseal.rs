//! Resealing: recomputing the checksums of on-disk and stream structures after the
//! fuzzer changed them, so a mutation reaches the decoder's field checks instead of
//! dying at the crc (a forger recomputes them too). Layouts: `docs/format.md`.

use ninefs::format::{bset, log, BLOCK_SIZE};
use ninefs::util::crc::{crc32c, crc32c_parts};

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A superblock or a leg label (one block): crc32c of bytes 12.. at offset 8.
pub fn superblock(b: &mut [u8]) {
    if b.len() >= 12 {
        let crc = crc32c(&b[12..]);
        put_u32(b, 8, crc);
    }
}

/// A bitmap group block or a log block: crc32c of bytes 8.. at offset 4.
pub fn block_at_4(b: &mut [u8]) {
    if b.len() >= 8 {
        let crc = crc32c(&b[8..]);
        put_u32(b, 4, crc);
    }
}

/// The bset whose header starts at `start` in `node`: its body checksum (offset 8,
/// over the bytes after the header up to its last block, cut at the end of `node`) and
/// its header checksum (offset 4, over bytes 8..64). Returns the blocks it covers.
pub fn bset(node: &mut [u8], start: usize) -> usize {
    if node.len() < start + bset::HEADER_LEN {
        return 0;
    }
    let h = &node[start..];
    let payload_len = u32::from_le_bytes([h[32], h[33], h[34], h[35]]) as usize;
    let blocks = (bset::HEADER_LEN + payload_len).div_ceil(BLOCK_SIZE).max(1);
    let end = (start + blocks * BLOCK_SIZE).min(node.len());
    let body = crc32c(&node[start + bset::HEADER_LEN..end]);
    put_u32(node, start + 8, body);
    let head = crc32c(&node[start + 8..start + bset::HEADER_LEN]);
    put_u32(node, start + 4, head);
    blocks
}

/// Every structure of a whole image, found by its magic at the start of a block:
/// superblocks and leg labels, bitmap groups, log blocks and bsets. Blocks are resealed
/// from the last to the first, so a bset's body checksum is computed after whatever
/// structure its later blocks hold was resealed.
pub fn image(img: &mut [u8]) {
    let blocks = img.len() / BLOCK_SIZE;
    for i in (0..blocks).rev() {
        let at = i * BLOCK_SIZE;
        let magic: [u8; 4] = img[at..at + 4].try_into().expect("4 bytes");
        match &magic {
            b"NINE" => superblock(&mut img[at..at + BLOCK_SIZE]),
            b"NFBM" | b"NFLG" => block_at_4(&mut img[at..at + BLOCK_SIZE]),
            b"NFBS" => {
                bset(img, at);
            }
            _ => {}
        }
    }
}

/// A snapshot stream: every whole record's chained checksum (after the 12-byte start),
/// and with `fix_count` the END record's count. A record cut short by the end of the
/// stream is left as it is.
pub fn stream(s: &mut [u8], fix_count: bool) {
    let mut at = 12;
    let mut prev = 0u32;
    let mut records = 0u64;
    while s.len() >= at + 9 {
        let kind = s[at];
        let len = u32::from_le_bytes(s[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        let Some(end) = (at + 5).checked_add(len).filter(|&e| e + 4 <= s.len()) else {
            break;
        };
        if fix_count && kind == 7 && len == 8 {
            s[at + 5..end].copy_from_slice(&records.to_le_bytes());
        }
        let crc = crc32c_parts(&[
            &prev.to_le_bytes(),
            &[kind],
            &(len as u32).to_le_bytes(),
            &s[at + 5..end],
        ]);
        put_u32(s, end, crc);
        prev = crc;
        records += 1;
        at = end + 4;
        if kind == 7 {
            break;
        }
    }
}

/// Where the log's block `seq` lives, given the ring's start and length.
pub fn log_block(log_start: u64, log_blocks: u64, seq: u64) -> usize {
    (log_start + seq % log_blocks) as usize * BLOCK_SIZE
}

/// Frames `payloads` as consecutive log commits from sequence `seq` of `epoch` into the
/// ring of `img`, each with valid checksums (the format's own encoder); returns the
/// sequence after the last. Commits that would not fit the ring are left out.
pub fn write_commits(
    img: &mut [u8],
    (log_start, log_blocks): (u64, u64),
    epoch: u64,
    fs_seq: u64,
    mut seq: u64,
    payloads: &[&[u8]],
) -> u64 {
    let mut used = 0u64;
    for p in payloads {
        let blocks = log::commit_blocks(p.len());
        if used + blocks > log_blocks {
            break;
        }
        let mut out = Vec::new();
        log::encode_commit(&[p.to_vec()], seq, epoch, fs_seq, &mut out);
        for (i, b) in out.chunks(BLOCK_SIZE).enumerate() {
            let at = log_block(log_start, log_blocks, seq + i as u64);
            img[at..at + BLOCK_SIZE].copy_from_slice(b);
        }
        seq += blocks;
        used += blocks;
    }
    seq
}

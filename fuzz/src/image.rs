//! `image`: a whole forged image — a valid one with bytes changed anywhere in its
//! metadata and every checksum resealed — through fsck, mount (log replay for the
//! crashed base), a client's walk and writes, unmount and fsck again. This is what a
//! forger with write access to the disk can do (F1, F2, F5, F6 of issue 40 are such
//! images).
//!
//! Input: a flags byte, then mutations, each `sel u8, block u16, offset u16, len u8`
//! and `len % 9` bytes written there. `sel` bit 0 clear: `block` indexes the base
//! image's metadata blocks (superblocks, bitmap slots, node blocks and, for the crashed
//! base, the log ring), set: any block. Flags bit 0: the crashed base (else the clean
//! rich image); bit 1: do not reseal.
//!
//! Checked: no panic, no hang, no runaway allocation; what fsck calls clean mounts and
//! serves (gated while the bugs that break it are open).

use std::sync::OnceLock;

use ninefs::format::BLOCK_SIZE;

use crate::envelope::{Bytes, Envelope};
use crate::{images, reseal};

/// The metadata blocks of the two bases (from fsck's report, plus the log ring).
fn metadata_blocks(crashed: bool) -> &'static [u64] {
    static CLEAN: OnceLock<Vec<u64>> = OnceLock::new();
    static CRASHED: OnceLock<Vec<u64>> = OnceLock::new();
    let cell = if crashed { &CRASHED } else { &CLEAN };
    cell.get_or_init(|| {
        let img = if crashed {
            images::crashed_image()
        } else {
            images::rich_image()
        };
        let report = images::check(&img).expect("fsck of the base");
        let mut blocks: Vec<u64> = report
            .metadata_blocks
            .iter()
            .flat_map(|&(s, n)| s..s + n)
            .collect();
        if crashed {
            let sb = images::superblock_of(&img).expect("superblock");
            blocks.extend(sb.layout.log_start..sb.layout.log_start + sb.layout.log_blocks);
        }
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    })
}

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let crashed = env.flags & 1 != 0;
    let mut img = if crashed {
        images::crashed_image()
    } else {
        images::rich_image()
    };
    let meta = metadata_blocks(crashed);
    let total = img.len() / BLOCK_SIZE;
    let mut r = Bytes::new(env.rest());
    let mut n = 0;
    while r.remaining() >= 6 && n < 64 {
        n += 1;
        let sel = r.u8();
        let block = r.u16() as usize;
        let offset = r.u16() as usize % BLOCK_SIZE;
        let len = r.u8() as usize % 9;
        let value = r.take(len);
        let block = match sel & 1 {
            0 => meta[block % meta.len()] as usize,
            _ => block % total,
        };
        let at = block * BLOCK_SIZE + offset;
        let end = (at + value.len()).min(img.len());
        img[at..end].copy_from_slice(&value[..end - at]);
    }
    if env.flags & 2 == 0 {
        reseal::image(&mut img);
    }
    let o = images::cycle(img);
    images::assert_rule(&o, "forged image");
}

/// Encodes one mutation (for seeds).
pub fn mutation(meta: bool, block: u16, offset: u16, value: &[u8]) -> Vec<u8> {
    let mut m = vec![u8::from(!meta)];
    m.extend_from_slice(&block.to_le_bytes());
    m.extend_from_slice(&offset.to_le_bytes());
    m.push(value.len() as u8);
    m.extend_from_slice(value);
    m
}

/// Seeds: both bases unchanged, and a few forgeries of the kinds issue 40 lists.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("clean".to_string(), vec![0u8]),
        ("crashed".to_string(), vec![1u8]),
    ];
    // Superblock fields (block 1 and 2 are metadata blocks 0 and 1): checkpoint_seq
    // (offset 172), next_ino (284), incompat (24), the state (CLEAN) bit.
    let meta = metadata_blocks(false);
    let sb_copy = |b: u64| {
        meta.iter()
            .position(|&m| m == b)
            .expect("superblock is metadata") as u16
    };
    for (name, off, val) in [
        ("next-ino", 284u16, &[0, 0, 0, 0, 0, 0, 0, 0x40][..]),
        ("incompat", 32, &[0x10][..]),
        ("checkpoint", 172, &[0xff, 0xff, 0xff][..]),
    ] {
        let mut s = vec![0u8];
        s.extend(mutation(true, sb_copy(1), off, val));
        s.extend(mutation(true, sb_copy(2), off, val));
        out.push((format!("sb-{name}"), s));
    }
    // A node's key count and payload length (the first node block after the bitmap).
    let node = meta.iter().position(|&m| m > 8).unwrap_or(0) as u16;
    let mut s = vec![0u8];
    s.extend(mutation(true, node, 36, &[2]));
    out.push(("bset-nkeys".into(), s));
    let mut s = vec![0u8];
    s.extend(mutation(true, node, 100, &[0xff; 8]));
    out.push(("node-item".into(), s));
    out
}

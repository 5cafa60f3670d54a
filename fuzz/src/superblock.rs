//! `superblock`: the superblock decoder (`Superblock::decode`), and a decoded
//! superblock put to use: written over both copies of the rich image (or of the
//! crashed one, whose log then replays) and put through fsck, mount, a client's walk
//! and writes, unmount and fsck again.
//!
//! Input: a flags byte, then the superblock (4096 bytes; shorter is zero-padded).
//! Unless flags bit 0 is set its checksum is resealed. Bit 1: decode only. Bit 2: the
//! crashed image instead of the clean one. Bit 3: write only the copy its generation
//! selects (the other keeps the image's own).
//!
//! Checked: no panic; a superblock that decodes re-encodes to one that decodes equal;
//! what fsck then calls clean mounts and serves (the rule of issue 40, gated while its
//! bugs are open).

use ninefs::format::{Superblock, BLOCK_SIZE};

use crate::envelope::Envelope;
use crate::{images, reseal};

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let f = env.flags;
    let mut b = vec![0u8; BLOCK_SIZE];
    let n = env.rest().len().min(BLOCK_SIZE);
    b[..n].copy_from_slice(&env.rest()[..n]);
    if f & 1 == 0 {
        reseal::superblock(&mut b);
    }
    let Ok(sb) = Superblock::decode(&b) else {
        return;
    };
    let again = Superblock::decode(&sb.encode()).expect("an encoded superblock decodes");
    assert_eq!(again, sb, "superblock round trip");
    if f & 2 != 0 {
        return;
    }
    let mut img = if f & 4 != 0 {
        images::crashed_image()
    } else {
        images::rich_image()
    };
    for copy in [1usize, 2] {
        if f & 8 != 0 && copy != 1 + (sb.generation % 2) as usize {
            continue;
        }
        img[copy * BLOCK_SIZE..(copy + 1) * BLOCK_SIZE].copy_from_slice(&b);
    }
    let o = images::cycle(img);
    images::assert_rule(&o, "forged superblock");
}

/// Seeds: the superblocks of the rich and crashed images.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, img, flags) in [
        ("clean", images::rich_image(), 0u8),
        ("crashed", images::crashed_image(), 4u8),
        ("empty", images::empty_image(), 0u8),
    ] {
        for copy in [1usize, 2] {
            let mut s = vec![flags];
            s.extend_from_slice(&img[copy * BLOCK_SIZE..(copy + 1) * BLOCK_SIZE]);
            // Trailing zeros are implied: keep seeds short.
            while s.len() > 1 && s.last() == Some(&0) {
                s.pop();
            }
            out.push((format!("{name}-copy{copy}"), s));
        }
    }
    out
}

//! `log_replay`: log commits decoded (`format::log::decode_records`) and replayed at
//! mount into the crashed image, then fsck, a client's walk and writes, unmount and
//! fsck again. A forger who can write the log region writes commits like these (F3 of
//! issue 40).
//!
//! Input: a flags byte, then pieces (`u16` length + bytes), each one commit's payload:
//! its records, `kind u8, len u32, body` one after another. Each is framed into log
//! blocks by the format's own encoder (valid checksums, the mount's epoch, consecutive
//! sequence numbers). Flags bit 0 clear: the commits replace the image's own, from
//! `log_tail` (the rest of the ring is zeroed); set: they follow its own. Bit 1: the
//! payloads are decoded only (no mount).
//!
//! Checked: no panic, no hang; a commit that decodes re-decodes the same; what fsck
//! calls clean after the replay and the client's writes mounts and serves (replay
//! refuses what a live operation would, since F3's fix: `synclog/rules.rs`).

use ninefs::format::log::{decode_records, LogBlockHeader};
use ninefs::format::BLOCK_SIZE;

use crate::envelope::{self, Envelope};
use crate::{images, reseal};

/// Most commits per input.
const MAX_COMMITS: usize = 16;

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let commits = env.pieces(MAX_COMMITS);
    for c in &commits {
        // Decoding is pure: the same bytes decode the same way twice.
        let a = decode_records(c);
        let b = decode_records(c);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
    if env.flags & 2 != 0 {
        return;
    }
    let mut img = images::crashed_image();
    let sb = images::superblock_of(&img).expect("the base has a superblock");
    let ring = (sb.layout.log_start, sb.layout.log_blocks);
    let start = if env.flags & 1 == 0 {
        let s = sb.layout.log_start as usize * BLOCK_SIZE;
        img[s..s + sb.layout.log_blocks as usize * BLOCK_SIZE].fill(0);
        sb.log_tail
    } else {
        own_commits(&img).1
    };
    reseal::write_commits(
        &mut img,
        ring,
        sb.log_epoch,
        sb.checkpoint_seq,
        start,
        &commits,
    );
    let o = images::cycle(img);
    images::assert_rule(&o, "forged log commits");
}

/// The crashed image's own commits' payloads, and the sequence number after them.
pub fn own_commits(img: &[u8]) -> (Vec<Vec<u8>>, u64) {
    let sb = images::superblock_of(img).expect("superblock");
    let mut seq = sb.log_tail;
    let mut out = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    loop {
        let at = reseal::log_block(sb.layout.log_start, sb.layout.log_blocks, seq);
        let Ok((h, payload)) = LogBlockHeader::decode_block(&img[at..at + BLOCK_SIZE]) else {
            break;
        };
        if h.epoch != sb.log_epoch || h.seq != seq {
            break;
        }
        current.extend_from_slice(payload);
        seq += 1;
        if h.seq + 1 == h.commit_seq + u64::from(h.commit_blocks) {
            out.push(std::mem::take(&mut current));
        }
        if seq - sb.log_tail >= sb.layout.log_blocks {
            break;
        }
    }
    (out, seq)
}

/// Seeds: the crashed image's commits, each alone, all together, and repeated after
/// themselves.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let (commits, _) = own_commits(&images::crashed_image());
    assert!(!commits.is_empty(), "the crashed image has log commits");
    let fits: Vec<&[u8]> = commits
        .iter()
        .filter(|c| c.len() < 60_000)
        .map(|c| &c[..])
        .collect();
    let mut out = vec![
        ("all".to_string(), envelope::encode(0, &fits)),
        ("again".to_string(), envelope::encode(1, &fits)),
    ];
    for (i, c) in fits.iter().enumerate() {
        out.push((format!("commit-{i}"), envelope::encode(0, &[c])));
    }
    out
}

//! `ninep_wire`: the 9P2000.L codec (`net/src/wire`): request and reply frames,
//! directory entries, frame sizes.
//!
//! Input: a flags byte, then pieces (`u16` length + bytes), each one frame. Unless
//! flags bit 0 is set each frame's size field is set to its length (9P frames carry no
//! checksum; the size is what a sender gets right). Bit 1: decode as replies too.
//!
//! Checked: no panic; a frame that decodes re-encodes to exactly itself; every
//! directory entry iterator ends.

use ninep::testing::corpus;
use ninep::wire::{frame_size, DirentIter, Header, Rmsg, Tmsg};

use crate::envelope::{self, Envelope};

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    for piece in env.pieces(64) {
        let mut f = piece.to_vec();
        if env.flags & 1 == 0 && f.len() >= 4 {
            let n = f.len() as u32;
            f[..4].copy_from_slice(&n.to_le_bytes());
        }
        let _ = frame_size(&f);
        let _ = Header::peek(&f);
        if let Ok((tag, m)) = Tmsg::decode(&f) {
            let mut again = Vec::new();
            m.encode(tag, &mut again)
                .expect("a decoded request encodes");
            assert_eq!(again, f, "request round trip: {m:?}");
        }
        if env.flags & 2 != 0 {
            if let Ok((tag, m)) = Rmsg::decode(&f) {
                let mut again = Vec::new();
                m.encode(tag, &mut again).expect("a decoded reply encodes");
                assert_eq!(again, f, "reply round trip: {m:?}");
                if let Rmsg::Readdir { data } = m {
                    for (i, e) in DirentIter::new(data.0).enumerate() {
                        assert!(i <= data.0.len(), "the entry iterator ends");
                        if e.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        // The body as directory entries, whatever it is.
        for (i, e) in DirentIter::new(&f).enumerate() {
            assert!(i <= f.len(), "the entry iterator ends");
            if e.is_err() {
                break;
            }
        }
    }
}

/// A stream as clients send it: the sessions of `ninep::testing::corpus` one after
/// another (each begins with its `Tversion`), which send every request type but
/// `Tauth` with fids and names that refer to what earlier requests made; then a
/// `Tauth`.
pub fn session() -> Vec<Vec<u8>> {
    let mut frames: Vec<Vec<u8>> = corpus::sessions().into_iter().flatten().collect();
    frames.push(corpus::frame(
        1,
        &Tmsg::Auth {
            afid: 9,
            uname: b"u",
            aname: b"",
            n_uname: 5,
        },
    ));
    frames
}

/// Seeds: the session's frames, all together and a few alone; replies of each kind.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    use ninep::wire::{Data, Qid};
    let frames = session();
    let all: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let mut out = vec![("session".to_string(), envelope::encode(0, &all))];
    for (i, f) in frames.iter().enumerate().step_by(5) {
        out.push((format!("request-{i}"), envelope::encode(0, &[f])));
    }
    let qid = Qid {
        ty: 0x80,
        version: 1,
        path: 2,
    };
    let mut dirents = Vec::new();
    let mut rd = ninep::wire::ReaddirReply::new(1, 4096).expect("reply");
    for (i, name) in [&b"."[..], b"..", b"file"].iter().enumerate() {
        let _ = rd.push(&ninep::wire::Dirent {
            qid,
            offset: i as u64 + 1,
            dtype: 4,
            name,
        });
    }
    dirents.push(rd.finish());
    let replies = [
        (Rmsg::Lerror { ecode: 2 }, 1u16),
        (
            Rmsg::Walk {
                qids: vec![qid, qid],
            },
            2,
        ),
        (Rmsg::Read { data: Data(b"abc") }, 3),
        (
            Rmsg::Getlock {
                lock_type: 1,
                start: 0,
                length: 5,
                proc_id: 1,
                client_id: b"x",
            },
            4,
        ),
    ];
    let mut rs: Vec<Vec<u8>> = replies
        .iter()
        .map(|(m, tag)| {
            let mut v = Vec::new();
            m.encode(*tag, &mut v).expect("encodes");
            v
        })
        .collect();
    rs.extend(dirents);
    let refs: Vec<&[u8]> = rs.iter().map(|f| &f[..]).collect();
    out.push(("replies".into(), envelope::encode(2, &refs)));
    out
}

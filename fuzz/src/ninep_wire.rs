//! `ninep_wire`: the 9P2000.L codec (`net/src/wire`): request and reply frames,
//! directory entries, frame sizes.
//!
//! Input: a flags byte, then pieces (`u16` length + bytes), each one frame. Unless
//! flags bit 0 is set each frame's size field is set to its length (9P frames carry no
//! checksum; the size is what a sender gets right). Bit 1: decode as replies too.
//!
//! Checked: no panic; a frame that decodes re-encodes to exactly itself; every
//! directory entry iterator ends.

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

/// A request frame.
pub fn frame(tag: u16, m: &Tmsg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    m.encode(tag, &mut out).expect("seed frames encode");
    out
}

/// A session as a client would send it: every request type once at least, with fids
/// and names that refer to what earlier requests made.
pub fn session() -> Vec<Vec<u8>> {
    use ninep::wire::{getattr, lock, open_flags, setattr, Data, AT_REMOVEDIR};
    let data = [0x61u8; 3000];
    let msgs = vec![
        Tmsg::Version {
            msize: 65536,
            version: b"9P2000.L",
        },
        Tmsg::Attach {
            fid: 0,
            afid: !0,
            uname: b"root",
            aname: b"",
            n_uname: 0,
        },
        Tmsg::Getattr {
            fid: 0,
            request_mask: getattr::BASIC,
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![],
        },
        Tmsg::Lcreate {
            fid: 1,
            name: b"file",
            flags: open_flags::RDWR | open_flags::CREATE,
            mode: 0o644,
            gid: 0,
        },
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Data(&data),
        },
        Tmsg::Write {
            fid: 1,
            offset: 70_000,
            data: Data(&data[..100]),
        },
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 8192,
        },
        Tmsg::Setattr {
            fid: 1,
            valid: setattr::SIZE | setattr::MODE,
            mode: 0o600,
            uid: 0,
            gid: 0,
            size: 100,
            atime_sec: 0,
            atime_nsec: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
        },
        Tmsg::Xattrcreate {
            fid: 1,
            name: b"user.a",
            attr_size: 5,
            flags: 0,
        },
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Data(b"value"),
        },
        Tmsg::Clunk { fid: 1 },
        Tmsg::Walk {
            fid: 0,
            newfid: 2,
            names: vec![b"file"],
        },
        Tmsg::Xattrwalk {
            fid: 2,
            newfid: 3,
            name: b"user.a",
        },
        Tmsg::Read {
            fid: 3,
            offset: 0,
            count: 100,
        },
        Tmsg::Clunk { fid: 3 },
        Tmsg::Lopen {
            fid: 2,
            flags: open_flags::RDWR,
        },
        Tmsg::Lock {
            fid: 2,
            lock_type: lock::WRLCK,
            flags: 0,
            start: 0,
            length: 10,
            proc_id: 1,
            client_id: b"host",
        },
        Tmsg::Getlock {
            fid: 2,
            lock_type: lock::RDLCK,
            start: 0,
            length: 10,
            proc_id: 2,
            client_id: b"other",
        },
        Tmsg::Lock {
            fid: 2,
            lock_type: lock::UNLCK,
            flags: 0,
            start: 0,
            length: 10,
            proc_id: 1,
            client_id: b"host",
        },
        Tmsg::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 4,
            names: vec![b"d"],
        },
        Tmsg::Symlink {
            fid: 4,
            name: b"s",
            target: b"../file",
            gid: 0,
        },
        Tmsg::Mknod {
            dfid: 4,
            name: b"n",
            mode: 0o10644,
            major: 0,
            minor: 0,
            gid: 0,
        },
        Tmsg::Link {
            dfid: 4,
            fid: 2,
            name: b"hard",
        },
        Tmsg::Walk {
            fid: 4,
            newfid: 5,
            names: vec![b"s"],
        },
        Tmsg::Readlink { fid: 5 },
        Tmsg::Rename {
            fid: 5,
            dfid: 0,
            name: b"s2",
        },
        Tmsg::Renameat {
            olddirfid: 4,
            oldname: b"n",
            newdirfid: 0,
            newname: b"n2",
        },
        Tmsg::Lopen { fid: 4, flags: 0 },
        Tmsg::Readdir {
            fid: 4,
            offset: 0,
            count: 4096,
        },
        Tmsg::Statfs { fid: 0 },
        Tmsg::Flush { oldtag: 3 },
        Tmsg::Unlinkat {
            dirfid: 4,
            name: b"hard",
            flags: 0,
        },
        Tmsg::Unlinkat {
            dirfid: 0,
            name: b"n2",
            flags: 0,
        },
        Tmsg::Remove { fid: 5 },
        Tmsg::Clunk { fid: 4 },
        Tmsg::Unlinkat {
            dirfid: 0,
            name: b"d",
            flags: AT_REMOVEDIR,
        },
        Tmsg::Auth {
            afid: 9,
            uname: b"u",
            aname: b"",
            n_uname: 5,
        },
        Tmsg::Clunk { fid: 2 },
    ];
    msgs.iter()
        .enumerate()
        .map(|(i, m)| frame(i as u16 + 1, m))
        .collect()
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

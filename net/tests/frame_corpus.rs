//! Fuzzing the decoder and the connection driver from a corpus of real sessions.
//!
//! The corpus is the request stream of whole sessions as the Linux client sends them
//! (version, attach, walks, creates, writes, fsyncs, reads, readdirs, xattrs, locks,
//! renames, unlinks, clunks), so each request refers to fids and names that exist and
//! reaches deep into the server. Each case takes one session and damages it: bytes
//! overwritten (size fields included), frames cut, spliced from other sessions,
//! repeated or reordered, tags reused; then feeds the bytes to a connection of a server
//! over the model filesystem in chunks of random sizes, so frame boundaries fall
//! anywhere.
//!
//! Checked: nothing panics; every frame of the corpus and every damaged one decodes to
//! something that re-encodes to itself, or is refused; every reply decodes (and, while
//! the framing is intact, carries a tag that was sent); the connection's teardown gives back every byte it was charged
//! and every lock; a bystander connection is served throughout.
//!
//! `PROPTEST_CASES` sets the number of cases (default 400); e.g.
//! `PROPTEST_CASES=20000 cargo test --release -p ninefold-ninep --test frame_corpus`.

mod common;

use std::collections::BTreeSet;

use common::{client, frame, model_server, poll, Model};
use ninep::conn::Connection;
use ninep::server::Config;
use ninep::wire::{
    getattr, lock, open_flags, setattr, Data, DirentIter, Rmsg, Tmsg, AT_REMOVEDIR, XATTR_CREATE,
};
use proptest::prelude::*;

/// The sessions of the corpus, each a list of request frames (tags 1, 2, ...).
fn corpus() -> Vec<Vec<Vec<u8>>> {
    let data = vec![0x61u8; 5000];
    let big = vec![0x62u8; 40_000];
    let mut sessions = Vec::new();
    // A mount that creates, writes, fsyncs, reads back and removes a file.
    sessions.push(vec![
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
            offset: 8192,
            data: Data(&big),
        },
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 65536 - 11,
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
        Tmsg::Clunk { fid: 1 },
        Tmsg::Unlinkat {
            dirfid: 0,
            name: b"file",
            flags: 0,
        },
        Tmsg::Statfs { fid: 0 },
    ]);
    // A tree: directories, readdir, rename, links, symlinks, nodes, removal.
    sessions.push(vec![
        Tmsg::Version {
            msize: 8192,
            version: b"9P2000.L",
        },
        Tmsg::Attach {
            fid: 0,
            afid: !0,
            uname: b"",
            aname: b"",
            n_uname: 0,
        },
        Tmsg::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"d"],
        },
        Tmsg::Mkdir {
            dfid: 1,
            name: b"e",
            mode: 0o2755,
            gid: 0,
        },
        Tmsg::Symlink {
            fid: 1,
            name: b"s",
            target: b"../d/e",
            gid: 0,
        },
        Tmsg::Mknod {
            dfid: 1,
            name: b"n",
            mode: 0o100644,
            major: 0,
            minor: 0,
            gid: 0,
        },
        Tmsg::Walk {
            fid: 1,
            newfid: 2,
            names: vec![b"n"],
        },
        Tmsg::Link {
            dfid: 1,
            fid: 2,
            name: b"n2",
        },
        Tmsg::Walk {
            fid: 1,
            newfid: 3,
            names: vec![b"s"],
        },
        Tmsg::Readlink { fid: 3 },
        Tmsg::Walk {
            fid: 0,
            newfid: 4,
            names: vec![b"d"],
        },
        Tmsg::Lopen {
            fid: 4,
            flags: open_flags::RDONLY | open_flags::DIRECTORY,
        },
        Tmsg::Readdir {
            fid: 4,
            offset: 0,
            count: 8192 - 11,
        },
        Tmsg::Readdir {
            fid: 4,
            offset: 3,
            count: 40,
        },
        Tmsg::Renameat {
            olddirfid: 1,
            oldname: b"n2",
            newdirfid: 0,
            newname: b"moved",
        },
        Tmsg::Rename {
            fid: 2,
            dfid: 0,
            name: b"moved2",
        },
        Tmsg::Walk {
            fid: 1,
            newfid: 5,
            names: vec![b"..", b"d", b"e", b"..", b"."],
        },
        Tmsg::Unlinkat {
            dirfid: 1,
            name: b"e",
            flags: AT_REMOVEDIR,
        },
        Tmsg::Remove { fid: 3 },
        Tmsg::Clunk { fid: 4 },
        Tmsg::Clunk { fid: 5 },
    ]);
    // Extended attributes and locks.
    sessions.push(vec![
        Tmsg::Version {
            msize: 131072,
            version: b"9P2000.L",
        },
        Tmsg::Attach {
            fid: 0,
            afid: !0,
            uname: b"",
            aname: b"",
            n_uname: 0,
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![],
        },
        Tmsg::Lcreate {
            fid: 1,
            name: b"x",
            flags: open_flags::RDWR,
            mode: 0o666,
            gid: 0,
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 2,
            names: vec![b"x"],
        },
        Tmsg::Xattrcreate {
            fid: 2,
            name: b"user.k",
            attr_size: 5000,
            flags: XATTR_CREATE,
        },
        Tmsg::Write {
            fid: 2,
            offset: 0,
            data: Data(&data),
        },
        Tmsg::Clunk { fid: 2 },
        Tmsg::Xattrwalk {
            fid: 1,
            newfid: 3,
            name: b"user.k",
        },
        Tmsg::Read {
            fid: 3,
            offset: 0,
            count: 4096,
        },
        Tmsg::Xattrwalk {
            fid: 1,
            newfid: 4,
            name: b"",
        },
        Tmsg::Read {
            fid: 4,
            offset: 0,
            count: 4096,
        },
        Tmsg::Lock {
            fid: 1,
            lock_type: lock::WRLCK,
            flags: lock::FLAGS_BLOCK,
            start: 0,
            length: 10,
            proc_id: 7,
            client_id: b"client-a",
        },
        Tmsg::Getlock {
            fid: 1,
            lock_type: lock::WRLCK,
            start: 0,
            length: 0,
            proc_id: 8,
            client_id: b"client-b",
        },
        Tmsg::Lock {
            fid: 1,
            lock_type: lock::RDLCK,
            flags: 0,
            start: 20,
            length: 0,
            proc_id: 7,
            client_id: b"client-a",
        },
        Tmsg::Lock {
            fid: 1,
            lock_type: lock::UNLCK,
            flags: 0,
            start: 0,
            length: 0,
            proc_id: 7,
            client_id: b"client-a",
        },
        Tmsg::Flush { oldtag: 3 },
        Tmsg::Clunk { fid: 3 },
        Tmsg::Clunk { fid: 1 },
    ]);
    sessions
        .into_iter()
        .map(|msgs| {
            msgs.into_iter()
                .enumerate()
                .map(|(i, m)| {
                    let tag = if matches!(m, Tmsg::Version { .. }) {
                        0xffff
                    } else {
                        i as u16
                    };
                    frame(tag, m)
                })
                .collect()
        })
        .collect()
}

/// One way of damaging a session.
#[derive(Clone, Debug)]
enum Damage {
    /// Overwrite a byte of frame `frame` (any byte: the size field too).
    Poke { frame: usize, at: usize, byte: u8 },
    /// Cut frame `frame` to `keep` bytes, fixing its size field or not.
    Cut {
        frame: usize,
        keep: usize,
        fix_size: bool,
    },
    /// Insert frame `from` of session `session` before frame `frame`.
    Splice {
        session: usize,
        from: usize,
        frame: usize,
    },
    /// Send frame `frame` twice (the same tag while it may be in flight).
    Repeat { frame: usize },
    /// Swap frames `a` and `b`.
    Swap { a: usize, b: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    let i = any::<prop::sample::Index>();
    prop_oneof![
        4 => (i.clone(), i.clone(), any::<u8>()).prop_map(|(f, at, byte)| Damage::Poke {
            frame: f.index(64),
            at: at.index(1 << 16),
            byte
        }),
        2 => (i.clone(), i.clone(), any::<bool>()).prop_map(|(f, keep, fix_size)| Damage::Cut {
            frame: f.index(64),
            keep: keep.index(1 << 16),
            fix_size
        }),
        1 => (i.clone(), i.clone(), i.clone()).prop_map(|(s, from, f)| Damage::Splice {
            session: s.index(64),
            from: from.index(64),
            frame: f.index(64)
        }),
        1 => i.clone().prop_map(|f| Damage::Repeat { frame: f.index(64) }),
        1 => (i.clone(), i).prop_map(|(a, b)| Damage::Swap {
            a: a.index(64),
            b: b.index(64)
        }),
    ]
}

/// `session` with `damages` applied (indices taken modulo the lengths).
fn damaged(corpus: &[Vec<Vec<u8>>], session: usize, damages: &[Damage]) -> Vec<Vec<u8>> {
    let mut frames = corpus[session % corpus.len()].clone();
    for d in damages {
        let n = frames.len();
        match *d {
            Damage::Poke { frame, at, byte } => {
                let f = &mut frames[frame % n];
                if !f.is_empty() {
                    let at = at % f.len();
                    f[at] = byte;
                }
            }
            Damage::Cut {
                frame,
                keep,
                fix_size,
            } => {
                let f = &mut frames[frame % n];
                f.truncate(keep % (f.len() + 1));
                if fix_size && f.len() >= 4 {
                    let len = f.len() as u32;
                    f[..4].copy_from_slice(&len.to_le_bytes());
                }
            }
            Damage::Splice {
                session,
                from,
                frame,
            } => {
                let other = &corpus[session % corpus.len()];
                let f = other[from % other.len()].clone();
                frames.insert(frame % (n + 1), f);
            }
            Damage::Repeat { frame } => {
                let f = frames[frame % n].clone();
                frames.insert(frame % n, f);
            }
            Damage::Swap { a, b } => frames.swap(a % n, b % n),
        }
    }
    frames
}

/// A frame that decodes must re-encode to itself; one that does not is refused.
fn decodes_consistently(f: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((tag, m)) = Tmsg::decode(f) {
        let mut again = Vec::new();
        m.encode(tag, &mut again).unwrap();
        prop_assert_eq!(again.as_slice(), f);
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn damaged_sessions(
        session in 0usize..3,
        damages in prop::collection::vec(damage(), 0..6),
        chunks in prop::collection::vec(1usize..20_000, 1..50),
    ) {
        let corpus = corpus();
        let frames = damaged(&corpus, session, &damages);
        for f in &frames {
            decodes_consistently(f)?;
        }
        // While every size field is right the server sees our frames; then every reply
        // answers a tag we sent. (A lying size shifts the framing: then any two bytes
        // may be read as a tag.)
        let framed = frames.iter().all(|f| {
            f.len() >= 7 && u32::from_le_bytes([f[0], f[1], f[2], f[3]]) as usize == f.len()
        });
        let tags: BTreeSet<u16> = frames
            .iter()
            .filter(|f| f.len() >= 7)
            .map(|f| u16::from_le_bytes([f[5], f[6]]))
            .collect();
        let stream: Vec<u8> = frames.concat();

        let server = model_server(Config::default());
        let mut bystander = client(&server);
        bystander.attach(0, 0, "").unwrap();
        let mut conn: Connection<Model> = Connection::new(server.clone());
        let mut pos = 0;
        let mut chunk = chunks.iter().cycle();
        let mut stuck = 0;
        while pos < stream.len() && conn.closing().is_none() && stuck < 3 {
            let end = (pos + chunk.next().unwrap()).min(stream.len());
            let taken = conn.receive(&stream[pos..end]);
            pos += taken;
            stuck = if taken == 0 { stuck + 1 } else { 0 };
            poll(&mut conn);
            while let Some(reply) = conn.take_output() {
                let (tag, r) = Rmsg::decode(&reply).expect("replies decode");
                prop_assert!(!framed || tags.contains(&tag), "a reply for tag {} never sent", tag);
                if let Rmsg::Readdir { data } = r {
                    prop_assert!(DirentIter::new(data.0).all(|e| e.is_ok()));
                }
            }
        }
        pollster::block_on(conn.shutdown());
        // The bystander is served; the damaged connection left nothing behind.
        prop_assert!(bystander.walk(0, 1, "").is_ok());
        prop_assert_eq!(server.lock_count(), 0);
        let m = server.memory();
        prop_assert_eq!(
            (m.charged.frames, m.charged.replies, m.charged.xattrs, m.charged.locks),
            (0, 0, 0, 0)
        );
        prop_assert!(m.peak <= m.limit);
    }
}

#[test]
fn the_corpus_is_served_without_errors() {
    // Undamaged, every session runs through (so damage is what the fuzzing adds).
    for (i, session) in corpus().iter().enumerate() {
        let server = model_server(Config::default());
        let mut conn: Connection<Model> = Connection::new(server.clone());
        let mut errors = Vec::new();
        for f in session {
            assert_eq!(conn.receive(f), f.len());
            poll(&mut conn);
            while let Some(reply) = conn.take_output() {
                if let (tag, Rmsg::Lerror { ecode }) = Rmsg::decode(&reply).unwrap() {
                    errors.push((tag, ecode));
                }
            }
        }
        assert!(errors.is_empty(), "session {i}: errors {errors:?}");
        assert!(conn.closing().is_none());
    }
}

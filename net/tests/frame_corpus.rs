//! Fuzzing the decoder and the connection driver from a corpus of real sessions.
//!
//! The corpus (`ninep::testing::corpus`) is the request stream of whole sessions as the
//! Linux client sends them (version, attach, walks, creates, writes, fsyncs, reads,
//! readdirs, xattrs, locks, renames, unlinks, clunks), so each request refers to fids
//! and names that exist and reaches deep into the server. Each case takes one session and damages it: bytes
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

use common::{client, model_server, poll, Model};
use ninep::conn::Connection;
use ninep::server::Config;
use ninep::testing::corpus::sessions;
use ninep::wire::{DirentIter, Rmsg, Tmsg};
use proptest::prelude::*;

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
        let corpus = sessions();
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
    for (i, session) in sessions().iter().enumerate() {
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

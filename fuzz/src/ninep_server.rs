//! `ninep_server`: the 9P server's request path — a connection (`ninep::conn`) fed
//! hostile bytes in memory, over the real filesystem on a RAM disk (the rich image) or
//! over the reference model.
//!
//! Input: a flags byte, then pieces (`u16` length + bytes), each one request frame.
//! Unless flags bit 0 is set each frame's size field is set to its length. Bit 1: a
//! `Tversion` and `Tattach` (fid 0, uid 0) go first. Bit 2: the model filesystem
//! instead of the real one. Bits 4..7: the frames are fed in chunks of
//! `1 + 97 * bits` bytes (0: whole frames), so frame boundaries fall anywhere.
//!
//! Checked: no panic, no hang; every reply decodes; after the connection is shut down
//! the server holds no memory charged to it and no lock; another client still attaches
//! and walks; and the real filesystem, synced, is fsck-clean: a hostile client cannot
//! damage it.

use std::sync::Arc;
use std::task::{Context, Waker};

use block::MemDisk;
use ninefs::volume::NineFs;
use ninep::conn::Connection;
use ninep::server::{Config, Server};
use ninep::testing::corpus::frame;
use ninep::wire::{Rmsg, Tmsg};
use testkit::model::ModelFs;
use vfs::FileSystem;

use crate::envelope::{self, Envelope};
use crate::ninep_wire::session;
use crate::{block_on, images};

fn poll<F: FileSystem + 'static>(conn: &mut Connection<F>) {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..4 {
        let _ = conn.poll_requests(&mut cx);
    }
}

/// Feeds `stream` to a new connection of `server` in chunks of `chunk` bytes (0: the
/// frames as given); checks the replies and the teardown.
fn serve<F: FileSystem + 'static>(server: &Arc<Server<F>>, frames: &[Vec<u8>], chunk: usize) {
    let mut conn: Connection<F> = Connection::new(server.clone());
    let stream: Vec<u8> = frames.concat();
    let pieces: Vec<&[u8]> = match chunk {
        0 => frames.iter().map(|f| &f[..]).collect(),
        n => stream.chunks(n).collect(),
    };
    let mut queue = pieces.into_iter();
    let mut pending: &[u8] = &[];
    let mut stuck = 0;
    while conn.closing().is_none() && stuck < 3 {
        if pending.is_empty() {
            match queue.next() {
                Some(p) => pending = p,
                None => break,
            }
        }
        let taken = conn.receive(pending);
        pending = &pending[taken..];
        stuck = if taken == 0 { stuck + 1 } else { 0 };
        poll(&mut conn);
        drain(&mut conn);
    }
    poll(&mut conn);
    drain(&mut conn);
    block_on(conn.shutdown());
    assert_eq!(
        server.lock_count(),
        0,
        "locks left after the connection closed"
    );
    let m = server.memory();
    assert_eq!(
        (
            m.charged.frames,
            m.charged.replies,
            m.charged.xattrs,
            m.charged.locks
        ),
        (0, 0, 0, 0),
        "memory left charged after the connection closed"
    );
    assert!(m.peak <= m.limit, "memory peak over the limit");
}

fn drain<F: FileSystem + 'static>(conn: &mut Connection<F>) {
    while let Some(reply) = conn.take_output() {
        if let Err(e) = Rmsg::decode(&reply) {
            panic!("a reply does not decode: {e:?}: {reply:02x?}");
        }
    }
}

/// A new client versions, attaches and walks.
fn bystander<F: FileSystem + 'static>(server: &Arc<Server<F>>) {
    let mut conn: Connection<F> = Connection::new(server.clone());
    let reqs = [
        frame(
            1,
            &Tmsg::Version {
                msize: 8192,
                version: b"9P2000.L",
            },
        ),
        frame(
            2,
            &Tmsg::Attach {
                fid: 0,
                afid: !0,
                uname: b"",
                aname: b"",
                n_uname: 0,
            },
        ),
        frame(
            3,
            &Tmsg::Walk {
                fid: 0,
                newfid: 1,
                names: vec![],
            },
        ),
    ];
    for r in &reqs {
        assert_eq!(conn.receive(r), r.len());
        poll(&mut conn);
        let reply = conn.take_output().expect("the bystander is answered");
        let (_, m) = Rmsg::decode(&reply).expect("decodes");
        assert!(
            !matches!(m, Rmsg::Lerror { .. }),
            "the bystander is refused: {m:?}"
        );
    }
    block_on(conn.shutdown());
}

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let f = env.flags;
    let mut frames: Vec<Vec<u8>> = Vec::new();
    if f & 2 != 0 {
        frames.push(frame(
            0xfffe,
            &Tmsg::Version {
                msize: 65536,
                version: b"9P2000.L",
            },
        ));
        frames.push(frame(
            0xfffd,
            &Tmsg::Attach {
                fid: 0,
                afid: !0,
                uname: b"",
                aname: b"",
                n_uname: 0,
            },
        ));
    }
    for p in env.pieces(128) {
        let mut fr = p.to_vec();
        if f & 1 == 0 && fr.len() >= 4 {
            let n = fr.len() as u32;
            fr[..4].copy_from_slice(&n.to_le_bytes());
        }
        frames.push(fr);
    }
    let chunk = match f >> 4 {
        0 => 0,
        n => 1 + 97 * n as usize,
    };
    if f & 4 != 0 {
        let server = Arc::new(Server::new(
            ModelFs::new(images::clock()),
            Config::default(),
        ));
        serve(&server, &frames, chunk);
        bystander(&server);
        return;
    }
    let fs: NineFs<MemDisk> = images::mount(images::rich_image()).expect("mount");
    let server = Arc::new(Server::new(fs, Config::default()));
    serve(&server, &frames, chunk);
    bystander(&server);
    let _ = block_on(server.fs().sync());
    let img = server.fs().device().snapshot();
    let r = images::check(&img).expect("fsck runs");
    assert!(
        r.is_clean(),
        "a 9P session damaged the filesystem: {:?}",
        &r.errors[..r.errors.len().min(5)]
    );
}

/// Seeds: the session of `ninep_wire` over both filesystems, whole and in chunks; a
/// few requests on the rich image's own files.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let frames = session();
    let all: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let existing = [
        frame(
            3,
            &Tmsg::Walk {
                fid: 0,
                newfid: 1,
                names: vec![b"dir", b"f4"],
            },
        ),
        frame(4, &Tmsg::Lopen { fid: 1, flags: 2 }),
        frame(
            5,
            &Tmsg::Read {
                fid: 1,
                offset: 0,
                count: 4096,
            },
        ),
        frame(
            6,
            &Tmsg::Write {
                fid: 1,
                offset: 10,
                data: ninep::wire::Data(b"x"),
            },
        ),
        frame(
            7,
            &Tmsg::Walk {
                fid: 0,
                newfid: 2,
                names: vec![b".snapshots", b"s1", b"big"],
            },
        ),
        frame(
            8,
            &Tmsg::Xattrwalk {
                fid: 2,
                newfid: 3,
                name: b"",
            },
        ),
        frame(
            9,
            &Tmsg::Renameat {
                olddirfid: 0,
                oldname: b"dir",
                newdirfid: 0,
                newname: b"quota",
            },
        ),
    ];
    let ex: Vec<&[u8]> = existing.iter().map(|f| &f[..]).collect();
    vec![
        ("session".into(), envelope::encode(0, &all)),
        ("session-model".into(), envelope::encode(4, &all)),
        ("session-chunked".into(), envelope::encode(0x30, &all)),
        ("existing".into(), envelope::encode(2, &ex)),
    ]
}

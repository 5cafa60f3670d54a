//! Hostile input at the connection level: random and mutated frames never panic the
//! server; each well-framed request gets exactly one reply (an error if it is garbage),
//! badly framed input closes only its own connection.

mod common;

use common::*;
use ninep::conn::Connection;
use ninep::server::Config;
use ninep::wire::{Data, Rmsg, Tmsg};
use proptest::prelude::*;

/// Requests with small, colliding fids and odd values: the server's state machine sees
/// opens of non-files, I/O on unopened fids, reuse of fids, and so on.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let fid = 0u32..6;
    let name = prop::sample::select(vec![&b"a"[..], b"..", b".", b"", b"x/y", b"a\0", b"dir"]);
    let msg = (fid.clone(), fid, name, any::<u32>(), any::<u64>(), 0u32..4).prop_map(
        |(fid, newfid, name, n, off, pick)| {
            let pick = (n as usize + pick as usize) % 16;
            let m = match pick {
                0 => Tmsg::Attach {
                    fid,
                    afid: !0,
                    uname: b"",
                    aname: name,
                    n_uname: n % 3,
                },
                1 => Tmsg::Walk {
                    fid,
                    newfid,
                    names: vec![name; (n % 3) as usize],
                },
                2 => Tmsg::Lopen { fid, flags: n },
                3 => Tmsg::Lcreate {
                    fid,
                    name,
                    flags: n,
                    mode: n,
                    gid: 0,
                },
                4 => Tmsg::Read {
                    fid,
                    offset: off,
                    count: n,
                },
                5 => Tmsg::Write {
                    fid,
                    offset: off % 4096,
                    data: Data(b"some bytes"),
                },
                6 => Tmsg::Clunk { fid },
                7 => Tmsg::Mkdir {
                    dfid: fid,
                    name,
                    mode: n,
                    gid: 0,
                },
                8 => Tmsg::Readdir {
                    fid,
                    offset: off % 8,
                    count: n,
                },
                9 => Tmsg::Xattrwalk { fid, newfid, name },
                10 => Tmsg::Xattrcreate {
                    fid,
                    name: b"user.a",
                    attr_size: off % 8,
                    flags: n % 4,
                },
                11 => Tmsg::Lock {
                    fid,
                    lock_type: n as u8,
                    flags: 0,
                    start: off,
                    length: off,
                    proc_id: 1,
                    client_id: b"c",
                },
                12 => Tmsg::Setattr {
                    fid,
                    valid: n,
                    mode: n,
                    uid: 0,
                    gid: 0,
                    size: off % 100,
                    atime_sec: 0,
                    atime_nsec: off,
                    mtime_sec: 0,
                    mtime_nsec: 0,
                },
                13 => Tmsg::Unlinkat {
                    dirfid: fid,
                    name,
                    flags: n % 0x400,
                },
                14 => Tmsg::Renameat {
                    olddirfid: fid,
                    oldname: name,
                    newdirfid: newfid,
                    newname: b"b",
                },
                _ => Tmsg::Remove { fid },
            };
            frame(0, m)
        },
    );
    // Then damage some of them.
    (
        msg,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        any::<bool>(),
    )
        .prop_map(|(mut f, pokes, keep_size)| {
            let size = f[..4].to_vec();
            for (i, b) in pokes {
                let i = i.index(f.len());
                f[i] = b;
            }
            if keep_size {
                f[..4].copy_from_slice(&size);
            }
            f
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn hostile_requests(frames in prop::collection::vec(request(), 1..40)) {
        let server = model_server(Config::default());
        let mut bystander = client(&server);
        bystander.attach(0, 0, "").unwrap();
        let mut conn = Connection::new(server.clone());
        conn.receive(&frame(0xffff, Tmsg::Version { msize: 8192, version: b"9P2000.L" }));
        poll(&mut conn);
        conn.take_output().unwrap();
        for (tag, mut f) in frames.into_iter().enumerate() {
            if f.len() >= 7 {
                f[5..7].copy_from_slice(&(tag as u16).to_le_bytes());
            }
            let taken = conn.receive(&f);
            poll(&mut conn);
            if conn.closing().is_some() {
                break;
            }
            if taken < f.len() || f.len() < 7 {
                // Part of a frame still expected (its size said more): no reply yet.
                prop_assert!(conn.take_output().is_none());
                break;
            }
            let declared = u32::from_le_bytes([f[0], f[1], f[2], f[3]]) as usize;
            if declared != f.len() {
                break;
            }
            let reply = conn.take_output().expect("one reply per request");
            let (rtag, _) = Rmsg::decode(&reply).expect("replies decode");
            prop_assert_eq!(rtag, tag as u16);
            prop_assert!(conn.take_output().is_none());
        }
        pollster::block_on(conn.shutdown());
        // The bystander's connection is untouched, and nothing of the other leaked.
        prop_assert!(bystander.walk(0, 1, "").is_ok());
        prop_assert_eq!(server.stats().connections_closed, 1);
        prop_assert_eq!(server.lock_count(), 0);
        // Every charge of the torn-down connection was given back.
        let m = server.memory();
        prop_assert_eq!((m.charged.frames, m.charged.replies, m.charged.xattrs), (0, 0, 0));
        prop_assert!(m.peak <= m.limit);
    }
}

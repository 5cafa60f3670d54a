//! A corpus of 9P2000.L sessions: the request frames of whole sessions as the Linux
//! client sends them (version, attach, walks, creates, writes, fsyncs, reads, readdirs,
//! xattrs, locks, renames, unlinks, clunks), each request referring to fids and names
//! that earlier ones made, so that each reaches deep into a server. The frame corpus
//! tests (`net/tests/frame_corpus.rs`) damage them; the fuzz targets of `fuzz/` seed
//! with them.

use alloc::vec;
use alloc::vec::Vec;

use crate::wire::{
    getattr, lock, open_flags, setattr, Data, Tmsg, AT_REMOVEDIR, NOTAG, XATTR_CREATE,
};

/// `msg` as a request frame with `tag`.
pub fn frame(tag: u16, msg: &Tmsg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(tag, &mut out)
        .expect("a request of the corpus encodes");
    out
}

/// The sessions, each a list of request frames: a `Tversion` (tag `NOTAG`), then the
/// requests with tags 1, 2, ... Undamaged, each runs through a server without an
/// error. Between them they send every request type but `Tauth`:
/// - a mount that creates, writes, fsyncs, reads back and removes a file;
/// - a tree: directories, readdir, rename, links, symlinks, nodes, removal;
/// - extended attributes and locks.
pub fn sessions() -> Vec<Vec<Vec<u8>>> {
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
            msgs.iter()
                .enumerate()
                .map(|(i, m)| {
                    let tag = if matches!(m, Tmsg::Version { .. }) {
                        NOTAG
                    } else {
                        i as u16
                    };
                    frame(tag, m)
                })
                .collect()
        })
        .collect()
}

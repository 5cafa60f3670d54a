//! The server through the test client over in-memory connections, on the reference
//! model filesystem.

mod common;

use std::future::Future;
use std::sync::Arc;

use common::*;
use ninep::conn::{CloseReason, Connection};
use ninep::server::{Config, Export, Squash};
use ninep::wire::{
    lock, open_flags as of, qid_type, setattr, Rmsg, Tmsg, AT_REMOVEDIR, XATTR_REPLACE,
};
use vfs::{Errno, FileSystem, ROOT_INO};

const RDWR: u32 = of::RDWR;

#[test]
fn version_negotiates_msize_and_rejects_other_versions() {
    let server = model_server(Config::default());
    let mut c = ninep::testing::Client::new(Local {
        conn: Connection::new(server.clone()),
    });
    assert_eq!(c.version(8192, b"9P2000.u").unwrap().1, b"unknown");
    // Still unversioned: requests are refused.
    assert_eq!(c.attach(0, 0, ""), Err(Errno::EPROTO));
    assert_eq!(
        c.version(4 << 20, b"9P2000.L").unwrap(),
        (1 << 20, b"9P2000.L".to_vec())
    );
    assert_eq!(c.version(8192, b"9P2000.L").unwrap().0, 8192);
    assert_eq!(c.version(100, b"9P2000.L"), Err(Errno::EINVAL));
}

#[test]
fn file_lifecycle() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    let root = c.attach(0, 0, "").unwrap();
    assert_eq!(root.ty, qid_type::DIR);
    assert_eq!(root.path, ROOT_INO);
    c.walk(0, 1, "").unwrap();
    let q = c.lcreate(1, "f", RDWR, 0o644).unwrap();
    assert_eq!(q.ty, qid_type::FILE);
    assert_eq!(c.write(1, 0, b"hello world").unwrap(), 11);
    c.fsync(1, false).unwrap();
    c.fsync(1, true).unwrap();
    assert_eq!(c.read(1, 6, 100).unwrap(), b"world");
    assert_eq!(c.read(1, 100, 100).unwrap(), b"");
    c.clunk(1).unwrap();
    assert_eq!(c.clunk(1), Err(Errno::EBADF));

    let qids = c.walk(0, 2, "f").unwrap();
    assert_eq!(qids, vec![q]);
    // I/O on an unopened fid.
    assert_eq!(c.read(2, 0, 10), Err(Errno::EBADF));
    assert_eq!(c.write(2, 0, b"x"), Err(Errno::EBADF));
    c.lopen(2, of::RDONLY).unwrap();
    assert_eq!(c.lopen(2, of::RDONLY), Err(Errno::EBADF), "opened twice");
    assert_eq!(c.write(2, 0, b"x"), Err(Errno::EBADF), "read-only open");
    let st = c.getattr(2).unwrap();
    assert_eq!((st.size, st.mode, st.qid), (11, 0o100644, q));
    // Truncate through setattr.
    c.setattr(2, setattr::SIZE, 0, 0, 0, 5).unwrap();
    assert_eq!(c.read(2, 0, 100).unwrap(), b"hello");
    c.setattr(2, setattr::MODE, 0o600, 0, 0, 0).unwrap();
    assert_eq!(c.getattr(2).unwrap().mode, 0o100600);
    c.clunk(2).unwrap();
    let (bsize, _, namelen) = c.statfs(0).unwrap();
    assert_eq!((bsize, namelen), (4096, 255));
    // Everything opened was released.
    let stats = server.stats();
    assert_eq!(stats.releases, 2);
    // The acknowledged writes and fsyncs (the write refused above is not counted).
    assert_eq!((stats.writes, stats.fsyncs, stats.datasyncs), (1, 2, 1));
}

#[test]
fn walk_rules() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    assert_eq!(c.walk(9, 1, ""), Err(Errno::EBADF), "unknown fid");
    c.mkdir(0, "a", 0o755).unwrap();
    c.walk(0, 1, "a").unwrap();
    c.mkdir(1, "b", 0o755).unwrap();
    assert_eq!(c.walk(0, 1, ""), Err(Errno::EBADF), "newfid in use");
    // A walk that fails at the first name is an error; later, a short Rwalk.
    assert_eq!(c.walk(0, 2, "nope/x"), Err(Errno::ENOENT));
    assert_eq!(c.walk(0, 2, "a/nope/x").unwrap().len(), 1);
    assert_eq!(
        c.clunk(2),
        Err(Errno::EBADF),
        "newfid not bound by a short walk"
    );
    assert_eq!(c.walk(0, 2, "a/b").unwrap().len(), 2);
    // Walking onto itself.
    let up = c.walk(2, 2, "..").unwrap();
    assert_eq!(up[0], c.walk(0, 3, "a").unwrap()[0]);
    assert_eq!(c.walk_names(0, 4, vec![b"a/b"]), Err(Errno::EINVAL));
    assert_eq!(c.walk_names(0, 4, vec![b""]), Err(Errno::EINVAL));
    // Walking from a file.
    c.lcreate(3, "f", RDWR, 0o644).unwrap();
    c.walk(0, 4, "a/f").unwrap();
    assert_eq!(c.walk(4, 5, "x"), Err(Errno::ENOTDIR));
    assert_eq!(c.walk(3, 5, ""), Err(Errno::EBADF), "walk from an open fid");
}

#[test]
fn directory_operations() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.mkdir(0, "d", 0o755).unwrap();
    c.walk(0, 1, "d").unwrap();
    for i in 0..50 {
        c.walk(1, 2, "").unwrap();
        c.lcreate(2, &format!("file-{i:03}"), RDWR, 0o644).unwrap();
        c.clunk(2).unwrap();
    }
    c.symlink(1, "sl", "file-000").unwrap();
    c.walk(1, 2, "sl").unwrap();
    assert_eq!(c.readlink(2).unwrap(), b"file-000");
    assert_eq!(c.getattr(2).unwrap().qid.ty, qid_type::SYMLINK);
    assert_eq!(c.lopen(2, of::RDONLY), Err(Errno::ELOOP));
    c.walk(1, 3, "file-001").unwrap();
    c.link(1, 3, "hard").unwrap();
    assert_eq!(c.getattr(3).unwrap().nlink, 2);
    c.mknod(1, "fifo", 0o010644, 0, 0).unwrap();
    c.mknod(1, "dev", 0o020644, 8, 1).unwrap();
    c.walk(1, 4, "dev").unwrap();
    assert_eq!(c.getattr(4).unwrap().rdev, (8 << 8) | 1);

    // Read the directory in small pieces: every name once, offsets resumable.
    c.walk(1, 5, "").unwrap();
    c.lopen(5, of::RDONLY).unwrap();
    let all = c.readdir_all(5, 100).unwrap();
    let mut names: Vec<_> = all
        .iter()
        .map(|e| String::from_utf8(e.name.clone()).unwrap())
        .collect();
    assert_eq!(names.len(), 2 + 50 + 4);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 56);
    assert_eq!(
        c.readdir(5, 0, 10),
        Err(Errno::EINVAL),
        "count too small for an entry"
    );
    assert_eq!(c.read(5, 0, 10), Err(Errno::EISDIR));

    c.renameat(1, "file-002", 0, "moved").unwrap();
    assert!(c.walk(0, 6, "moved").is_ok());
    assert_eq!(c.walk(1, 7, "file-002"), Err(Errno::ENOENT));
    // Trename moves the fid's file.
    c.rename(6, 1, "back").unwrap();
    c.walk(1, 7, "back").unwrap();
    c.unlinkat(1, "back", 0).unwrap();
    assert_eq!(c.unlinkat(0, "d", 0), Err(Errno::EISDIR));
    assert_eq!(c.unlinkat(1, "hard", AT_REMOVEDIR), Err(Errno::ENOTDIR));
    assert_eq!(c.unlinkat(0, "d", AT_REMOVEDIR), Err(Errno::ENOTEMPTY));
    assert_eq!(c.unlinkat(1, "..", 0), Err(Errno::EINVAL));
    // Tremove removes and clunks.
    c.walk(1, 8, "fifo").unwrap();
    c.remove(8).unwrap();
    assert_eq!(c.walk(1, 8, "fifo"), Err(Errno::ENOENT));
    assert_eq!(c.clunk(8), Err(Errno::EBADF));
}

#[test]
fn xattrs() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.lcreate(0, "f", RDWR, 0o644).unwrap(); // fid 0 is now the file
    c.attach(1, 0, "").unwrap();
    c.walk(1, 2, "f").unwrap();
    // Set: xattrcreate turns the fid into a writer; the value lands at clunk.
    c.walk(2, 3, "").unwrap();
    c.xattrcreate(3, "user.color", 4, 0).unwrap();
    c.write(3, 0, b"bl").unwrap();
    c.write(3, 2, b"ue").unwrap();
    c.clunk(3).unwrap();
    // Get.
    assert_eq!(c.xattrwalk(2, 4, "user.color").unwrap(), 4);
    assert_eq!(c.read(4, 0, 100).unwrap(), b"blue");
    assert_eq!(c.read(4, 2, 100).unwrap(), b"ue");
    c.clunk(4).unwrap();
    assert_eq!(c.xattrwalk(2, 4, "user.none"), Err(Errno::ENODATA));
    // List.
    c.walk(2, 3, "").unwrap();
    c.xattrcreate(3, "user.b", 0, 0).unwrap();
    c.clunk(3).unwrap();
    let n = c.xattrwalk(2, 4, "").unwrap();
    assert_eq!(c.read(4, 0, 100).unwrap(), b"user.b\0user.color\0");
    assert_eq!(n, 18);
    c.clunk(4).unwrap();
    // Short value: the clunk fails and nothing is stored.
    c.walk(2, 3, "").unwrap();
    c.xattrcreate(3, "user.short", 10, 0).unwrap();
    c.write(3, 0, b"abc").unwrap();
    assert_eq!(c.write(3, 3, b"too long now"), Err(Errno::ERANGE));
    assert_eq!(c.clunk(3), Err(Errno::EINVAL));
    assert_eq!(c.xattrwalk(2, 4, "user.short"), Err(Errno::ENODATA));
    // Remove (what Linux sends for removexattr).
    c.walk(2, 3, "").unwrap();
    c.xattrcreate(3, "user.color", 0, XATTR_REPLACE).unwrap();
    c.clunk(3).unwrap();
    assert_eq!(c.xattrwalk(2, 4, "user.color"), Err(Errno::ENODATA));
    // Unknown namespaces and bad flags.
    c.walk(2, 3, "").unwrap();
    assert_eq!(c.xattrcreate(3, "weird.x", 1, 0), Err(Errno::EOPNOTSUPP));
    assert_eq!(c.xattrcreate(3, "user.x", 1, 3), Err(Errno::EINVAL));
    assert_eq!(c.xattrcreate(3, "user.x", 1 << 20, 0), Err(Errno(7)));
}

#[test]
fn locks_between_connections() {
    let server = model_server(Config::default());
    let mut a = client(&server);
    let mut b = client(&server);
    a.attach(0, 0, "").unwrap();
    a.lcreate(0, "f", RDWR, 0o644).unwrap();
    b.attach(0, 0, "").unwrap();
    b.walk(0, 1, "f").unwrap();
    b.lopen(1, RDWR).unwrap();
    b.walk(0, 2, "f").unwrap();
    b.lopen(2, RDWR).unwrap();

    assert_eq!(a.lock(0, lock::WRLCK, 0, 100, 1).unwrap(), lock::SUCCESS);
    assert_eq!(b.lock(1, lock::RDLCK, 50, 10, 7).unwrap(), lock::BLOCKED);
    assert_eq!(b.lock(1, lock::WRLCK, 100, 0, 7).unwrap(), lock::SUCCESS);
    assert_eq!(
        b.getlock(1, lock::WRLCK, 0, 0, 7).unwrap(),
        (lock::WRLCK, 0, 100, 1)
    );
    assert_eq!(a.getlock(0, lock::RDLCK, 0, 10, 1).unwrap().0, lock::UNLCK);
    // Unlocking part of a range frees just that part.
    assert_eq!(a.lock(0, lock::UNLCK, 50, 10, 1).unwrap(), lock::SUCCESS);
    assert_eq!(b.lock(2, lock::RDLCK, 50, 10, 7).unwrap(), lock::SUCCESS);
    assert_eq!(server.lock_count(), 4);
    // Clunking the fid a lock was taken through releases it.
    b.clunk(2).unwrap();
    assert_eq!(server.lock_count(), 3);
    // Lock type must match the open mode.
    b.walk(0, 3, "f").unwrap();
    b.lopen(3, of::RDONLY).unwrap();
    assert_eq!(b.lock(3, lock::WRLCK, 0, 1, 9), Err(Errno::EBADF));
    assert_eq!(b.lock(3, 7, 0, 1, 9), Err(Errno::EINVAL));
    // Disconnecting releases the rest of that connection's locks.
    let Local { conn } = b.io;
    pollster::block_on(conn.shutdown());
    assert_eq!(server.lock_count(), 2);
    assert_eq!(a.lock(0, lock::WRLCK, 0, 0, 1).unwrap(), lock::SUCCESS);
}

#[test]
fn getlock_unlck_asks_whether_anything_is_in_the_way() {
    // Linux sends every Tgetlock with type UNLCK (v9fs_file_getlock), after finding no
    // conflict among its own processes' locks: the answer is any other owner's lock.
    let server = model_server(Config::default());
    let mut a = client(&server);
    let mut b = client(&server);
    a.attach(0, 0, "").unwrap();
    a.lcreate(0, "f", RDWR, 0o644).unwrap();
    b.attach(0, 0, "").unwrap();
    b.walk(0, 1, "f").unwrap();
    b.lopen(1, RDWR).unwrap();
    b.walk(0, 2, "f").unwrap(); // walked, not opened: may test too
    let free = (lock::UNLCK, 5, 0, 99, b"node-b".to_vec());
    assert_eq!(
        getlock_as(&mut b, 1, lock::UNLCK, (5, 0), b"node-b"),
        Ok(free)
    );

    assert_eq!(a.lock(0, lock::RDLCK, 10, 20, 1).unwrap(), lock::SUCCESS);
    let held = (lock::RDLCK, 10, 20, 1, b"test".to_vec());
    assert_eq!(
        getlock_as(&mut b, 1, lock::UNLCK, (0, 0), b"node-b"),
        Ok(held.clone())
    );
    assert_eq!(
        getlock_as(&mut b, 2, lock::UNLCK, (29, 1), b"node-b"),
        Ok(held)
    );
    assert_eq!(
        getlock_as(&mut b, 1, lock::UNLCK, (30, 5), b"node-b")
            .unwrap()
            .0,
        lock::UNLCK,
        "past the lock"
    );
    // A read lock is not in the way of a reader; RDLCK and WRLCK are answered as asked.
    assert_eq!(b.getlock(1, lock::RDLCK, 0, 0, 7).unwrap().0, lock::UNLCK);
    assert_eq!(b.getlock(1, lock::WRLCK, 0, 0, 7).unwrap().0, lock::RDLCK);
    // The holder's own locks are never in its way; another process's are.
    assert_eq!(a.getlock(0, lock::UNLCK, 0, 0, 1).unwrap().0, lock::UNLCK);
    assert_eq!(
        a.getlock(0, lock::UNLCK, 0, 0, 2).unwrap(),
        (lock::RDLCK, 10, 20, 1)
    );
    // A write lock to end of file is reported with length 0.
    assert_eq!(b.lock(1, lock::WRLCK, 100, 0, 7).unwrap(), lock::SUCCESS);
    assert_eq!(
        a.getlock(0, lock::UNLCK, 50, 0, 1).unwrap(),
        (lock::WRLCK, 100, 0, 7)
    );
    assert_eq!(b.getlock(1, 7, 0, 0, 7), Err(Errno::EINVAL));
}

#[test]
fn lock_limits_are_enolck() {
    let server = model_server(Config {
        max_locks_per_conn: 3,
        max_locks: 5,
        ..Config::default()
    });
    let mut a = client(&server);
    let mut b = client(&server);
    a.attach(0, 0, "").unwrap();
    a.lcreate(0, "f", RDWR, 0o644).unwrap();
    b.attach(0, 0, "").unwrap();
    b.walk(0, 1, "f").unwrap();
    b.lopen(1, RDWR).unwrap();
    for i in 0..3 {
        assert_eq!(a.lock(0, lock::RDLCK, 10 * i, 1, 1), Ok(lock::SUCCESS));
    }
    assert_eq!(a.lock(0, lock::RDLCK, 100, 1, 1), Err(Errno::ENOLCK));
    // Growing a lock until it merges with the next takes no room; cutting a hole does.
    assert_eq!(a.lock(0, lock::RDLCK, 0, 10, 1), Ok(lock::SUCCESS));
    assert_eq!(a.lock(0, lock::RDLCK, 30, 1, 1), Ok(lock::SUCCESS));
    assert_eq!(a.lock(0, lock::UNLCK, 5, 1, 1), Err(Errno::ENOLCK));
    assert_eq!(server.stats().conn_lock_limit_hits, 2);
    for i in 0..2 {
        assert_eq!(
            b.lock(1, lock::RDLCK, 200 + 10 * i, 1, 7),
            Ok(lock::SUCCESS)
        );
    }
    assert_eq!(server.lock_count(), 5);
    assert_eq!(b.lock(1, lock::RDLCK, 300, 1, 7), Err(Errno::ENOLCK));
    assert_eq!(server.stats().lock_limit_hits, 1);
    // Room again once a's fid is clunked.
    a.clunk(0).unwrap();
    assert_eq!(b.lock(1, lock::RDLCK, 300, 1, 7), Ok(lock::SUCCESS));
}

#[test]
fn client_ids_are_bounded_and_stored_once() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.lcreate(0, "f", RDWR, 0o644).unwrap();
    let longest = [b'x'; 256];
    for i in 0..100 {
        assert_eq!(
            lock_as(&mut c, 0, lock::WRLCK, 2 * i, 1, &longest),
            Ok(lock::SUCCESS)
        );
    }
    let too_long = [b'x'; 257];
    assert_eq!(
        lock_as(&mut c, 0, lock::WRLCK, 500, 1, &too_long),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        getlock_as(&mut c, 0, lock::UNLCK, (0, 0), &too_long),
        Err(Errno::EINVAL)
    );
    assert_eq!(server.stats().long_client_ids, 2);
    // 100 lock records and one copy of the id.
    let bytes = server.lock_bytes(c.io.conn.session());
    let records = 100 * ninep::server::locks::LOCK_RECORD_BYTES;
    assert!(
        (records + 256..records + 512).contains(&bytes),
        "{bytes} bytes for 100 locks of {} bytes",
        ninep::server::locks::LOCK_RECORD_BYTES
    );
    c.clunk(0).unwrap();
    assert_eq!(server.lock_bytes(c.io.conn.session()), 0);
}

#[test]
fn teardown_releases_open_files() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    c.write(1, 0, b"data").unwrap();
    c.unlinkat(0, "f", 0).unwrap();
    // Unlinked but open: still readable.
    assert_eq!(c.read(1, 0, 10).unwrap(), b"data");
    let before = server.fs().inode_count();
    let Local { conn } = c.io;
    pollster::block_on(conn.shutdown());
    assert_eq!(
        server.fs().inode_count(),
        before - 1,
        "orphan freed at release"
    );
    let stats = server.stats();
    assert_eq!((stats.connections_opened, stats.connections_closed), (1, 1));
}

#[test]
fn timings_split_by_request_kind() {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Every reading of this clock is 1000 ns after the last.
    fn clock() -> u64 {
        static T: AtomicU64 = AtomicU64::new(0);
        T.fetch_add(1000, Ordering::Relaxed)
    }
    let untimed = model_server(Config::default());
    let mut c = client(&untimed);
    c.attach(0, 0, "").unwrap();
    assert_eq!(untimed.timings(), ninep::server::Timings::default());

    let server = model_server(Config {
        clock: Some(clock),
        ..Config::default()
    });
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    let t0 = server.timings();
    assert!(t0.other_ns > 0 && t0.write_ns == 0 && t0.fsync_ns == 0 && t0.read_ns == 0);
    c.write(1, 0, b"data").unwrap();
    c.fsync(1, false).unwrap();
    c.read(1, 0, 4).unwrap();
    let t = server.timings();
    assert!(t.write_ns > 0 && t.fsync_ns > 0 && t.read_ns > 0, "{t:?}");
    assert_eq!(t.other_ns, t0.other_ns);
}

#[test]
fn requests_are_counted_and_timed_by_type_from_receipt_to_reply() {
    use std::sync::atomic::{AtomicU64, Ordering};
    fn clock() -> u64 {
        static T: AtomicU64 = AtomicU64::new(0);
        T.fetch_add(1000, Ordering::Relaxed)
    }
    let untimed = model_server(Config::default());
    let mut c = client(&untimed);
    c.attach(0, 0, "").unwrap();
    let r = untimed.request_stats();
    assert_eq!(r.received(104), 1, "counted without a clock");
    assert!(r.latency(104).is_empty(), "but not timed");

    let server = model_server(Config {
        clock: Some(clock),
        ..Config::default()
    });
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    for i in 0..3 {
        c.write(1, i * 4, b"data").unwrap();
    }
    c.fsync(1, false).unwrap();
    // A flush of no request in flight is answered at once; it is timed too.
    c.rpc(&Tmsg::Flush { oldtag: 999 }).unwrap();
    assert_eq!(c.read(1, 0, 100).unwrap(), b"datadatadata");
    // Error replies are answers too.
    assert_eq!(c.read(42, 0, 1).unwrap_err(), Errno::EBADF);
    let r = server.request_stats();
    const TWRITE: u8 = 118;
    assert_eq!(r.received(TWRITE), 3);
    assert_eq!(r.received(116), 2, "Tread");
    let seen: Vec<(String, u64, u64)> = r.by_type().map(|(n, k, h)| (n, k, h.count)).collect();
    for name in [
        "Tversion", "Tattach", "Twalk", "Tlcreate", "Twrite", "Tfsync", "Tflush", "Tread",
    ] {
        assert!(seen.iter().any(|(n, _, _)| n == name), "{name} in {seen:?}");
    }
    for (name, received, h) in r.by_type() {
        assert_eq!(received, h.count, "{name}: every request answered once");
        assert_eq!(h.buckets.iter().sum::<u64>(), h.count, "{name}");
        assert!(
            h.sum_ns >= 1000 * h.count,
            "{name}: at least one clock step each"
        );
    }
}

#[test]
fn fid_limit_is_emfile() {
    let server = model_server(Config {
        max_fids: 3,
        ..Config::default()
    });
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.walk(0, 2, "").unwrap();
    assert_eq!(c.walk(0, 3, ""), Err(Errno::EMFILE));
    assert_eq!(c.attach(3, 0, ""), Err(Errno::EMFILE));
    assert_eq!(c.xattrwalk(0, 3, ""), Err(Errno::EMFILE));
    c.walk(0, 2, "").unwrap_err();
    c.clunk(2).unwrap();
    c.walk(0, 3, "").unwrap();
    assert_eq!(server.stats().fid_limit_hits, 3);
}

fn export_config() -> Config {
    let mut exp = Export::root("inner");
    exp.path = "/srv/data".into();
    let mut ro = Export::root("ro");
    ro.read_only = true;
    let mut squashed = Export::root("squash");
    squashed.squash = Squash::Root;
    let mut all = Export::root("all");
    all.squash = Squash::All;
    all.anon_uid = 4000;
    all.anon_gid = 4001;
    Config {
        exports: vec![Export::root(""), exp, ro, squashed, all],
        ..Config::default()
    }
}

#[test]
fn exports_confine_walks_and_apply_options() {
    let server = model_server(export_config());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.mkdir(0, "srv", 0o755).unwrap();
    c.walk(0, 1, "srv").unwrap();
    c.mkdir(1, "data", 0o755).unwrap();
    c.walk(0, 2, "srv/data").unwrap();
    c.mkdir(2, "sub", 0o755).unwrap();

    let root = c.attach(10, 0, "inner").unwrap();
    assert_eq!(root, c.walk(0, 3, "srv/data").unwrap()[1]);
    // `..` at the export root stays there, however often.
    let up = c.walk(10, 11, "sub/../../../..").unwrap();
    assert_eq!(*up.last().unwrap(), root);
    // `../srv` finds no `srv` beside the export: a short walk, fid 12 not bound.
    assert_eq!(c.walk(10, 12, "../srv").unwrap(), vec![root]);
    assert_eq!(c.clunk(12), Err(Errno::EBADF));
    c.walk(10, 13, "").unwrap();
    c.lopen(13, of::RDONLY).unwrap();
    let entries = c.readdir_all(13, 4096).unwrap();
    let dotdot = entries.iter().find(|e| e.name == b"..").unwrap();
    assert_eq!(
        dotdot.qid.path, root.path,
        "readdir's .. of the export root"
    );
    // Unknown export.
    assert_eq!(c.attach(20, 0, "nope"), Err(Errno::ENOENT));
    // Also selectable by path.
    assert_eq!(c.attach(20, 0, "/srv/data").unwrap(), root);

    // Read-only export.
    c.attach(30, 0, "ro").unwrap();
    assert_eq!(c.mkdir(30, "x", 0o755), Err(Errno::EROFS));
    c.walk(30, 31, "srv").unwrap();
    assert_eq!(
        c.setattr(31, setattr::MODE, 0o700, 0, 0, 0),
        Err(Errno::EROFS)
    );
    c.walk(30, 32, "").unwrap();
    assert_eq!(c.lcreate(32, "f", RDWR, 0o644), Err(Errno::EROFS));
    c.walk(0, 4, "").unwrap();
    c.lcreate(4, "file", RDWR, 0o644).unwrap();
    c.walk(30, 33, "file").unwrap();
    c.lopen(33, of::RDONLY).unwrap();
    c.walk(30, 34, "file").unwrap();
    assert_eq!(c.lopen(34, RDWR), Err(Errno::EROFS));
    assert_eq!(c.unlinkat(30, "file", 0), Err(Errno::EROFS));
    c.walk(30, 35, "file").unwrap();
    assert_eq!(c.xattrcreate(35, "user.x", 1, 0), Err(Errno::EROFS));
}

#[test]
fn squashing_maps_users() {
    let server = model_server(export_config());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.setattr(0, setattr::MODE, 0o777, 0, 0, 0).unwrap();
    // root_squash: root acts as nobody.
    c.attach(1, 0, "squash").unwrap();
    c.walk(1, 2, "").unwrap();
    c.lcreate(2, "by-squashed-root", RDWR, 0o600).unwrap();
    let st = c.getattr(2).unwrap();
    assert_eq!((st.uid, st.gid), (65534, 65534));
    // all_squash: everyone is the export's anonymous user.
    c.attach(3, 1234, "all").unwrap();
    c.mkdir(3, "by-anyone", 0o755).unwrap();
    c.walk(3, 4, "by-anyone").unwrap();
    let st = c.getattr(4).unwrap();
    assert_eq!((st.uid, st.gid), (4000, 4001));
}

#[test]
fn permissions_follow_the_attaching_user() {
    let mut config = Config::default();
    config.groups.insert(1001, vec![500]);
    let server = model_server(config);
    let mut root = client(&server);
    root.attach(0, 0, "").unwrap();
    root.walk(0, 1, "").unwrap();
    root.lcreate(1, "secret", RDWR, 0o600).unwrap();
    root.walk(0, 2, "").unwrap();
    root.lcreate(2, "public", RDWR, 0o644).unwrap();
    root.walk(0, 3, "").unwrap();
    root.lcreate(3, "group", RDWR, 0o660).unwrap();
    root.setattr(3, setattr::GID, 0, 0, 500, 0).unwrap();
    root.mkdir(0, "locked", 0o700).unwrap();
    root.mkdir(0, "tmp", 0o1777).unwrap();

    // access=user: one attach per uid, n_uname carries it.
    let mut u = client(&server);
    u.attach(0, 1000, "").unwrap();
    u.walk(0, 1, "secret").unwrap();
    assert_eq!(u.lopen(1, of::RDONLY), Err(Errno::EACCES));
    u.walk(0, 2, "public").unwrap();
    assert_eq!(u.lopen(2, RDWR), Err(Errno::EACCES));
    u.lopen(2, of::RDONLY).unwrap();
    // No search permission: the first step fails; a later step makes the walk short.
    u.walk(0, 3, "locked").unwrap();
    assert_eq!(u.walk(3, 4, "x"), Err(Errno::EACCES));
    assert_eq!(u.walk(0, 4, "locked/x").unwrap().len(), 1);
    u.clunk(3).unwrap();
    u.walk(0, 3, "").unwrap();
    assert_eq!(u.lcreate(3, "mine", RDWR, 0o644), Err(Errno::EACCES));
    assert_eq!(u.unlinkat(0, "public", 0), Err(Errno::EACCES));
    u.walk(0, 4, "public").unwrap();
    assert_eq!(
        u.setattr(4, setattr::MODE, 0o777, 0, 0, 0),
        Err(Errno::EPERM)
    );
    assert_eq!(u.setattr(4, setattr::UID, 0, 1000, 0, 0), Err(Errno::EPERM));
    assert_eq!(u.setattr(4, setattr::SIZE, 0, 0, 0, 0), Err(Errno::EACCES));
    // Group membership comes from the configuration.
    u.walk(0, 5, "group").unwrap();
    assert_eq!(u.lopen(5, of::RDONLY), Err(Errno::EACCES));
    let mut g = client(&server);
    g.attach(0, 1001, "").unwrap();
    g.walk(0, 5, "group").unwrap();
    g.lopen(5, RDWR).unwrap();
    // Sticky directory: others' entries cannot be removed.
    g.walk(0, 6, "tmp").unwrap();
    g.walk(6, 7, "").unwrap();
    g.lcreate(7, "g-file", RDWR, 0o666).unwrap();
    assert_eq!(g.getattr(7).unwrap().uid, 1001);
    u.walk(0, 6, "tmp").unwrap();
    assert_eq!(u.unlinkat(6, "g-file", 0), Err(Errno::EPERM));
    assert_eq!(u.renameat(6, "g-file", 6, "stolen"), Err(Errno::EPERM));
    g.unlinkat(6, "g-file", 0).unwrap();
    // Device nodes are root's.
    assert_eq!(u.mknod(6, "dev", 0o020644, 1, 3), Err(Errno::EPERM));
    // The mount-time attach Linux makes: uname "nobody", no numeric uid.
    let mut n = client(&server);
    n.attach_named(0, b"nobody", ninep::wire::NONUNAME, "")
        .unwrap();
    n.walk(0, 1, "secret").unwrap();
    assert_eq!(n.lopen(1, of::RDONLY), Err(Errno::EACCES));
    n.attach_named(2, b"root", ninep::wire::NONUNAME, "")
        .unwrap();
    n.walk(2, 3, "secret").unwrap();
    n.lopen(3, of::RDONLY).unwrap();
}

fn gated_server(config: Config) -> (Arc<ninep::server::Server<GatedFs>>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let fs = GatedFs {
        inner: testkit::model::ModelFs::new(Ticks::default()),
        gate: gate.clone(),
    };
    (Arc::new(ninep::server::Server::new(fs, config)), gate)
}

/// A connection with fid 1 = an open file "f" holding "abc".
fn open_file(server: &Arc<ninep::server::Server<GatedFs>>) -> Connection<GatedFs> {
    let mut c = client(server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    c.write(1, 0, b"abc").unwrap();
    c.io.conn
}

#[test]
fn slow_fsync_does_not_hold_up_other_tags() {
    let (server, gate) = gated_server(Config::default());
    let mut conn = open_file(&server);
    conn.receive(&frame(
        100,
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
    ));
    conn.receive(&frame(
        101,
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 10,
        },
    ));
    poll(&mut conn);
    assert_eq!(gate.arrivals(), 1, "fsync reached the filesystem");
    assert_eq!(
        replies(&mut conn),
        vec![(101, 117)],
        "read answered, fsync pending"
    );
    assert_eq!(conn.in_flight(), 1);
    gate.open();
    poll(&mut conn);
    assert_eq!(replies(&mut conn), vec![(100, 51)]);
}

#[test]
fn flush_answers_after_the_flushed_reply() {
    let (server, gate) = gated_server(Config::default());
    let mut conn = open_file(&server);
    conn.receive(&frame(
        7,
        Tmsg::Fsync {
            fid: 1,
            datasync: 1,
        },
    ));
    conn.receive(&frame(8, Tmsg::Flush { oldtag: 7 }));
    conn.receive(&frame(9, Tmsg::Flush { oldtag: 8 }));
    // Flushing a tag not in flight answers at once.
    conn.receive(&frame(10, Tmsg::Flush { oldtag: 555 }));
    poll(&mut conn);
    assert_eq!(replies(&mut conn), vec![(10, 109)]);
    gate.open();
    poll(&mut conn);
    // The fsync's own reply, then the flushes in order; nothing for tag 7 after that.
    assert_eq!(replies(&mut conn), vec![(7, 51), (8, 109), (9, 109)]);
    // Tags are free again.
    conn.receive(&frame(
        7,
        Tmsg::Getattr {
            fid: 1,
            request_mask: 0x7ff,
        },
    ));
    poll(&mut conn);
    assert_eq!(replies(&mut conn), vec![(7, 25)]);
}

#[test]
fn in_flight_limit_applies_backpressure() {
    let (server, gate) = gated_server(Config {
        max_in_flight: 2,
        ..Config::default()
    });
    let mut conn = open_file(&server);
    let mut bytes = Vec::new();
    for tag in 1..=3 {
        bytes.extend(frame(
            tag,
            Tmsg::Fsync {
                fid: 1,
                datasync: 0,
            },
        ));
    }
    let taken = conn.receive(&bytes);
    assert_eq!(taken, bytes.len() * 2 / 3, "third request left unread");
    assert!(conn.read_buf().is_empty());
    poll(&mut conn);
    assert_eq!(server.stats().in_flight_limit_hits, 1);
    gate.open();
    poll(&mut conn);
    // Answered but unsent replies still count: a client that does not read its replies
    // cannot make the server queue more.
    assert_eq!(conn.receive(&bytes[taken..]), 0);
    let first = conn.take_output().unwrap();
    assert_eq!(Rmsg::decode(&first).unwrap().1.msg_type(), 51);
    assert_eq!(conn.receive(&bytes[taken..]), bytes.len() - taken);
    poll(&mut conn);
    assert_eq!(replies(&mut conn).len(), 2);
}

#[test]
fn protocol_violations_close_the_connection_only() {
    let server = model_server(Config::default());
    let mut other = client(&server);
    other.attach(0, 0, "").unwrap();

    let mut c = client(&server);
    c.version(8192, b"9P2000.L").unwrap();
    // A frame larger than msize.
    let mut big = 9000u32.to_le_bytes().to_vec();
    big.extend([118, 1, 0]);
    c.io.conn.receive(&big);
    assert_eq!(c.io.conn.closing(), Some(CloseReason::BadFrameSize(9000)));
    assert!(c.io.conn.read_buf().is_empty());

    let (gserver, _gate) = gated_server(Config::default());
    let mut conn = open_file(&gserver);
    conn.receive(&frame(
        5,
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
    ));
    conn.receive(&frame(5, Tmsg::Clunk { fid: 1 }));
    assert_eq!(conn.closing(), Some(CloseReason::DuplicateTag(5)));
    assert_eq!(gserver.stats().duplicate_tags, 1);

    // A tiny size field.
    let mut c2 = client(&server);
    c2.io.conn.receive(&[3, 0, 0, 0]);
    assert_eq!(c2.io.conn.closing(), Some(CloseReason::BadFrameSize(3)));

    // Malformed but well-framed: an error reply, the connection lives on.
    let mut c3 = client(&server);
    let mut bad = frame(4, Tmsg::Clunk { fid: 1 });
    bad.push(0);
    bad[0] += 1;
    c3.io.conn.receive(&bad);
    poll(&mut c3.io.conn);
    let reply = c3.io.conn.take_output().unwrap();
    assert_eq!(
        Rmsg::decode(&reply).unwrap(),
        (
            4,
            Rmsg::Lerror {
                ecode: Errno::EPROTO.0
            }
        )
    );
    c3.attach(0, 0, "").unwrap();
    let mut unknown = frame(4, Tmsg::Clunk { fid: 1 });
    unknown[4] = 200;
    assert_eq!(
        c3.io.exchange_raw(&unknown),
        Rmsg::Lerror {
            ecode: Errno::EOPNOTSUPP.0
        }
        .msg_type()
    );

    // Others are unaffected.
    assert!(other.walk(0, 1, "").is_ok());
}

trait RawExchange {
    fn exchange_raw(&mut self, frame: &[u8]) -> u8;
}

impl<F: FileSystem + 'static> RawExchange for Local<F> {
    fn exchange_raw(&mut self, frame: &[u8]) -> u8 {
        use ninep::testing::Exchange;
        let reply = self.exchange(frame);
        Rmsg::decode(&reply).unwrap().1.msg_type()
    }
}

#[test]
fn auth_is_not_needed() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    let auth = Tmsg::Auth {
        afid: 1,
        uname: b"u",
        aname: b"",
        n_uname: 1000,
    };
    assert_eq!(c.rpc(&auth), Err(Errno::EOPNOTSUPP));
}

#[test]
fn version_resets_the_session() {
    let server = model_server(Config::default());
    let mut c = client(&server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", RDWR, 0o644).unwrap();
    c.version(65536, b"9P2000.L").unwrap();
    assert_eq!(c.io.conn.session().fid_count(), 0);
    assert_eq!(server.stats().releases, 1);
    assert_eq!(c.clunk(0), Err(Errno::EBADF));
}

/// An in-memory byte stream that hands out input `read_chunk` bytes at a time (then
/// EOF) and takes output `write_chunk` bytes at a time.
struct Trickle {
    input: Vec<u8>,
    pos: usize,
    read_chunk: usize,
    write_chunk: usize,
    output: Vec<u8>,
}

impl ninep::conn::Transport for Trickle {
    type Error = ();

    fn poll_read(
        &mut self,
        _: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<Result<usize, ()>> {
        let n = buf
            .len()
            .min(self.read_chunk)
            .min(self.input.len() - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        std::task::Poll::Ready(Ok(n))
    }

    fn poll_write(
        &mut self,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<Result<usize, ()>> {
        let n = buf.len().min(self.write_chunk);
        self.output.extend_from_slice(&buf[..n]);
        std::task::Poll::Ready(Ok(n))
    }
}

#[test]
fn run_reassembles_frames_from_any_chunking() {
    let payload: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    let mut input = Vec::new();
    let requests = [
        Tmsg::Version {
            msize: 65536,
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
            name: b"f",
            flags: RDWR,
            mode: 0o644,
            gid: 0,
        },
        Tmsg::Write {
            fid: 1,
            offset: 0,
            data: ninep::wire::Data(&payload),
        },
        Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 50_000,
        },
        Tmsg::Clunk { fid: 1 },
    ];
    for (tag, m) in requests.iter().enumerate() {
        m.encode(tag as u16, &mut input).unwrap();
    }
    for (read_chunk, write_chunk) in [(1, 1), (5, 7), (20_000, 3), (1 << 20, 1 << 20)] {
        let server = model_server(Config::default());
        let mut io = Trickle {
            input: input.clone(),
            pos: 0,
            read_chunk,
            write_chunk,
            output: Vec::new(),
        };
        pollster::block_on(Connection::new(server.clone()).run(&mut io)).unwrap();
        let mut rest = &io.output[..];
        let mut got = Vec::new();
        while !rest.is_empty() {
            let size = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            let (tag, r) = Rmsg::decode(&rest[..size]).unwrap();
            if let Rmsg::Read { data } = &r {
                assert_eq!(data.0, &payload[..]);
            }
            got.push((tag, r.msg_type()));
            rest = &rest[size..];
        }
        let want: Vec<(u16, u8)> = requests
            .iter()
            .enumerate()
            .map(|(t, m)| (t as u16, m.msg_type() + 1))
            .collect();
        assert_eq!(got, want, "chunks {read_chunk}/{write_chunk}");
        // EOF tore the connection down.
        assert_eq!(server.stats().connections_closed, 1);
    }
}

/// A transport fed by the test: reads what was pushed into `input` (pending while it is
/// empty), collects what the connection writes.
#[derive(Default)]
struct Scripted {
    input: std::rc::Rc<std::cell::RefCell<Vec<u8>>>,
    output: std::rc::Rc<std::cell::RefCell<Vec<u8>>>,
}

impl ninep::conn::Transport for Scripted {
    type Error = ();
    fn poll_read(
        &mut self,
        _: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<Result<usize, ()>> {
        let mut input = self.input.borrow_mut();
        if input.is_empty() {
            return std::task::Poll::Pending;
        }
        let n = buf.len().min(input.len());
        buf[..n].copy_from_slice(&input[..n]);
        input.drain(..n);
        std::task::Poll::Ready(Ok(n))
    }
    fn poll_write(
        &mut self,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<Result<usize, ()>> {
        self.output.borrow_mut().extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
}

/// Every reply frame in `bytes`, as (tag, type).
fn reply_frames(bytes: &[u8]) -> Vec<(u16, u8)> {
    let mut rest = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let size = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        let (tag, r) = Rmsg::decode(&rest[..size]).unwrap();
        out.push((tag, r.msg_type()));
        rest = &rest[size..];
    }
    out
}

#[test]
fn a_shutdown_answers_the_requests_in_flight_then_closes() {
    let (server, gate) = gated_server(Config::default());
    let conn = open_file(&server);
    let io = Scripted::default();
    let (input, output) = (io.input.clone(), io.output.clone());
    input.borrow_mut().extend(frame(
        5,
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
    ));
    let mut io = io;
    let mut run = std::pin::pin!(conn.run(&mut io));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(run.as_mut().poll(&mut cx).is_pending());
    assert_eq!(gate.arrivals(), 1, "the fsync is in flight");

    assert_eq!(server.shut_down(), 1);
    // A request that arrives now is not read.
    let late = frame(
        6,
        Tmsg::Getattr {
            fid: 1,
            request_mask: 0x7ff,
        },
    );
    input.borrow_mut().extend(&late);
    assert!(
        run.as_mut().poll(&mut cx).is_pending(),
        "waits for the fsync"
    );
    assert!(output.borrow().is_empty());
    gate.open();
    match run.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => assert_eq!(r, Ok(Some(CloseReason::Shutdown))),
        std::task::Poll::Pending => panic!("the connection should have closed"),
    }
    assert_eq!(
        reply_frames(&output.borrow()),
        vec![(5, 51)],
        "the fsync answered"
    );
    assert_eq!(*input.borrow(), late, "the late request left unread");
    assert_eq!(server.stats().connections_closed, 1);
    // A connection opened during the shutdown closes before it reads anything.
    let newcomer = Connection::new(server.clone());
    assert_eq!(
        newcomer.session().close_requested(),
        Some(CloseReason::Shutdown)
    );
}

#[test]
fn a_shutdown_past_its_grace_sheds_the_connection_after_its_requests() {
    let (server, gate) = gated_server(Config::default());
    let conn = open_file(&server);
    let mut io = Scripted::default();
    let (input, output) = (io.input.clone(), io.output.clone());
    input.borrow_mut().extend(frame(
        5,
        Tmsg::Fsync {
            fid: 1,
            datasync: 0,
        },
    ));
    let mut run = std::pin::pin!(conn.run(&mut io));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(run.as_mut().poll(&mut cx).is_pending());
    assert_eq!(server.shut_down(), 1);
    assert_eq!(server.shut_down_now(), 1);
    // Shed, but the fsync still runs to its end before the connection is torn down.
    assert!(run.as_mut().poll(&mut cx).is_pending());
    assert_eq!(server.stats().connections_closed, 0);
    gate.open();
    match run.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => assert_eq!(r, Ok(Some(CloseReason::ShutdownNow))),
        std::task::Poll::Pending => panic!("the connection should have closed"),
    }
    assert!(output.borrow().is_empty(), "its reply dropped");
    assert_eq!(server.stats().connections_closed, 1);
}

#[test]
fn shedding_overrides_a_polite_close_and_nothing_else_does() {
    use CloseReason::*;
    assert!(Shutdown.overridden_by(ShutdownNow));
    assert!(Shutdown.overridden_by(MemoryReclaimed));
    assert!(BadFrameSize(3).overridden_by(IdleTimeout));
    assert!(!ShutdownNow.overridden_by(Shutdown));
    assert!(!IdleTimeout.overridden_by(ShutdownNow));
    assert!(!Shutdown.overridden_by(DuplicateTag(1)));
    assert!(Shutdown.finishes_requests() && !ShutdownNow.finishes_requests());
}

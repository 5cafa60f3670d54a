//! Property tests of the 9P codec: every message round-trips in both directions, and no
//! byte string — random, truncated or mutated — makes decoding panic.

use std::sync::LazyLock;

use ninep::wire::{Data, DirentIter, Qid, Rmsg, Tmsg};
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, Union};

/// Pseudo-random bytes (non-UTF-8, NULs and slashes included) that generated messages
/// borrow their names and payloads from.
static POOL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..140_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
});

fn bytes(max: usize) -> impl Strategy<Value = &'static [u8]> + Clone {
    (0..70_000usize, 0..=max).prop_map(|(start, len)| &POOL[start..start + len])
}

fn name() -> impl Strategy<Value = &'static [u8]> + Clone {
    prop_oneof![bytes(300), bytes(65535)]
}

fn qid() -> impl Strategy<Value = Qid> + Clone {
    (any::<u8>(), any::<u32>(), any::<u64>()).prop_map(|(ty, version, path)| Qid {
        ty,
        version,
        path,
    })
}

fn data() -> impl Strategy<Value = Data<'static>> + Clone {
    prop_oneof![bytes(64), bytes(66_000)].prop_map(Data)
}

fn walk_names() -> impl Strategy<Value = Vec<&'static [u8]>> {
    prop::collection::vec(bytes(40), 0..=16)
}

fn tmsg() -> BoxedStrategy<Tmsg<'static>> {
    let u32_ = any::<u32>;
    let u64_ = any::<u64>;
    Union::new(vec![
        (u32_(), name())
            .prop_map(|(msize, version)| Tmsg::Version { msize, version })
            .boxed(),
        (u32_(), name(), name(), u32_())
            .prop_map(|(afid, uname, aname, n_uname)| Tmsg::Auth {
                afid,
                uname,
                aname,
                n_uname,
            })
            .boxed(),
        (u32_(), u32_(), name(), name(), u32_())
            .prop_map(|(fid, afid, uname, aname, n_uname)| Tmsg::Attach {
                fid,
                afid,
                uname,
                aname,
                n_uname,
            })
            .boxed(),
        any::<u16>()
            .prop_map(|oldtag| Tmsg::Flush { oldtag })
            .boxed(),
        (u32_(), u32_(), walk_names())
            .prop_map(|(fid, newfid, names)| Tmsg::Walk { fid, newfid, names })
            .boxed(),
        (u32_(), u64_(), u32_())
            .prop_map(|(fid, offset, count)| Tmsg::Read { fid, offset, count })
            .boxed(),
        (u32_(), u64_(), data())
            .prop_map(|(fid, offset, data)| Tmsg::Write { fid, offset, data })
            .boxed(),
        u32_().prop_map(|fid| Tmsg::Clunk { fid }).boxed(),
        u32_().prop_map(|fid| Tmsg::Remove { fid }).boxed(),
        u32_().prop_map(|fid| Tmsg::Statfs { fid }).boxed(),
        (u32_(), u32_())
            .prop_map(|(fid, flags)| Tmsg::Lopen { fid, flags })
            .boxed(),
        (u32_(), name(), u32_(), u32_(), u32_())
            .prop_map(|(fid, name, flags, mode, gid)| Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            })
            .boxed(),
        (u32_(), name(), name(), u32_())
            .prop_map(|(fid, name, target, gid)| Tmsg::Symlink {
                fid,
                name,
                target,
                gid,
            })
            .boxed(),
        (u32_(), name(), u32_(), u32_(), u32_(), u32_())
            .prop_map(|(dfid, name, mode, major, minor, gid)| Tmsg::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                gid,
            })
            .boxed(),
        (u32_(), u32_(), name())
            .prop_map(|(fid, dfid, name)| Tmsg::Rename { fid, dfid, name })
            .boxed(),
        u32_().prop_map(|fid| Tmsg::Readlink { fid }).boxed(),
        (u32_(), u64_())
            .prop_map(|(fid, request_mask)| Tmsg::Getattr { fid, request_mask })
            .boxed(),
        (
            (u32_(), u32_(), u32_(), u32_(), u32_(), u64_()),
            (u64_(), u64_(), u64_(), u64_()),
        )
            .prop_map(
                |((fid, valid, mode, uid, gid, size), (a_s, a_ns, m_s, m_ns))| Tmsg::Setattr {
                    fid,
                    valid,
                    mode,
                    uid,
                    gid,
                    size,
                    atime_sec: a_s,
                    atime_nsec: a_ns,
                    mtime_sec: m_s,
                    mtime_nsec: m_ns,
                },
            )
            .boxed(),
        (u32_(), u32_(), name())
            .prop_map(|(fid, newfid, name)| Tmsg::Xattrwalk { fid, newfid, name })
            .boxed(),
        (u32_(), name(), u64_(), u32_())
            .prop_map(|(fid, name, attr_size, flags)| Tmsg::Xattrcreate {
                fid,
                name,
                attr_size,
                flags,
            })
            .boxed(),
        (u32_(), u64_(), u32_())
            .prop_map(|(fid, offset, count)| Tmsg::Readdir { fid, offset, count })
            .boxed(),
        (u32_(), u32_())
            .prop_map(|(fid, datasync)| Tmsg::Fsync { fid, datasync })
            .boxed(),
        (u32_(), any::<u8>(), u32_(), u64_(), u64_(), u32_(), name())
            .prop_map(
                |(fid, lock_type, flags, start, length, proc_id, client_id)| Tmsg::Lock {
                    fid,
                    lock_type,
                    flags,
                    start,
                    length,
                    proc_id,
                    client_id,
                },
            )
            .boxed(),
        (u32_(), any::<u8>(), u64_(), u64_(), u32_(), name())
            .prop_map(
                |(fid, lock_type, start, length, proc_id, client_id)| Tmsg::Getlock {
                    fid,
                    lock_type,
                    start,
                    length,
                    proc_id,
                    client_id,
                },
            )
            .boxed(),
        (u32_(), u32_(), name())
            .prop_map(|(dfid, fid, name)| Tmsg::Link { dfid, fid, name })
            .boxed(),
        (u32_(), name(), u32_(), u32_())
            .prop_map(|(dfid, name, mode, gid)| Tmsg::Mkdir {
                dfid,
                name,
                mode,
                gid,
            })
            .boxed(),
        (u32_(), name(), u32_(), name())
            .prop_map(|(olddirfid, oldname, newdirfid, newname)| Tmsg::Renameat {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            })
            .boxed(),
        (u32_(), name(), u32_())
            .prop_map(|(dirfid, name, flags)| Tmsg::Unlinkat {
                dirfid,
                name,
                flags,
            })
            .boxed(),
    ])
    .boxed()
}

fn rmsg() -> BoxedStrategy<Rmsg<'static>> {
    let u32_ = any::<u32>;
    let u64_ = any::<u64>;
    Union::new(vec![
        u32_().prop_map(|ecode| Rmsg::Lerror { ecode }).boxed(),
        (u32_(), name())
            .prop_map(|(msize, version)| Rmsg::Version { msize, version })
            .boxed(),
        qid().prop_map(|aqid| Rmsg::Auth { aqid }).boxed(),
        qid().prop_map(|qid| Rmsg::Attach { qid }).boxed(),
        Just(Rmsg::Flush {}).boxed(),
        prop::collection::vec(qid(), 0..=16)
            .prop_map(|qids| Rmsg::Walk { qids })
            .boxed(),
        data().prop_map(|data| Rmsg::Read { data }).boxed(),
        u32_().prop_map(|count| Rmsg::Write { count }).boxed(),
        Just(Rmsg::Clunk {}).boxed(),
        Just(Rmsg::Remove {}).boxed(),
        (
            (u32_(), u32_(), u64_(), u64_(), u64_()),
            (u64_(), u64_(), u64_(), u32_()),
        )
            .prop_map(
                |((fs_type, bsize, blocks, bfree, bavail), (files, ffree, fsid, namelen))| {
                    Rmsg::Statfs {
                        fs_type,
                        bsize,
                        blocks,
                        bfree,
                        bavail,
                        files,
                        ffree,
                        fsid,
                        namelen,
                    }
                },
            )
            .boxed(),
        (qid(), u32_())
            .prop_map(|(qid, iounit)| Rmsg::Lopen { qid, iounit })
            .boxed(),
        (qid(), u32_())
            .prop_map(|(qid, iounit)| Rmsg::Lcreate { qid, iounit })
            .boxed(),
        qid().prop_map(|qid| Rmsg::Symlink { qid }).boxed(),
        qid().prop_map(|qid| Rmsg::Mknod { qid }).boxed(),
        Just(Rmsg::Rename {}).boxed(),
        name().prop_map(|target| Rmsg::Readlink { target }).boxed(),
        (
            (u64_(), qid(), u32_(), u32_(), u32_(), u64_(), u64_()),
            (u64_(), u64_(), u64_(), u64_(), u64_(), u64_()),
            (u64_(), u64_(), u64_(), u64_(), u64_(), u64_(), u64_()),
        )
            .prop_map(
                |(
                    (valid, qid, mode, uid, gid, nlink, rdev),
                    (size, blksize, blocks, atime_sec, atime_nsec, mtime_sec),
                    (mtime_nsec, ctime_sec, ctime_nsec, btime_sec, btime_nsec, gen, data_version),
                )| Rmsg::Getattr {
                    valid,
                    qid,
                    mode,
                    uid,
                    gid,
                    nlink,
                    rdev,
                    size,
                    blksize,
                    blocks,
                    atime_sec,
                    atime_nsec,
                    mtime_sec,
                    mtime_nsec,
                    ctime_sec,
                    ctime_nsec,
                    btime_sec,
                    btime_nsec,
                    gen,
                    data_version,
                },
            )
            .boxed(),
        Just(Rmsg::Setattr {}).boxed(),
        u64_().prop_map(|size| Rmsg::Xattrwalk { size }).boxed(),
        Just(Rmsg::Xattrcreate {}).boxed(),
        data().prop_map(|data| Rmsg::Readdir { data }).boxed(),
        Just(Rmsg::Fsync {}).boxed(),
        any::<u8>().prop_map(|status| Rmsg::Lock { status }).boxed(),
        (any::<u8>(), u64_(), u64_(), u32_(), name())
            .prop_map(
                |(lock_type, start, length, proc_id, client_id)| Rmsg::Getlock {
                    lock_type,
                    start,
                    length,
                    proc_id,
                    client_id,
                },
            )
            .boxed(),
        Just(Rmsg::Link {}).boxed(),
        qid().prop_map(|qid| Rmsg::Mkdir { qid }).boxed(),
        Just(Rmsg::Renameat {}).boxed(),
        Just(Rmsg::Unlinkat {}).boxed(),
    ])
    .boxed()
}

/// A valid frame of either direction, then damaged: truncated, extended, or with bytes
/// overwritten (the size field included, so it may lie).
fn damaged_frame() -> impl Strategy<Value = Vec<u8>> {
    let frame = prop_oneof![
        (tmsg(), any::<u16>()).prop_map(|(m, tag)| {
            let mut v = Vec::new();
            m.encode(tag, &mut v).unwrap();
            v
        }),
        (rmsg(), any::<u16>()).prop_map(|(m, tag)| {
            let mut v = Vec::new();
            m.encode(tag, &mut v).unwrap();
            v
        }),
    ];
    (
        frame,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(mut v, pokes, cut, truncate, fix_size)| {
            for (at, byte) in pokes {
                let i = at.index(v.len());
                v[i] = byte;
            }
            if truncate {
                v.truncate(cut.index(v.len() + 1));
            }
            if fix_size && v.len() >= 4 {
                let len = v.len() as u32;
                v[..4].copy_from_slice(&len.to_le_bytes());
            }
            v
        })
}

/// Every outcome of decoding must be consistent: a frame that decodes re-encodes to
/// exactly itself.
fn check_reencodes(frame: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((tag, m)) = Tmsg::decode(frame) {
        let mut again = Vec::new();
        m.encode(tag, &mut again).unwrap();
        prop_assert_eq!(again.as_slice(), frame);
    }
    if let Ok((tag, m)) = Rmsg::decode(frame) {
        let mut again = Vec::new();
        m.encode(tag, &mut again).unwrap();
        prop_assert_eq!(again.as_slice(), frame);
        if let Rmsg::Readdir { data } = m {
            // Entry parsing of arbitrary data must not panic either.
            let _ = DirentIter::new(data.0).count();
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn tmsg_roundtrip(m in tmsg(), tag in any::<u16>()) {
        let mut frame = Vec::new();
        let len = m.encode(tag, &mut frame).unwrap();
        prop_assert_eq!(len, frame.len());
        prop_assert_eq!(Tmsg::decode(&frame), Ok((tag, m.clone())));
        check_reencodes(&frame)?;
    }

    #[test]
    fn rmsg_roundtrip(m in rmsg(), tag in any::<u16>()) {
        let mut frame = Vec::new();
        let len = m.encode(tag, &mut frame).unwrap();
        prop_assert_eq!(len, frame.len());
        prop_assert_eq!(Rmsg::decode(&frame), Ok((tag, m.clone())));
        check_reencodes(&frame)?;
    }

    #[test]
    fn damaged_frames_never_panic(frame in damaged_frame()) {
        check_reencodes(&frame)?;
    }

    #[test]
    fn random_bytes_never_panic(mut frame in prop::collection::vec(any::<u8>(), 0..200), fix in any::<bool>()) {
        if fix && frame.len() >= 4 {
            let len = frame.len() as u32;
            frame[..4].copy_from_slice(&len.to_le_bytes());
        }
        check_reencodes(&frame)?;
    }
}

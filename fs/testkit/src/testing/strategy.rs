//! proptest strategies for op sequences.
//!
//! Sequences act on a small namespace (four common names, directories `/a`, `/b` and
//! one level below them) so that ops collide often: creates hit existing names, renames
//! replace things, rmdir meets non-empty directories. Arguments are mostly valid, with a
//! small share of invalid names, misaligned clones, oversized xattrs and the like. Every
//! op is an independent value, so proptest shrinks a failing sequence by dropping and
//! simplifying ops.

use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;
use proptest::strategy::Union;

use super::op::{Name, Op, Path, Target, XName};
use vfs::{mode, SetAttr, SetTime, Timespec, XattrMode, SYMLINK_MAX, XATTR_VALUE_MAX};

/// The number of proptest cases: `PROPTEST_CASES` from the environment, else `default`
/// (keeps `cargo test` fast while allowing long runs).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Which kinds of ops a generated sequence contains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenConfig {
    /// Emit [`Op::Remount`].
    pub remount: bool,
    /// Emit open/release and handle targets.
    pub handles: bool,
    /// Emit fsync/fdatasync/fsync-dir/sync.
    pub durability: bool,
    /// Emit ops with invalid arguments now and then.
    pub invalid: bool,
}

impl Default for GenConfig {
    fn default() -> GenConfig {
        GenConfig {
            remount: true,
            handles: true,
            durability: true,
            invalid: true,
        }
    }
}

fn invalid_name() -> BoxedStrategy<Name> {
    prop_oneof![
        Just(Name::Longest),
        Just(Name::TooLong),
        Just(Name::Empty),
        Just(Name::Dot),
        Just(Name::DotDot),
        Just(Name::Slash),
    ]
    .boxed()
}

/// Mostly one of the plain names in `usual`, sometimes any plain name, rarely (if
/// configured) an invalid one.
fn name_from(usual: core::ops::Range<u8>, config: GenConfig) -> BoxedStrategy<Name> {
    let valid = prop_oneof![8 => usual.prop_map(Name::Plain), 2 => (0u8..5).prop_map(Name::Plain)];
    if config.invalid {
        prop_oneof![30 => valid, 1 => invalid_name()].boxed()
    } else {
        valid.boxed()
    }
}

/// A name for a file: mostly `c` or `d`.
pub fn file_name(config: GenConfig) -> BoxedStrategy<Name> {
    name_from(2..4, config)
}

/// A name for a directory: mostly `a` or `b`.
pub fn dir_name(config: GenConfig) -> BoxedStrategy<Name> {
    name_from(0..2, config)
}

/// Any entry name.
pub fn name(config: GenConfig) -> BoxedStrategy<Name> {
    prop_oneof![file_name(config), dir_name(config)].boxed()
}

/// A directory: the root, `/a` or `/b`, or one level below `/a`.
pub fn dir_path() -> BoxedStrategy<Path> {
    prop_oneof![
        4 => Just(Path::root()),
        3 => (0u8..2).prop_map(|a| Path::of(&[a])),
        1 => (0u8..2).prop_map(|b| Path::of(&[0, b])),
    ]
    .boxed()
}

/// A path to something that is usually a file: a file name in one of the directories.
pub fn entry_path(config: GenConfig) -> BoxedStrategy<Path> {
    (dir_path(), file_name(config))
        .prop_map(|(mut dir, name)| {
            dir.0.push(name);
            dir
        })
        .boxed()
}

/// A target: a path, or now and then an open handle.
pub fn target(config: GenConfig) -> BoxedStrategy<Target> {
    let path = prop_oneof![6 => entry_path(config), 1 => dir_path()].prop_map(Target::Path);
    if config.handles {
        prop_oneof![6 => path, 1 => any::<u8>().prop_map(Target::Handle)].boxed()
    } else {
        path.boxed()
    }
}

/// A file offset: mostly in the first few blocks, sometimes block-aligned, sometimes
/// far out (sparse).
pub fn offset() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 0u64..12_288,
        2 => (0u64..4).prop_map(|b| b * 4096),
        1 => 0u64..(1 << 18),
    ]
    .boxed()
}

/// A data length: mostly under two blocks, sometimes zero or large.
pub fn length() -> BoxedStrategy<u32> {
    prop_oneof![
        5 => 1u32..5000,
        1 => 0u32..2,
        1 => (1u32..4).prop_map(|b| b * 4096),
        1 => 5000u32..70_000,
    ]
    .boxed()
}

fn time() -> BoxedStrategy<SetTime> {
    prop_oneof![
        Just(SetTime::Now),
        (0i64..2_000_000_000, 0u32..1_000_000_000)
            .prop_map(|(sec, nsec)| SetTime::To(Timespec { sec, nsec })),
    ]
    .boxed()
}

/// A `setattr`: a truncate, a chmod, a chown or a utimes (sometimes several).
pub fn set_attr() -> BoxedStrategy<SetAttr> {
    let size = prop_oneof![
        0u64..10_000,
        (0u64..4).prop_map(|b| b * 4096),
        Just(1u64 << 20)
    ];
    prop_oneof![
        4 => size.prop_map(|s| SetAttr { size: Some(s), ..SetAttr::default() }),
        2 => (0u32..0o10000).prop_map(|m| SetAttr { mode: Some(m), ..SetAttr::default() }),
        1 => (0u32..3, 0u32..3).prop_map(|(u, g)| SetAttr {
            uid: Some(u),
            gid: Some(g),
            ..SetAttr::default()
        }),
        1 => (proptest::option::of(time()), proptest::option::of(time())).prop_map(|(a, m)| {
            SetAttr { atime: a, mtime: m, ..SetAttr::default() }
        }),
        1 => Just(SetAttr::default()),
    ]
    .boxed()
}

fn xname(config: GenConfig) -> BoxedStrategy<XName> {
    let valid = prop_oneof![4 => (0u8..2).prop_map(XName), 1 => (2u8..4).prop_map(XName)];
    if config.invalid {
        prop_oneof![30 => valid, 1 => (4u8..6).prop_map(XName)].boxed()
    } else {
        valid.boxed()
    }
}

fn xattr_len(config: GenConfig) -> BoxedStrategy<u32> {
    let max = XATTR_VALUE_MAX as u32;
    if config.invalid {
        prop_oneof![20 => 0u32..100, 2 => 100u32..5000, 1 => Just(max), 1 => Just(max + 1)].boxed()
    } else {
        prop_oneof![20 => 0u32..100, 2 => 100u32..5000].boxed()
    }
}

fn symlink_target(config: GenConfig) -> BoxedStrategy<Vec<u8>> {
    let valid = prop_oneof![
        Just(b"a".to_vec()),
        Just(b"../b/c".to_vec()),
        Just(b"/abs/path".to_vec()),
        Just(vec![b't'; SYMLINK_MAX]),
    ];
    if config.invalid {
        prop_oneof![8 => valid, 1 => Just(Vec::new()), 1 => Just(vec![b't'; SYMLINK_MAX + 1])]
            .boxed()
    } else {
        valid.boxed()
    }
}

fn clone_op(config: GenConfig) -> BoxedStrategy<Op> {
    // Files are mostly a block or two long: clone from their start, to anywhere.
    let aligned = (
        target(config),
        prop_oneof![3 => Just(0u64), 1 => Just(4096)],
        target(config),
        (0u64..4).prop_map(|b| b * 4096),
        prop_oneof![3 => Just(4096u64), 1 => Just(8192)],
    );
    let any_args = (
        target(config),
        offset(),
        target(config),
        offset(),
        0u64..10_000,
    );
    let to_op = |(src, src_offset, dst, dst_offset, len)| Op::Clone {
        src,
        src_offset,
        dst,
        dst_offset,
        len,
    };
    if config.invalid {
        prop_oneof![3 => aligned.prop_map(to_op), 1 => any_args.prop_map(to_op)].boxed()
    } else {
        aligned.prop_map(to_op).boxed()
    }
}

/// One op, weighted towards namespace changes and writes.
pub fn op(config: GenConfig) -> BoxedStrategy<Op> {
    let c = config;
    let perm = prop_oneof![Just(0o644u32), Just(0o755), 0u32..0o10000];
    let mut arms: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (
            10,
            (dir_path(), file_name(c), perm.clone())
                .prop_map(|(dir, name, perm)| Op::Create { dir, name, perm })
                .boxed(),
        ),
        (
            6,
            (dir_path(), dir_name(c), perm)
                .prop_map(|(dir, name, perm)| Op::Mkdir { dir, name, perm })
                .boxed(),
        ),
        (
            12,
            (target(c), offset(), length(), any::<u8>())
                .prop_map(|(target, offset, len, seed)| Op::Write {
                    target,
                    offset,
                    len,
                    seed,
                })
                .boxed(),
        ),
        (
            4,
            (target(c), length(), any::<u8>())
                .prop_map(|(target, len, seed)| Op::Append { target, len, seed })
                .boxed(),
        ),
        (
            4,
            (target(c), offset(), length())
                .prop_map(|(target, offset, len)| Op::Read {
                    target,
                    offset,
                    len,
                })
                .boxed(),
        ),
        (
            5,
            (target(c), set_attr())
                .prop_map(|(target, changes)| Op::Setattr { target, changes })
                .boxed(),
        ),
        (
            6,
            (dir_path(), file_name(c))
                .prop_map(|(dir, name)| Op::Unlink { dir, name })
                .boxed(),
        ),
        (
            3,
            (dir_path(), dir_name(c))
                .prop_map(|(dir, name)| Op::Rmdir { dir, name })
                .boxed(),
        ),
        (
            8,
            (dir_path(), name(c), dir_path(), name(c))
                .prop_map(|(from_dir, from, to_dir, to)| Op::Rename {
                    from_dir,
                    from,
                    to_dir,
                    to,
                })
                .boxed(),
        ),
        (
            4,
            (target(c), dir_path(), file_name(c))
                .prop_map(|(target, dir, name)| Op::Link { target, dir, name })
                .boxed(),
        ),
        (
            2,
            (dir_path(), file_name(c), symlink_target(c))
                .prop_map(|(dir, name, target)| Op::Symlink { dir, name, target })
                .boxed(),
        ),
        (
            1,
            (
                dir_path(),
                file_name(c),
                prop_oneof![
                    Just(mode::S_IFCHR | 0o600),
                    Just(mode::S_IFBLK | 0o600),
                    Just(mode::S_IFIFO | 0o644),
                    Just(mode::S_IFSOCK | 0o755),
                    Just(0o644),
                    Just(mode::S_IFDIR | 0o755),
                ],
                0u64..0x10000,
            )
                .prop_map(|(dir, name, mode, rdev)| Op::Mknod {
                    dir,
                    name,
                    mode,
                    rdev,
                })
                .boxed(),
        ),
        (
            1,
            target(c).prop_map(|target| Op::Readlink { target }).boxed(),
        ),
        (
            2,
            (dir_path(), name(c))
                .prop_map(|(dir, name)| Op::Lookup { dir, name })
                .boxed(),
        ),
        (
            2,
            target(c).prop_map(|target| Op::Getattr { target }).boxed(),
        ),
        (
            3,
            (dir_path(), prop_oneof![1u8..4, Just(64)])
                .prop_map(|(dir, page)| Op::Readdir { dir, page })
                .boxed(),
        ),
        (3, clone_op(c)),
        (
            4,
            (
                target(c),
                xname(c),
                xattr_len(c),
                any::<u8>(),
                prop_oneof![
                    3 => Just(XattrMode::Upsert),
                    1 => Just(XattrMode::Create),
                    1 => Just(XattrMode::Replace)
                ],
            )
                .prop_map(|(target, name, len, seed, how)| Op::Setxattr {
                    target,
                    name,
                    len,
                    seed,
                    how,
                })
                .boxed(),
        ),
        (
            2,
            (target(c), xname(c))
                .prop_map(|(target, name)| Op::Getxattr { target, name })
                .boxed(),
        ),
        (
            1,
            target(c)
                .prop_map(|target| Op::Listxattr { target })
                .boxed(),
        ),
        (
            2,
            (target(c), xname(c))
                .prop_map(|(target, name)| Op::Removexattr { target, name })
                .boxed(),
        ),
        (1, Just(Op::Statfs).boxed()),
    ];
    if c.handles {
        arms.push((3, target(c).prop_map(|target| Op::Open { target }).boxed()));
        arms.push((
            2,
            any::<u8>()
                .prop_map(|handle| Op::Release { handle })
                .boxed(),
        ));
    }
    if c.durability {
        arms.push((
            4,
            (target(c), any::<bool>())
                .prop_map(|(target, datasync)| Op::Fsync { target, datasync })
                .boxed(),
        ));
        arms.push((2, dir_path().prop_map(|dir| Op::FsyncDir { dir }).boxed()));
        arms.push((1, Just(Op::Sync).boxed()));
    }
    if c.remount {
        arms.push((1, Just(Op::Remount).boxed()));
    }
    Union::new_weighted(arms).boxed()
}

/// A starting namespace so that later ops have something to act on: directories `/a`,
/// `/b` and `/a/a`, files `/c`, `/d`, `/a/c`, `/b/d`, and some data in `/c`.
pub fn prelude() -> Vec<Op> {
    let mut ops: Vec<Op> = [(Path::root(), 0), (Path::root(), 1), (Path::of(&[0]), 0)]
        .into_iter()
        .map(|(dir, n)| Op::Mkdir {
            dir,
            name: Name::Plain(n),
            perm: 0o755,
        })
        .collect();
    for (dir, n) in [
        (Path::root(), 2),
        (Path::root(), 3),
        (Path::of(&[0]), 2),
        (Path::of(&[1]), 3),
    ] {
        ops.push(Op::Create {
            dir,
            name: Name::Plain(n),
            perm: 0o644,
        });
    }
    ops.push(Op::Write {
        target: Target::Path(Path::of(&[2])),
        offset: 0,
        len: 6000,
        seed: 0,
    });
    ops
}

/// A sequence: [`prelude`] followed by `len` generated ops.
pub fn ops(config: GenConfig, len: core::ops::Range<usize>) -> BoxedStrategy<Vec<Op>> {
    proptest::collection::vec(op(config), len)
        .prop_map(|ops| {
            let mut all = prelude();
            all.extend(ops);
            all
        })
        .boxed()
}

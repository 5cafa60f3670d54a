//! The reference model's rules, one test (or more) per rule of `testkit::model`'s documentation.

use std::cell::Cell;

use pollster::block_on;
use testkit::model::{ModelConfig, ModelFs};
use vfs::{
    mode, Clock, Errno, FileSystem, FileType, Ino, Owner, SetAttr, SetTime, Timespec, XattrMode,
    NAME_MAX, ROOT_INO, SYMLINK_MAX, XATTR_VALUE_MAX,
};

/// A clock the test moves by hand.
#[derive(Debug, Default)]
struct Hand(Cell<i64>);

impl Clock for Hand {
    fn now(&self) -> Timespec {
        Timespec {
            sec: self.0.get(),
            nsec: 0,
        }
    }
}

fn t(sec: i64) -> Timespec {
    Timespec { sec, nsec: 0 }
}

const ME: Owner = Owner {
    uid: 1000,
    gid: 100,
};

fn model() -> ModelFs<Hand> {
    ModelFs::new(Hand::default())
}

fn set_time(fs: &ModelFs<Hand>, sec: i64) {
    fs.clock().0.set(sec);
}

fn create(fs: &ModelFs<Hand>, dir: Ino, name: &str) -> Ino {
    block_on(fs.create(dir, name.as_bytes(), 0o644, ME))
        .unwrap()
        .ino
}

fn mkdir(fs: &ModelFs<Hand>, dir: Ino, name: &str) -> Ino {
    block_on(fs.mkdir(dir, name.as_bytes(), 0o755, ME))
        .unwrap()
        .ino
}

fn nlink(fs: &ModelFs<Hand>, ino: Ino) -> u32 {
    block_on(fs.getattr(ino)).unwrap().nlink
}

fn read_all(fs: &ModelFs<Hand>, ino: Ino) -> Vec<u8> {
    let size = block_on(fs.getattr(ino)).unwrap().size as usize;
    let mut buf = vec![0xee; size + 10];
    let n = block_on(fs.read(ino, 0, &mut buf)).unwrap();
    buf.truncate(n);
    buf
}

fn names(fs: &ModelFs<Hand>, dir: Ino) -> Vec<String> {
    block_on(fs.readdir(dir, 0, 1000))
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

#[test]
fn root_is_an_empty_directory() {
    let fs = model();
    let root = block_on(fs.getattr(ROOT_INO)).unwrap();
    assert_eq!(root.file_type(), FileType::Directory);
    assert_eq!(root.mode, mode::S_IFDIR | 0o755);
    assert_eq!(root.nlink, 2);
    assert_eq!(names(&fs, ROOT_INO), [".", ".."]);
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"..")).unwrap().ino, ROOT_INO);
    assert_eq!(block_on(fs.getattr(99)), Err(Errno::ENOENT));
}

#[test]
fn name_validation() {
    let fs = model();
    let long = vec![b'x'; NAME_MAX + 1];
    let max = vec![b'x'; NAME_MAX];
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
        assert_eq!(
            block_on(fs.create(ROOT_INO, bad, 0o644, ME)),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            block_on(fs.mkdir(ROOT_INO, bad, 0o755, ME)),
            Err(Errno::EINVAL)
        );
        assert_eq!(block_on(fs.unlink(ROOT_INO, bad)), Err(Errno::EINVAL));
        assert_eq!(block_on(fs.rmdir(ROOT_INO, bad)), Err(Errno::EINVAL));
    }
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"a/b")), Err(Errno::EINVAL));
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"")), Err(Errno::EINVAL));
    assert_eq!(
        block_on(fs.create(ROOT_INO, &long, 0o644, ME)),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        block_on(fs.lookup(ROOT_INO, &long)),
        Err(Errno::ENAMETOOLONG)
    );
    // Argument validation comes before existence checks.
    assert_eq!(
        block_on(fs.create(999, &long, 0o644, ME)),
        Err(Errno::ENAMETOOLONG)
    );
    block_on(fs.create(ROOT_INO, &max, 0o644, ME)).unwrap();
    assert!(block_on(fs.lookup(ROOT_INO, &max)).is_ok());
}

#[test]
fn dot_and_dotdot_lookups() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    let b = mkdir(&fs, a, "b");
    assert_eq!(block_on(fs.lookup(b, b".")).unwrap().ino, b);
    assert_eq!(block_on(fs.lookup(b, b"..")).unwrap().ino, a);
    assert_eq!(block_on(fs.lookup(a, b"..")).unwrap().ino, ROOT_INO);
    let f = create(&fs, a, "f");
    assert_eq!(block_on(fs.lookup(f, b".")), Err(Errno::ENOTDIR));
    assert_eq!(block_on(fs.lookup(a, b"nope")), Err(Errno::ENOENT));
}

#[test]
fn create_kinds_and_eexist() {
    let fs = model();
    let f = block_on(fs.create(ROOT_INO, b"f", 0o4755 | mode::S_IFDIR, ME)).unwrap();
    assert_eq!(
        f.mode,
        mode::S_IFREG | 0o4755,
        "type bits of perm are ignored"
    );
    assert_eq!((f.uid, f.gid, f.nlink, f.size), (1000, 100, 1, 0));
    assert_eq!(
        block_on(fs.create(ROOT_INO, b"f", 0o644, ME)),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        block_on(fs.mkdir(ROOT_INO, b"f", 0o755, ME)),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        block_on(fs.create(f.ino, b"x", 0o644, ME)),
        Err(Errno::ENOTDIR)
    );
    assert_eq!(block_on(fs.create(77, b"x", 0o644, ME)), Err(Errno::ENOENT));

    let chr = block_on(fs.mknod(ROOT_INO, b"c", mode::S_IFCHR | 0o600, 0x0501, ME)).unwrap();
    assert_eq!((chr.file_type(), chr.rdev), (FileType::CharDevice, 0x0501));
    let fifo = block_on(fs.mknod(ROOT_INO, b"p", mode::S_IFIFO | 0o600, 7, ME)).unwrap();
    assert_eq!(
        (fifo.file_type(), fifo.rdev),
        (FileType::Fifo, 0),
        "rdev only for devices"
    );
    let sock = block_on(fs.mknod(ROOT_INO, b"s", mode::S_IFSOCK, 0, ME)).unwrap();
    assert_eq!(sock.file_type(), FileType::Socket);
    let blk = block_on(fs.mknod(ROOT_INO, b"b", mode::S_IFBLK, 3, ME)).unwrap();
    assert_eq!((blk.file_type(), blk.rdev), (FileType::BlockDevice, 3));
    let reg = block_on(fs.mknod(ROOT_INO, b"r", 0o600, 3, ME)).unwrap();
    assert_eq!((reg.file_type(), reg.rdev), (FileType::Regular, 0));
    assert_eq!(
        block_on(fs.mknod(ROOT_INO, b"d", mode::S_IFDIR | 0o755, 0, ME)),
        Err(Errno::EPERM)
    );
    assert_eq!(
        block_on(fs.mknod(ROOT_INO, b"l", mode::S_IFLNK | 0o777, 0, ME)),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        block_on(fs.mknod(ROOT_INO, b"l", 0o170000, 0, ME)),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        block_on(fs.read(chr.ino, 0, &mut [0; 4])),
        Err(Errno::EINVAL)
    );
}

#[test]
fn directory_link_counts() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    assert_eq!((nlink(&fs, ROOT_INO), nlink(&fs, a)), (3, 2));
    let b = mkdir(&fs, a, "b");
    create(&fs, a, "f");
    assert_eq!(
        (nlink(&fs, ROOT_INO), nlink(&fs, a), nlink(&fs, b)),
        (3, 3, 2)
    );
    block_on(fs.rmdir(a, b"b")).unwrap();
    assert_eq!(nlink(&fs, a), 2);
    // Moving a directory moves its ".." link.
    let c = mkdir(&fs, ROOT_INO, "c");
    block_on(fs.rename(ROOT_INO, b"c", a, b"c")).unwrap();
    assert_eq!((nlink(&fs, ROOT_INO), nlink(&fs, a)), (3, 3));
    assert_eq!(block_on(fs.lookup(c, b"..")).unwrap().ino, a);
}

#[test]
fn hard_links() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    let f = create(&fs, ROOT_INO, "f");
    let attr = block_on(fs.link(f, a, b"g")).unwrap();
    assert_eq!((attr.ino, attr.nlink), (f, 2));
    assert_eq!(block_on(fs.lookup(a, b"g")).unwrap().ino, f);
    assert_eq!(block_on(fs.link(f, a, b"g")), Err(Errno::EEXIST));
    assert_eq!(block_on(fs.link(a, ROOT_INO, b"x")), Err(Errno::EPERM));
    assert_eq!(block_on(fs.link(f, f, b"x")), Err(Errno::ENOTDIR));
    assert_eq!(block_on(fs.link(f, ROOT_INO, b"")), Err(Errno::EINVAL));
    block_on(fs.unlink(ROOT_INO, b"f")).unwrap();
    assert_eq!(nlink(&fs, f), 1);
    block_on(fs.unlink(a, b"g")).unwrap();
    assert_eq!(block_on(fs.getattr(f)), Err(Errno::ENOENT));
}

#[test]
fn link_limit() {
    let config = ModelConfig {
        max_links: 3,
        ..ModelConfig::default()
    };
    let fs = ModelFs::with_config(Hand::default(), config);
    let f = block_on(fs.create(ROOT_INO, b"f", 0o644, ME)).unwrap().ino;
    block_on(fs.link(f, ROOT_INO, b"g")).unwrap();
    block_on(fs.link(f, ROOT_INO, b"h")).unwrap();
    assert_eq!(block_on(fs.link(f, ROOT_INO, b"i")), Err(Errno::EMLINK));
    // Directories: the root has 2 links, one subdirectory brings it to the limit.
    block_on(fs.mkdir(ROOT_INO, b"d", 0o755, ME)).unwrap();
    assert_eq!(
        block_on(fs.mkdir(ROOT_INO, b"e", 0o755, ME)),
        Err(Errno::EMLINK)
    );
    let d = block_on(fs.lookup(ROOT_INO, b"d")).unwrap().ino;
    block_on(fs.mkdir(d, b"x", 0o755, ME)).unwrap();
    assert_eq!(
        block_on(fs.rename(d, b"x", ROOT_INO, b"x")),
        Err(Errno::EMLINK)
    );
    // Renaming within the same directory needs no new link.
    block_on(fs.rename(d, b"x", d, b"y")).unwrap();
}

#[test]
fn unlink_and_rmdir_rules() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    create(&fs, a, "f");
    assert_eq!(block_on(fs.unlink(ROOT_INO, b"a")), Err(Errno::EISDIR));
    assert_eq!(block_on(fs.rmdir(a, b"f")), Err(Errno::ENOTDIR));
    assert_eq!(block_on(fs.rmdir(ROOT_INO, b"a")), Err(Errno::ENOTEMPTY));
    assert_eq!(block_on(fs.unlink(a, b"nope")), Err(Errno::ENOENT));
    assert_eq!(block_on(fs.rmdir(a, b"nope")), Err(Errno::ENOENT));
    block_on(fs.unlink(a, b"f")).unwrap();
    block_on(fs.rmdir(ROOT_INO, b"a")).unwrap();
    assert_eq!(names(&fs, ROOT_INO), [".", ".."]);
    assert_eq!(block_on(fs.getattr(a)), Err(Errno::ENOENT));
}

#[test]
fn rename_replaces_file_with_file() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    let g = create(&fs, ROOT_INO, "g");
    block_on(fs.write(f, 0, b"new")).unwrap();
    block_on(fs.rename(ROOT_INO, b"f", ROOT_INO, b"g")).unwrap();
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"g")).unwrap().ino, f);
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"f")), Err(Errno::ENOENT));
    assert_eq!(
        block_on(fs.getattr(g)),
        Err(Errno::ENOENT),
        "replaced inode freed"
    );
    assert_eq!(read_all(&fs, f), b"new");
}

#[test]
fn rename_directory_rules() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    let b = mkdir(&fs, a, "b");
    let empty = mkdir(&fs, ROOT_INO, "empty");
    let full = mkdir(&fs, ROOT_INO, "full");
    create(&fs, full, "x");
    create(&fs, ROOT_INO, "f");
    // Directory onto a non-directory, and the reverse.
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"a", ROOT_INO, b"f")),
        Err(Errno::ENOTDIR)
    );
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"f", ROOT_INO, b"a")),
        Err(Errno::EISDIR)
    );
    // Onto a non-empty directory.
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"a", ROOT_INO, b"full")),
        Err(Errno::ENOTEMPTY)
    );
    // Into itself or a descendant.
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"a", a, b"z")),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"a", b, b"z")),
        Err(Errno::EINVAL)
    );
    // Onto an ancestor of the source (ENOTEMPTY comes first, even for a file source).
    assert_eq!(
        block_on(fs.rename(b, b"..", ROOT_INO, b"a")),
        Err(Errno::EINVAL)
    );
    let deep = create(&fs, b, "deep");
    assert_eq!(
        block_on(fs.rename(b, b"deep", ROOT_INO, b"a")),
        Err(Errno::ENOTEMPTY)
    );
    assert_eq!(
        block_on(fs.rename(a, b"b", ROOT_INO, b"a")),
        Err(Errno::ENOTEMPTY)
    );
    // Onto an empty directory: replaced, link counts stay right.
    block_on(fs.rename(ROOT_INO, b"a", ROOT_INO, b"empty")).unwrap();
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"empty")).unwrap().ino, a);
    assert_eq!(block_on(fs.getattr(empty)), Err(Errno::ENOENT));
    assert_eq!(nlink(&fs, ROOT_INO), 4, "root: ., .., a(as empty), full");
    assert_eq!(block_on(fs.lookup(b, b"deep")).unwrap().ino, deep);
    // Missing source.
    assert_eq!(
        block_on(fs.rename(ROOT_INO, b"nope", ROOT_INO, b"x")),
        Err(Errno::ENOENT)
    );
}

#[test]
fn rename_onto_itself_or_a_hard_link_is_a_no_op() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    block_on(fs.link(f, ROOT_INO, b"g")).unwrap();
    let a = mkdir(&fs, ROOT_INO, "a");
    set_time(&fs, 50);
    block_on(fs.rename(ROOT_INO, b"f", ROOT_INO, b"g")).unwrap();
    block_on(fs.rename(ROOT_INO, b"f", ROOT_INO, b"f")).unwrap();
    block_on(fs.rename(ROOT_INO, b"a", ROOT_INO, b"a")).unwrap();
    assert_eq!(names(&fs, ROOT_INO), [".", "..", "f", "g", "a"]);
    assert_eq!(nlink(&fs, f), 2);
    assert_eq!(
        block_on(fs.getattr(ROOT_INO)).unwrap().mtime,
        t(0),
        "no change at all"
    );
    assert_eq!(block_on(fs.getattr(f)).unwrap().ctime, t(0));
    assert_eq!(block_on(fs.getattr(a)).unwrap().ctime, t(0));
}

#[test]
fn readdir_offsets_are_stable() {
    let fs = model();
    let d = mkdir(&fs, ROOT_INO, "d");
    for name in ["a", "b", "c", "e"] {
        create(&fs, d, name);
    }
    let all = block_on(fs.readdir(d, 0, 100)).unwrap();
    let listed: Vec<_> = all.iter().map(|e| e.name.clone()).collect();
    assert_eq!(listed, [&b"."[..], b"..", b"a", b"b", b"c", b"e"]);
    assert_eq!(all[0].ino, d);
    assert_eq!(all[1].ino, ROOT_INO);
    assert!(all
        .iter()
        .all(|e| e.file_type == FileType::Directory || e.name.len() == 1));

    // Page through two at a time while the directory changes under the listing.
    let mut seen = Vec::new();
    let mut offset = 0;
    let mut step = 0;
    loop {
        let page = block_on(fs.readdir(d, offset, 2)).unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        for e in &page {
            seen.push(String::from_utf8(e.name.clone()).unwrap());
        }
        offset = page.last().unwrap().next_offset;
        match step {
            0 => {
                // Delete one not yet listed, create new ones.
                block_on(fs.unlink(d, b"c")).unwrap();
                create(&fs, d, "z");
            }
            1 => block_on(fs.unlink(d, b"a")).unwrap(),
            _ => {}
        }
        step += 1;
    }
    // Present for the whole listing: ".", "..", "b", "e" exactly once each; "a" was
    // listed before its removal; "c" removed before being reached; "z" may or may not be.
    for name in [".", "..", "a", "b", "e"] {
        assert_eq!(
            seen.iter().filter(|n| *n == name).count(),
            1,
            "{name} in {seen:?}"
        );
    }
    assert!(!seen.contains(&"c".to_string()));
    assert!(seen.iter().filter(|n| *n == "z").count() <= 1);
    assert_eq!(block_on(fs.readdir(d, 0, 0)), Err(Errno::EINVAL));
    let f = create(&fs, d, "f");
    assert_eq!(block_on(fs.readdir(f, 0, 10)), Err(Errno::ENOTDIR));
    // A resumed listing starting past the end is empty.
    assert!(block_on(fs.readdir(d, 1 << 40, 10)).unwrap().is_empty());
}

#[test]
fn sparse_files_holes_and_write_past_eof() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    assert_eq!(block_on(fs.write(f, 10_000, b"xyz")).unwrap(), 3);
    let attr = block_on(fs.getattr(f)).unwrap();
    assert_eq!(attr.size, 10_003);
    assert_eq!(attr.blocks, 8, "only the written block is allocated");
    let data = read_all(&fs, f);
    assert_eq!(data.len(), 10_003);
    assert!(data[..10_000].iter().all(|&b| b == 0));
    assert_eq!(&data[10_000..], b"xyz");
    // Reads are short only at EOF; past EOF they return 0.
    let mut buf = [0u8; 8];
    assert_eq!(block_on(fs.read(f, 10_001, &mut buf)).unwrap(), 2);
    assert_eq!(block_on(fs.read(f, 20_000, &mut buf)).unwrap(), 0);
    // A write spanning block boundaries.
    let big: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
    block_on(fs.write(f, 4000, &big)).unwrap();
    let data = read_all(&fs, f);
    assert_eq!(&data[4000..13_000], &big[..]);
    assert!(data[..4000].iter().all(|&b| b == 0));
    // Huge sparse offset.
    block_on(fs.write(f, 1 << 40, b"end")).unwrap();
    assert_eq!(block_on(fs.getattr(f)).unwrap().size, (1 << 40) + 3);
    let mut buf = [1u8; 5];
    assert_eq!(block_on(fs.read(f, (1 << 40) - 2, &mut buf)).unwrap(), 5);
    assert_eq!(&buf, b"\0\0end");
}

#[test]
fn write_rules() {
    let config = ModelConfig {
        max_file_size: 10_000,
        ..ModelConfig::default()
    };
    let fs = ModelFs::with_config(Hand::default(), config);
    let f = block_on(fs.create(ROOT_INO, b"f", 0o644, ME)).unwrap().ino;
    set_time(&fs, 5);
    assert_eq!(block_on(fs.write(f, 0, b"")).unwrap(), 0);
    assert_eq!(
        block_on(fs.getattr(f)).unwrap().mtime,
        t(0),
        "empty write: no change"
    );
    assert_eq!(block_on(fs.write(f, 10_000, b"x")), Err(Errno::EFBIG));
    assert_eq!(
        block_on(fs.write(f, 9_998, b"abcd")).unwrap(),
        2,
        "cut short at the limit"
    );
    assert_eq!(block_on(fs.getattr(f)).unwrap().size, 10_000);
    assert_eq!(block_on(fs.write(ROOT_INO, 0, b"x")), Err(Errno::EISDIR));
    assert_eq!(
        block_on(fs.read(ROOT_INO, 0, &mut [0; 1])),
        Err(Errno::EISDIR)
    );
    assert_eq!(block_on(fs.write(42, 0, b"x")), Err(Errno::ENOENT));
}

#[test]
fn append_writes_at_the_size() {
    let config = ModelConfig {
        max_file_size: 10_000,
        ..ModelConfig::default()
    };
    let fs = ModelFs::with_config(Hand::default(), config);
    let f = block_on(fs.create(ROOT_INO, b"f", 0o644, ME)).unwrap().ino;
    assert_eq!(block_on(fs.append(f, b"abc")), Ok((0, 3)));
    assert_eq!(block_on(fs.append(f, b"de")), Ok((3, 2)));
    block_on(fs.write(f, 10, b"z")).unwrap();
    assert_eq!(block_on(fs.append(f, b"!")), Ok((11, 1)), "after a hole");
    assert_eq!(read_all(&fs, f), b"abcde\0\0\0\0\0z!");
    set_time(&fs, 5);
    assert_eq!(block_on(fs.append(f, b"")), Ok((12, 0)));
    assert_eq!(
        block_on(fs.getattr(f)).unwrap().mtime,
        t(0),
        "empty append: no change"
    );
    block_on(fs.setattr(
        f,
        SetAttr {
            size: Some(9_998),
            ..SetAttr::default()
        },
    ))
    .unwrap();
    assert_eq!(
        block_on(fs.append(f, b"abcd")),
        Ok((9_998, 2)),
        "cut short at the limit"
    );
    assert_eq!(block_on(fs.append(f, b"x")), Err(Errno::EFBIG));
    assert_eq!(block_on(fs.append(ROOT_INO, b"x")), Err(Errno::EISDIR));
    assert_eq!(block_on(fs.append(42, b"x")), Err(Errno::ENOENT));
}

#[test]
fn truncate_and_extend() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    block_on(fs.write(f, 0, &[7u8; 10_000])).unwrap();
    let shrink = SetAttr {
        size: Some(5000),
        ..SetAttr::default()
    };
    block_on(fs.setattr(f, shrink)).unwrap();
    assert_eq!(read_all(&fs, f), vec![7u8; 5000]);
    // Extending exposes zeros, never the old bytes.
    let grow = SetAttr {
        size: Some(12_000),
        ..SetAttr::default()
    };
    let attr = block_on(fs.setattr(f, grow)).unwrap();
    assert_eq!(attr.size, 12_000);
    let data = read_all(&fs, f);
    assert_eq!(&data[..5000], &[7u8; 5000][..]);
    assert!(data[5000..].iter().all(|&b| b == 0));
    // Writing past EOF after a shrink inside a block also sees zeros in between.
    block_on(fs.setattr(f, shrink)).unwrap();
    block_on(fs.write(f, 6000, b"x")).unwrap();
    let data = read_all(&fs, f);
    assert!(data[5000..6000].iter().all(|&b| b == 0));
    let to_zero = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(block_on(fs.setattr(f, to_zero)).unwrap().blocks, 0);
    let d = mkdir(&fs, ROOT_INO, "d");
    assert_eq!(block_on(fs.setattr(d, to_zero)), Err(Errno::EISDIR));
    let l = block_on(fs.symlink(ROOT_INO, b"l", b"f", ME)).unwrap().ino;
    assert_eq!(block_on(fs.setattr(l, to_zero)), Err(Errno::EINVAL));
    let huge = SetAttr {
        size: Some(u64::MAX),
        ..SetAttr::default()
    };
    assert_eq!(block_on(fs.setattr(f, huge)), Err(Errno::EFBIG));
}

#[test]
fn setattr_fields_and_times() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    set_time(&fs, 10);
    let attr = block_on(fs.setattr(f, SetAttr::default())).unwrap();
    assert_eq!(attr.ctime, t(0), "an empty setattr changes nothing");
    let changes = SetAttr {
        mode: Some(mode::S_IFDIR | 0o7600),
        uid: Some(5),
        gid: Some(6),
        atime: Some(SetTime::To(t(3))),
        ..SetAttr::default()
    };
    let attr = block_on(fs.setattr(f, changes)).unwrap();
    assert_eq!(attr.mode, mode::S_IFREG | 0o7600);
    assert_eq!((attr.uid, attr.gid), (5, 6));
    assert_eq!((attr.atime, attr.mtime, attr.ctime), (t(3), t(0), t(10)));
    set_time(&fs, 20);
    let same_size = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    let attr = block_on(fs.setattr(f, same_size)).unwrap();
    assert_eq!(
        (attr.mtime, attr.ctime),
        (t(0), t(20)),
        "no size change: ctime only"
    );
    set_time(&fs, 30);
    let grow = SetAttr {
        size: Some(1),
        ..SetAttr::default()
    };
    let attr = block_on(fs.setattr(f, grow)).unwrap();
    assert_eq!((attr.mtime, attr.ctime), (t(30), t(30)));
    set_time(&fs, 40);
    let explicit = SetAttr {
        size: Some(2),
        mtime: Some(SetTime::To(t(7))),
        atime: Some(SetTime::Now),
        ..SetAttr::default()
    };
    let attr = block_on(fs.setattr(f, explicit)).unwrap();
    assert_eq!((attr.atime, attr.mtime, attr.ctime), (t(40), t(7), t(40)));
    assert_eq!(attr.btime, t(0));
}

#[test]
fn namespace_timestamps() {
    let fs = model();
    let a = mkdir(&fs, ROOT_INO, "a");
    let b = mkdir(&fs, ROOT_INO, "b");
    set_time(&fs, 1);
    let f = create(&fs, a, "f");
    let (root, da) = (
        block_on(fs.getattr(ROOT_INO)).unwrap(),
        block_on(fs.getattr(a)).unwrap(),
    );
    assert_eq!((da.mtime, da.ctime, root.mtime), (t(1), t(1), t(0)));
    let fa = block_on(fs.getattr(f)).unwrap();
    assert_eq!(
        (fa.atime, fa.mtime, fa.ctime, fa.btime),
        (t(1), t(1), t(1), t(1))
    );

    set_time(&fs, 2);
    block_on(fs.link(f, b, b"g")).unwrap();
    let (fa, db) = (
        block_on(fs.getattr(f)).unwrap(),
        block_on(fs.getattr(b)).unwrap(),
    );
    assert_eq!(
        (fa.mtime, fa.ctime, db.mtime, db.ctime),
        (t(1), t(2), t(2), t(2))
    );

    set_time(&fs, 3);
    block_on(fs.rename(a, b"f", b, b"h")).unwrap();
    let fa = block_on(fs.getattr(f)).unwrap();
    let (da, db) = (
        block_on(fs.getattr(a)).unwrap(),
        block_on(fs.getattr(b)).unwrap(),
    );
    assert_eq!((fa.mtime, fa.ctime), (t(1), t(3)));
    assert_eq!(
        (da.mtime, da.ctime, db.mtime, db.ctime),
        (t(3), t(3), t(3), t(3))
    );

    set_time(&fs, 4);
    let victim = create(&fs, ROOT_INO, "v");
    block_on(fs.open(victim)).unwrap();
    set_time(&fs, 5);
    block_on(fs.rename(b, b"h", ROOT_INO, b"v")).unwrap();
    assert_eq!(
        block_on(fs.getattr(victim)).unwrap().ctime,
        t(5),
        "replaced inode"
    );
    assert_eq!(block_on(fs.getattr(victim)).unwrap().nlink, 0);

    set_time(&fs, 6);
    block_on(fs.unlink(b, b"g")).unwrap();
    let (fa, db) = (
        block_on(fs.getattr(f)).unwrap(),
        block_on(fs.getattr(b)).unwrap(),
    );
    assert_eq!(
        (fa.ctime, fa.nlink, db.mtime, db.ctime),
        (t(6), 1, t(6), t(6))
    );

    set_time(&fs, 7);
    block_on(fs.rmdir(ROOT_INO, b"a")).unwrap();
    let root = block_on(fs.getattr(ROOT_INO)).unwrap();
    assert_eq!((root.mtime, root.ctime), (t(7), t(7)));

    set_time(&fs, 8);
    block_on(fs.write(f, 0, b"data")).unwrap();
    let fa = block_on(fs.getattr(f)).unwrap();
    assert_eq!((fa.atime, fa.mtime, fa.ctime), (t(1), t(8), t(8)));
    set_time(&fs, 9);
    block_on(fs.read(f, 0, &mut [0; 4])).unwrap();
    assert_eq!(
        block_on(fs.getattr(f)).unwrap().atime,
        t(1),
        "reads leave atime"
    );
    block_on(fs.setxattr(f, b"user.a", b"1", XattrMode::Upsert)).unwrap();
    let fa = block_on(fs.getattr(f)).unwrap();
    assert_eq!((fa.mtime, fa.ctime), (t(8), t(9)));
    set_time(&fs, 10);
    block_on(fs.removexattr(f, b"user.a")).unwrap();
    assert_eq!(block_on(fs.getattr(f)).unwrap().ctime, t(10));
    set_time(&fs, 11);
    let _ = block_on(fs.removexattr(f, b"user.a"));
    let _ = block_on(fs.create(ROOT_INO, b"v", 0o644, ME));
    assert_eq!(
        block_on(fs.getattr(f)).unwrap().ctime,
        t(10),
        "failures change nothing"
    );
    assert_eq!(block_on(fs.getattr(ROOT_INO)).unwrap().mtime, t(7));
}

#[test]
fn clone_range_copies_with_alignment_rules() {
    let fs = model();
    let src = create(&fs, ROOT_INO, "src");
    let dst = create(&fs, ROOT_INO, "dst");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 % 256) as u8).collect();
    block_on(fs.write(src, 0, &data)).unwrap();
    // Aligned block range.
    block_on(fs.clone_range(src, 4096, dst, 8192, 4096)).unwrap();
    let got = read_all(&fs, dst);
    assert_eq!(got.len(), 12_288);
    assert!(got[..8192].iter().all(|&b| b == 0));
    assert_eq!(&got[8192..], &data[4096..8192]);
    // A range ending at the source's EOF may be unaligned...
    block_on(fs.clone_range(src, 8192, dst, 16_384, 10_000 - 8192)).unwrap();
    let got = read_all(&fs, dst);
    assert_eq!(got.len(), 16_384 + 1808);
    assert_eq!(&got[16_384..], &data[8192..]);
    // ...but may not land inside the destination.
    assert_eq!(
        block_on(fs.clone_range(src, 8192, dst, 0, 1808)),
        Err(Errno::EINVAL)
    );
    // Later writes to the source do not show in the destination (a copy).
    block_on(fs.write(src, 4096, b"changed")).unwrap();
    assert_eq!(&read_all(&fs, dst)[8192..8199], &data[4096..4103]);
    let einval = [
        (src, 1, dst, 0, 4096),               // unaligned source offset
        (src, 0, dst, 1, 4096),               // unaligned destination offset
        (src, 0, dst, 0, 100),                // unaligned length not at EOF
        (src, 8192, dst, 0, 4096),            // past the source's EOF
        (src, 0, src, 4096, 8192),            // overlapping ranges of one file
        (src, 0, dst, u64::MAX - 4095, 4096), // offset overflow
    ];
    for (s, so, d, dof, len) in einval {
        assert_eq!(
            block_on(fs.clone_range(s, so, d, dof, len)),
            Err(Errno::EINVAL),
            "{so} {dof} {len}"
        );
    }
    block_on(fs.clone_range(src, 0, dst, 0, 0)).unwrap();
    // Within one file, disjoint ranges are fine.
    block_on(fs.clone_range(src, 0, src, 12_288, 4096)).unwrap();
    assert_eq!(&read_all(&fs, src)[12_288..], &data[..4096]);
    let d = mkdir(&fs, ROOT_INO, "d");
    assert_eq!(
        block_on(fs.clone_range(d, 0, dst, 0, 4096)),
        Err(Errno::EISDIR)
    );
    assert_eq!(
        block_on(fs.clone_range(src, 0, d, 0, 4096)),
        Err(Errno::EISDIR)
    );
    assert_eq!(
        block_on(fs.clone_range(src, 0, 999, 0, 4096)),
        Err(Errno::ENOENT)
    );
    // Holes stay holes.
    let sparse = create(&fs, ROOT_INO, "sparse");
    block_on(fs.write(sparse, 8192, &[1; 4096])).unwrap();
    block_on(fs.clone_range(sparse, 0, dst, 0, 8192)).unwrap();
    assert!(read_all(&fs, dst)[..8192].iter().all(|&b| b == 0));
}

#[test]
fn clone_range_size_limit() {
    let config = ModelConfig {
        max_file_size: 8192,
        ..ModelConfig::default()
    };
    let fs = ModelFs::with_config(Hand::default(), config);
    let src = block_on(fs.create(ROOT_INO, b"s", 0o644, ME)).unwrap().ino;
    block_on(fs.write(src, 0, &[1; 4096])).unwrap();
    assert_eq!(
        block_on(fs.clone_range(src, 0, src, 8192, 4096)),
        Err(Errno::EFBIG)
    );
}

#[test]
fn xattr_rules() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    assert_eq!(block_on(fs.getxattr(f, b"user.a")), Err(Errno::ENODATA));
    assert_eq!(
        block_on(fs.setxattr(f, b"user.a", b"1", XattrMode::Replace)),
        Err(Errno::ENODATA)
    );
    block_on(fs.setxattr(f, b"user.b", b"1", XattrMode::Create)).unwrap();
    assert_eq!(
        block_on(fs.setxattr(f, b"user.b", b"2", XattrMode::Create)),
        Err(Errno::EEXIST)
    );
    block_on(fs.setxattr(f, b"user.b", b"2", XattrMode::Replace)).unwrap();
    block_on(fs.setxattr(f, b"user.a", b"", XattrMode::Upsert)).unwrap();
    assert_eq!(block_on(fs.getxattr(f, b"user.b")).unwrap(), b"2");
    assert_eq!(block_on(fs.getxattr(f, b"user.a")).unwrap(), b"");
    assert_eq!(
        block_on(fs.listxattr(f)).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    block_on(fs.removexattr(f, b"user.a")).unwrap();
    assert_eq!(block_on(fs.removexattr(f, b"user.a")), Err(Errno::ENODATA));
    assert_eq!(block_on(fs.listxattr(f)).unwrap(), vec![b"user.b".to_vec()]);
    // Limits.
    let long = vec![b'n'; NAME_MAX + 1];
    let max_value = vec![9u8; XATTR_VALUE_MAX];
    assert_eq!(block_on(fs.getxattr(f, b"")), Err(Errno::ERANGE));
    assert_eq!(
        block_on(fs.setxattr(f, &long, b"", XattrMode::Upsert)),
        Err(Errno::ERANGE)
    );
    assert_eq!(
        block_on(fs.setxattr(f, b"a\0b", b"", XattrMode::Upsert)),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        block_on(fs.setxattr(
            f,
            b"user.big",
            &vec![0; XATTR_VALUE_MAX + 1],
            XattrMode::Upsert
        )),
        Err(Errno::ERANGE)
    );
    block_on(fs.setxattr(f, &long[..NAME_MAX], &max_value, XattrMode::Upsert)).unwrap();
    assert_eq!(
        block_on(fs.getxattr(f, &long[..NAME_MAX])).unwrap(),
        max_value
    );
    // Every inode type carries xattrs.
    block_on(fs.setxattr(ROOT_INO, b"user.d", b"x", XattrMode::Upsert)).unwrap();
    let l = block_on(fs.symlink(ROOT_INO, b"l", b"f", ME)).unwrap().ino;
    block_on(fs.setxattr(l, b"user.l", b"x", XattrMode::Upsert)).unwrap();
    assert_eq!(block_on(fs.listxattr(999)), Err(Errno::ENOENT));
}

#[test]
fn symlink_rules() {
    let fs = model();
    let attr = block_on(fs.symlink(ROOT_INO, b"l", b"some/where", ME)).unwrap();
    assert_eq!(attr.mode, mode::S_IFLNK | 0o777);
    assert_eq!(attr.size, 10);
    assert_eq!(block_on(fs.readlink(attr.ino)).unwrap(), b"some/where");
    assert_eq!(block_on(fs.readlink(ROOT_INO)), Err(Errno::EINVAL));
    assert_eq!(
        block_on(fs.symlink(ROOT_INO, b"m", b"", ME)),
        Err(Errno::ENOENT)
    );
    assert_eq!(
        block_on(fs.symlink(ROOT_INO, b"m", &vec![b'x'; SYMLINK_MAX + 1], ME)),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        block_on(fs.symlink(ROOT_INO, b"m", b"a\0", ME)),
        Err(Errno::EINVAL)
    );
    let max = block_on(fs.symlink(ROOT_INO, b"m", &vec![b'x'; SYMLINK_MAX], ME)).unwrap();
    assert_eq!(block_on(fs.readlink(max.ino)).unwrap().len(), SYMLINK_MAX);
    assert_eq!(
        block_on(fs.symlink(ROOT_INO, b"m", b"x", ME)),
        Err(Errno::EEXIST)
    );
    assert_eq!(block_on(fs.write(attr.ino, 0, b"x")), Err(Errno::EINVAL));
}

#[test]
fn unlinked_but_open_files_live_until_release() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    block_on(fs.write(f, 0, b"hello")).unwrap();
    block_on(fs.open(f)).unwrap();
    block_on(fs.open(f)).unwrap();
    block_on(fs.unlink(ROOT_INO, b"f")).unwrap();
    assert_eq!(nlink(&fs, f), 0);
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"f")), Err(Errno::ENOENT));
    block_on(fs.write(f, 5, b" world")).unwrap();
    assert_eq!(read_all(&fs, f), b"hello world");
    block_on(fs.setxattr(f, b"user.x", b"1", XattrMode::Upsert)).unwrap();
    block_on(fs.fsync(f, false)).unwrap();
    assert_eq!(block_on(fs.link(f, ROOT_INO, b"again")), Err(Errno::ENOENT));
    block_on(fs.release(f)).unwrap();
    assert!(block_on(fs.getattr(f)).is_ok(), "one opener left");
    block_on(fs.release(f)).unwrap();
    assert_eq!(block_on(fs.getattr(f)), Err(Errno::ENOENT));
    assert_eq!(block_on(fs.release(f)), Err(Errno::ENOENT));
    let g = create(&fs, ROOT_INO, "g");
    assert_eq!(block_on(fs.release(g)), Err(Errno::EBADF));
    // Inode numbers are never reused.
    assert!(g > f);
    assert_eq!(block_on(fs.open(f)), Err(Errno::ENOENT));
}

#[test]
fn removed_but_open_directory() {
    let fs = model();
    let d = mkdir(&fs, ROOT_INO, "d");
    block_on(fs.open(d)).unwrap();
    block_on(fs.rmdir(ROOT_INO, b"d")).unwrap();
    assert_eq!(nlink(&fs, d), 0);
    assert_eq!(nlink(&fs, ROOT_INO), 2);
    assert_eq!(block_on(fs.create(d, b"x", 0o644, ME)), Err(Errno::ENOENT));
    assert_eq!(block_on(fs.readdir(d, 0, 10)), Err(Errno::ENOENT));
    assert_eq!(block_on(fs.lookup(d, b"..")), Err(Errno::ENOENT));
    block_on(fs.release(d)).unwrap();
    assert_eq!(block_on(fs.getattr(d)), Err(Errno::ENOENT));
}

#[test]
fn rename_replacing_an_open_file_keeps_it_readable() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    let g = create(&fs, ROOT_INO, "g");
    block_on(fs.write(g, 0, b"old")).unwrap();
    block_on(fs.open(g)).unwrap();
    block_on(fs.rename(ROOT_INO, b"f", ROOT_INO, b"g")).unwrap();
    assert_eq!(read_all(&fs, g), b"old");
    assert_eq!(block_on(fs.lookup(ROOT_INO, b"g")).unwrap().ino, f);
    block_on(fs.release(g)).unwrap();
    assert_eq!(block_on(fs.getattr(g)), Err(Errno::ENOENT));
}

#[test]
fn statfs_counts_data_and_inodes() {
    let fs = model();
    let before = block_on(fs.statfs()).unwrap();
    assert_eq!(
        (before.block_size, before.name_max),
        (4096, NAME_MAX as u32)
    );
    let f = create(&fs, ROOT_INO, "f");
    block_on(fs.write(f, 0, &[1; 8192])).unwrap();
    let after = block_on(fs.statfs()).unwrap();
    assert_eq!(before.blocks_free - after.blocks_free, 2);
    assert_eq!(before.files_free - after.files_free, 1);
    assert_eq!(after.blocks, before.blocks);
}

#[test]
fn fsync_and_sync_check_the_inode() {
    let fs = model();
    let f = create(&fs, ROOT_INO, "f");
    block_on(fs.fsync(f, true)).unwrap();
    block_on(fs.fsync(ROOT_INO, false)).unwrap();
    block_on(fs.sync()).unwrap();
    assert_eq!(block_on(fs.fsync(12345, false)), Err(Errno::ENOENT));
}

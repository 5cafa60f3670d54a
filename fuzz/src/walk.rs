//! A bounded read-everything walk of a filesystem, as a client would do it (readdir,
//! lookup, getattr, read, readlink, listxattr, getxattr) — bounded, because a forged
//! image may hold a cycle, a huge size or a listing that never ends, and the fuzzer
//! must not hang on the walk itself. The result lists what was seen (for comparing two
//! states) and the errors met.

use std::collections::BTreeSet;

use vfs::{FileSystem, FileType, Ino, ROOT_INO};

/// What a walk saw.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// One line per path: type, mode, owner, size, links, content digest, target,
    /// xattrs. Sorted by path.
    pub lines: Vec<String>,
    /// Errors returned (errno per operation), in order.
    pub errors: Vec<String>,
}

/// Most inodes visited.
const MAX_NODES: usize = 400;
/// Most readdir pages per directory.
const MAX_PAGES: usize = 64;
/// Most bytes read per file (from its start and before its end).
const MAX_READ: usize = 16 * 1024;
/// Deepest path followed.
const MAX_DEPTH: usize = 32;

/// Walks `fs` from its root.
pub async fn walk(fs: &impl FileSystem) -> Seen {
    let mut seen = Seen::default();
    let mut dirs_seen = BTreeSet::from([ROOT_INO]);
    let mut stack: Vec<(Ino, String, usize)> = vec![(ROOT_INO, String::new(), 0)];
    let mut nodes = 0usize;
    match fs.getattr(ROOT_INO).await {
        Ok(a) => seen
            .lines
            .push(format!("/ {:?} {:o} {}", a.file_type(), a.mode, a.nlink)),
        Err(e) => seen.errors.push(format!("getattr /: {e}")),
    }
    while let Some((dir, path, depth)) = stack.pop() {
        let mut offset = 0u64;
        let mut names = BTreeSet::new();
        for _ in 0..MAX_PAGES {
            let batch = match fs.readdir(dir, offset, 32).await {
                Ok(b) => b,
                Err(e) => {
                    seen.errors
                        .push(format!("readdir {path}/ at {offset}: {e}"));
                    break;
                }
            };
            let Some(last) = batch.last() else { break };
            if last.next_offset <= offset {
                seen.errors
                    .push(format!("readdir {path}/: offset {offset} went back"));
                break;
            }
            offset = last.next_offset;
            for e in batch {
                if e.name == b"." || e.name == b".." || !names.insert(e.name.clone()) {
                    continue;
                }
                nodes += 1;
                if nodes > MAX_NODES {
                    return seen;
                }
                let p = format!("{path}/{}", e.name.escape_ascii());
                let attr = match fs.lookup(dir, &e.name).await {
                    Ok(a) => a,
                    Err(err) => {
                        seen.errors.push(format!("lookup {p}: {err}"));
                        continue;
                    }
                };
                let mut line = format!(
                    "{p} {:?} {:o} {}:{} size {} links {}",
                    attr.file_type(),
                    attr.mode,
                    attr.uid,
                    attr.gid,
                    attr.size,
                    attr.nlink
                );
                match attr.file_type() {
                    FileType::Directory => {
                        if depth < MAX_DEPTH && dirs_seen.insert(attr.ino) {
                            stack.push((attr.ino, p.clone(), depth + 1));
                        }
                    }
                    FileType::Regular => {
                        let d = read_digest(fs, attr.ino, attr.size, &p, &mut seen.errors).await;
                        line.push_str(&format!(" data {d:08x}"));
                    }
                    FileType::Symlink => match fs.readlink(attr.ino).await {
                        Ok(t) => line.push_str(&format!(" -> {}", t.escape_ascii())),
                        Err(err) => seen.errors.push(format!("readlink {p}: {err}")),
                    },
                    _ => {}
                }
                match fs.listxattr(attr.ino).await {
                    Ok(xs) => {
                        for x in xs.iter().take(16) {
                            match fs.getxattr(attr.ino, x).await {
                                Ok(v) => line.push_str(&format!(
                                    " {}={:08x}",
                                    x.escape_ascii(),
                                    ninefs::util::crc::crc32c(&v)
                                )),
                                Err(err) => seen.errors.push(format!("getxattr {p}: {err}")),
                            }
                        }
                    }
                    Err(err) => seen.errors.push(format!("listxattr {p}: {err}")),
                }
                seen.lines.push(line);
            }
        }
    }
    seen.lines.sort();
    seen
}

/// A checksum of a file's first and last [`MAX_READ`] bytes.
async fn read_digest(
    fs: &impl FileSystem,
    ino: Ino,
    size: u64,
    path: &str,
    errors: &mut Vec<String>,
) -> u32 {
    let mut buf = vec![0u8; MAX_READ];
    let mut digest = 0u32;
    let tail = size.saturating_sub(MAX_READ as u64);
    for offset in [0, tail] {
        match fs.read(ino, offset, &mut buf).await {
            Ok(n) => digest ^= ninefs::util::crc::crc32c(&buf[..n.min(buf.len())]),
            Err(e) => errors.push(format!("read {path} at {offset}: {e}")),
        }
        if tail == 0 {
            break;
        }
    }
    digest
}

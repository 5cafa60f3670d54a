//! Directories: names (`DIR_ENTRY` by hash, `DIR_INDEX` by readdir cookie, `INODE_REF`
//! back-references), lookup, readdir, link, unlink, rmdir, rename.

use alloc::vec::Vec;

use crate::core::txn::{Core, Step, Stop, Txn};
use crate::format::items::{
    decode_dir_entries, decode_inode_refs, encode_dir_entries, encode_inode_refs, DirEntryRec,
    DirIndexRec, InodeItem, InodeRefRec,
};
use crate::format::key::kind;
use crate::format::{Key, TreeId};
use crate::util::hash::{domain, keyed_hash, name_ref_hash};
use vfs::{Attr, DirEntry, Errno, FileType, Ino, Timespec, NAME_MAX, ROOT_INO};

/// `EXDEV` if `ino` (whose item is `item`) may not be linked or moved into directory
/// `dir`: it is charged to another project. A quota root moves with its project.
pub fn same_project(ino: Ino, item: &InodeItem, dir: &InodeItem) -> Step<()> {
    if item.project == dir.project || item.project == ino {
        return Ok(());
    }
    Err(Errno::EXDEV.into())
}

/// Validates a name for an operation that takes a new or existing entry name.
pub fn check_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// What [`Core::is_within`] stops with when directory parents form a loop.
pub(crate) const PARENT_LOOP: &str = "directory parents form a loop";

/// First `DIR_INDEX` of a directory (`.` and `..` are offsets 0 and 1).
pub const FIRST_INDEX: u64 = 2;

/// Deepest a directory is followed up through its parents (or down a path): deeper is
/// taken for a loop of parents.
pub const MAX_DEPTH: usize = 4096;

/// Whether directory `ino` is `ancestor` or below it, walking up through `parent` (a
/// directory's parent; the root, and a directory that has no name, are their own):
/// what `rename` checks before moving a directory, so that it never goes under
/// itself. Also the check of a received stream's links (`receive/model.rs`), on the tree
/// the stream makes. `too_deep` is the error after [`MAX_DEPTH`] steps.
pub(crate) fn within<E>(
    mut ino: Ino,
    ancestor: Ino,
    mut parent: impl FnMut(Ino) -> Result<Ino, E>,
    too_deep: impl FnOnce() -> E,
) -> Result<bool, E> {
    for _ in 0..MAX_DEPTH {
        if ino == ancestor {
            return Ok(true);
        }
        let p = parent(ino)?;
        if p == ino {
            return Ok(false);
        }
        ino = p;
    }
    Err(too_deep())
}

impl Core {
    /// The keyed hash of a directory entry name (the `DIR_ENTRY` key offset).
    pub fn name_hash(&self, name: &[u8]) -> u64 {
        keyed_hash(self.sb.secret, domain::DIR_NAME, name)
    }

    /// A directory that still exists (`ENOENT` if missing or removed, `ENOTDIR`).
    pub fn live_dir(&mut self, tx: &Txn, dir: Ino) -> Step<InodeItem> {
        let d = tx.inode(self, dir)?;
        if !d.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        if d.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        Ok(d)
    }

    /// The entry `name` of `dir`.
    pub fn find_entry(&mut self, tx: &Txn, dir: Ino, name: &[u8]) -> Step<Option<DirEntryRec>> {
        let key = Key::new(dir, kind::DIR_ENTRY, self.name_hash(name));
        let Some(b) = tx.get(self, TreeId::Fs, &key)? else {
            return Ok(None);
        };
        let list = decode_dir_entries(&b).ok_or(Stop::Corrupt("undecodable directory entry"))?;
        Ok(list.into_iter().find(|e| e.name == name))
    }

    /// The parent of directory `dir` (the root is its own parent).
    pub fn parent_of(&mut self, tx: &Txn, dir: Ino) -> Step<Ino> {
        if dir == ROOT_INO {
            return Ok(ROOT_INO);
        }
        // A directory has one name; a removed one has none left: report itself.
        Ok(self.names_of(tx, dir)?.first().map_or(dir, |r| r.parent))
    }

    /// Every name of `ino` (its back-references), in key order.
    pub(crate) fn names_of(&mut self, tx: &Txn, ino: Ino) -> Step<Vec<InodeRefRec>> {
        let items = tx.range(
            self,
            TreeId::Fs,
            Key::new(ino, kind::INODE_REF, 0),
            Key::new(ino, kind::INODE_REF, u64::MAX),
        )?;
        let mut out = Vec::new();
        for (_, v) in items {
            out.extend(decode_inode_refs(&v).ok_or(Stop::Corrupt("undecodable inode ref"))?);
        }
        Ok(out)
    }

    /// The key of the back-reference item that holds `parent/name` for `child`.
    fn name_ref_key(&self, child: Ino, parent: Ino, name: &[u8]) -> Key {
        Key::new(
            child,
            kind::INODE_REF,
            name_ref_hash(self.sb.secret, parent, name),
        )
    }

    /// Removes the back-reference `parent/name` (readdir index `index`) of `child`, if
    /// it has one.
    pub(crate) fn remove_name_ref(
        &mut self,
        tx: &mut Txn,
        child: Ino,
        parent: Ino,
        name: &[u8],
        index: u64,
    ) -> Step<()> {
        let rkey = self.name_ref_key(child, parent, name);
        if let Some(b) = tx.get(self, TreeId::Fs, &rkey)? {
            let mut refs = decode_inode_refs(&b).ok_or(Stop::Corrupt("undecodable inode ref"))?;
            refs.retain(|r| !(r.parent == parent && r.index == index));
            if refs.is_empty() {
                tx.del(TreeId::Fs, rkey);
            } else {
                tx.put(TreeId::Fs, rkey, encode_inode_refs(&refs));
            }
        }
        Ok(())
    }

    /// Whether `ino` is `ancestor` or below it (walking up through parents; a walk
    /// longer than [`MAX_DEPTH`] is a loop: [`PARENT_LOOP`]).
    pub(crate) fn is_within(&mut self, tx: &Txn, ino: Ino, ancestor: Ino) -> Step<bool> {
        within(
            ino,
            ancestor,
            |i| self.parent_of(tx, i),
            || Stop::Corrupt(PARENT_LOOP),
        )
    }

    /// Whether directory `dir` has no entries.
    fn dir_is_empty(&mut self, dir: Ino) -> Step<bool> {
        let mut empty = true;
        self.trees.range(
            TreeId::Fs,
            Key::new(dir, kind::DIR_INDEX, 0),
            Key::new(dir, kind::DIR_INDEX, u64::MAX),
            |_, _| {
                empty = false;
                false
            },
        )?;
        Ok(empty)
    }

    /// Adds `dir/name -> child`; updates the directory's size, index counter and times.
    pub fn add_entry(
        &mut self,
        tx: &mut Txn,
        dir: Ino,
        name: &[u8],
        child: Ino,
        ft: FileType,
        now: Timespec,
    ) -> Step<()> {
        let mut d = tx.inode(self, dir)?;
        let index = d.next_seq;
        // Both come from the disk: at their end they were forged, never made.
        d.next_seq = index
            .checked_add(1)
            .ok_or(Stop::Corrupt("directory index counter out of range"))?;
        d.size = d
            .size
            .checked_add(1)
            .ok_or(Stop::Corrupt("directory size out of range"))?;
        d.mtime = now;
        d.ctime = now;
        tx.put_inode(dir, &d);
        self.put_name_items(tx, dir, name, child, ft, index)
    }

    /// Writes the three items of the name `dir/name -> child` with readdir index `index`
    /// (the entry in its hash bucket, the index entry and the child's back reference);
    /// the caller has made sure nothing else holds that name or index.
    pub(crate) fn put_name_items(
        &mut self,
        tx: &mut Txn,
        dir: Ino,
        name: &[u8],
        child: Ino,
        ft: FileType,
        index: u64,
    ) -> Step<()> {
        let rec = DirEntryRec {
            ino: child,
            file_type: ft,
            index,
            name: name.to_vec(),
        };
        let key = Key::new(dir, kind::DIR_ENTRY, self.name_hash(name));
        let mut list = match tx.get(self, TreeId::Fs, &key)? {
            Some(b) => {
                decode_dir_entries(&b).ok_or(Stop::Corrupt("undecodable directory entry"))?
            }
            None => Vec::new(),
        };
        list.push(rec);
        tx.put(TreeId::Fs, key, encode_dir_entries(&list));
        let idx = DirIndexRec {
            ino: child,
            file_type: ft,
            name: name.to_vec(),
        };
        tx.put(
            TreeId::Fs,
            Key::new(dir, kind::DIR_INDEX, index),
            idx.encode(),
        );
        let rkey = self.name_ref_key(child, dir, name);
        let mut refs = match tx.get(self, TreeId::Fs, &rkey)? {
            Some(b) => decode_inode_refs(&b).ok_or(Stop::Corrupt("undecodable inode ref"))?,
            None => Vec::new(),
        };
        refs.push(InodeRefRec {
            parent: dir,
            index,
            name: name.to_vec(),
        });
        tx.put(TreeId::Fs, rkey, encode_inode_refs(&refs));
        Ok(())
    }

    /// Removes `dir/name` (which must exist); returns the entry.
    pub fn remove_entry(
        &mut self,
        tx: &mut Txn,
        dir: Ino,
        name: &[u8],
        now: Timespec,
    ) -> Step<DirEntryRec> {
        let hash = self.name_hash(name);
        let key = Key::new(dir, kind::DIR_ENTRY, hash);
        let b = tx
            .get(self, TreeId::Fs, &key)?
            .ok_or(Stop::Errno(Errno::ENOENT))?;
        let mut list =
            decode_dir_entries(&b).ok_or(Stop::Corrupt("undecodable directory entry"))?;
        let pos = list
            .iter()
            .position(|e| e.name == name)
            .ok_or(Stop::Errno(Errno::ENOENT))?;
        let rec = list.remove(pos);
        tx.removals.push((dir, hash, rec.ino));
        if list.is_empty() {
            tx.del(TreeId::Fs, key);
        } else {
            tx.put(TreeId::Fs, key, encode_dir_entries(&list));
        }
        tx.del(TreeId::Fs, Key::new(dir, kind::DIR_INDEX, rec.index));
        self.remove_name_ref(tx, rec.ino, dir, name, rec.index)?;
        let mut d = tx.inode(self, dir)?;
        d.size = d.size.saturating_sub(1);
        d.mtime = now;
        d.ctime = now;
        tx.put_inode(dir, &d);
        self.state(dir).last_unlink_trans = self.seq;
        self.state(rec.ino).last_unlink_trans = self.seq;
        Ok(rec)
    }

    /// Drops one link of `ino` (its name already removed). Directories lose every link.
    /// An inode left without links gets an orphan item; returns whether it did.
    fn drop_link(&mut self, tx: &mut Txn, ino: Ino, now: Timespec) -> Step<bool> {
        let mut item = tx.inode(self, ino)?;
        item.nlink = if item.is_dir() {
            0
        } else {
            item.nlink.saturating_sub(1)
        };
        item.ctime = now;
        tx.put_inode(ino, &item);
        if item.nlink == 0 {
            tx.put(TreeId::Fs, Key::new(0, kind::ORPHAN, ino), Vec::new());
            return Ok(true);
        }
        Ok(false)
    }

    /// `lookup`.
    pub fn op_lookup(&mut self, dir: Ino, name: &[u8]) -> Step<Attr> {
        if name != b"." && name != b".." {
            check_name(name)?;
        }
        let tx = Txn::new();
        self.live_dir(&tx, dir)?;
        let ino = match name {
            b"." => dir,
            b".." => self.parent_of(&tx, dir)?,
            _ => {
                self.find_entry(&tx, dir, name)?
                    .ok_or(Stop::Errno(Errno::ENOENT))?
                    .ino
            }
        };
        let item = self.inode(ino)?;
        Ok(self.attr(ino, &item))
    }

    /// `readdir`.
    pub fn op_readdir(&mut self, dir: Ino, offset: u64, max: usize) -> Step<Vec<DirEntry>> {
        if max == 0 {
            return Err(Errno::EINVAL.into());
        }
        let tx = Txn::new();
        self.live_dir(&tx, dir)?;
        let mut out = Vec::new();
        if offset == 0 {
            out.push(DirEntry {
                ino: dir,
                file_type: FileType::Directory,
                name: b".".to_vec(),
                next_offset: 1,
            });
        }
        if offset <= 1 {
            out.push(DirEntry {
                ino: self.parent_of(&tx, dir)?,
                file_type: FileType::Directory,
                name: b"..".to_vec(),
                next_offset: 2,
            });
        }
        let mut corrupt = false;
        let want = max.saturating_sub(out.len());
        let mut found = Vec::new();
        if want > 0 {
            self.trees.range(
                TreeId::Fs,
                Key::new(dir, kind::DIR_INDEX, offset.max(FIRST_INDEX)),
                Key::new(dir, kind::DIR_INDEX, u64::MAX),
                |k, v| {
                    match DirIndexRec::decode(v) {
                        Some(rec) => found.push(DirEntry {
                            ino: rec.ino,
                            file_type: rec.file_type,
                            name: rec.name,
                            next_offset: k.offset + 1,
                        }),
                        None => corrupt = true,
                    }
                    !corrupt && found.len() < want
                },
            )?;
        }
        if corrupt {
            return Err(Stop::Corrupt("undecodable directory index"));
        }
        out.extend(found);
        out.truncate(max);
        Ok(out)
    }

    /// `link`.
    pub fn op_link(&mut self, ino: Ino, new_dir: Ino, name: &[u8], now: Timespec) -> Step<Attr> {
        check_name(name)?;
        self.writable()?;
        let mut tx = Txn::new();
        let mut item = tx.inode(self, ino)?;
        let nd = self.live_dir(&tx, new_dir)?;
        if item.is_dir() {
            return Err(Errno::EPERM.into());
        }
        same_project(ino, &item, &nd)?;
        if item.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        if self.find_entry(&tx, new_dir, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        self.check_link_limit(item.nlink)?;
        self.check_user_space()?;
        let ft = item.file_type().ok_or(Stop::Corrupt("inode type"))?;
        self.add_entry(&mut tx, new_dir, name, ino, ft, now)?;
        item = tx.inode(self, ino)?;
        item.nlink += 1;
        item.ctime = now;
        tx.put_inode(ino, &item);
        self.commit(tx)?;
        Ok(self.attr(ino, &item))
    }

    /// `unlink` (and `rmdir` with `dir_wanted`). Returns the inode if it lost its last
    /// link (the caller frees it unless open).
    pub fn op_remove(
        &mut self,
        dir: Ino,
        name: &[u8],
        dir_wanted: bool,
        now: Timespec,
    ) -> Step<Option<Ino>> {
        check_name(name)?;
        self.writable()?;
        let mut tx = Txn::new();
        self.live_dir(&tx, dir)?;
        let rec = self
            .find_entry(&tx, dir, name)?
            .ok_or(Stop::Errno(Errno::ENOENT))?;
        let victim = tx.inode(self, rec.ino)?;
        match (victim.is_dir(), dir_wanted) {
            (true, false) => return Err(Errno::EISDIR.into()),
            (false, true) => return Err(Errno::ENOTDIR.into()),
            (true, true) if !self.dir_is_empty(rec.ino)? => return Err(Errno::ENOTEMPTY.into()),
            _ => {}
        }
        self.remove_entry(&mut tx, dir, name, now)?;
        if dir_wanted {
            let mut d = tx.inode(self, dir)?;
            d.nlink -= 1;
            tx.put_inode(dir, &d);
        }
        let orphaned = self.drop_link(&mut tx, rec.ino, now)?;
        self.commit(tx)?;
        Ok(orphaned.then_some(rec.ino))
    }

    /// `rename`. Returns a replaced inode that lost its last link.
    pub fn op_rename(
        &mut self,
        old_dir: Ino,
        old_name: &[u8],
        new_dir: Ino,
        new_name: &[u8],
        now: Timespec,
    ) -> Step<Option<Ino>> {
        check_name(old_name)?;
        check_name(new_name)?;
        self.writable()?;
        let mut tx = Txn::new();
        self.live_dir(&tx, old_dir)?;
        let nd = self.live_dir(&tx, new_dir)?;
        let target = self.find_entry(&tx, new_dir, new_name)?;
        let source = self
            .find_entry(&tx, old_dir, old_name)?
            .ok_or(Stop::Errno(Errno::ENOENT))?;
        let src = tx.inode(self, source.ino)?;
        if old_dir != new_dir {
            same_project(source.ino, &src, &nd)?;
        }
        let src_is_dir = src.is_dir();
        if src_is_dir && self.is_within(&tx, new_dir, source.ino)? {
            return Err(Errno::EINVAL.into());
        }
        if let Some(t) = &target {
            let titem = tx.inode(self, t.ino)?;
            if titem.is_dir() && self.is_within(&tx, old_dir, t.ino)? {
                return Err(Errno::ENOTEMPTY.into());
            }
            if t.ino == source.ino {
                return Ok(None);
            }
            match (titem.is_dir(), src_is_dir) {
                (true, false) => return Err(Errno::EISDIR.into()),
                (true, true) if !self.dir_is_empty(t.ino)? => return Err(Errno::ENOTEMPTY.into()),
                (false, true) => return Err(Errno::ENOTDIR.into()),
                _ => {}
            }
        } else if src_is_dir && old_dir != new_dir {
            self.check_link_limit(nd.nlink)?;
        }
        self.check_meta_space()?;
        let mut orphan = None;
        if let Some(t) = &target {
            self.remove_entry(&mut tx, new_dir, new_name, now)?;
            if src_is_dir {
                let mut d = tx.inode(self, new_dir)?;
                d.nlink -= 1;
                tx.put_inode(new_dir, &d);
            }
            if self.drop_link(&mut tx, t.ino, now)? {
                orphan = Some(t.ino);
            }
        }
        self.remove_entry(&mut tx, old_dir, old_name, now)?;
        let ft = src.file_type().ok_or(Stop::Corrupt("inode type"))?;
        self.add_entry(&mut tx, new_dir, new_name, source.ino, ft, now)?;
        if src_is_dir && old_dir != new_dir {
            let mut o = tx.inode(self, old_dir)?;
            o.nlink -= 1;
            tx.put_inode(old_dir, &o);
            let mut n = tx.inode(self, new_dir)?;
            n.nlink += 1;
            tx.put_inode(new_dir, &n);
        }
        let mut moved = tx.inode(self, source.ino)?;
        moved.ctime = now;
        tx.put_inode(source.ino, &moved);
        self.commit(tx)?;
        Ok(orphan)
    }
}

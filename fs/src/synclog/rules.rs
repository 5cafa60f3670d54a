//! What replay accepts. A logged record is applied only if the live operation it
//! stands for would have been accepted: a checksum-valid commit may still be forged
//! (anyone who can write the disk can seal a log block) or written by a bug, and
//! replay must not do what no live operation does (`docs/durability.md`, "Log commits
//! as input"). The rules reuse the live operations' own checks (`check_name`,
//! `check_target`, `check_xattr_name`, `is_reserved`, `is_within`, the allocator's
//! test for blocks replay may claim), so fsck, which replays the log in memory the
//! same way, makes exactly these checks too.
//!
//! Each record is checked against the state replay has reached, just before it is
//! applied ([`Core::check_record`]); what a commit may pass through on its way (a
//! directory renamed out of another one that the same commit then moves is, for a
//! moment, inside it) is checked once the whole commit is applied
//! ([`Core::check_shape`]).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use crate::format::items::{decode_xattrs, FileExtent, InodeItem, XATTR_CHUNK_LEN};
use crate::format::key::kind;
use crate::format::log::{LoggedEntry, LoggedName, Record};
use crate::format::{Key, TreeId, BLOCK_SIZE, MAX_VALUE_LEN};
use vfs::{Errno, FileType, Ino, ROOT_INO, XATTR_VALUE_MAX};

use crate::core::dir::{check_name, PARENT_LOOP};
use crate::core::inode::check_target;
use crate::core::inode::MAX_FILE_SIZE;
use crate::core::inode::{is_reserved, LIVE_INO_END};
use crate::core::txn::{Core, Stop, Txn};
use crate::core::xattr::check_xattr_name;

/// Why replay refuses a logged commit: one of its records asks for what no live
/// operation does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The rule the record breaks.
    pub rule: &'static str,
    /// The inode the record is about (the directory, for an entry).
    pub ino: Ino,
    /// The name concerned, if any.
    pub name: Option<Vec<u8>>,
}

impl core::fmt::Display for Refusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} (inode {}", self.rule, self.ino)?;
        if let Some(n) = &self.name {
            write!(f, ", name \"{}\"", n.escape_ascii())?;
        }
        write!(f, ")")
    }
}

/// How a check inside the core ends when it does not pass: stopped (something to
/// load, or the metadata is corrupt), or the record refused.
#[derive(Debug)]
pub(crate) enum Fault {
    /// As any operation stops.
    Stop(Stop),
    /// The record breaks a rule.
    Refused(Refusal),
}

impl From<Stop> for Fault {
    fn from(s: Stop) -> Fault {
        Fault::Stop(s)
    }
}

/// The outcome of a check inside the core.
pub(crate) type Check = Result<(), Fault>;

/// A refusal of rule `rule` for inode `ino` (and `name`).
fn refuse(rule: &'static str, ino: Ino, name: Option<&[u8]>) -> Fault {
    Fault::Refused(Refusal {
        rule,
        ino,
        name: name.map(<[u8]>::to_vec),
    })
}

/// Fails with [`refuse`] unless `ok`.
fn ensure(ok: bool, rule: &'static str, ino: Ino, name: Option<&[u8]>) -> Check {
    if ok {
        Ok(())
    } else {
        Err(refuse(rule, ino, name))
    }
}

/// A check's outcome as a core operation returns it: stops go to the driver (which
/// loads what is missing and runs the check again), refusals to replay.
pub(crate) fn settle(c: Check) -> Result<Result<(), Refusal>, Stop> {
    match c {
        Ok(()) => Ok(Ok(())),
        Err(Fault::Refused(r)) => Ok(Err(r)),
        Err(Fault::Stop(s)) => Err(s),
    }
}

/// Whether `ino` is a number the live filesystem can hand out: not 0 (the
/// filesystem's own items), below the numbers of `.snapshots` and the snapshots.
pub(super) fn live_ino(ino: Ino) -> Check {
    ensure(
        (ROOT_INO..LIVE_INO_END).contains(&ino),
        "an inode number outside the live filesystem's",
        ino,
        None,
    )
}

/// File blocks a file can map: those below [`MAX_FILE_SIZE`].
const FILE_BLOCKS_END: u64 = MAX_FILE_SIZE.div_ceil(BLOCK_SIZE as u64);

/// The data extents replay has seen referenced that the checkpoint does not have:
/// first block and length. Blocks are never reused between two checkpoints, so no two
/// of them overlap.
pub(crate) type NewExtents = BTreeMap<u64, u32>;

impl Core {
    /// Checks `rec` against the state replay has reached, before it is applied.
    /// `csums` are the checksums logged so far (this commit's included), `new` the new
    /// data extents referenced so far (extended here).
    pub(crate) fn check_record(
        &mut self,
        rec: &Record,
        csums: &BTreeMap<u64, Vec<u32>>,
        new: &mut NewExtents,
    ) -> Check {
        match rec {
            Record::Inode { ino, item } => self.check_inode_record(*ino, item),
            Record::Names { ino, names } => self.check_names_record(*ino, names),
            Record::Xattrs { ino, items } => self.check_xattrs_record(*ino, items),
            Record::Extents { ino, pieces, .. } => {
                self.check_extents_record(*ino, pieces, csums, new)
            }
            // Checked where an extent uses them.
            Record::Csum { .. } => Ok(()),
            Record::Symlink { ino, target } => {
                let item = self.logged_inode(*ino)?;
                ensure(
                    item.file_type() == Some(FileType::Symlink),
                    "a symlink target for an inode that is not a symlink",
                    *ino,
                    None,
                )?;
                ensure(
                    check_target(target).is_ok(),
                    "a symlink target no live operation accepts",
                    *ino,
                    None,
                )
            }
            Record::Dentries {
                dir,
                entries,
                removed,
            } => self.check_dentries_record(*dir, entries, removed),
        }
    }

    /// After a commit is applied: every directory among `inos` (those whose names it
    /// changed) has at most one name, and is not inside itself. (The root never gets
    /// one: [`Core::check_entry`] refuses every entry naming it.)
    pub(crate) fn check_shape(&mut self, inos: &BTreeSet<Ino>) -> Check {
        let tx = Txn::new();
        for &ino in inos {
            let item = match self.inode(ino) {
                Ok(i) => i,
                Err(Stop::Errno(Errno::ENOENT)) => continue,
                Err(e) => return Err(e.into()),
            };
            if !item.is_dir() {
                continue;
            }
            let names = self.names_of(&tx, ino)?;
            ensure(
                names.len() <= 1,
                "a directory with more than one name",
                ino,
                None,
            )?;
            let Some(name) = names.first() else {
                continue;
            };
            // As rename refuses to move a directory under itself.
            let inside = match self.is_within(&tx, name.parent, ino) {
                Err(Stop::Corrupt(what)) if what == PARENT_LOOP => true,
                r => r?,
            };
            ensure(
                !inside,
                "a directory inside itself (a cycle of directories)",
                ino,
                Some(&name.name),
            )?;
        }
        Ok(())
    }

    /// The inode item of `ino`, which a record names: it must exist.
    fn logged_inode(&mut self, ino: Ino) -> Result<InodeItem, Fault> {
        live_ino(ino)?;
        match self.inode(ino) {
            Ok(item) => Ok(item),
            Err(Stop::Errno(Errno::ENOENT)) => Err(refuse(
                "a record for an inode that does not exist",
                ino,
                None,
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// An `INODE` record: a decodable item, of the type the inode has (an inode never
    /// changes type), a new inode only with a number the checkpoint had not handed out
    /// yet, a size a file can have, charged to a project that exists.
    fn check_inode_record(&mut self, ino: Ino, item: &[u8]) -> Check {
        live_ino(ino)?;
        let Some(new) = InodeItem::decode(item) else {
            return Err(refuse("an undecodable inode item", ino, None));
        };
        match self.inode(ino) {
            Ok(old) => ensure(
                old.file_type() == new.file_type(),
                "an inode item that changes the inode's type",
                ino,
                None,
            )?,
            Err(Stop::Errno(Errno::ENOENT)) => ensure(
                ino >= self.sb.next_ino,
                "a new inode with a number the checkpoint had handed out",
                ino,
                None,
            )?,
            Err(e) => return Err(e.into()),
        }
        ensure(
            new.size <= MAX_FILE_SIZE,
            "an inode larger than a file can be",
            ino,
            None,
        )?;
        if new.project != 0 {
            let exists = self.quota_item(&Txn::new(), new.project)?.is_some();
            ensure(
                exists,
                "an inode charged to a project that has no quota item",
                ino,
                None,
            )?;
        }
        Ok(())
    }

    /// `dir/name -> child` of type `ft`, as a logged name or entry: a name `lookup`,
    /// `create` and `rename` accept, not `.snapshots` at the root, never the root as
    /// the child, both inodes existing, the directory a directory, the type the
    /// child's.
    fn check_entry(&mut self, dir: Ino, name: &[u8], child: Ino, ft: FileType) -> Check {
        ensure(
            check_name(name).is_ok(),
            "a name no live operation accepts (empty, \".\", \"..\", with '/' or NUL, too long)",
            dir,
            Some(name),
        )?;
        ensure(
            !is_reserved(dir, name),
            "the snapshots directory's name in the root",
            dir,
            Some(name),
        )?;
        ensure(
            child != ROOT_INO,
            "a name for the root directory",
            dir,
            Some(name),
        )?;
        let d = self.logged_inode(dir)?;
        ensure(
            d.is_dir(),
            "an entry in an inode that is not a directory",
            dir,
            Some(name),
        )?;
        let c = self.logged_inode(child)?;
        ensure(
            c.file_type() == Some(ft),
            "an entry whose type is not its inode's",
            dir,
            Some(name),
        )
    }

    /// A `NAMES` record: every name an entry [`Core::check_entry`] accepts (how many a
    /// directory has is checked once the commit is applied, [`Core::check_shape`]).
    fn check_names_record(&mut self, ino: Ino, names: &[LoggedName]) -> Check {
        self.logged_inode(ino)?;
        for n in names {
            self.check_entry(n.parent, &n.name, ino, n.file_type)?;
        }
        Ok(())
    }

    /// A `DENTRIES` record: entries of an existing directory, each one
    /// [`Core::check_entry`] accepts; removed entries of live inode numbers.
    fn check_dentries_record(
        &mut self,
        dir: Ino,
        entries: &[LoggedEntry],
        removed: &[(u64, Ino)],
    ) -> Check {
        let d = self.logged_inode(dir)?;
        ensure(
            d.is_dir(),
            "directory entries of an inode that is not a directory",
            dir,
            None,
        )?;
        for e in entries {
            self.check_entry(dir, &e.name, e.ino, e.file_type)?;
        }
        for &(_, ino) in removed {
            live_ino(ino)?;
        }
        Ok(())
    }

    /// An `XATTRS` record: xattr buckets that decode, of names `setxattr` accepts, each
    /// filed under its name's hash, with values it accepts; chunks of chunk size.
    fn check_xattrs_record(&mut self, ino: Ino, items: &[(u8, u64, Vec<u8>)]) -> Check {
        self.logged_inode(ino)?;
        for (k, offset, v) in items {
            ensure(
                v.len() <= MAX_VALUE_LEN,
                "an xattr item too large",
                ino,
                None,
            )?;
            match *k {
                kind::XATTR => {
                    let Some(recs) = decode_xattrs(v) else {
                        return Err(refuse("an undecodable xattr item", ino, None));
                    };
                    for r in &recs {
                        ensure(
                            check_xattr_name(&r.name).is_ok()
                                && r.value_len as usize <= XATTR_VALUE_MAX,
                            "an xattr setxattr does not accept",
                            ino,
                            Some(&r.name),
                        )?;
                        ensure(
                            self.xattr_key(ino, &r.name).offset == *offset,
                            "an xattr filed under another name's hash",
                            ino,
                            Some(&r.name),
                        )?;
                    }
                }
                kind::XATTR_CHUNK => ensure(
                    v.len() <= XATTR_CHUNK_LEN,
                    "an xattr chunk larger than a chunk",
                    ino,
                    None,
                )?,
                _ => {
                    return Err(refuse(
                        "an item of another kind among the xattrs",
                        ino,
                        None,
                    ))
                }
            }
        }
        Ok(())
    }

    /// An `EXTENTS` record: data of a regular file, pieces in order without overlaps,
    /// below the largest file size, over data extents in the data area; an extent the
    /// checkpoint does not have comes with its checksums and lies on blocks free in the
    /// checkpoint, apart from every other new one (the blocks replay claims for it).
    fn check_extents_record(
        &mut self,
        ino: Ino,
        pieces: &[(u64, FileExtent)],
        csums: &BTreeMap<u64, Vec<u32>>,
        new: &mut NewExtents,
    ) -> Check {
        let item = self.logged_inode(ino)?;
        ensure(
            item.file_type() == Some(FileType::Regular),
            "file data for an inode that is not a regular file",
            ino,
            None,
        )?;
        let mut next = 0;
        for (fb, fe) in pieces {
            // The decoder made sure the piece lies inside the record's range.
            let end = fb + u64::from(fe.num_blocks);
            ensure(
                *fb >= next && end <= FILE_BLOCKS_END,
                "file extents out of order, overlapping or past the largest file",
                ino,
                None,
            )?;
            next = end;
            ensure(
                self.in_data_area(fe.disk_block, fe.disk_blocks),
                "a data extent outside the data area",
                ino,
                None,
            )?;
            self.check_extent_owner(ino, fe, csums, new)?;
        }
        Ok(())
    }

    /// Whether the data extent `fe` uses is one replay may reference: one the
    /// checkpoint has (a reference more, as a clone makes), or a new one (see
    /// [`Core::check_extents_record`]), which is noted in `new`.
    fn check_extent_owner(
        &mut self,
        ino: Ino,
        fe: &FileExtent,
        csums: &BTreeMap<u64, Vec<u32>>,
        new: &mut NewExtents,
    ) -> Check {
        let (disk, len) = (fe.disk_block, fe.disk_blocks);
        let key = Key::new(disk, kind::EXTENT, u64::from(len));
        let known = self.trees.get(TreeId::Extent, &key).map_err(Stop::from)?;
        if known.is_some() || new.get(&disk) == Some(&len) {
            return Ok(());
        }
        ensure(
            csums.get(&disk).is_some_and(|s| s.len() == len as usize),
            "a new data extent without its checksums",
            ino,
            None,
        )?;
        let end = disk + u64::from(len);
        let before = new.range(..end).next_back();
        ensure(
            before.is_none_or(|(&s, &l)| s + u64::from(l) <= disk),
            "two new data extents over the same blocks",
            ino,
            None,
        )?;
        self.space
            .ensure_groups(disk..end)
            .map_err(|n| Fault::Stop(n.into()))?;
        ensure(
            self.space.replayable(disk..end),
            "a new data extent over blocks the checkpoint uses",
            ino,
            None,
        )?;
        new.insert(disk, len);
        Ok(())
    }
}

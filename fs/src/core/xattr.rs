//! Extended attributes: `(ino, XATTR, hash(name))` items list the attributes with that
//! name hash; values up to [`XATTR_INLINE_MAX`] bytes are stored inline, longer ones in
//! `(ino, XATTR_CHUNK, id << 8 | chunk)` items.

use alloc::vec::Vec;

use crate::core::txn::{Core, Step, Stop, Txn};
use crate::format::items::{
    decode_xattrs, encode_xattrs, XattrRec, XATTR_CHUNK_LEN, XATTR_INLINE_MAX,
};
use crate::format::key::kind;
use crate::format::{Key, TreeId};
use crate::util::hash::{domain, keyed_hash};
use vfs::{Errno, Ino, Timespec, XattrMode, NAME_MAX, XATTR_VALUE_MAX};

/// Validates an xattr name.
pub fn check_xattr_name(name: &[u8]) -> Result<(), Errno> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn chunk_key(ino: Ino, id: u64, chunk: usize) -> Key {
    Key::new(ino, kind::XATTR_CHUNK, (id << 8) | chunk as u64)
}

impl Core {
    /// The key of the xattr bucket that holds `name` of `ino`.
    pub(crate) fn xattr_key(&self, ino: Ino, name: &[u8]) -> Key {
        Key::new(
            ino,
            kind::XATTR,
            keyed_hash(self.sb.secret, domain::XATTR_NAME, name),
        )
    }

    fn xattr_bucket(&mut self, tx: &Txn, key: &Key) -> Step<Vec<XattrRec>> {
        match tx.get(self, TreeId::Fs, key)? {
            Some(b) => decode_xattrs(&b).ok_or(Stop::Corrupt("undecodable xattr item")),
            None => Ok(Vec::new()),
        }
    }

    fn xattr_value(&mut self, ino: Ino, rec: &XattrRec) -> Step<Vec<u8>> {
        if let Some(v) = &rec.inline {
            return Ok(v.clone());
        }
        let mut out = Vec::with_capacity(rec.value_len as usize);
        for chunk in 0..(rec.value_len as usize).div_ceil(XATTR_CHUNK_LEN) {
            let part = self
                .trees
                .get(TreeId::Fs, &chunk_key(ino, rec.id, chunk))?
                .ok_or(Stop::Corrupt("missing xattr chunk"))?;
            out.extend_from_slice(&part);
        }
        if out.len() != rec.value_len as usize {
            return Err(Stop::Corrupt("xattr value length"));
        }
        Ok(out)
    }

    fn drop_chunks(tx: &mut Txn, ino: Ino, rec: &XattrRec) {
        if rec.inline.is_none() {
            for chunk in 0..(rec.value_len as usize).div_ceil(XATTR_CHUNK_LEN) {
                tx.del(TreeId::Fs, chunk_key(ino, rec.id, chunk));
            }
        }
    }

    /// `getxattr`.
    pub fn op_getxattr(&mut self, ino: Ino, name: &[u8]) -> Step<Vec<u8>> {
        check_xattr_name(name)?;
        self.inode(ino)?;
        let key = self.xattr_key(ino, name);
        let rec = self
            .xattr_bucket(&Txn::new(), &key)?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or(Stop::Errno(Errno::ENODATA))?;
        self.xattr_value(ino, &rec)
    }

    /// `setxattr`.
    pub fn op_setxattr(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrMode,
        now: Timespec,
    ) -> Step<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(Errno::ERANGE.into());
        }
        let mut tx = Txn::new();
        let mut item = tx.inode(self, ino)?;
        self.writable()?;
        let key = self.xattr_key(ino, name);
        let mut bucket = self.xattr_bucket(&tx, &key)?;
        let existing = bucket.iter().position(|r| r.name == name);
        match (how, existing.is_some()) {
            (XattrMode::Create, true) => return Err(Errno::EEXIST.into()),
            (XattrMode::Replace, false) => return Err(Errno::ENODATA.into()),
            _ => {}
        }
        self.check_user_space()?;
        let id = match existing {
            Some(i) => {
                let old = bucket.remove(i);
                Self::drop_chunks(&mut tx, ino, &old);
                old.id
            }
            None => {
                let id = item.next_seq;
                // From the disk: at its end it was forged, never made.
                item.next_seq = id
                    .checked_add(1)
                    .ok_or(Stop::Corrupt("xattr id counter out of range"))?;
                id
            }
        };
        let inline = value.len() <= XATTR_INLINE_MAX;
        if !inline {
            for (chunk, part) in value.chunks(XATTR_CHUNK_LEN).enumerate() {
                tx.put(TreeId::Fs, chunk_key(ino, id, chunk), part.to_vec());
            }
        }
        bucket.push(XattrRec {
            id,
            name: name.to_vec(),
            value_len: value.len() as u32,
            inline: inline.then(|| value.to_vec()),
        });
        tx.put(TreeId::Fs, key, encode_xattrs(&bucket));
        item.ctime = now;
        tx.put_inode(ino, &item);
        self.commit(tx)?;
        self.state(ino).no_xattrs = false;
        Ok(())
    }

    /// `listxattr`: names in byte order.
    pub fn op_listxattr(&mut self, ino: Ino) -> Step<Vec<Vec<u8>>> {
        self.inode(ino)?;
        let mut names = Vec::new();
        let mut corrupt = false;
        self.trees.range(
            TreeId::Fs,
            Key::new(ino, kind::XATTR, 0),
            Key::new(ino, kind::XATTR, u64::MAX),
            |_, v| {
                match decode_xattrs(v) {
                    Some(list) => names.extend(list.into_iter().map(|r| r.name)),
                    None => corrupt = true,
                }
                !corrupt
            },
        )?;
        if corrupt {
            return Err(Stop::Corrupt("undecodable xattr item"));
        }
        names.sort();
        if names.is_empty() {
            self.state(ino).no_xattrs = true;
        }
        Ok(names)
    }

    /// `removexattr`.
    pub fn op_removexattr(&mut self, ino: Ino, name: &[u8], now: Timespec) -> Step<()> {
        check_xattr_name(name)?;
        let mut tx = Txn::new();
        let mut item = tx.inode(self, ino)?;
        let key = self.xattr_key(ino, name);
        let mut bucket = self.xattr_bucket(&tx, &key)?;
        let i = bucket
            .iter()
            .position(|r| r.name == name)
            .ok_or(Stop::Errno(Errno::ENODATA))?;
        self.writable()?;
        let old = bucket.remove(i);
        Self::drop_chunks(&mut tx, ino, &old);
        if bucket.is_empty() {
            tx.del(TreeId::Fs, key);
        } else {
            tx.put(TreeId::Fs, key, encode_xattrs(&bucket));
        }
        item.ctime = now;
        tx.put_inode(ino, &item);
        self.commit(tx)
    }
}

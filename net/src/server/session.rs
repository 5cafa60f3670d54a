//! A connection's session: negotiated msize and the fid table.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::net::IpAddr;

use fs::vfs::{Errno, FsResult};

use super::fid::{Fid, FidState};

/// Per-connection state the request handlers share. Borrows of the fid table never live
/// across an `await`: handlers copy a fid's entry out, work, and write back.
#[derive(Debug)]
pub struct Session {
    id: u64,
    peer: Option<IpAddr>,
    msize: Cell<u32>,
    versioned: Cell<bool>,
    fids: RefCell<BTreeMap<u32, Fid>>,
}

impl Session {
    pub(crate) fn new(id: u64, peer: Option<IpAddr>, msize: u32) -> Self {
        Session {
            id,
            peer,
            msize: Cell::new(msize),
            versioned: Cell::new(false),
            fids: RefCell::new(BTreeMap::new()),
        }
    }

    /// The connection's id (unique within a server; owns its POSIX locks).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The client's address, if the transport knows it.
    pub fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    /// The negotiated msize (before `Tversion`: the server's maximum).
    pub fn msize(&self) -> u32 {
        self.msize.get()
    }

    pub(crate) fn set_msize(&self, msize: u32) {
        self.msize.set(msize);
    }

    /// Whether a `Tversion` for 9P2000.L succeeded.
    pub fn versioned(&self) -> bool {
        self.versioned.get()
    }

    pub(crate) fn set_versioned(&self, v: bool) {
        self.versioned.set(v);
    }

    /// Number of fids in use.
    pub fn fid_count(&self) -> usize {
        self.fids.borrow().len()
    }

    /// A copy of `fid`'s entry: `EBADF` if unknown.
    pub(crate) fn get(&self, fid: u32) -> FsResult<Fid> {
        self.fids.borrow().get(&fid).cloned().ok_or(Errno::EBADF)
    }

    /// Binds a new fid: `EBADF` if `fid` is in use, `EMFILE` at `max` fids.
    pub(crate) fn insert(&self, fid: u32, entry: Fid, max: usize) -> FsResult<()> {
        let mut fids = self.fids.borrow_mut();
        if fids.contains_key(&fid) {
            return Err(Errno::EBADF);
        }
        if fids.len() >= max {
            return Err(Errno::EMFILE);
        }
        fids.insert(fid, entry);
        Ok(())
    }

    /// Checks that `fid` could be bound now (as [`Session::insert`] would).
    pub(crate) fn check_free(&self, fid: u32, max: usize) -> FsResult<()> {
        let fids = self.fids.borrow();
        if fids.contains_key(&fid) {
            Err(Errno::EBADF)
        } else if fids.len() >= max {
            Err(Errno::EMFILE)
        } else {
            Ok(())
        }
    }

    /// Replaces an existing fid's entry (after a walk onto itself, open, create, ...).
    /// `EBADF` if the fid was clunked meanwhile.
    pub(crate) fn replace(&self, fid: u32, entry: Fid) -> FsResult<()> {
        match self.fids.borrow_mut().get_mut(&fid) {
            Some(slot) => {
                *slot = entry;
                Ok(())
            }
            None => Err(Errno::EBADF),
        }
    }

    /// Moves `fid` from `Path` to `state` if it is still in `Path`; `EBADF` otherwise
    /// (clunked, or opened by a concurrent request).
    pub(crate) fn transition(&self, fid: u32, state: FidState) -> FsResult<()> {
        match self.fids.borrow_mut().get_mut(&fid) {
            Some(slot) if matches!(slot.state, FidState::Path) => {
                slot.state = state;
                Ok(())
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// Unbinds `fid`.
    pub(crate) fn remove(&self, fid: u32) -> FsResult<Fid> {
        self.fids.borrow_mut().remove(&fid).ok_or(Errno::EBADF)
    }

    /// Unbinds every fid.
    pub(crate) fn take_all(&self) -> Vec<(u32, Fid)> {
        core::mem::take(&mut *self.fids.borrow_mut())
            .into_iter()
            .collect()
    }
}

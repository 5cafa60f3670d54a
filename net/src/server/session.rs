//! A connection's session: negotiated msize, the fid table, the memory account it is
//! charged to, and what the server's housekeeping needs to know about it (activity,
//! stalled output) and to tell it (close).

use alloc::collections::BTreeMap;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::net::IpAddr;
use core::task::Waker;

use vfs::{Errno, FsResult, NAME_MAX};

use super::fid::{Fid, FidState};
use crate::conn::CloseReason;
use crate::memory::{Account, Refused, Use};

/// Memory charged for one fid table entry, an upper bound: the entry, the map's share of
/// it, and the longest name of a last walk step (which [`Fid::parent`] keeps).
pub const FID_ENTRY_BYTES: usize = core::mem::size_of::<(u32, Fid)>() + 48 + 16 + NAME_MAX;

/// What the server's housekeeping knows of a connection at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    /// When the session was opened (server clock, ns).
    pub opened: u64,
    /// When a request last arrived or was answered.
    pub last: u64,
    /// Requests in flight or answered but not yet sent.
    pub outstanding: usize,
    /// Since when replies have been waiting without the client taking any of their
    /// bytes; `None` when nothing waits or the client is reading.
    pub output_stalled_since: Option<u64>,
    /// Since when a frame whose size field has arrived has been waiting for more of its
    /// bytes; `None` between frames.
    pub input_stalled_since: Option<u64>,
}

impl Activity {
    /// Whether the connection has held memory without the client moving it — replies
    /// unread or a frame unfinished — for at least `grace` ns at `now`.
    pub fn stalled(&self, now: u64, grace: u64) -> bool {
        [self.output_stalled_since, self.input_stalled_since]
            .into_iter()
            .flatten()
            .any(|since| now.saturating_sub(since) >= grace)
    }
}

/// Per-connection state the request handlers share. Borrows of the fid table never live
/// across an `await`: handlers copy a fid's entry out, work, and write back.
#[derive(Debug)]
pub struct Session {
    id: u64,
    peer: Option<IpAddr>,
    msize: Cell<u32>,
    versioned: Cell<bool>,
    fids: RefCell<BTreeMap<u32, Fid>>,
    account: Rc<Account>,
    activity: Cell<Activity>,
    close: Cell<Option<CloseReason>>,
    waker: RefCell<Option<Waker>>,
}

impl Session {
    pub(crate) fn new(
        id: u64,
        peer: Option<IpAddr>,
        msize: u32,
        account: Account,
        now: u64,
    ) -> Self {
        Session {
            id,
            peer,
            msize: Cell::new(msize),
            versioned: Cell::new(false),
            fids: RefCell::new(BTreeMap::new()),
            account: Rc::new(account),
            activity: Cell::new(Activity {
                opened: now,
                last: now,
                outstanding: 0,
                output_stalled_since: None,
                input_stalled_since: None,
            }),
            close: Cell::new(None),
            waker: RefCell::new(None),
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

    /// The memory account everything this connection makes the server hold is charged
    /// to.
    pub fn account(&self) -> &Rc<Account> {
        &self.account
    }

    /// Number of fids in use.
    pub fn fid_count(&self) -> usize {
        self.fids.borrow().len()
    }

    /// What housekeeping knows of the connection now.
    pub fn activity(&self) -> Activity {
        self.activity.get()
    }

    /// Updates the activity record (the connection driver does, as things happen).
    pub(crate) fn note(&self, f: impl FnOnce(&mut Activity)) {
        let mut a = self.activity.get();
        f(&mut a);
        self.activity.set(a);
    }

    /// Asks the connection to close and wakes its task. The first reason given stands,
    /// unless a later one sheds a connection the first would have let send its replies
    /// ([`CloseReason::overridden_by`]).
    pub fn request_close(&self, reason: CloseReason) {
        if self
            .close
            .get()
            .is_none_or(|first| first.overridden_by(reason))
        {
            self.close.set(Some(reason));
        }
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Why the connection was asked to close, if it was.
    pub fn close_requested(&self) -> Option<CloseReason> {
        self.close.get()
    }

    /// Remembers the task to wake for [`Session::request_close`].
    pub(crate) fn register_waker(&self, waker: &Waker) {
        let mut w = self.waker.borrow_mut();
        if !w.as_ref().is_some_and(|old| old.will_wake(waker)) {
            *w = Some(waker.clone());
        }
    }

    /// A copy of `fid`'s entry: `EBADF` if unknown.
    pub(crate) fn get(&self, fid: u32) -> FsResult<Fid> {
        self.fids.borrow().get(&fid).cloned().ok_or(Errno::EBADF)
    }

    /// Binds a new fid: `EBADF` if `fid` is in use, `EMFILE` at `max` fids, and the
    /// refusal if the entry's memory cannot be charged.
    pub(crate) fn insert(&self, fid: u32, entry: Fid, max: usize) -> Result<(), BindError> {
        let mut fids = self.fids.borrow_mut();
        if fids.contains_key(&fid) {
            return Err(BindError::Errno(Errno::EBADF));
        }
        if fids.len() >= max {
            return Err(BindError::Errno(Errno::EMFILE));
        }
        self.account
            .take(Use::Fids, FID_ENTRY_BYTES)
            .map_err(BindError::Memory)?;
        fids.insert(fid, entry);
        Ok(())
    }

    /// Checks that `fid` could be bound now (as [`Session::insert`] would, memory
    /// aside).
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
        let f = self.fids.borrow_mut().remove(&fid).ok_or(Errno::EBADF)?;
        self.account.release(Use::Fids, FID_ENTRY_BYTES);
        Ok(f)
    }

    /// Unbinds every fid.
    pub(crate) fn take_all(&self) -> Vec<(u32, Fid)> {
        let all = core::mem::take(&mut *self.fids.borrow_mut());
        self.account.release(Use::Fids, all.len() * FID_ENTRY_BYTES);
        all.into_iter().collect()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A connection dropped without a teardown (tests, a transport that gave up)
        // still gives its fids' memory back.
        let n = self.fids.get_mut().len();
        self.account.release(Use::Fids, n * FID_ENTRY_BYTES);
    }
}

/// Why a fid could not be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindError {
    /// The protocol's answer (`EBADF`, `EMFILE`).
    Errno(Errno),
    /// Its memory could not be charged.
    Memory(Refused),
}

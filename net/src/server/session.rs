//! A connection's session: negotiated msize, the fid table, the memory account it is
//! charged to, and what the server's housekeeping needs to know about it (activity,
//! stalled output) and to tell it (close).
//!
//! A session is shared (`Arc`) between its connection, which runs on one CPU, and the
//! server's housekeeping, which may run on another: its fields are atomics or behind
//! short locks ([`Locked`]), and a close asked for from any CPU wakes the connection's
//! task.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::net::IpAddr;
use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicBool, AtomicU32};
use core::task::Waker;

use vfs::{Errno, FsResult, NAME_MAX};

use super::fid::{Fid, FidState};
use super::tenant::Tenant;
use crate::conn::CloseReason;
use crate::memory::{Account, Refused, Use};
use crate::sync::Locked;

/// Memory charged for one fid table entry, an upper bound: the entry, the map's share of
/// it, the longest name of a last walk step (which [`Fid::parent`] keeps) and an open
/// file's read stream with its allocation.
pub const FID_ENTRY_BYTES: usize = core::mem::size_of::<(u32, Fid)>()
    + 48
    + 16
    + NAME_MAX
    + core::mem::size_of::<vfs::ReadStream>()
    + 16;

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

/// Per-connection state the request handlers share. The fid table is locked only inside
/// a method (never across an `await`): handlers copy a fid's entry out, work, and write
/// back.
#[derive(Debug)]
pub struct Session {
    id: u64,
    peer: Option<IpAddr>,
    msize: AtomicU32,
    versioned: AtomicBool,
    /// Locked before the account's books when a new entry is charged.
    fids: Locked<BTreeMap<u32, Fid>>,
    account: Arc<Account>,
    tenant: Arc<Tenant>,
    activity: Locked<Activity>,
    close: Locked<CloseSignal>,
}

/// A close asked for, and the task to wake for it: one lock, so that a close asked for
/// on another CPU either finds the task's waker or is seen by the task when it registers.
#[derive(Debug, Default)]
struct CloseSignal {
    reason: Option<CloseReason>,
    waker: Option<Waker>,
}

impl Session {
    pub(crate) fn new(
        id: u64,
        peer: Option<IpAddr>,
        msize: u32,
        account: Account,
        tenant: Arc<Tenant>,
        now: u64,
    ) -> Self {
        Session {
            id,
            peer,
            msize: AtomicU32::new(msize),
            versioned: AtomicBool::new(false),
            fids: Locked::new(BTreeMap::new()),
            account: Arc::new(account),
            tenant,
            activity: Locked::new(Activity {
                opened: now,
                last: now,
                outstanding: 0,
                output_stalled_since: None,
                input_stalled_since: None,
            }),
            close: Locked::default(),
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
        self.msize.load(Relaxed)
    }

    pub(crate) fn set_msize(&self, msize: u32) {
        self.msize.store(msize, Relaxed);
    }

    /// Whether a `Tversion` for 9P2000.L succeeded.
    pub fn versioned(&self) -> bool {
        self.versioned.load(Relaxed)
    }

    pub(crate) fn set_versioned(&self, v: bool) {
        self.versioned.store(v, Relaxed);
    }

    /// The memory account everything this connection makes the server hold is charged
    /// to.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// The tenant it belongs to.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// Number of fids in use.
    pub fn fid_count(&self) -> usize {
        self.fids.with(|f| f.len())
    }

    /// What housekeeping knows of the connection now.
    pub fn activity(&self) -> Activity {
        self.activity.with(|a| *a)
    }

    /// Updates the activity record (the connection driver does, as things happen).
    pub(crate) fn note(&self, f: impl FnOnce(&mut Activity)) {
        self.activity.with(f);
    }

    /// Asks the connection to close and wakes its task (from any CPU). The first reason
    /// given stands, unless a later one sheds a connection the first would have let send
    /// its replies ([`CloseReason::overridden_by`]).
    pub fn request_close(&self, reason: CloseReason) {
        let waker = self.close.with(|c| {
            if c.reason.is_none_or(|first| first.overridden_by(reason)) {
                c.reason = Some(reason);
            }
            c.waker.take()
        });
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Why the connection was asked to close, if it was.
    pub fn close_requested(&self) -> Option<CloseReason> {
        self.close.with(|c| c.reason)
    }

    /// Remembers the task to wake for [`Session::request_close`]. Call it before
    /// checking [`Session::close_requested`], so that a close asked for in between is
    /// seen or wakes the task.
    pub(crate) fn register_waker(&self, waker: &Waker) {
        self.close.with(|c| {
            if !c.waker.as_ref().is_some_and(|old| old.will_wake(waker)) {
                c.waker = Some(waker.clone());
            }
        });
    }

    /// A copy of `fid`'s entry: `EBADF` if unknown.
    pub(crate) fn get(&self, fid: u32) -> FsResult<Fid> {
        self.fids.with(|f| f.get(&fid).cloned()).ok_or(Errno::EBADF)
    }

    /// Binds a new fid: `EBADF` if `fid` is in use, `EMFILE` at `max` fids or when the
    /// tenant holds `tenant_max`, and the refusal (with the entry back) if the entry's
    /// memory cannot be charged.
    pub(crate) fn insert(
        &self,
        fid: u32,
        entry: Fid,
        max: usize,
        tenant_max: usize,
    ) -> Result<(), (BindError, Option<Fid>)> {
        // The check and the charge under the table's lock: two binds of one fid cannot
        // both pass it.
        let refused = self.fids.with(|fids| {
            if let Err(e) = free_slot(fids, fid, max) {
                return Some((BindError::Errno(e), entry));
            }
            if !self.tenant.take_fids(1, tenant_max) {
                return Some((BindError::TenantFids, entry));
            }
            if let Err(r) = self.account.take(Use::Fids, FID_ENTRY_BYTES) {
                self.tenant.release_fids(1);
                return Some((BindError::Memory(r), entry));
            }
            fids.insert(fid, entry);
            None
        });
        // A refused entry is dropped outside the lock (see `Session::replace`), or handed
        // back when memory refused it, for a retry once memory is reclaimed.
        match refused {
            None => Ok(()),
            Some((BindError::Memory(r), entry)) => Err((BindError::Memory(r), Some(entry))),
            Some((e, _entry)) => Err((e, None)),
        }
    }

    /// Checks that `fid` could be bound now (as [`Session::insert`] would, memory
    /// aside).
    pub(crate) fn check_free(&self, fid: u32, max: usize) -> FsResult<()> {
        self.fids.with(|fids| free_slot(fids, fid, max))
    }

    /// Replaces an existing fid's entry (after a walk onto itself, open, create, ...).
    /// `EBADF` if the fid was clunked meanwhile.
    pub(crate) fn replace(&self, fid: u32, entry: Fid) -> FsResult<()> {
        let displaced = self.fids.with(|fids| match fids.get_mut(&fid) {
            Some(slot) => Ok(core::mem::replace(slot, entry)),
            None => Err(entry),
        });
        // Whichever entry is left over is dropped here, outside the lock: its charge (an
        // xattr value) goes back to the account, which may wake tasks.
        displaced.map(drop).map_err(|_| Errno::EBADF)
    }

    /// Moves `fid` from `Path` to `state` if it is still in `Path`; `EBADF` otherwise
    /// (clunked, or opened by a concurrent request).
    pub(crate) fn transition(&self, fid: u32, state: FidState) -> FsResult<()> {
        let refused = self.fids.with(|fids| match fids.get_mut(&fid) {
            Some(slot) if matches!(slot.state, FidState::Path) => {
                slot.state = state;
                None
            }
            _ => Some(state),
        });
        // A refused state is dropped outside the lock (see `Session::replace`).
        match refused {
            None => Ok(()),
            Some(_state) => Err(Errno::EBADF),
        }
    }

    /// Unbinds `fid`.
    pub(crate) fn remove(&self, fid: u32) -> FsResult<Fid> {
        let f = self.fids.with(|f| f.remove(&fid)).ok_or(Errno::EBADF)?;
        self.account.release(Use::Fids, FID_ENTRY_BYTES);
        self.tenant.release_fids(1);
        Ok(f)
    }

    /// Unbinds every fid.
    pub(crate) fn take_all(&self) -> Vec<(u32, Fid)> {
        let all = self.fids.with(core::mem::take);
        self.account.release(Use::Fids, all.len() * FID_ENTRY_BYTES);
        self.tenant.release_fids(all.len());
        all.into_iter().collect()
    }
}

/// Whether `fid` can be bound in `fids`: `EBADF` if in use, `EMFILE` at `max` fids.
fn free_slot(fids: &BTreeMap<u32, Fid>, fid: u32, max: usize) -> FsResult<()> {
    if fids.contains_key(&fid) {
        Err(Errno::EBADF)
    } else if fids.len() >= max {
        Err(Errno::EMFILE)
    } else {
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A connection dropped without a teardown (tests, a transport that gave up)
        // still gives its fids' memory back.
        let n = self.fids.get_mut().len();
        self.account.release(Use::Fids, n * FID_ENTRY_BYTES);
        self.tenant.release_fids(n);
    }
}

/// Why a fid could not be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindError {
    /// The protocol's answer (`EBADF`, `EMFILE`).
    Errno(Errno),
    /// The tenant holds its share of fids (`EMFILE`).
    TenantFids,
    /// Its memory could not be charged.
    Memory(Refused),
}

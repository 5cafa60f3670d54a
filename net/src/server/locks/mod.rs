//! POSIX byte-range locks, kept in memory and shared by all connections of a server.
//!
//! Requests never wait: a conflicting request is answered `BLOCKED` and the Linux client
//! retries (it polls for `F_SETLKW`). An owner is a process on a client:
//! `(connection, client_id, proc_id)`; an owner's own locks never conflict with each other
//! and a new lock replaces the overlapped parts of the owner's older ones, as `fcntl` does:
//! unlocking or relocking part of a lock splits it, and a lock next to or over one of
//! the same kind taken through the same fid merges with it, so an owner's locks on a file
//! are disjoint and as few as they can be. Locks remember the fid they were taken
//! through, so clunking that fid (closing the file) or dropping the connection releases
//! them.
//!
//! Every operation costs O(log n) plus the locks it changes, whatever else is held:
//! - each inode's locks are an interval tree (`tree`) that finds a conflicting lock
//!   without stepping over the requester's own or compatible ones;
//! - each owner's locks are also kept by `(owner, inode, start)`, which is what
//!   unlocking, replacing and merging walk, and by `(connection, fid)`, which is what a
//!   clunk releases; a connection's locks are a range of the former.
//!
//! Limits: most locks per connection, per tenant (the connections
//! [`LockTable::bind_tenant`] put together) and overall (`ENOLCK` beyond), longest client
//! id (`EINVAL` beyond). Client ids are interned per connection (`clients`).

mod clients;
mod tree;

#[cfg(test)]
mod tests;

use alloc::collections::btree_map::Entry;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::mem::size_of;

use vfs::{Errno, Ino};

use clients::ClientIds;
/// Memory a stored client id takes beyond its bytes.
pub(crate) use clients::NAME_OVERHEAD as CLIENT_ID_OVERHEAD;
use tree::{LockTree, TreeLock};

/// Shared or exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// `F_RDLCK`.
    Read,
    /// `F_WRLCK`.
    Write,
}

/// Who asks, as a request names it: a process (`proc_id`) on a client (`client_id`)
/// over one connection (`conn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOwner<'a> {
    /// The connection's id.
    pub conn: u64,
    /// The client's name for itself (Linux: its nodename).
    pub client_id: &'a [u8],
    /// The process on the client.
    pub proc_id: u32,
}

/// A held lock, as `Tgetlock` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// Shared or exclusive.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte (`u64::MAX`: to end of file, however far it grows).
    pub end: u64,
    /// The holding process.
    pub proc_id: u32,
    /// The holding client's name for itself.
    pub client_id: Arc<[u8]>,
}

/// How many locks may be held, and how long a client id may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockLimits {
    /// Most locks one connection may hold.
    pub per_conn: usize,
    /// Most locks the connections of one tenant may hold together.
    pub per_tenant: usize,
    /// Most locks all connections together may hold.
    pub total: usize,
    /// Longest client id accepted, in bytes.
    pub client_id_len: usize,
}

/// Why a lock request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockError {
    /// The connection holds [`LockLimits::per_conn`] locks.
    ConnLimit,
    /// The connection's tenant holds [`LockLimits::per_tenant`] locks.
    TenantLimit,
    /// The server holds [`LockLimits::total`] locks.
    TotalLimit,
    /// The client id is longer than [`LockLimits::client_id_len`].
    ClientIdTooLong,
}

impl LockError {
    /// The errno a client gets: `ENOLCK` for the limits (what `fcntl` returns when a
    /// lock table is full), `EINVAL` for the id.
    pub fn errno(self) -> Errno {
        match self {
            LockError::ConnLimit | LockError::TenantLimit | LockError::TotalLimit => Errno::ENOLCK,
            LockError::ClientIdTooLong => Errno::EINVAL,
        }
    }
}

/// The inclusive end of a POSIX range of `length` bytes from `start` (`0` = to EOF).
pub fn range_end(start: u64, length: u64) -> u64 {
    if length == 0 {
        u64::MAX
    } else {
        start.saturating_add(length - 1)
    }
}

/// A lock's owner inside the table: the client id replaced by its number among the
/// connection's interned ids. `Copy` and compared as three integers, as the interval tree
/// does at every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct OwnerKey {
    conn: u64,
    client: u32,
    proc_id: u32,
}

impl OwnerKey {
    /// The lowest and highest keys of connection `conn`.
    fn bounds(conn: u64) -> (OwnerKey, OwnerKey) {
        let key = |n| OwnerKey {
            conn,
            client: n,
            proc_id: n,
        };
        (key(0), key(u32::MAX))
    }
}

/// What the owner-ordered index holds of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    end: u64,
    kind: LockKind,
    fid: u32,
}

/// A lock in the owner-ordered index: owner, inode, start.
type HeldKey = (OwnerKey, Ino, u64);

/// A lock in the fid-ordered index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FidKey {
    conn: u64,
    fid: u32,
    ino: Ino,
    owner: OwnerKey,
    start: u64,
}

impl FidKey {
    /// The lowest and highest keys of `fid` of connection `conn`.
    fn bounds(conn: u64, fid: u32) -> (FidKey, FidKey) {
        let (low, high) = OwnerKey::bounds(conn);
        let key = |ino, owner, start| FidKey {
            conn,
            fid,
            ino,
            owner,
            start,
        };
        (key(Ino::MIN, low, 0), key(Ino::MAX, high, u64::MAX))
    }
}

/// Bytes one lock takes in the table: its tree node and its entries in the two indexes
/// (B-tree nodes are at least about half full, so twice the entries bounds them).
pub const LOCK_RECORD_BYTES: usize =
    tree::NODE_BYTES + 2 * (size_of::<(HeldKey, Held)>() + size_of::<FidKey>());

/// What one connection holds.
#[derive(Debug, Default)]
struct ConnLocks {
    locks: usize,
    clients: ClientIds,
    /// Its tenant, if bound.
    tenant: Option<u64>,
}

/// What a lock or unlock does to its owner's locks on one inode: the locks that go (by
/// start) and the ones that come (pieces of split locks, the new lock grown by merges).
#[derive(Debug, Default)]
struct Plan {
    remove: Vec<u64>,
    add: Vec<(u64, Held)>,
}

impl Plan {
    /// How many more locks the owner holds afterwards (0 if fewer).
    fn growth(&self) -> usize {
        self.add.len().saturating_sub(self.remove.len())
    }
}

/// All locks of a server. See the module documentation.
#[derive(Debug)]
pub struct LockTable {
    limits: LockLimits,
    /// Every lock, by inode: what conflict searches look at.
    inodes: BTreeMap<Ino, LockTree>,
    /// Every lock, by owner, inode and start (an owner's locks on an inode are disjoint).
    held: BTreeMap<HeldKey, Held>,
    /// Every lock, by the connection and fid it was taken through.
    by_fid: BTreeSet<FidKey>,
    /// Per connection holding locks: their count and client ids.
    conns: BTreeMap<u64, ConnLocks>,
    /// Locks held per tenant.
    tenants: BTreeMap<u64, usize>,
    /// Locks held in all.
    len: usize,
}

impl LockTable {
    /// An empty table enforcing `limits`.
    pub fn new(limits: LockLimits) -> Self {
        LockTable {
            limits,
            inodes: BTreeMap::new(),
            held: BTreeMap::new(),
            by_fid: BTreeSet::new(),
            conns: BTreeMap::new(),
            tenants: BTreeMap::new(),
            len: 0,
        }
    }

    /// The conflicting lock with the lowest start that stands in the way of `owner`
    /// taking `kind` over `start..=end` of `ino`, if any.
    pub fn conflict(
        &self,
        ino: Ino,
        owner: &LockOwner<'_>,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<HeldLock>, LockError> {
        self.check_client_id(owner)?;
        let found = self.first_conflict(ino, owner, kind, start, end);
        Ok(found.map(|l| self.describe(&l)))
    }

    /// Takes `kind` over `start..=end` of `ino` for `owner` through `fid` unless another
    /// owner's lock conflicts: returns whether it was granted. The owner's older locks
    /// in the range are replaced.
    pub fn lock(
        &mut self,
        ino: Ino,
        owner: &LockOwner<'_>,
        fid: u32,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<bool, LockError> {
        self.check_client_id(owner)?;
        if self.first_conflict(ino, owner, kind, start, end).is_some() {
            return Ok(false);
        }
        let new = Held { end, kind, fid };
        let plan = self.plan(self.key_of(owner), ino, start, end, Some(new));
        self.check_room(owner.conn, plan.growth())?;
        let key = self.intern(owner);
        self.apply(key, ino, plan);
        Ok(true)
    }

    /// Releases `owner`'s locks over `start..=end` of `ino`, splitting those that stick
    /// out (which can need room: `ENOLCK` at the limits, as `fcntl` says).
    pub fn unlock(
        &mut self,
        ino: Ino,
        owner: &LockOwner<'_>,
        start: u64,
        end: u64,
    ) -> Result<(), LockError> {
        self.check_client_id(owner)?;
        let Some(key) = self.key_of(owner) else {
            return Ok(()); // Holds nothing anywhere.
        };
        let plan = self.plan(Some(key), ino, start, end, None);
        self.check_room(owner.conn, plan.growth())?;
        self.apply(key, ino, plan);
        self.forget_client_if_unused(key);
        Ok(())
    }

    /// Drops every lock taken through `fid` of connection `conn`.
    pub fn release_fid(&mut self, conn: u64, fid: u32) {
        let (low, high) = FidKey::bounds(conn, fid);
        let gone: Vec<FidKey> = self.by_fid.range(low..=high).copied().collect();
        for k in gone {
            self.remove_lock(k.owner, k.ino, k.start);
            self.forget_client_if_unused(k.owner);
        }
    }

    /// Counts connection `conn`'s locks, from now on, against tenant `tenant`'s share
    /// ([`LockLimits::per_tenant`]). A connection is bound once, before its first lock;
    /// one never bound is a tenant by itself.
    pub fn bind_tenant(&mut self, conn: u64, tenant: u64) {
        let c = self.conns.entry(conn).or_default();
        if c.tenant.is_none() {
            debug_assert_eq!(c.locks, 0, "bound after taking locks");
            c.tenant = Some(tenant);
        }
    }

    /// Number of locks the connections of tenant `tenant` hold.
    pub fn tenant_len(&self, tenant: u64) -> usize {
        self.tenants.get(&tenant).copied().unwrap_or(0)
    }

    /// Drops every lock of connection `conn`.
    pub fn release_conn(&mut self, conn: u64) {
        let (low, high) = OwnerKey::bounds(conn);
        let range = (low, Ino::MIN, 0)..=(high, Ino::MAX, u64::MAX);
        let gone: Vec<HeldKey> = self.held.range(range).map(|(k, _)| *k).collect();
        for (owner, ino, start) in gone {
            self.remove_lock(owner, ino, start);
        }
        self.conns.remove(&conn);
    }

    /// Number of locks held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of locks connection `conn` holds.
    pub fn conn_len(&self, conn: u64) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.locks)
    }

    /// Bytes of lock records connection `conn` holds: [`LOCK_RECORD_BYTES`] per lock and
    /// its interned client ids (an estimate from the records' sizes, not the
    /// allocator's count).
    pub fn conn_bytes(&self, conn: u64) -> usize {
        self.conns
            .get(&conn)
            .map_or(0, |c| c.locks * LOCK_RECORD_BYTES + c.clients.bytes())
    }

    fn check_client_id(&self, owner: &LockOwner<'_>) -> Result<(), LockError> {
        if owner.client_id.len() > self.limits.client_id_len {
            Err(LockError::ClientIdTooLong)
        } else {
            Ok(())
        }
    }

    /// Whether connection `conn`, its tenant and the server have room for `growth` more
    /// locks.
    fn check_room(&self, conn: u64, growth: usize) -> Result<(), LockError> {
        let tenant = self.conns.get(&conn).and_then(|c| c.tenant);
        if growth == 0 {
            Ok(())
        } else if self.conn_len(conn) + growth > self.limits.per_conn {
            Err(LockError::ConnLimit)
        } else if tenant.is_some_and(|t| self.tenant_len(t) + growth > self.limits.per_tenant) {
            Err(LockError::TenantLimit)
        } else if self.len + growth > self.limits.total {
            Err(LockError::TotalLimit)
        } else {
            Ok(())
        }
    }

    fn first_conflict(
        &self,
        ino: Ino,
        owner: &LockOwner<'_>,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Option<TreeLock> {
        let tree = self.inodes.get(&ino)?;
        tree.first_conflict(self.key_of(owner), kind, start, end)
    }

    /// The key of `owner`, if its client id is interned (otherwise it holds nothing).
    fn key_of(&self, owner: &LockOwner<'_>) -> Option<OwnerKey> {
        let client = self.conns.get(&owner.conn)?.clients.find(owner.client_id)?;
        Some(OwnerKey {
            conn: owner.conn,
            client,
            proc_id: owner.proc_id,
        })
    }

    /// The key of `owner`, interning its client id if needed.
    fn intern(&mut self, owner: &LockOwner<'_>) -> OwnerKey {
        let conn = self.conns.entry(owner.conn).or_default();
        OwnerKey {
            conn: owner.conn,
            client: conn.clients.intern(owner.client_id),
            proc_id: owner.proc_id,
        }
    }

    /// Drops `owner`'s client id if no lock names it any more, and the connection's
    /// entry with its last lock.
    fn forget_client_if_unused(&mut self, owner: OwnerKey) {
        if let Entry::Occupied(mut e) = self.conns.entry(owner.conn) {
            e.get_mut().clients.forget_if_unused(owner.client);
            if e.get().locks == 0 && e.get().clients.is_empty() {
                e.remove();
            }
        }
    }

    fn describe(&self, lock: &TreeLock) -> HeldLock {
        let client_id = self
            .conns
            .get(&lock.owner.conn)
            .and_then(|c| c.clients.name(lock.owner.client))
            .cloned()
            .unwrap_or_else(|| Arc::from(&[][..]));
        HeldLock {
            kind: lock.kind,
            start: lock.start,
            end: lock.end,
            proc_id: lock.owner.proc_id,
            client_id,
        }
    }

    /// What taking `new` (or, for `None`, releasing) `start..=end` of `ino` does to the
    /// locks of `owner` (`None`: an owner holding nothing). Looks only at the owner's
    /// locks that overlap or touch the range.
    fn plan(
        &self,
        owner: Option<OwnerKey>,
        ino: Ino,
        start: u64,
        end: u64,
        new: Option<Held>,
    ) -> Plan {
        let mut plan = Plan::default();
        // The new lock, grown by the locks it merges with.
        let (mut first, mut last) = (start, end);
        if let Some(owner) = owner {
            // Locks are disjoint and sorted: one may start before the range and reach
            // into it (or touch it); the rest start within it or right after it.
            let before =
                self.held
                    .range(..(owner, ino, start))
                    .next_back()
                    .filter(|((o, i, _), h)| {
                        *o == owner && *i == ino && h.end.saturating_add(1) >= start
                    });
            let from = self
                .held
                .range((owner, ino, start)..=(owner, ino, end.saturating_add(1)));
            for (&(_, _, l_start), &held) in before.into_iter().chain(from) {
                let overlaps = l_start <= end && start <= held.end;
                let touches =
                    Some(start) == held.end.checked_add(1) || Some(l_start) == end.checked_add(1);
                let same = new.is_some_and(|n| (n.kind, n.fid) == (held.kind, held.fid));
                if same && (overlaps || touches) {
                    plan.remove.push(l_start);
                    first = first.min(l_start);
                    last = last.max(held.end);
                } else if overlaps {
                    plan.remove.push(l_start);
                    if l_start < start {
                        let end = start - 1;
                        plan.add.push((l_start, Held { end, ..held }));
                    }
                    if held.end > end {
                        plan.add.push((end + 1, held));
                    }
                }
            }
        }
        if let Some(new) = new {
            plan.add.push((first, Held { end: last, ..new }));
        }
        plan
    }

    fn apply(&mut self, owner: OwnerKey, ino: Ino, plan: Plan) {
        for start in plan.remove {
            self.remove_lock(owner, ino, start);
        }
        for (start, held) in plan.add {
            self.insert_lock(owner, ino, start, held);
        }
    }

    /// Adds one lock to the tree, both indexes and the counts.
    fn insert_lock(&mut self, owner: OwnerKey, ino: Ino, start: u64, held: Held) {
        self.inodes.entry(ino).or_default().insert(TreeLock {
            start,
            end: held.end,
            kind: held.kind,
            owner,
        });
        self.by_fid.insert(FidKey {
            conn: owner.conn,
            fid: held.fid,
            ino,
            owner,
            start,
        });
        self.held.insert((owner, ino, start), held);
        let conn = self.conns.entry(owner.conn).or_default();
        conn.locks += 1;
        conn.clients.add_user(owner.client);
        if let Some(t) = conn.tenant {
            *self.tenants.entry(t).or_default() += 1;
        }
        self.len += 1;
    }

    /// Removes one lock from the tree, both indexes and the counts (the client id stays
    /// interned: see [`LockTable::forget_client_if_unused`]).
    fn remove_lock(&mut self, owner: OwnerKey, ino: Ino, start: u64) {
        let Some(held) = self.held.remove(&(owner, ino, start)) else {
            return;
        };
        if let Entry::Occupied(mut tree) = self.inodes.entry(ino) {
            tree.get_mut().remove(start, owner);
            if tree.get().is_empty() {
                tree.remove();
            }
        }
        self.by_fid.remove(&FidKey {
            conn: owner.conn,
            fid: held.fid,
            ino,
            owner,
            start,
        });
        if let Some(conn) = self.conns.get_mut(&owner.conn) {
            conn.locks -= 1;
            conn.clients.drop_user(owner.client);
            if let Some(Entry::Occupied(mut t)) = conn.tenant.map(|t| self.tenants.entry(t)) {
                *t.get_mut() -= 1;
                if *t.get() == 0 {
                    t.remove();
                }
            }
        }
        self.len -= 1;
    }
}

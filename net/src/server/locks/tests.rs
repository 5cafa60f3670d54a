//! The lock table against a byte-by-byte reference model, and its costs.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::clients::NAME_OVERHEAD;
use super::*;

/// A lock as the tests see it: owner (connection, client id, process), inode, range,
/// kind, fid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Flat {
    conn: u64,
    client_id: Vec<u8>,
    proc_id: u32,
    ino: Ino,
    start: u64,
    end: u64,
    kind: Kind,
    fid: u32,
}

/// [`LockKind`] with an order, for sorting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Read,
    Write,
}

impl From<LockKind> for Kind {
    fn from(k: LockKind) -> Kind {
        match k {
            LockKind::Read => Kind::Read,
            LockKind::Write => Kind::Write,
        }
    }
}

impl LockTable {
    /// Every lock, sorted.
    fn dump(&self) -> Vec<Flat> {
        let mut out: Vec<Flat> = self
            .held
            .iter()
            .map(|(&(owner, ino, start), held)| Flat {
                conn: owner.conn,
                client_id: self.conns[&owner.conn]
                    .clients
                    .name(owner.client)
                    .expect("interned")
                    .to_vec(),
                proc_id: owner.proc_id,
                ino,
                start,
                end: held.end,
                kind: held.kind.into(),
                fid: held.fid,
            })
            .collect();
        out.sort();
        out
    }

    /// Checks that the trees, the two indexes, the counts and the interned ids agree.
    fn check(&self) {
        let mut per_conn: BTreeMap<u64, usize> = BTreeMap::new();
        let mut per_client: BTreeMap<(u64, u32), usize> = BTreeMap::new();
        let mut in_trees: BTreeMap<Ino, Vec<TreeLock>> = BTreeMap::new();
        for (&(owner, ino, start), held) in &self.held {
            *per_conn.entry(owner.conn).or_default() += 1;
            *per_client.entry((owner.conn, owner.client)).or_default() += 1;
            in_trees.entry(ino).or_default().push(TreeLock {
                start,
                end: held.end,
                kind: held.kind,
                owner,
            });
            assert!(self.by_fid.contains(&FidKey {
                conn: owner.conn,
                fid: held.fid,
                ino,
                owner,
                start,
            }));
        }
        assert_eq!(self.by_fid.len(), self.held.len());
        assert_eq!(self.len, self.held.len());
        assert_eq!(
            self.inodes.keys().collect::<Vec<_>>(),
            in_trees.keys().collect::<Vec<_>>(),
            "an empty tree is dropped"
        );
        for (ino, mut locks) in in_trees {
            let tree = &self.inodes[&ino];
            tree.check();
            locks.sort_by_key(|l| (l.start, l.owner));
            assert_eq!(tree.locks(), locks);
        }
        for (conn, c) in &self.conns {
            assert_eq!(c.locks, per_conn.get(conn).copied().unwrap_or(0));
            let used = per_client.keys().filter(|(k, _)| k == conn).count();
            assert_eq!(c.clients.len(), used, "interned ids of conn {conn} in use");
            assert!(c.locks > 0, "conn {conn} kept without locks");
        }
    }

    /// Nodes a conflict search looks at.
    fn conflict_visits(
        &self,
        ino: Ino,
        owner: &LockOwner<'_>,
        kind: LockKind,
        r: (u64, u64),
    ) -> usize {
        let mut visited = 0;
        if let Some(tree) = self.inodes.get(&ino) {
            tree.first_conflict_counting(self.key_of(owner), kind, r.0, r.1, &mut visited);
        }
        visited
    }
}

const LIMITS: LockLimits = LockLimits {
    per_conn: 4096,
    per_tenant: usize::MAX,
    total: 32768,
    client_id_len: 256,
};

fn who(conn: u64, proc_id: u32) -> LockOwner<'static> {
    LockOwner {
        conn,
        client_id: b"host",
        proc_id,
    }
}

#[test]
fn readers_share_writers_exclude() {
    let (a, b) = (who(1, 10), who(2, 10));
    let mut t = LockTable::new(LIMITS);
    assert_eq!(t.lock(7, &a, 1, LockKind::Read, 0, 99), Ok(true));
    assert_eq!(t.lock(7, &b, 1, LockKind::Read, 50, 150), Ok(true));
    assert_eq!(t.lock(7, &b, 1, LockKind::Write, 90, 95), Ok(false));
    assert_eq!(t.lock(7, &b, 1, LockKind::Write, 100, 200), Ok(true));
    // Other inodes are independent.
    assert_eq!(t.lock(8, &b, 1, LockKind::Write, 0, u64::MAX), Ok(true));
    let held = t.conflict(7, &a, LockKind::Write, 0, u64::MAX).unwrap();
    assert_eq!(
        held,
        Some(HeldLock {
            kind: LockKind::Read,
            start: 50,
            end: 99,
            proc_id: 10,
            client_id: Arc::from(&b"host"[..]),
        }),
        "b's read lock, cut back by its write lock"
    );
    t.check();
}

#[test]
fn unlock_in_the_middle_splits() {
    let (a, b) = (who(1, 1), who(1, 2));
    let mut t = LockTable::new(LIMITS);
    assert_eq!(t.lock(1, &a, 1, LockKind::Write, 0, 99), Ok(true));
    t.unlock(1, &a, 40, 59).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t.lock(1, &b, 1, LockKind::Write, 40, 59), Ok(true));
    assert_eq!(t.lock(1, &b, 1, LockKind::Write, 39, 40), Ok(false));
    assert_eq!(t.lock(1, &b, 1, LockKind::Write, 60, 60), Ok(false));
    t.check();
}

#[test]
fn relocks_replace_split_and_merge() {
    let a = who(1, 1);
    let mut t = LockTable::new(LIMITS);
    let ranges = |t: &LockTable| -> Vec<(u64, u64, Kind, u32)> {
        t.dump()
            .iter()
            .map(|l| (l.start, l.end, l.kind, l.fid))
            .collect()
    };
    t.lock(1, &a, 1, LockKind::Write, 0, 99).unwrap();
    t.lock(1, &a, 1, LockKind::Read, 10, 19).unwrap();
    assert_eq!(
        ranges(&t),
        [
            (0, 9, Kind::Write, 1),
            (10, 19, Kind::Read, 1),
            (20, 99, Kind::Write, 1)
        ]
    );
    // Back to write: one lock again.
    t.lock(1, &a, 1, LockKind::Write, 10, 19).unwrap();
    assert_eq!(ranges(&t), [(0, 99, Kind::Write, 1)]);
    // Touching ranges merge, overlapping ones too, to end of file included.
    t.lock(1, &a, 1, LockKind::Write, 100, 100).unwrap();
    t.lock(1, &a, 1, LockKind::Write, 150, u64::MAX).unwrap();
    t.lock(1, &a, 1, LockKind::Write, 90, 160).unwrap();
    assert_eq!(ranges(&t), [(0, u64::MAX, Kind::Write, 1)]);
    // Through another fid: no merge (clunking one fid releases what it took).
    t.lock(1, &a, 2, LockKind::Write, 10, 19).unwrap();
    assert_eq!(t.len(), 3);
    t.release_fid(1, 2);
    assert_eq!(
        ranges(&t),
        [(0, 9, Kind::Write, 1), (20, u64::MAX, Kind::Write, 1)]
    );
    t.check();
    let b = who(2, 1);
    assert!(t.conflict(1, &b, LockKind::Read, 10, 19).unwrap().is_none());
    assert!(t.conflict(1, &b, LockKind::Read, 0, 10).unwrap().is_some());
    t.release_conn(1);
    assert!(t.is_empty());
    t.check();
}

#[test]
fn a_tenant_holds_at_most_its_share_of_the_table() {
    let mut t = LockTable::new(LockLimits {
        per_conn: 3,
        per_tenant: 4,
        total: 10,
        client_id_len: 8,
    });
    // Connections 1 and 2 are one tenant (7), connection 3 another (8).
    for (conn, tenant) in [(1, 7), (2, 7), (3, 8)] {
        t.bind_tenant(conn, tenant);
    }
    let (a, b, c) = (who(1, 1), who(2, 1), who(3, 1));
    // Locks apart from each other (neighbours of one kind would merge).
    for i in 0..3 {
        assert_eq!(t.lock(1, &a, 1, LockKind::Read, 10 * i, 10 * i), Ok(true));
    }
    assert_eq!(t.lock(1, &b, 1, LockKind::Read, 100, 100), Ok(true));
    assert_eq!(
        t.lock(1, &b, 1, LockKind::Read, 200, 200),
        Err(LockError::TenantLimit),
        "connection 2 is below its own limit, its tenant is not"
    );
    assert_eq!(t.tenant_len(7), 4);
    for i in 0..3 {
        assert_eq!(t.lock(2, &c, 1, LockKind::Read, 10 * i, 10 * i), Ok(true));
    }
    t.release_conn(1);
    assert_eq!((t.tenant_len(7), t.tenant_len(8)), (1, 3));
    assert_eq!(t.lock(1, &b, 1, LockKind::Read, 200, 200), Ok(true));
    t.check();
}

#[test]
fn limits_refuse_growth_not_shrinkage() {
    let mut t = LockTable::new(LockLimits {
        per_conn: 3,
        per_tenant: usize::MAX,
        total: 4,
        client_id_len: 8,
    });
    let (a, b) = (who(1, 1), who(2, 1));
    for i in 0..3 {
        assert_eq!(t.lock(1, &a, 1, LockKind::Read, 10 * i, 10 * i), Ok(true));
    }
    assert_eq!(
        t.lock(1, &a, 1, LockKind::Read, 100, 100),
        Err(LockError::ConnLimit)
    );
    // Splitting needs room too; replacing, merging and unlocking whole locks do not.
    assert_eq!(t.unlock(1, &a, 0, 0), Ok(()));
    t.lock(1, &a, 1, LockKind::Read, 0, 5).unwrap();
    assert_eq!(t.unlock(1, &a, 2, 2), Err(LockError::ConnLimit));
    assert_eq!(t.lock(1, &a, 1, LockKind::Read, 6, 9), Ok(true), "merges");
    assert_eq!(
        t.lock(1, &a, 1, LockKind::Write, 0, 30),
        Ok(true),
        "replaces"
    );
    assert_eq!(t.conn_len(1), 1);
    t.lock(1, &a, 1, LockKind::Read, 40, 40).unwrap();
    t.lock(1, &a, 1, LockKind::Read, 50, 50).unwrap();
    t.lock(1, &b, 1, LockKind::Read, 60, 60).unwrap();
    assert_eq!(
        t.lock(1, &b, 1, LockKind::Read, 70, 70),
        Err(LockError::TotalLimit)
    );
    // Client ids: up to the limit.
    let long = LockOwner {
        conn: 2,
        client_id: b"123456789",
        proc_id: 1,
    };
    assert_eq!(
        t.lock(1, &long, 1, LockKind::Read, 90, 90),
        Err(LockError::ClientIdTooLong)
    );
    assert_eq!(
        t.conflict(1, &long, LockKind::Read, 90, 90),
        Err(LockError::ClientIdTooLong)
    );
    assert_eq!(LockError::ConnLimit.errno(), Errno::ENOLCK);
    assert_eq!(LockError::ClientIdTooLong.errno(), Errno::EINVAL);
    t.check();
}

#[test]
fn a_connection_pays_for_its_locks_and_each_client_id_once() {
    let mut t = LockTable::new(LIMITS);
    let id = [b'n'; 200];
    let owner = |proc_id| LockOwner {
        conn: 1,
        client_id: &id,
        proc_id,
    };
    assert_eq!(t.conn_bytes(1), 0);
    for i in 0..1000 {
        t.lock(
            1,
            &owner(i % 7),
            1,
            LockKind::Read,
            2 * u64::from(i),
            2 * u64::from(i),
        )
        .unwrap();
    }
    assert_eq!(
        t.conn_bytes(1),
        1000 * LOCK_RECORD_BYTES + 200 + NAME_OVERHEAD
    );
    t.lock(1, &who(1, 1), 1, LockKind::Read, 5000, 5000)
        .unwrap();
    assert_eq!(
        t.conn_bytes(1),
        1001 * LOCK_RECORD_BYTES + 204 + 2 * NAME_OVERHEAD
    );
    assert_eq!(t.conn_bytes(2), 0);
    t.release_fid(1, 1);
    assert_eq!(t.conn_bytes(1), 0);
    assert!(
        t.conns.is_empty(),
        "nothing kept for a connection without locks"
    );
}

#[test]
fn forty_thousand_locks_cost_a_lookup_not_a_scan() {
    // One owner's 40,000 one-byte locks, alternately read and write; another owner's
    // read lock beyond them. Every request below looks at O(log n) tree nodes and
    // touches only the locks it changes.
    let n = 40_000u64;
    let (a, b) = (who(1, 1), who(2, 1));
    let mut t = LockTable::new(LockLimits {
        per_conn: 50_000,
        per_tenant: usize::MAX,
        total: 100_000,
        client_id_len: 256,
    });
    for i in 0..n {
        let kind = if i % 2 == 0 {
            LockKind::Read
        } else {
            LockKind::Write
        };
        assert_eq!(t.lock(1, &a, 1, kind, 2 * i, 2 * i), Ok(true));
    }
    t.lock(1, &b, 1, LockKind::Read, 3 * n, 3 * n).unwrap();
    let height = usize::from(t.inodes[&1].height());
    let bound = 4 * height;
    let whole = (0, u64::MAX);
    for (owner, kind, range) in [
        (&a, LockKind::Write, whole),
        (&a, LockKind::Read, whole),
        (&b, LockKind::Read, whole),
        (&b, LockKind::Write, (n, n + 1)),
        (&b, LockKind::Read, (2 * n + 1, 2 * n + 1)),
    ] {
        let visited = t.conflict_visits(1, owner, kind, range);
        assert!(
            visited <= bound,
            "{visited} nodes for {kind:?} {range:?} (height {height})"
        );
    }
    // a's whole-range test finds b's lock past its own 40,000.
    let found = t.conflict(1, &a, LockKind::Write, 0, u64::MAX).unwrap();
    assert_eq!(found.map(|l| l.start), Some(3 * n));
    // A one-byte change among them plans with its neighbours only.
    let plan = t.plan(t.key_of(&a), 1, 2 * n - 4, 2 * n - 4, None);
    assert_eq!((plan.remove.len(), plan.add.len()), (1, 0));
    let new = Held {
        end: 2 * n + 1,
        kind: LockKind::Write,
        fid: 1,
    };
    let plan = t.plan(t.key_of(&a), 1, 2 * n - 1, 2 * n + 1, Some(new));
    assert_eq!(
        (plan.remove.len(), plan.add.len()),
        (1, 1),
        "merges with its neighbour"
    );
}

// --- against a reference model --------------------------------------------------------

/// Offsets the model tracks one by one; cell `CELLS - 1` stands for every byte from
/// there to end of file (requests end before it, or at end of file).
const CELLS: usize = 24;
const EOF_CELL: usize = CELLS - 1;

/// What one owner holds on one inode, byte by byte.
type Cells = [Option<(LockKind, u32)>; CELLS];

/// An owner as the model names it.
type Name = (u64, &'static [u8], u32);

/// The reference: for every owner and inode, who holds each byte, how, through which fid.
/// Locks are the maximal runs of equal cells, which is what merging and splitting in the
/// table must amount to.
#[derive(Clone, Debug, Default)]
struct Model {
    cells: BTreeMap<(Name, Ino), Cells>,
}

fn cell_range(start: u64, end: u64) -> core::ops::RangeInclusive<usize> {
    let last = if end == u64::MAX {
        EOF_CELL
    } else {
        end as usize
    };
    start as usize..=last
}

fn cell_end(cell: usize) -> u64 {
    if cell == EOF_CELL {
        u64::MAX
    } else {
        cell as u64
    }
}

fn runs(cells: &Cells) -> Vec<(usize, usize, LockKind, u32)> {
    let mut out: Vec<(usize, usize, LockKind, u32)> = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        let Some((kind, fid)) = *c else { continue };
        match out.last_mut() {
            Some(last) if last.1 + 1 == i && (last.2, last.3) == (kind, fid) => last.1 = i,
            _ => out.push((i, i, kind, fid)),
        }
    }
    out
}

impl Model {
    fn dump(&self) -> Vec<Flat> {
        let mut out = Vec::new();
        for (&((conn, client_id, proc_id), ino), cells) in &self.cells {
            for (first, last, kind, fid) in runs(cells) {
                out.push(Flat {
                    conn,
                    client_id: client_id.to_vec(),
                    proc_id,
                    ino,
                    start: first as u64,
                    end: cell_end(last),
                    kind: kind.into(),
                    fid,
                });
            }
        }
        out.sort();
        out
    }

    fn count(&self, conn: Option<u64>) -> usize {
        self.cells
            .iter()
            .filter(|(((c, _, _), _), _)| conn.is_none_or(|conn| *c == conn))
            .map(|(_, cells)| runs(cells).len())
            .sum()
    }

    fn conflicts(&self, name: Name, ino: Ino, kind: LockKind, start: u64, end: u64) -> Vec<Flat> {
        self.dump()
            .into_iter()
            .filter(|l| {
                (l.conn, &l.client_id[..], l.proc_id) != name
                    && l.ino == ino
                    && l.start <= end
                    && start <= l.end
                    && (kind == LockKind::Write || l.kind == Kind::Write)
            })
            .collect()
    }

    /// Sets `name`'s cells over the range, unless that grows past the limits.
    fn set(
        &mut self,
        limits: &LockLimits,
        name: Name,
        ino: Ino,
        (start, end): (u64, u64),
        value: Option<(LockKind, u32)>,
    ) -> Result<(), LockError> {
        let before = self.clone();
        let cells = self.cells.entry((name, ino)).or_insert([None; CELLS]);
        for c in cell_range(start, end) {
            cells[c] = value;
        }
        if cells.iter().all(Option::is_none) {
            self.cells.remove(&(name, ino));
        }
        let (conn_before, conn_after) = (before.count(Some(name.0)), self.count(Some(name.0)));
        let grows = conn_after > conn_before;
        let refused = if grows && conn_after > limits.per_conn {
            Some(LockError::ConnLimit)
        } else if grows && self.count(None) > limits.total {
            Some(LockError::TotalLimit)
        } else {
            None
        };
        match refused {
            Some(e) => {
                *self = before;
                Err(e)
            }
            None => Ok(()),
        }
    }

    fn release(&mut self, keep: impl Fn(u64, Option<(LockKind, u32)>) -> bool) {
        for (((conn, _, _), _), cells) in self.cells.iter_mut() {
            for c in cells.iter_mut() {
                if !keep(*conn, *c) {
                    *c = None;
                }
            }
        }
        self.cells
            .retain(|_, cells| cells.iter().any(Option::is_some));
    }
}

const CLIENTS: [&[u8]; 3] = [b"a", b"bb", b"too-long"];
const TEST_LIMITS: LockLimits = LockLimits {
    per_conn: 7,
    per_tenant: usize::MAX,
    total: 12,
    client_id_len: 4,
};

#[derive(Clone, Debug)]
enum Op {
    Lock(Name, Ino, u32, LockKind, (u64, u64)),
    Unlock(Name, Ino, (u64, u64)),
    Test(Name, Ino, LockKind, (u64, u64)),
    ReleaseFid(u64, u32),
    ReleaseConn(u64),
}

fn name() -> impl Strategy<Value = Name> {
    (
        1..4u64,
        prop_oneof![6 => Just(0usize), 3 => Just(1), 1 => Just(2)],
        1..3u32,
    )
        .prop_map(|(conn, client, proc_id)| (conn, CLIENTS[client], proc_id))
}

fn kind() -> impl Strategy<Value = LockKind> {
    prop_oneof![Just(LockKind::Read), Just(LockKind::Write)]
}

/// A range within the tracked cells, or from a tracked cell to end of file.
fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..EOF_CELL as u64).prop_flat_map(|start| {
        let end = prop_oneof![
            4 => start..(start + 6).min(EOF_CELL as u64),
            1 => Just(u64::MAX),
        ];
        (Just(start), end)
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (name(), 1..3u64, 1..3u32, kind(), range())
            .prop_map(|(n, ino, fid, k, r)| Op::Lock(n, ino, fid, k, r)),
        3 => (name(), 1..3u64, range()).prop_map(|(n, ino, r)| Op::Unlock(n, ino, r)),
        5 => (name(), 1..3u64, kind(), range()).prop_map(|(n, ino, k, r)| Op::Test(n, ino, k, r)),
        1 => (1..4u64, 1..3u32).prop_map(|(c, f)| Op::ReleaseFid(c, f)),
        1 => (1..4u64).prop_map(Op::ReleaseConn),
    ]
}

fn owner_of(name: Name) -> LockOwner<'static> {
    LockOwner {
        conn: name.0,
        client_id: name.1,
        proc_id: name.2,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random lock, unlock, test and release sequences give the model's answers, leave
    /// the model's locks (merged and split as it implies), and keep the table's
    /// structures consistent.
    #[test]
    fn agrees_with_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut table = LockTable::new(TEST_LIMITS);
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Lock(name, ino, fid, kind, (start, end)) => {
                    let got = table.lock(ino, &owner_of(name), fid, kind, start, end);
                    let want = if name.1.len() > TEST_LIMITS.client_id_len {
                        Err(LockError::ClientIdTooLong)
                    } else if !model.conflicts(name, ino, kind, start, end).is_empty() {
                        Ok(false)
                    } else {
                        model
                            .set(&TEST_LIMITS, name, ino, (start, end), Some((kind, fid)))
                            .map(|()| true)
                    };
                    prop_assert_eq!(got, want, "{:?}", op);
                }
                Op::Unlock(name, ino, (start, end)) => {
                    let got = table.unlock(ino, &owner_of(name), start, end);
                    let want = if name.1.len() > TEST_LIMITS.client_id_len {
                        Err(LockError::ClientIdTooLong)
                    } else {
                        model.set(&TEST_LIMITS, name, ino, (start, end), None)
                    };
                    prop_assert_eq!(got, want, "{:?}", op);
                }
                Op::Test(name, ino, kind, (start, end)) => {
                    let got = table.conflict(ino, &owner_of(name), kind, start, end);
                    if name.1.len() > TEST_LIMITS.client_id_len {
                        prop_assert_eq!(got, Err(LockError::ClientIdTooLong));
                        continue;
                    }
                    let got = got.unwrap();
                    let conflicts = model.conflicts(name, ino, kind, start, end);
                    let lowest = conflicts.iter().map(|l| l.start).min();
                    prop_assert_eq!(got.as_ref().map(|h| h.start), lowest, "{:?}", op);
                    if let Some(h) = got {
                        // One of the model's conflicting locks, reported as it is held.
                        prop_assert!(conflicts.iter().any(|l| (
                            l.start, l.end, l.kind, l.proc_id, &l.client_id[..]
                        ) == (h.start, h.end, h.kind.into(), h.proc_id, &h.client_id[..])));
                    }
                }
                Op::ReleaseFid(conn, fid) => {
                    table.release_fid(conn, fid);
                    model.release(|c, cell| c != conn || cell.is_none_or(|(_, f)| f != fid));
                }
                Op::ReleaseConn(conn) => {
                    table.release_conn(conn);
                    model.release(|c, _| c != conn);
                }
            }
            table.check();
            prop_assert_eq!(table.dump(), model.dump());
            for conn in 1..4 {
                prop_assert_eq!(table.conn_len(conn), model.count(Some(conn)));
                let names: alloc::collections::BTreeSet<&[u8]> = model
                    .cells
                    .keys()
                    .filter(|((c, _, _), _)| *c == conn)
                    .map(|((_, id, _), _)| *id)
                    .collect();
                let want = model.count(Some(conn)) * LOCK_RECORD_BYTES
                    + names.iter().map(|n| n.len() + NAME_OVERHEAD).sum::<usize>();
                prop_assert_eq!(table.conn_bytes(conn), want);
            }
        }
    }
}

#[test]
fn model_runs_are_maximal() {
    let mut cells: Cells = [None; CELLS];
    for c in cell_range(3, 5) {
        cells[c] = Some((LockKind::Read, 1));
    }
    for c in cell_range(6, u64::MAX) {
        cells[c] = Some((LockKind::Read, 2));
    }
    assert_eq!(
        runs(&cells),
        vec![(3, 5, LockKind::Read, 1), (6, EOF_CELL, LockKind::Read, 2)]
    );
}

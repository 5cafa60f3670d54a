//! The locks on one inode, as an interval tree: an AVL tree ordered by `(start, owner)`
//! whose every node also knows how far right the locks of its subtree reach — overall,
//! and counting write locks only — and how far those of anyone *but* the furthest
//! reaching owner do.
//!
//! That last figure is what makes the one question every lock request asks cheap: "is
//! there a lock of someone other than me over `start..=end` (a write lock, if I only
//! want to read)?". The requester's own locks never conflict, and there may be any
//! number of them in the range; a plain interval tree would have to step over each. With
//! the furthest reach of the others at hand, the search descends only into subtrees that
//! hold a conflicting lock and answers in O(log n), whatever the locks around it.

use alloc::boxed::Box;
use core::cmp::Ordering;

use super::{LockKind, OwnerKey};

/// One lock as the tree holds it: the inclusive byte range `start..=end`, kind, holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TreeLock {
    /// First byte.
    pub start: u64,
    /// Last byte (`u64::MAX`: to end of file).
    pub end: u64,
    /// Shared or exclusive.
    pub kind: LockKind,
    /// Holder.
    pub owner: OwnerKey,
}

impl TreeLock {
    fn key(&self) -> (u64, OwnerKey) {
        (self.start, self.owner)
    }

    /// Whether this lock stands in the way of `owner` taking `kind` over `start..=end`.
    pub fn conflicts(&self, owner: Option<OwnerKey>, kind: LockKind, start: u64, end: u64) -> bool {
        Some(self.owner) != owner
            && self.start <= end
            && start <= self.end
            && (kind == LockKind::Write || self.kind == LockKind::Write)
    }
}

/// How far right a set of locks reaches: the furthest end and its owner, and the
/// furthest end among the locks of every other owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Reach {
    furthest: Option<(u64, OwnerKey)>,
    others: Option<u64>,
}

impl Reach {
    fn of(lock: &TreeLock) -> Reach {
        Reach {
            furthest: Some((lock.end, lock.owner)),
            others: None,
        }
    }

    /// The reach of two sets together. Ties keep `self`'s owner (either would do).
    fn join(self, other: Reach) -> Reach {
        let furthest = match (self.furthest, other.furthest) {
            (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
            (a, b) => a.or(b),
        };
        let Some((_, top)) = furthest else {
            return Reach::default();
        };
        // Each side's furthest lock not held by `top`'s owner.
        let beyond = |r: Reach| match r.furthest {
            Some((end, owner)) if owner != top => Some(end),
            _ => r.others,
        };
        Reach {
            furthest,
            others: beyond(self).max(beyond(other)),
        }
    }

    /// The furthest end among the locks not held by `owner`.
    fn excluding(&self, owner: Option<OwnerKey>) -> Option<u64> {
        match self.furthest {
            Some((_, top)) if Some(top) == owner => self.others,
            f => f.map(|(end, _)| end),
        }
    }
}

type Link = Option<Box<Node>>;

/// Bytes one lock's node takes.
pub(super) const NODE_BYTES: usize = core::mem::size_of::<Node>();

#[derive(Debug)]
struct Node {
    lock: TreeLock,
    left: Link,
    right: Link,
    height: u8,
    /// Reach of every lock in this subtree.
    all: Reach,
    /// Reach of the write locks in this subtree.
    writes: Reach,
}

impl Node {
    fn leaf(lock: TreeLock) -> Box<Node> {
        let mut node = Box::new(Node {
            lock,
            left: None,
            right: None,
            height: 1,
            all: Reach::default(),
            writes: Reach::default(),
        });
        node.update();
        node
    }

    /// Recomputes height and reaches from the children (after any change below).
    fn update(&mut self) {
        let own = Reach::of(&self.lock);
        let own_write = match self.lock.kind {
            LockKind::Write => own,
            LockKind::Read => Reach::default(),
        };
        let (mut all, mut writes) = (own, own_write);
        for child in [&self.left, &self.right].into_iter().flatten() {
            all = all.join(child.all);
            writes = writes.join(child.writes);
        }
        self.all = all;
        self.writes = writes;
        self.height = 1 + height(&self.left).max(height(&self.right));
    }

    /// The reach that matters to a request for `kind`: every lock stands in the way of a
    /// write lock, only write locks in the way of a read lock.
    fn reach(&self, kind: LockKind) -> &Reach {
        match kind {
            LockKind::Write => &self.all,
            LockKind::Read => &self.writes,
        }
    }
}

fn height(link: &Link) -> u8 {
    link.as_ref().map_or(0, |n| n.height)
}

/// The locks on one inode. See the module documentation.
#[derive(Debug, Default)]
pub(super) struct LockTree {
    root: Link,
    len: usize,
}

impl LockTree {
    /// Number of locks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tree holds no lock.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `lock`. Its `(start, owner)` must not be in the tree yet (an owner's locks
    /// never overlap); if it is, the old entry is replaced.
    pub fn insert(&mut self, lock: TreeLock) {
        let mut added = true;
        self.root = Some(insert(self.root.take(), lock, &mut added));
        if added {
            self.len += 1;
        } else {
            debug_assert!(false, "lock tree: {lock:?} inserted twice");
        }
    }

    /// Removes and returns the lock of `owner` starting at `start`.
    pub fn remove(&mut self, start: u64, owner: OwnerKey) -> Option<TreeLock> {
        let mut removed = None;
        self.root = remove(self.root.take(), (start, owner), &mut removed);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// The conflicting lock with the lowest start (see [`TreeLock::conflicts`]): what
    /// stands in the way of `owner` (`None`: someone holding nothing here) taking `kind`
    /// over `start..=end`.
    pub fn first_conflict(
        &self,
        owner: Option<OwnerKey>,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Option<TreeLock> {
        let mut visited = 0;
        self.first_conflict_counting(owner, kind, start, end, &mut visited)
    }

    /// [`LockTree::first_conflict`], counting the nodes it looks at in `visited`.
    pub fn first_conflict_counting(
        &self,
        owner: Option<OwnerKey>,
        kind: LockKind,
        start: u64,
        end: u64,
        visited: &mut usize,
    ) -> Option<TreeLock> {
        let query = Query {
            owner,
            kind,
            start,
            end,
        };
        query.search(&self.root, visited)
    }

    /// Height of the tree (0 when empty).
    #[cfg(test)]
    pub fn height(&self) -> u8 {
        height(&self.root)
    }

    /// Every lock, in `(start, owner)` order.
    #[cfg(test)]
    pub fn locks(&self) -> alloc::vec::Vec<TreeLock> {
        fn walk(link: &Link, out: &mut alloc::vec::Vec<TreeLock>) {
            if let Some(n) = link {
                walk(&n.left, out);
                out.push(n.lock);
                walk(&n.right, out);
            }
        }
        let mut out = alloc::vec::Vec::with_capacity(self.len);
        walk(&self.root, &mut out);
        out
    }

    /// Checks order, balance, heights and reaches of every node (tests).
    #[cfg(test)]
    pub fn check(&self) {
        fn check(link: &Link) -> (usize, u8, Reach, Reach) {
            let Some(n) = link else {
                return (0, 0, Reach::default(), Reach::default());
            };
            if let Some(l) = &n.left {
                assert!(l.lock.key() < n.lock.key(), "order");
            }
            if let Some(r) = &n.right {
                assert!(r.lock.key() > n.lock.key(), "order");
            }
            let (ln, lh, la, lw) = check(&n.left);
            let (rn, rh, ra, rw) = check(&n.right);
            assert!(lh.abs_diff(rh) <= 1, "balance");
            assert_eq!(n.height, 1 + lh.max(rh), "height");
            let own = Reach::of(&n.lock);
            let own_w = if n.lock.kind == LockKind::Write {
                own
            } else {
                Reach::default()
            };
            assert_eq!(n.all, own.join(la).join(ra), "reach of all locks");
            assert_eq!(n.writes, own_w.join(lw).join(rw), "reach of write locks");
            (1 + ln + rn, n.height, n.all, n.writes)
        }
        assert_eq!(check(&self.root).0, self.len, "length");
    }
}

/// One conflict search.
struct Query {
    owner: Option<OwnerKey>,
    kind: LockKind,
    start: u64,
    end: u64,
}

impl Query {
    /// The leftmost conflicting lock under `link`. A subtree is entered only if some
    /// lock in it of another owner reaches `start`; all of the left subtree starts no
    /// later than the node, so once the node starts within the range such a left
    /// subtree surely holds the answer, and once it starts past the range nothing to
    /// its right can: one path down, O(log n).
    fn search(&self, link: &Link, visited: &mut usize) -> Option<TreeLock> {
        let node = link.as_deref()?;
        *visited += 1;
        if node
            .reach(self.kind)
            .excluding(self.owner)
            .is_none_or(|end| end < self.start)
        {
            return None;
        }
        if let Some(found) = self.search(&node.left, visited) {
            return Some(found);
        }
        if node.lock.start > self.end {
            return None;
        }
        if node
            .lock
            .conflicts(self.owner, self.kind, self.start, self.end)
        {
            return Some(node.lock);
        }
        self.search(&node.right, visited)
    }
}

fn insert(link: Link, lock: TreeLock, added: &mut bool) -> Box<Node> {
    let Some(mut node) = link else {
        return Node::leaf(lock);
    };
    match lock.key().cmp(&node.lock.key()) {
        Ordering::Less => node.left = Some(insert(node.left.take(), lock, added)),
        Ordering::Greater => node.right = Some(insert(node.right.take(), lock, added)),
        Ordering::Equal => {
            node.lock = lock;
            *added = false;
        }
    }
    rebalance(node)
}

fn remove(link: Link, key: (u64, OwnerKey), removed: &mut Option<TreeLock>) -> Link {
    let mut node = link?;
    match key.cmp(&node.lock.key()) {
        Ordering::Less => node.left = remove(node.left.take(), key, removed),
        Ordering::Greater => node.right = remove(node.right.take(), key, removed),
        Ordering::Equal => {
            *removed = Some(node.lock);
            match (node.left.take(), node.right.take()) {
                (None, only) | (only, None) => return only,
                (left, Some(right)) => {
                    // The successor takes the node's place.
                    let (rest, successor) = remove_min(right);
                    node.lock = successor;
                    node.left = left;
                    node.right = rest;
                }
            }
        }
    }
    Some(rebalance(node))
}

/// Removes the leftmost lock under `node`: the rest of the subtree, and that lock.
fn remove_min(mut node: Box<Node>) -> (Link, TreeLock) {
    match node.left.take() {
        None => (node.right.take(), node.lock),
        Some(left) => {
            let (rest, min) = remove_min(left);
            node.left = rest;
            (Some(rebalance(node)), min)
        }
    }
}

/// Restores the AVL balance at `node` (its children are balanced, their heights differ
/// by at most two) and recomputes what it knows about its subtree.
fn rebalance(mut node: Box<Node>) -> Box<Node> {
    node.update();
    let (lh, rh) = (height(&node.left), height(&node.right));
    if lh > rh + 1 {
        if let Some(left) = node.left.take() {
            node.left = Some(if height(&left.left) < height(&left.right) {
                rotate_left(left)
            } else {
                left
            });
        }
        rotate_right(node)
    } else if rh > lh + 1 {
        if let Some(right) = node.right.take() {
            node.right = Some(if height(&right.right) < height(&right.left) {
                rotate_right(right)
            } else {
                right
            });
        }
        rotate_left(node)
    } else {
        node
    }
}

fn rotate_right(mut node: Box<Node>) -> Box<Node> {
    let Some(mut pivot) = node.left.take() else {
        return node;
    };
    node.left = pivot.right.take();
    node.update();
    pivot.right = Some(node);
    pivot.update();
    pivot
}

fn rotate_left(mut node: Box<Node>) -> Box<Node> {
    let Some(mut pivot) = node.right.take() else {
        return node;
    };
    node.right = pivot.left.take();
    node.update();
    pivot.left = Some(node);
    pivot.update();
    pivot
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    fn owner(n: u32) -> OwnerKey {
        OwnerKey {
            conn: u64::from(n % 3),
            client: 0,
            proc_id: n,
        }
    }

    fn lock(start: u64, end: u64, kind: LockKind, who: u32) -> TreeLock {
        TreeLock {
            start,
            end,
            kind,
            owner: owner(who),
        }
    }

    /// The reference: every conflicting lock, by a scan; the lowest start wins.
    fn naive_first(
        locks: &[TreeLock],
        who: Option<OwnerKey>,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Option<u64> {
        locks
            .iter()
            .filter(|l| l.conflicts(who, kind, start, end))
            .map(|l| l.start)
            .min()
    }

    #[test]
    fn finds_the_leftmost_conflict_and_skips_the_owners_own_locks() {
        let mut t = LockTree::default();
        t.insert(lock(0, 9, LockKind::Read, 1));
        t.insert(lock(5, 20, LockKind::Read, 2));
        t.insert(lock(30, 39, LockKind::Write, 3));
        t.check();
        let q = |t: &LockTree, who, kind, s, e| t.first_conflict(who, kind, s, e).map(|l| l.start);
        // Readers share; writers see everyone.
        assert_eq!(q(&t, Some(owner(1)), LockKind::Read, 0, 29), None);
        assert_eq!(q(&t, Some(owner(1)), LockKind::Write, 0, 29), Some(5));
        assert_eq!(q(&t, Some(owner(2)), LockKind::Write, 0, 29), Some(0));
        assert_eq!(q(&t, None, LockKind::Read, 0, u64::MAX), Some(30));
        assert_eq!(q(&t, Some(owner(3)), LockKind::Read, 0, u64::MAX), None);
        assert_eq!(t.remove(5, owner(2)).map(|l| l.end), Some(20));
        assert_eq!(t.remove(5, owner(2)), None);
        t.check();
        assert_eq!(q(&t, Some(owner(1)), LockKind::Write, 0, 29), None);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn own_locks_cost_nothing_to_step_over() {
        // 40,000 one-byte locks of one owner, one lock of another at the far end: asking
        // as the first owner over the whole range finds it in O(log n) node visits.
        let n = 40_000u64;
        let mut t = LockTree::default();
        for i in 0..n {
            let kind = if i % 2 == 0 {
                LockKind::Read
            } else {
                LockKind::Write
            };
            t.insert(lock(2 * i, 2 * i, kind, 1));
        }
        t.insert(lock(2 * n + 5, 2 * n + 5, LockKind::Read, 2));
        let bound = 4 * usize::from(t.height());
        assert!(t.height() <= 23, "AVL height {} for {n} locks", t.height());
        for (who, kind, want) in [
            (owner(1), LockKind::Write, Some(2 * n + 5)),
            (owner(1), LockKind::Read, None),
            (owner(2), LockKind::Write, Some(0)),
            (owner(2), LockKind::Read, Some(2)),
        ] {
            let mut visited = 0;
            let found = t.first_conflict_counting(Some(who), kind, 0, u64::MAX, &mut visited);
            assert_eq!(found.map(|l| l.start), want);
            assert!(visited <= bound, "{visited} nodes visited (bound {bound})");
        }
        // A two-byte request in the middle.
        let mut visited = 0;
        let found =
            t.first_conflict_counting(Some(owner(2)), LockKind::Read, 998, 999, &mut visited);
        assert_eq!(found.map(|l| l.start), Some(998));
        assert!(visited <= bound, "{visited} nodes visited (bound {bound})");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(TreeLock),
        /// Remove the i-th held lock (modulo).
        Remove(usize),
        Query(Option<u32>, LockKind, u64, u64),
    }

    fn kind() -> impl Strategy<Value = LockKind> {
        prop_oneof![Just(LockKind::Read), Just(LockKind::Write)]
    }

    fn end(start: u64) -> impl Strategy<Value = u64> {
        prop_oneof![4 => start..start + 12, 1 => Just(u64::MAX)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..64u64, kind(), 0..5u32)
                .prop_flat_map(|(s, k, o)| (Just(s), end(s), Just(k), Just(o)))
                .prop_map(|(s, e, k, o)| Op::Insert(lock(s, e, k, o))),
            1 => any::<usize>().prop_map(Op::Remove),
            3 => (proptest::option::of(0..5u32), kind(), 0..70u64)
                .prop_flat_map(|(o, k, s)| (Just(o), Just(k), Just(s), end(s)))
                .prop_map(|(o, k, s, e)| Op::Query(o, k, s, e)),
        ]
    }

    proptest! {
        /// Random inserts, removals and conflict searches against a scan of a plain list:
        /// same answers, and the tree's invariants hold after every step.
        #[test]
        fn agrees_with_a_scan(ops in proptest::collection::vec(op(), 1..200)) {
            let mut tree = LockTree::default();
            let mut list: Vec<TreeLock> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(l) => {
                        if list.iter().any(|x| x.key() == l.key()) {
                            continue;
                        }
                        tree.insert(l);
                        list.push(l);
                    }
                    Op::Remove(i) => {
                        if list.is_empty() {
                            prop_assert_eq!(tree.remove(3, owner(1)), None);
                            continue;
                        }
                        let l = list.swap_remove(i % list.len());
                        prop_assert_eq!(tree.remove(l.start, l.owner), Some(l));
                    }
                    Op::Query(who, kind, s, e) => {
                        let who = who.map(owner);
                        let got = tree.first_conflict(who, kind, s, e);
                        prop_assert_eq!(got.map(|l| l.start), naive_first(&list, who, kind, s, e));
                        if let Some(l) = got {
                            prop_assert!(list.contains(&l) && l.conflicts(who, kind, s, e));
                        }
                    }
                }
                tree.check();
                let mut sorted = list.clone();
                sorted.sort_by_key(TreeLock::key);
                prop_assert_eq!(tree.locks(), sorted);
            }
        }
    }
}

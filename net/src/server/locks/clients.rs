//! A connection's client ids, each stored once however many locks name it.
//!
//! Every `Tlock` carries the client's name for itself (Linux: its nodename, up to 64
//! bytes). A connection's locks refer to it by a small number instead, so thousands of
//! locks cost one copy of the name. A name is kept while some lock uses it.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::mem::size_of;

/// Bytes one interned name costs besides its own bytes: the `Arc` header, its slot, and
/// its entry in the lookup map (B-tree nodes are at least about half full, so twice
/// the entry bounds it).
pub(crate) const NAME_OVERHEAD: usize =
    2 * size_of::<usize>() + size_of::<Option<Slot>>() + 2 * size_of::<(Arc<[u8]>, u32)>();

#[derive(Debug)]
pub(super) struct Slot {
    name: Arc<[u8]>,
    /// Locks naming it.
    users: usize,
}

/// The interned client ids of one connection.
#[derive(Debug, Default)]
pub(super) struct ClientIds {
    by_name: BTreeMap<Arc<[u8]>, u32>,
    /// By number; `None` for numbers free for reuse (listed in `free`).
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Sum of the names' lengths.
    name_bytes: usize,
}

impl ClientIds {
    /// The number of `name`, if interned.
    pub fn find(&self, name: &[u8]) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    /// The number of `name`, interning it if needed (with no user yet: callers add one
    /// or call [`ClientIds::forget_if_unused`]).
    pub fn intern(&mut self, name: &[u8]) -> u32 {
        if let Some(id) = self.find(name) {
            return id;
        }
        let name: Arc<[u8]> = Arc::from(name);
        let slot = Some(Slot {
            name: name.clone(),
            users: 0,
        });
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                // At most one number per lock of the connection, which is bounded far
                // below u32::MAX by the lock limits.
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.name_bytes += name.len();
        self.by_name.insert(name, id);
        id
    }

    /// The name numbered `id`.
    pub fn name(&self, id: u32) -> Option<&Arc<[u8]>> {
        self.slot(id).map(|s| &s.name)
    }

    /// One more lock names `id`.
    pub fn add_user(&mut self, id: u32) {
        if let Some(Some(slot)) = self.slots.get_mut(id as usize) {
            slot.users += 1;
        }
    }

    /// One lock fewer names `id` (the name stays until [`ClientIds::forget_if_unused`]).
    pub fn drop_user(&mut self, id: u32) {
        if let Some(Some(slot)) = self.slots.get_mut(id as usize) {
            slot.users = slot.users.saturating_sub(1);
        }
    }

    /// Drops the name numbered `id` if no lock uses it.
    pub fn forget_if_unused(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        if slot.as_ref().is_some_and(|s| s.users == 0) {
            if let Some(s) = slot.take() {
                self.by_name.remove(&s.name);
                self.name_bytes -= s.name.len();
                self.free.push(id);
            }
        }
    }

    /// Whether no name is interned.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Number of interned names.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Memory the names take.
    pub fn bytes(&self) -> usize {
        self.name_bytes + self.by_name.len() * NAME_OVERHEAD
    }

    fn slot(&self, id: u32) -> Option<&Slot> {
        self.slots.get(id as usize)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stored_once_and_dropped_when_unused() {
        let mut ids = ClientIds::default();
        let a = ids.intern(b"alpha");
        assert_eq!(ids.intern(b"alpha"), a);
        ids.add_user(a);
        ids.add_user(a);
        let b = ids.intern(b"beta");
        ids.add_user(b);
        assert_ne!(a, b);
        assert_eq!(ids.bytes(), 9 + 2 * NAME_OVERHEAD);
        ids.drop_user(a);
        ids.forget_if_unused(a);
        assert_eq!(
            ids.name(a).map(|n| &n[..]),
            Some(&b"alpha"[..]),
            "still used once"
        );
        ids.drop_user(a);
        ids.forget_if_unused(a);
        assert_eq!(ids.find(b"alpha"), None);
        assert_eq!(ids.bytes(), 4 + NAME_OVERHEAD);
        // Its number is reused.
        assert_eq!(ids.intern(b"gamma"), a);
        ids.forget_if_unused(a);
        ids.drop_user(b);
        ids.forget_if_unused(b);
        assert!(ids.is_empty());
        assert_eq!(ids.bytes(), 0);
    }
}

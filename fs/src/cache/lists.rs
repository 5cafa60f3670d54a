//! Doubly linked lists threaded through a slab by index: O(1) push to the front, unlink
//! and a look at the back, with no allocation per entry (the links live in the entries).
//! The data cache's queues ([`super::data`]) are such lists over its one slab of entries.

/// No entry: the end of a list.
pub const NIL: u32 = u32::MAX;

/// An entry's place in a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Links {
    prev: u32,
    next: u32,
}

impl Default for Links {
    fn default() -> Links {
        Links {
            prev: NIL,
            next: NIL,
        }
    }
}

/// Something that can be on a [`List`]: gives access to its links.
pub trait Linked {
    /// Its links.
    fn links(&mut self) -> &mut Links;
}

/// A list of slab indices, most recently pushed at the front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> List {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl List {
    /// Entries on the list.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry pushed longest ago (the cold end).
    pub fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Puts entry `i` (on no list) at the front.
    pub fn push_front<T: Linked>(&mut self, slab: &mut [T], i: u32) {
        debug_assert_eq!(*slab[i as usize].links(), Links::default());
        let old = self.head;
        *slab[i as usize].links() = Links {
            prev: NIL,
            next: old,
        };
        if old == NIL {
            self.tail = i;
        } else {
            slab[old as usize].links().prev = i;
        }
        self.head = i;
        self.len += 1;
    }

    /// Takes entry `i`, which is on this list, off it.
    pub fn unlink<T: Linked>(&mut self, slab: &mut [T], i: u32) {
        let Links { prev, next } = *slab[i as usize].links();
        match prev {
            NIL => self.head = next,
            p => slab[p as usize].links().next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => slab[n as usize].links().prev = prev,
        }
        *slab[i as usize].links() = Links::default();
        self.len -= 1;
    }

    /// Moves entry `i`, which is on this list, to the front.
    pub fn move_to_front<T: Linked>(&mut self, slab: &mut [T], i: u32) {
        if self.head != i {
            self.unlink(slab, i);
            self.push_front(slab, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[derive(Default)]
    struct E(Links);
    impl Linked for E {
        fn links(&mut self) -> &mut Links {
            &mut self.0
        }
    }

    fn order(l: &List, slab: &mut [E]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = l.head;
        while i != NIL {
            out.push(i);
            i = slab[i as usize].links().next;
        }
        out
    }

    #[test]
    fn pushes_unlinks_and_moves() {
        let mut slab: Vec<E> = (0..5).map(|_| E::default()).collect();
        let mut l = List::default();
        for i in 0..5 {
            l.push_front(&mut slab, i);
        }
        assert_eq!(order(&l, &mut slab), [4, 3, 2, 1, 0]);
        assert_eq!(l.back(), Some(0));
        l.unlink(&mut slab, 0);
        l.unlink(&mut slab, 4);
        l.unlink(&mut slab, 2);
        assert_eq!(order(&l, &mut slab), [3, 1]);
        assert_eq!((l.len(), l.back()), (2, Some(1)));
        l.move_to_front(&mut slab, 1);
        assert_eq!(order(&l, &mut slab), [1, 3]);
        l.unlink(&mut slab, 1);
        l.unlink(&mut slab, 3);
        assert!(l.is_empty() && l.back().is_none());
    }
}

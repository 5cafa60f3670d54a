//! In-flight request slots: the bookkeeping both block drivers share.
//!
//! A device queue can hold a fixed number of requests. Each request takes a *slot* (for
//! NVMe the slot number is the command identifier; for virtio-blk it indexes the driver's
//! per-request memory) and keeps it until the device has completed the request:
//!
//! ```text
//!   Free --acquire--> Reserved --submitted--> Waiting --complete--> Done --take--> Free
//!                        |                       |
//!                        +--release--> Free      +--abandon--> Abandoned --complete--> Free
//! ```
//!
//! - **Back-pressure.** When every slot is taken, [`Slots::poll_acquire`] queues the caller
//!   (first come, first served) and wakes it when a slot is freed, so a burst of requests
//!   waits asynchronously instead of failing.
//! - **Abandoned requests.** A request whose future is dropped while the device still owns
//!   the slot is *abandoned*: the slot stays taken until the completion arrives, and the
//!   completion's result (which carries the request's DMA memory) is then dropped, so the
//!   memory is freed only once the device has handed it back. Dropping never waits.
//!   Forgetting a request future (`mem::forget`) leaks its slot and, once the device
//!   completes it, the result held there; nothing the device could still write is freed.
//! - **Stray completions** (a slot that is not waiting) are reported, not trusted.
//!
//! The table knows no hardware; the drivers keep it under their queue's
//! [`IrqLock`] next to the rest of the queue's state ([`SlotQueue::with_slots`]), so
//! requests on several CPUs and the completion path share it, and the lock's closure
//! cannot be held across an `await`. Wakers may belong to tasks of any CPU: they are
//! woken under the lock (the lock order is a queue's lock, then an executor's ready
//! queue), and a request registers its waker on every poll that leaves it waiting.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::future::{poll_fn, Future};
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use crate::sync::IrqLock;

/// A slot's life (see the module documentation).
#[derive(Debug)]
enum State<R> {
    Free,
    Reserved,
    Waiting(Option<Waker>),
    Done(R),
    Abandoned,
}

/// What [`Slots::complete`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completed {
    /// The waiting request was woken with its result.
    Delivered,
    /// The request had been abandoned; its slot is free again (release its resources).
    Freed,
    /// The slot was not waiting for a completion: the device reported a request we did not
    /// submit (or completed one twice). Nothing changed.
    Stray,
}

/// Counters, per cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Slots handed out.
    pub acquired: u64,
    /// Acquisitions that had to wait for a free slot (queue full).
    pub waited: u64,
    /// Requests abandoned while in flight.
    pub abandoned: u64,
    /// Completions for slots that were not waiting.
    pub stray: u64,
    /// Most requests the device owned at once (in a device's totals over several queues,
    /// see [`SlotStats::merge`]: the most one queue owned at once).
    pub peak_in_device: usize,
}

impl SlotStats {
    /// Adds another queue's counters to these (a device's totals over its queues); the
    /// peak is the higher one (queues fill independently, so their peaks do not add up).
    pub fn merge(&mut self, other: &SlotStats) {
        self.acquired += other.acquired;
        self.waited += other.waited;
        self.abandoned += other.abandoned;
        self.stray += other.stray;
        self.peak_in_device = self.peak_in_device.max(other.peak_in_device);
    }
}

/// A fixed set of request slots with a FIFO of callers waiting for one.
#[derive(Debug)]
pub struct Slots<R> {
    states: Vec<State<R>>,
    /// Free slots, most recently freed last (reused first: its memory is cache-warm).
    free: Vec<u16>,
    /// Callers waiting for a slot, oldest first, by ticket.
    waiters: VecDeque<(u64, Waker)>,
    next_ticket: u64,
    /// Slots waiting or abandoned (the device owns them).
    in_device: usize,
    stats: SlotStats,
}

/// A place in the queue for a slot; see [`Slots::poll_acquire`].
#[derive(Debug, Default)]
pub struct Ticket(Option<u64>);

impl<R> Slots<R> {
    /// `count` free slots, numbered `0..count`.
    ///
    /// # Panics
    /// If `count` is 0 or above 65536.
    pub fn new(count: usize) -> Slots<R> {
        assert!(count > 0 && count <= 1 << 16, "bad slot count {count}");
        Slots {
            states: (0..count).map(|_| State::Free).collect(),
            free: (0..count as u32).rev().map(|s| s as u16).collect(),
            waiters: VecDeque::new(),
            next_ticket: 0,
            in_device: 0,
            stats: SlotStats::default(),
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.states.len()
    }

    /// Slots not free (reserved, waiting, done but not taken, or abandoned).
    pub fn busy(&self) -> usize {
        self.states.len() - self.free.len()
    }

    /// Slots whose request the device owns (waiting or abandoned).
    pub fn in_device(&self) -> usize {
        self.in_device
    }

    /// The counters.
    pub fn stats(&self) -> SlotStats {
        self.stats
    }

    /// Takes a free slot if one is free and nobody is queued for one.
    pub fn try_acquire(&mut self) -> Option<u16> {
        if !self.waiters.is_empty() {
            return None;
        }
        self.take_free()
    }

    fn take_free(&mut self) -> Option<u16> {
        let slot = self.free.pop()?;
        debug_assert!(matches!(self.states[usize::from(slot)], State::Free));
        self.states[usize::from(slot)] = State::Reserved;
        self.stats.acquired += 1;
        Some(slot)
    }

    /// Takes a slot, or queues `ticket` for one and returns `Pending` (the waker is woken
    /// when it is this ticket's turn). Callers must pass the same ticket on every poll and
    /// call [`Slots::cancel`] with it if they give up.
    pub fn poll_acquire(&mut self, ticket: &mut Ticket, cx: &mut Context<'_>) -> Poll<u16> {
        match ticket.0 {
            None => {
                if let Some(slot) = self.try_acquire() {
                    return Poll::Ready(slot);
                }
                let t = self.next_ticket;
                self.next_ticket += 1;
                self.stats.waited += 1;
                self.waiters.push_back((t, cx.waker().clone()));
                ticket.0 = Some(t);
                Poll::Pending
            }
            Some(t) => {
                let first = self.waiters.front().map(|w| w.0) == Some(t);
                if first {
                    if let Some(slot) = self.take_free() {
                        self.waiters.pop_front();
                        ticket.0 = None;
                        self.wake_first_if_free();
                        return Poll::Ready(slot);
                    }
                }
                if let Some(w) = self.waiters.iter_mut().find(|w| w.0 == t) {
                    w.1.clone_from(cx.waker());
                }
                Poll::Pending
            }
        }
    }

    /// Gives up a queued ticket (the acquiring future was dropped). If it was first in line
    /// and a slot is free, the next caller is woken instead.
    pub fn cancel(&mut self, ticket: &mut Ticket) {
        if let Some(t) = ticket.0.take() {
            self.waiters.retain(|w| w.0 != t);
            self.wake_first_if_free();
        }
    }

    fn wake_first_if_free(&self) {
        if !self.free.is_empty() {
            if let Some((_, w)) = self.waiters.front() {
                w.wake_by_ref();
            }
        }
    }

    fn free_slot(&mut self, slot: u16) {
        self.states[usize::from(slot)] = State::Free;
        self.free.push(slot);
        self.wake_first_if_free();
    }

    /// Returns a reserved slot whose request was never submitted.
    ///
    /// # Panics
    /// If the slot is not reserved.
    pub fn release(&mut self, slot: u16) {
        assert!(
            matches!(self.states[usize::from(slot)], State::Reserved),
            "releasing slot {slot} that is not reserved"
        );
        self.free_slot(slot);
    }

    /// The reserved slot's request is now owned by the device.
    ///
    /// # Panics
    /// If the slot is not reserved.
    pub fn submitted(&mut self, slot: u16) {
        let s = &mut self.states[usize::from(slot)];
        assert!(
            matches!(s, State::Reserved),
            "submitting slot {slot} that is not reserved"
        );
        *s = State::Waiting(None);
        self.in_device += 1;
        self.stats.peak_in_device = self.stats.peak_in_device.max(self.in_device);
    }

    /// The device completed the request in `slot` with `result`.
    pub fn complete(&mut self, slot: u16, result: R) -> Completed {
        let Some(s) = self.states.get_mut(usize::from(slot)) else {
            self.stats.stray += 1;
            return Completed::Stray;
        };
        match s {
            State::Waiting(waker) => {
                if let Some(w) = waker.take() {
                    w.wake();
                }
                *s = State::Done(result);
                self.in_device -= 1;
                Completed::Delivered
            }
            State::Abandoned => {
                self.in_device -= 1;
                self.free_slot(slot);
                Completed::Freed
            }
            State::Free | State::Reserved | State::Done(_) => {
                self.stats.stray += 1;
                Completed::Stray
            }
        }
    }

    /// The request's result once the device has completed it; the slot is then free.
    /// Otherwise registers the waker and returns `Pending`.
    ///
    /// # Panics
    /// If the slot holds no submitted request.
    pub fn poll_result(&mut self, slot: u16, cx: &mut Context<'_>) -> Poll<R> {
        match self.take_result(slot) {
            Some(r) => Poll::Ready(r),
            None => {
                if let State::Waiting(w) = &mut self.states[usize::from(slot)] {
                    match w {
                        Some(w) => w.clone_from(cx.waker()),
                        None => *w = Some(cx.waker().clone()),
                    }
                }
                Poll::Pending
            }
        }
    }

    /// The result if the request has completed (freeing the slot), without waiting.
    ///
    /// # Panics
    /// If the slot holds no submitted request.
    pub fn take_result(&mut self, slot: u16) -> Option<R> {
        let s = &mut self.states[usize::from(slot)];
        match s {
            State::Done(_) => {
                let State::Done(r) = core::mem::replace(s, State::Free) else {
                    unreachable!()
                };
                self.free.push(slot);
                self.wake_first_if_free();
                Some(r)
            }
            State::Waiting(_) => None,
            _ => panic!("slot {slot} holds no submitted request"),
        }
    }

    /// The request's future is gone. Returns true if the slot is free again (it had
    /// completed, or was never submitted); false if the device still owns it, in which
    /// case the slot frees itself on completion ([`Completed::Freed`]).
    pub fn abandon(&mut self, slot: u16) -> bool {
        let s = &mut self.states[usize::from(slot)];
        match s {
            State::Waiting(_) => {
                *s = State::Abandoned;
                self.stats.abandoned += 1;
                false
            }
            State::Done(_) | State::Reserved => {
                self.free_slot(slot);
                true
            }
            State::Abandoned => false,
            State::Free => true,
        }
    }

    /// Whether the device owns `slot` now (waiting or abandoned).
    pub fn is_in_device(&self, slot: u16) -> bool {
        matches!(
            self.states.get(usize::from(slot)),
            Some(State::Waiting(_) | State::Abandoned)
        )
    }

    /// Every slot the device owns, for timeout scans and for failing everything after a
    /// reset.
    pub fn in_device_slots(&self) -> impl Iterator<Item = u16> + '_ {
        self.states
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, State::Waiting(_) | State::Abandoned))
            .map(|(i, _)| i as u16)
    }
}

/// A device queue whose requests live in [`Slots`]: what [`Request`] needs from a
/// driver. A device may have several (NVMe: one per I/O queue pair), each under its own
/// lock; the queue's reaper (`drivers::reaper`) completes its slots.
pub trait SlotQueue {
    /// What a completed request yields (its status, and the DMA memory it lent the
    /// device, which the driver took back when it saw the completion).
    type Output;
    /// Everything under the queue's lock: the slot table and what the driver keeps
    /// with it (its ring, per-slot memory).
    type State;

    /// Runs `f` on the queue's state, under the queue's lock (short: interrupts are off
    /// and other CPUs wait meanwhile).
    fn with_state<T>(&self, f: impl FnOnce(&mut Self::State) -> T) -> T;

    /// The slot table in the queue's state.
    fn slots(state: &mut Self::State) -> &mut Slots<Self::Output>;

    /// Runs `f` on the queue's slot table, under the queue's lock.
    fn with_slots<T>(&self, f: impl FnOnce(&mut Slots<Self::Output>) -> T) -> T {
        self.with_state(|s| f(Self::slots(s)))
    }
}

/// A slot table alone under its lock (the NVMe admin queue's one-at-a-time turn).
impl<R> SlotQueue for IrqLock<Slots<R>> {
    type Output = R;
    type State = Slots<R>;

    fn with_state<T>(&self, f: impl FnOnce(&mut Slots<R>) -> T) -> T {
        self.lock(f)
    }

    fn slots(state: &mut Slots<R>) -> &mut Slots<R> {
        state
    }
}

/// One request's hold on a slot, from acquisition to completion.
///
/// Dropping it never waits and never frees memory the device may use:
/// - before [`Request::submitted`], the slot is simply released;
/// - after, the slot is abandoned: it stays taken until the device completes the request,
///   and the request's DMA memory, which the driver keeps with the slot (not in the
///   future), is freed then.
#[derive(Debug)]
pub struct Request<'q, Q: SlotQueue> {
    queue: &'q Q,
    slot: u16,
    phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Reserved,
    Submitted,
    Finished,
}

impl<'q, Q: SlotQueue> Request<'q, Q> {
    /// Waits (first come, first served) for a free slot of `queue`.
    pub async fn acquire(queue: &'q Q) -> Request<'q, Q> {
        let slot = acquire(queue).await;
        Request {
            queue,
            slot,
            phase: Phase::Reserved,
        }
    }

    /// The slot number.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Marks the request as handed to the device; call before the device can see it.
    pub fn submitted(&mut self) {
        let ok: Result<(), ()> = self.submit(|_| Ok(()));
        ok.expect("nothing to refuse");
    }

    /// Hands the request to the device: under the queue's lock, `hand_over` puts it
    /// where the device will find it (a ring entry) and, if it did, the slot becomes the
    /// device's in the same critical section, so whatever else takes the lock (the
    /// completion path, a reset failing everything in flight) sees both or neither.
    /// `hand_over` may refuse (the device is being reset): the request stays reserved.
    pub fn submit<E>(
        &mut self,
        hand_over: impl FnOnce(&mut Q::State) -> Result<(), E>,
    ) -> Result<(), E> {
        assert_eq!(self.phase, Phase::Reserved, "request submitted twice");
        let slot = self.slot;
        self.queue.with_state(|state| {
            hand_over(state)?;
            Q::slots(state).submitted(slot);
            Ok(())
        })?;
        self.phase = Phase::Submitted;
        Ok(())
    }

    /// Waits for the device to complete the request.
    pub async fn wait(&mut self) -> Q::Output {
        assert_eq!(
            self.phase,
            Phase::Submitted,
            "waiting for a request that was not submitted"
        );
        let (queue, slot) = (self.queue, self.slot);
        let out = poll_fn(|cx| queue.with_slots(|s| s.poll_result(slot, cx))).await;
        self.phase = Phase::Finished;
        out
    }
}

impl<Q: SlotQueue> Drop for Request<'_, Q> {
    fn drop(&mut self) {
        let slot = self.slot;
        match self.phase {
            Phase::Finished => {}
            Phase::Reserved => self.queue.with_slots(|s| s.release(slot)),
            Phase::Submitted => {
                self.queue.with_slots(|s| s.abandon(slot));
            }
        }
    }
}

/// Waits (first come, first served) for a slot of `queue`. The caller owns the slot and
/// must release it.
pub fn acquire<Q: SlotQueue>(queue: &Q) -> impl Future<Output = u16> + '_ {
    Acquire {
        queue,
        ticket: Ticket::default(),
    }
}

/// The future of [`acquire`]: gives up its place in line when dropped.
struct Acquire<'a, Q: SlotQueue> {
    queue: &'a Q,
    ticket: Ticket,
}

impl<Q: SlotQueue> Future for Acquire<'_, Q> {
    type Output = u16;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u16> {
        let this = self.get_mut();
        let ticket = &mut this.ticket;
        this.queue.with_slots(|s| s.poll_acquire(ticket, cx))
    }
}

impl<Q: SlotQueue> Drop for Acquire<'_, Q> {
    fn drop(&mut self) {
        if self.ticket.0.is_some() {
            let ticket = &mut self.ticket;
            self.queue.with_slots(|s| s.cancel(ticket));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::rc::Rc;
    use alloc::sync::Arc;
    use alloc::task::Wake;
    use core::cell::{Cell, RefCell};
    use core::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter::default());
        (c.clone(), Waker::from(c))
    }

    fn woken(c: &Counter) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn acquire_submit_complete_take() {
        let mut s: Slots<u32> = Slots::new(2);
        let (c, w) = waker();
        let cx = &mut Context::from_waker(&w);
        let a = s.try_acquire().unwrap();
        s.submitted(a);
        assert!(s.poll_result(a, cx).is_pending());
        assert_eq!(s.complete(a, 7), Completed::Delivered);
        assert_eq!(woken(&c), 1);
        assert_eq!(s.poll_result(a, cx), Poll::Ready(7));
        assert_eq!(s.busy(), 0);
        assert_eq!(s.complete(a, 8), Completed::Stray);
        assert_eq!(s.stats().stray, 1);
        assert_eq!(s.complete(99, 8), Completed::Stray);
    }

    #[test]
    fn full_table_queues_callers_in_order() {
        let mut s: Slots<()> = Slots::new(1);
        let held = s.try_acquire().unwrap();
        let (c1, w1) = waker();
        let (c2, w2) = waker();
        let (mut t1, mut t2) = (Ticket::default(), Ticket::default());
        assert!(s
            .poll_acquire(&mut t1, &mut Context::from_waker(&w1))
            .is_pending());
        assert!(s
            .poll_acquire(&mut t2, &mut Context::from_waker(&w2))
            .is_pending());
        // A newcomer may not jump the queue.
        assert_eq!(s.try_acquire(), None);
        s.release(held);
        assert_eq!((woken(&c1), woken(&c2)), (1, 0));
        // The second in line cannot take it either.
        assert!(s
            .poll_acquire(&mut t2, &mut Context::from_waker(&w2))
            .is_pending());
        let got = s.poll_acquire(&mut t1, &mut Context::from_waker(&w1));
        assert_eq!(got, Poll::Ready(held));
        s.release(held);
        assert_eq!(woken(&c2), 1);
        assert_eq!(
            s.poll_acquire(&mut t2, &mut Context::from_waker(&w2)),
            Poll::Ready(held)
        );
        assert_eq!(s.stats().waited, 2);
    }

    #[test]
    fn a_cancelled_first_waiter_passes_its_turn_on() {
        let mut s: Slots<()> = Slots::new(1);
        let held = s.try_acquire().unwrap();
        let (c1, w1) = waker();
        let (c2, w2) = waker();
        let (mut t1, mut t2) = (Ticket::default(), Ticket::default());
        let _ = s.poll_acquire(&mut t1, &mut Context::from_waker(&w1));
        let _ = s.poll_acquire(&mut t2, &mut Context::from_waker(&w2));
        s.release(held);
        assert_eq!(woken(&c1), 1);
        s.cancel(&mut t1);
        assert_eq!(woken(&c2), 1);
        assert!(s
            .poll_acquire(&mut t2, &mut Context::from_waker(&w2))
            .is_ready());
    }

    #[test]
    fn abandoned_slots_stay_taken_until_the_device_completes() {
        let mut s: Slots<u8> = Slots::new(1);
        let a = s.try_acquire().unwrap();
        s.submitted(a);
        assert!(!s.abandon(a));
        assert_eq!(s.try_acquire(), None, "the device still owns the slot");
        assert_eq!(s.in_device_slots().collect::<Vec<_>>(), [a]);
        assert_eq!(s.complete(a, 1), Completed::Freed);
        assert_eq!(s.try_acquire(), Some(a));
        // Abandoning a completed (not yet taken) or never-submitted request frees at once.
        s.submitted(a);
        s.complete(a, 2);
        assert!(s.abandon(a));
        let b = s.try_acquire().unwrap();
        assert!(s.abandon(b));
        assert_eq!(s.busy(), 0);
        assert_eq!(s.stats().abandoned, 1);
    }

    #[test]
    fn stats_merge_adds_counts_and_keeps_the_highest_peak() {
        let mut a = SlotStats {
            acquired: 5,
            waited: 1,
            abandoned: 2,
            stray: 0,
            peak_in_device: 7,
        };
        let b = SlotStats {
            acquired: 3,
            waited: 4,
            abandoned: 0,
            stray: 1,
            peak_in_device: 9,
        };
        a.merge(&b);
        assert_eq!(
            a,
            SlotStats {
                acquired: 8,
                waited: 5,
                abandoned: 2,
                stray: 1,
                peak_in_device: 9
            }
        );
        a.merge(&SlotStats::default());
        assert_eq!(a.peak_in_device, 9);
    }

    #[test]
    fn results_are_per_slot() {
        let mut s: Slots<usize> = Slots::new(64);
        let slots: Vec<u16> = (0..64).map(|_| s.try_acquire().unwrap()).collect();
        for &x in &slots {
            s.submitted(x);
        }
        assert_eq!(s.in_device(), 64);
        assert_eq!(s.stats().peak_in_device, 64);
        for &x in slots.iter().rev() {
            assert_eq!(s.complete(x, usize::from(x) * 3), Completed::Delivered);
        }
        for &x in &slots {
            assert_eq!(s.take_result(x), Some(usize::from(x) * 3));
        }
        assert_eq!(s.busy(), 0);
    }

    /// A request's result that records when it is dropped, as the DMA memory a real
    /// result carries would be freed.
    #[derive(Debug)]
    struct Held(Rc<Cell<u32>>, u32);

    impl Drop for Held {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    /// A fake device: completes requests when told to, counts reaps.
    struct FakeQueue {
        slots: IrqLock<Slots<Held>>,
        /// Slots the "device" will complete on the next reap.
        ready: RefCell<Vec<u16>>,
        reaps: Cell<u64>,
        /// Results dropped so far.
        freed: Rc<Cell<u32>>,
    }

    impl FakeQueue {
        fn new(n: usize) -> FakeQueue {
            FakeQueue {
                slots: IrqLock::new(Slots::new(n)),
                ready: RefCell::new(Vec::new()),
                reaps: Cell::new(0),
                freed: Rc::new(Cell::new(0)),
            }
        }

        fn complete(&self, slot: u16) -> Completed {
            let result = Held(self.freed.clone(), 100 + u32::from(slot));
            self.slots.lock(|s| s.complete(slot, result))
        }
    }

    impl SlotQueue for FakeQueue {
        type Output = Held;
        type State = Slots<Held>;

        fn with_state<T>(&self, f: impl FnOnce(&mut Slots<Held>) -> T) -> T {
            self.slots.lock(f)
        }

        fn slots(state: &mut Slots<Held>) -> &mut Slots<Held> {
            state
        }
    }

    impl FakeQueue {
        fn reap(&self) {
            self.reaps.set(self.reaps.get() + 1);
            for s in self.ready.take() {
                self.complete(s);
            }
        }
    }

    fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        let (_, w) = waker();
        f.poll(&mut Context::from_waker(&w))
    }

    #[test]
    fn a_request_goes_through_its_phases() {
        let q = FakeQueue::new(2);
        let mut req = pollster::block_on(Request::acquire(&q));
        let slot = req.slot();
        req.submitted();
        q.ready.borrow_mut().push(slot);
        {
            let mut wait = core::pin::pin!(req.wait());
            assert!(poll_once(wait.as_mut()).is_pending());
            q.reap();
            let Poll::Ready(held) = poll_once(wait.as_mut()) else {
                panic!("completed request still pending");
            };
            assert_eq!(held.1, 100 + u32::from(slot));
        }
        drop(req);
        assert_eq!(q.slots.lock(|s| s.busy()), 0);
        assert_eq!(
            q.freed.get(),
            1,
            "the result went to the waiter, who dropped it"
        );
    }

    #[test]
    fn dropping_a_submitted_request_abandons_it_without_waiting() {
        let q = FakeQueue::new(1);
        let mut req = pollster::block_on(Request::acquire(&q));
        let slot = req.slot();
        req.submitted();
        drop(req);
        assert_eq!(q.reaps.get(), 0, "the drop did not wait for the device");
        assert_eq!(
            q.slots.lock(|s| s.busy()),
            1,
            "the device still owns the slot"
        );
        assert_eq!(q.freed.get(), 0);
        // The completion frees the slot and drops its result (the request's memory).
        assert_eq!(q.complete(slot), Completed::Freed);
        assert_eq!(q.freed.get(), 1);
        assert_eq!(q.slots.lock(|s| s.busy()), 0);
        // Unsubmitted requests just give their slot back.
        let req = pollster::block_on(Request::acquire(&q));
        drop(req);
        assert_eq!(q.slots.lock(|s| s.busy()), 0);
    }

    #[test]
    fn forgetting_a_request_leaks_its_slot_and_result_only() {
        let q = FakeQueue::new(2);
        let mut req = pollster::block_on(Request::acquire(&q));
        let slot = req.slot();
        req.submitted();
        core::mem::forget(req);
        assert_eq!(q.complete(slot), Completed::Delivered);
        // Nobody takes the result: it stays in the slot, never reused, never freed early.
        assert_eq!(q.freed.get(), 0);
        assert_eq!(q.slots.lock(|s| s.busy()), 1);
        let other = pollster::block_on(Request::acquire(&q));
        assert_ne!(other.slot(), slot);
        drop(other);
        // Dropping the table (the driver) drops it.
        drop(q.slots.lock(|s| core::mem::replace(s, Slots::new(1))));
        assert_eq!(q.freed.get(), 1);
    }

    #[test]
    fn a_dropped_acquire_leaves_the_line() {
        let q = FakeQueue::new(1);
        let held = pollster::block_on(Request::acquire(&q));
        let mut second = alloc::boxed::Box::pin(Request::acquire(&q));
        assert!(poll_once(second.as_mut()).is_pending());
        let mut third = core::pin::pin!(Request::acquire(&q));
        assert!(poll_once(third.as_mut()).is_pending());
        drop(held);
        // `second` was first in line; it goes away without taking the slot.
        drop(second);
        assert!(matches!(poll_once(third.as_mut()), Poll::Ready(_)));
    }

    /// The completion path on another CPU (a thread here) completes the slot of a request
    /// waiting on this one, and its wake reaches the waiting task; meanwhile requests from
    /// several threads share the table.
    #[test]
    fn completions_from_another_cpu_wake_the_waiting_request() {
        extern crate std;
        use std::sync::mpsc;

        let q: Arc<IrqLock<Slots<u64>>> = Arc::new(IrqLock::new(Slots::new(4)));
        let (submitted, to_reaper) = mpsc::channel::<u16>();
        let reaper = {
            let q = q.clone();
            std::thread::spawn(move || {
                for slot in to_reaper {
                    std::thread::sleep(core::time::Duration::from_micros(200));
                    assert_eq!(
                        q.lock(|s| s.complete(slot, u64::from(slot) + 1000)),
                        Completed::Delivered
                    );
                }
            })
        };
        let submitters: Vec<_> = (0..4)
            .map(|_| {
                let (q, submitted) = (q.clone(), submitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mut req = pollster::block_on(Request::acquire(&*q));
                        req.submitted();
                        submitted.send(req.slot()).unwrap();
                        let out = pollster::block_on(req.wait());
                        assert_eq!(out, u64::from(req.slot()) + 1000);
                    }
                })
            })
            .collect();
        drop(submitted);
        for t in submitters {
            t.join().unwrap();
        }
        reaper.join().unwrap();
        let s = q.lock(|s| s.stats());
        assert_eq!((s.acquired, q.lock(|s| s.busy())), (200, 0));
    }
}

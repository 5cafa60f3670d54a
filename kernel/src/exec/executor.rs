//! Tasks, the ready queue, and the run loop.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::task::Wake;
use core::cell::{Cell, RefCell};
use core::future::Future;
use core::pin::{pin, Pin};
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use super::halt::{HaltGate, WakeStats};
use super::join::{self, JoinHandle};
use super::timer::{Elapsed, Sleep, TimerQueue};
use super::{Kick, Platform};
use crate::sync::IrqLock;
use crate::time::Instant;

/// Identifies a task within its executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(u64);

/// The future passed to [`Executor::block_on`]; not stored in the task table.
const MAIN: TaskId = TaskId(0);

/// How many ready tasks to poll before looking at the timers again.
const POLL_BATCH: usize = 64;

/// Ids of tasks to poll. Wakers push (possibly from interrupt handlers and other CPUs);
/// the run loop pops. Each task is queued at most once (see [`TaskWaker::scheduled`]) and
/// capacity for every task is reserved at spawn, so pushing never allocates.
struct ReadyQueue {
    queue: IrqLock<VecDeque<TaskId>>,
    /// Interrupts the executor after a push from elsewhere, when `halt` says so (outside
    /// the lock).
    kick: Option<Kick>,
    /// Whether the executor is halted or about to halt.
    halt: Arc<HaltGate>,
}

impl core::fmt::Debug for ReadyQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadyQueue")
            .field("queue", &self.queue)
            .field("kick", &self.kick.is_some())
            .field("wakes", &self.halt.stats())
            .finish()
    }
}

impl ReadyQueue {
    fn push(&self, id: TaskId) {
        self.queue.lock(|q| {
            assert!(q.len() < q.capacity(), "ready queue capacity not reserved");
            q.push_back(id);
        });
        if let Some(kick) = &self.kick {
            if kick.is_remote() && self.halt.must_interrupt() {
                kick.interrupt();
            }
        }
    }

    /// The run loop's last look before halting (interrupts off): tells the gate it is
    /// about to halt, then whether anything is queued.
    fn about_to_halt(&self) -> bool {
        self.halt.halting();
        !self.is_empty()
    }

    fn pop(&self) -> Option<TaskId> {
        self.queue.lock(|q| q.pop_front())
    }

    fn is_empty(&self) -> bool {
        self.queue.lock(|q| q.is_empty())
    }

    fn reserve_for(&self, tasks: usize) {
        self.queue.lock(|q| {
            let want = tasks.saturating_sub(q.len());
            q.reserve(want);
        });
    }
}

/// Tasks that gave up the CPU with work left ([`Spawner::defer_current`]), oldest first.
/// The run loop moves one back to the ready queue per pass, so tasks woken by events
/// (a request arriving, a device completing) run before a CPU-bound task's next turn,
/// and the CPU-bound tasks take turns among themselves. Only the executor's own CPU
/// touches it (no interrupt handler defers a task); capacity is reserved at spawn.
#[derive(Debug, Default)]
struct BackgroundQueue(RefCell<VecDeque<TaskId>>);

/// A task's waker. `scheduled` is true while the task sits in the ready queue or the
/// background queue, and forever once the task has finished, so wakes of a queued task
/// and late wakes of a finished task are ignored.
#[derive(Debug)]
struct TaskWaker {
    id: TaskId,
    scheduled: AtomicBool,
    ready: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            self.ready.push(self.id);
        }
    }
}

struct Task {
    future: RefCell<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Arc<TaskWaker>,
}

/// Counters, per cause, since the executor was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tasks spawned.
    pub spawned: u64,
    /// Tasks that ran to completion.
    pub completed: u64,
    /// Task polls (the main future's included).
    pub polls: u64,
    /// Timers that expired and woke their task.
    pub timers_fired: u64,
    /// Times the executor went idle.
    pub idles: u64,
    /// Times a task gave up the CPU with work left and waited in the background queue.
    pub deferrals: u64,
}

pub(super) struct Inner {
    platform: Box<dyn Platform>,
    tasks: RefCell<BTreeMap<TaskId, Rc<Task>>>,
    ready: Arc<ReadyQueue>,
    background: BackgroundQueue,
    /// The task being polled (not the main future), for [`Spawner::defer_current`].
    current: Cell<Option<TaskId>>,
    pub(super) timers: RefCell<TimerQueue>,
    next_id: Cell<u64>,
    stats: Cell<Stats>,
}

impl Inner {
    pub(super) fn now(&self) -> Instant {
        self.platform.now()
    }

    fn bump(&self, f: impl FnOnce(&mut Stats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Wakes every timer whose deadline has passed.
    fn fire_timers(&self) {
        let now = self.now();
        let fired = self.timers.borrow_mut().expire(now);
        if fired > 0 {
            self.bump(|s| s.timers_fired += fired);
        }
    }

    fn poll_task(&self, id: TaskId) {
        let Some(task) = self.tasks.borrow().get(&id).cloned() else {
            return; // finished after it was queued
        };
        // Clear before polling, so a wake during the poll queues the task again.
        task.waker.scheduled.store(false, Ordering::Release);
        let waker = Waker::from(task.waker.clone());
        let mut cx = Context::from_waker(&waker);
        self.bump(|s| s.polls += 1);
        self.current.set(Some(id));
        let done = task.future.borrow_mut().as_mut().poll(&mut cx).is_ready();
        self.current.set(None);
        if done {
            task.waker.scheduled.store(true, Ordering::Release);
            self.tasks.borrow_mut().remove(&id);
            self.bump(|s| s.completed += 1);
        }
    }

    /// Moves the longest-waiting deferred task to the ready queue, if there is one.
    fn release_deferred(&self) {
        if let Some(id) = self.background.0.borrow_mut().pop_front() {
            // Still `scheduled`: it is queued again, so wakes keep being ignored.
            self.ready.push(id);
        }
    }
}

/// A handle for spawning tasks and making timers on one executor. Cheap to clone; not
/// `Send` (tasks stay on their CPU).
#[derive(Clone)]
pub struct Spawner {
    inner: Rc<Inner>,
}

impl core::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Spawner")
            .field("tasks", &self.inner.tasks.borrow().len())
            .field("stats", &self.inner.stats.get())
            .finish()
    }
}

impl Spawner {
    /// Starts `future` as a new task. The task runs even if the handle is dropped.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let (handle, task_future) = join::wrap(future);
        let inner = &self.inner;
        let id = TaskId(inner.next_id.get());
        inner.next_id.set(id.0 + 1);
        let waker = Arc::new(TaskWaker {
            id,
            scheduled: AtomicBool::new(false),
            ready: inner.ready.clone(),
        });
        let task = Rc::new(Task {
            future: RefCell::new(Box::pin(task_future)),
            waker: waker.clone(),
        });
        let count = {
            let mut tasks = inner.tasks.borrow_mut();
            tasks.insert(id, task);
            tasks.len()
        };
        // +1 for the main future of `block_on`.
        inner.ready.reserve_for(count + 1);
        {
            let mut background = inner.background.0.borrow_mut();
            let want = count.saturating_sub(background.len());
            background.reserve(want);
        }
        inner.bump(|s| s.spawned += 1);
        waker.wake_by_ref();
        handle
    }

    /// Sends the task being polled to the background queue: it is polled again after the
    /// tasks that are ready now and after the tasks deferred before it, and wakes meanwhile
    /// are absorbed (it will look at everything when its turn comes). For a task that
    /// used up its share of the CPU with work left; an event-driven task keeps its place.
    ///
    /// Returns false, doing nothing, outside a task's poll (the main future of
    /// [`Executor::block_on`], or another thread) or if the task was already woken
    /// during this poll (it is in the ready queue already): the caller then wakes itself.
    pub fn defer_current(&self) -> bool {
        let inner = &self.inner;
        let Some(id) = inner.current.get() else {
            return false;
        };
        let Some(task) = inner.tasks.borrow().get(&id).cloned() else {
            return false;
        };
        if task.waker.scheduled.swap(true, Ordering::AcqRel) {
            return false;
        }
        inner.background.0.borrow_mut().push_back(id);
        inner.bump(|s| s.deferrals += 1);
        true
    }

    /// The current time on the platform's clock.
    pub fn now(&self) -> Instant {
        self.inner.now()
    }

    /// A future that completes `duration` from now.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(self.now() + duration)
    }

    /// A future that completes at `deadline` (immediately if it has passed).
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep::new(self.inner.clone(), deadline)
    }

    /// Runs `future` for at most `duration`; dropping it if the time runs out.
    pub async fn timeout<F: Future>(
        &self,
        duration: Duration,
        future: F,
    ) -> Result<F::Output, Elapsed> {
        let mut future = pin!(future);
        let mut sleep = self.sleep(duration);
        core::future::poll_fn(|cx| {
            if let Poll::Ready(v) = future.as_mut().poll(cx) {
                return Poll::Ready(Ok(v));
            }
            if Pin::new(&mut sleep).poll(cx).is_ready() {
                return Poll::Ready(Err(Elapsed));
            }
            Poll::Pending
        })
        .await
    }

    /// Tasks spawned and not yet finished.
    pub fn task_count(&self) -> usize {
        self.inner.tasks.borrow().len()
    }

    /// Timers currently armed.
    pub fn timer_count(&self) -> usize {
        self.inner.timers.borrow().len()
    }

    /// The executor's counters.
    pub fn stats(&self) -> Stats {
        self.inner.stats.get()
    }

    /// How wakes from other CPUs reached the executor.
    pub fn wake_stats(&self) -> WakeStats {
        self.inner.ready.halt.stats()
    }
}

/// Runs tasks on one CPU. See the [module documentation](super).
#[derive(Debug)]
pub struct Executor {
    spawner: Spawner,
}

impl Executor {
    /// An executor with no tasks, over `platform`.
    pub fn new(platform: impl Platform + 'static) -> Executor {
        let mut queue = VecDeque::new();
        queue.reserve(1);
        let kick = platform.kicker();
        Executor {
            spawner: Spawner {
                inner: Rc::new(Inner {
                    platform: Box::new(platform),
                    tasks: RefCell::new(BTreeMap::new()),
                    ready: Arc::new(ReadyQueue {
                        queue: IrqLock::new(queue),
                        kick,
                        halt: Arc::new(HaltGate::new()),
                    }),
                    background: BackgroundQueue::default(),
                    current: Cell::new(None),
                    timers: RefCell::new(TimerQueue::default()),
                    next_id: Cell::new(MAIN.0 + 1),
                    stats: Cell::new(Stats::default()),
                }),
            },
        }
    }

    /// A handle for spawning tasks and making timers.
    pub fn spawner(&self) -> Spawner {
        self.spawner.clone()
    }

    /// Its [`HaltGate`], whose counters other CPUs may read.
    pub fn halt_gate(&self) -> Arc<HaltGate> {
        self.spawner.inner.ready.halt.clone()
    }

    /// Runs all tasks until `main` completes, and returns its output. Tasks still running
    /// then stay in the executor (a later `block_on` continues them).
    pub fn block_on<F: Future>(&self, main: F) -> F::Output {
        let inner = &self.spawner.inner;
        let mut main = pin!(main);
        let main_waker = Arc::new(TaskWaker {
            id: MAIN,
            scheduled: AtomicBool::new(false),
            ready: inner.ready.clone(),
        });
        main_waker.wake_by_ref();
        let waker = Waker::from(main_waker.clone());
        loop {
            inner.fire_timers();
            for _ in 0..POLL_BATCH {
                let Some(id) = inner.ready.pop() else { break };
                if id != MAIN {
                    inner.poll_task(id);
                    continue;
                }
                main_waker.scheduled.store(false, Ordering::Release);
                inner.bump(|s| s.polls += 1);
                if let Poll::Ready(v) = main.as_mut().poll(&mut Context::from_waker(&waker)) {
                    // Late wakes of the finished main future must not queue it again.
                    main_waker.scheduled.store(true, Ordering::Release);
                    return v;
                }
            }
            // One deferred task per pass: after everything an event made ready.
            inner.release_deferred();
            if inner.ready.is_empty() {
                let deadline = inner.timers.borrow().next_deadline();
                if deadline.is_none_or(|d| d > inner.now()) {
                    inner.bump(|s| s.idles += 1);
                    let ready = &inner.ready;
                    inner.platform.idle(deadline, &|| ready.about_to_halt());
                    ready.halt.running();
                }
            }
        }
    }
}

//! Host tests of the executor on a simulated clock.

use super::*;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::vec::Vec;

/// A clock that jumps to the next deadline when the executor idles. With no deadline and
/// no work it waits (briefly, in real time) for another thread to wake a task.
#[derive(Clone, Default)]
struct SimClock {
    now: Rc<Cell<u64>>,
    idles: Rc<Cell<u32>>,
}

impl Platform for SimClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.now.get())
    }

    fn idle(&self, deadline: Option<Instant>, work_pending: &dyn Fn() -> bool) {
        self.idles.set(self.idles.get() + 1);
        if work_pending() {
            return;
        }
        match deadline {
            Some(d) => {
                assert!(d.as_nanos() >= self.now.get(), "deadline in the past");
                self.now.set(d.as_nanos());
            }
            None => {
                for _ in 0..5_000 {
                    if work_pending() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                panic!("deadlock: no task ready, no timer armed, no wake-up came");
            }
        }
    }
}

fn executor() -> (Executor, SimClock) {
    let clock = SimClock::default();
    (Executor::new(clock.clone()), clock)
}

#[test]
fn block_on_returns_the_value() {
    let (ex, _) = executor();
    assert_eq!(ex.block_on(async { 41 + 1 }), 42);
}

#[test]
fn many_sleeping_tasks_wake_in_deadline_order() {
    let (ex, clock) = executor();
    let sp = ex.spawner();
    let order = Rc::new(RefCell::new(Vec::new()));
    let mut handles = Vec::new();
    // A scrambled permutation of deadlines, some equal.
    for i in 0..1000u64 {
        let ms = (i * 7919) % 500;
        let sp2 = sp.clone();
        let order = order.clone();
        handles.push(sp.spawn(async move {
            sp2.sleep(Duration::from_millis(ms)).await;
            order.borrow_mut().push((sp2.now(), ms));
            ms
        }));
    }
    let sum: u64 = ex.block_on(async move {
        let mut sum = 0;
        for h in handles {
            sum += h.await;
        }
        sum
    });
    assert_eq!(sum, (0..1000u64).map(|i| (i * 7919) % 500).sum::<u64>());
    let order = order.borrow();
    assert_eq!(order.len(), 1000);
    for (woke_at, ms) in order.iter() {
        assert!(
            woke_at.as_nanos() >= ms * 1_000_000,
            "a timer fired early: {ms} ms at {woke_at}"
        );
    }
    assert!(order.windows(2).all(|w| w[0].1 <= w[1].1), "out of order");
    assert_eq!(
        clock.now.get(),
        499 * 1_000_000,
        "clock ran past the last deadline"
    );
    assert_eq!(sp.task_count(), 0);
    assert_eq!(sp.timer_count(), 0);
    let stats = sp.stats();
    assert_eq!(stats.spawned, 1000);
    assert_eq!(stats.completed, 1000);
    // Zero-length sleeps complete without arming a timer; every other one fires once.
    let armed = (0..1000u64).filter(|i| (i * 7919) % 500 != 0).count() as u64;
    assert_eq!(stats.timers_fired, armed, "{stats:?}");
}

#[test]
fn tasks_spawn_tasks() {
    let (ex, _) = executor();
    let sp = ex.spawner();
    let sp2 = sp.clone();
    let v = ex.block_on(async move {
        let inner = sp2.clone();
        sp2.spawn(async move { inner.spawn(async { 5 }).await * 2 })
            .await
    });
    assert_eq!(v, 10);
    assert_eq!(sp.stats().completed, 2);
}

#[test]
fn timeout_elapses_and_completes() {
    let (ex, clock) = executor();
    let sp = ex.spawner();
    let r = ex.block_on(sp.timeout(Duration::from_millis(10), core::future::pending::<()>()));
    assert_eq!(r, Err(Elapsed));
    assert_eq!(clock.now.get(), 10_000_000);
    let sp2 = sp.clone();
    let r = ex.block_on(sp.timeout(Duration::from_millis(10), async move {
        sp2.sleep(Duration::from_millis(3)).await;
        7
    }));
    assert_eq!(r, Ok(7));
    assert_eq!(clock.now.get(), 13_000_000);
    assert_eq!(sp.timer_count(), 0, "the losing timer was disarmed");
}

#[test]
fn dropped_sleep_disarms_its_timer() {
    let (ex, _) = executor();
    let sp = ex.spawner();
    let sp2 = sp.clone();
    ex.block_on(async move {
        let mut s = sp2.sleep(Duration::from_secs(100));
        // Poll once to arm, then drop.
        core::future::poll_fn(|cx| {
            assert!(core::pin::Pin::new(&mut s).poll(cx).is_pending());
            core::task::Poll::Ready(())
        })
        .await;
        assert_eq!(sp2.timer_count(), 1);
    });
    assert_eq!(sp.timer_count(), 0);
}

#[test]
fn past_deadline_completes_immediately() {
    let (ex, clock) = executor();
    clock.now.set(5_000);
    let sp = ex.spawner();
    ex.block_on(sp.sleep_until(Instant::from_nanos(10)));
    assert_eq!(clock.idles.get(), 0);
}

#[test]
fn irq_event_from_another_thread_wakes_the_task() {
    let (ex, _) = executor();
    let event = Arc::new(IrqEvent::new());
    let remote = event.clone();
    let signaller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        remote.signal();
    });
    ex.block_on(event.wait());
    signaller.join().unwrap();
    assert_eq!(event.signal_count(), 1);
    assert!(!event.take(), "the wait consumed the signal");
}

/// The executor's thread, for [`Interrupter::is_remote`].
fn this_thread() -> std::thread::ThreadId {
    std::thread::current().id()
}

/// A CPU's interrupt line: an IPI sets it, a halt waits for it.
#[derive(Default)]
struct Line {
    pending: std::sync::Mutex<bool>,
    raised: std::sync::Condvar,
    /// Interrupts sent.
    sent: AtomicUsize,
}

/// Kicks from threads other than `owner` raise the line.
struct LineKick {
    owner: std::thread::ThreadId,
    line: Arc<Line>,
}

impl Interrupter for LineKick {
    fn is_remote(&self) -> bool {
        this_thread() != self.owner
    }

    fn interrupt(&self) {
        self.line.sent.fetch_add(1, Ordering::SeqCst);
        *self.line.pending.lock().unwrap() = true;
        self.line.raised.notify_one();
    }
}

/// A platform that halts like a CPU: with nothing to do (and no deadline) it waits for
/// its interrupt line, and a halt that nothing ends within 5 s is a lost wake.
#[derive(Clone)]
struct HaltingCpu {
    clock: SimClock,
    line: Arc<Line>,
    owner: std::thread::ThreadId,
}

impl HaltingCpu {
    fn new() -> HaltingCpu {
        HaltingCpu {
            clock: SimClock::default(),
            line: Arc::default(),
            owner: this_thread(),
        }
    }
}

impl Platform for HaltingCpu {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn idle(&self, deadline: Option<Instant>, work_pending: &dyn Fn() -> bool) {
        if deadline.is_some() {
            return self.clock.idle(deadline, work_pending);
        }
        // "Interrupts off": the line's lock is held from the last look to the halt.
        let mut pending = self.line.pending.lock().unwrap();
        if work_pending() {
            return;
        }
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !*pending {
            let left = until.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "halted with a task queued: a lost wake");
            pending = self.line.raised.wait_timeout(pending, left).unwrap().0;
        }
        *pending = false;
    }

    fn kicker(&self) -> Option<Kick> {
        Some(Arc::new(LineKick {
            owner: self.owner,
            line: self.line.clone(),
        }))
    }
}

#[test]
fn a_wake_from_another_thread_interrupts_the_halted_executor() {
    let platform = HaltingCpu::new();
    let line = platform.line.clone();
    let ex = Executor::new(platform);
    let event = Arc::new(IrqEvent::new());
    let remote = event.clone();
    let signaller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        remote.signal();
    });
    ex.block_on(event.wait());
    signaller.join().unwrap();
    assert_eq!(
        line.sent.load(Ordering::SeqCst),
        1,
        "one IPI to the halted executor"
    );
    assert_eq!(ex.spawner().wake_stats().ipis, 1);
}

/// Wakes from another thread while the executor halts between them: each is seen (the
/// halt that would lose one fails), each was either an IPI or found the executor
/// running, and no IPI is sent that the gate did not ask for.
#[test]
fn remote_wakes_are_never_lost_and_interrupt_only_a_halting_executor() {
    const WAKES: usize = 2_000;
    let platform = HaltingCpu::new();
    let line = platform.line.clone();
    let ex = Executor::new(platform);
    let event = Arc::new(IrqEvent::new());
    let consumed = Arc::new(AtomicUsize::new(0));
    let (remote, seen) = (event.clone(), consumed.clone());
    let signaller = std::thread::spawn(move || {
        for i in 0..WAKES {
            remote.signal();
            // Wait until the task took it, so signals do not coalesce.
            while seen.load(Ordering::SeqCst) <= i {
                std::hint::spin_loop();
            }
        }
    });
    let (e, c) = (event.clone(), consumed.clone());
    ex.block_on(async move {
        for _ in 0..WAKES {
            e.wait().await;
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    signaller.join().unwrap();
    let s = ex.spawner().wake_stats();
    assert_eq!(s.ipis as usize, line.sent.load(Ordering::SeqCst));
    assert!(
        s.ipis + s.ipis_skipped >= 1 && s.ipis as usize <= WAKES,
        "{s:?}"
    );
}

/// An executor that never runs out of work is never interrupted: a remote wake while it
/// polls a busy task is counted as skipped.
#[test]
fn a_running_executor_gets_no_ipi() {
    let platform = HaltingCpu::new();
    let line = platform.line.clone();
    let ex = Executor::new(platform);
    let sp = ex.spawner();
    let event = Arc::new(IrqEvent::new());
    let remote = event.clone();
    let signalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = signalled.clone();
    let signaller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        remote.signal();
        done.store(true, Ordering::SeqCst);
    });
    // Busy until the wake has been sent: it wakes itself on every poll.
    let busy = signalled.clone();
    sp.spawn(core::future::poll_fn(move |cx| {
        if busy.load(Ordering::SeqCst) {
            return core::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        core::task::Poll::Pending
    }));
    ex.block_on(event.wait());
    signaller.join().unwrap();
    assert_eq!(line.sent.load(Ordering::SeqCst), 0);
    assert_eq!(
        sp.wake_stats(),
        WakeStats {
            ipis: 0,
            ipis_skipped: 1
        }
    );
}

#[test]
fn signal_before_wait_is_not_lost_and_signals_coalesce() {
    let (ex, clock) = executor();
    let event = IrqEvent::new();
    event.signal();
    event.signal();
    ex.block_on(event.wait());
    assert_eq!(clock.idles.get(), 0);
    assert_eq!(event.signal_count(), 2);
    assert!(!event.take());
}

#[test]
fn a_self_waking_task_does_not_starve_timers() {
    let (ex, _) = executor();
    let sp = ex.spawner();
    let spins = Arc::new(AtomicUsize::new(0));
    let s2 = spins.clone();
    sp.spawn(async move {
        loop {
            s2.fetch_add(1, Ordering::Relaxed);
            // Yield: wake ourselves and return Pending once.
            let mut yielded = false;
            core::future::poll_fn(|cx| {
                if yielded {
                    core::task::Poll::Ready(())
                } else {
                    yielded = true;
                    cx.waker().wake_by_ref();
                    core::task::Poll::Pending
                }
            })
            .await;
        }
    });
    // The clock only moves when idle, which never happens here; the main future must
    // still complete because a zero-length sleep is due immediately.
    let sp2 = sp.clone();
    ex.block_on(async move { sp2.sleep(Duration::ZERO).await });
    assert!(spins.load(Ordering::Relaxed) >= 1);
}

/// A CPU-bound task that defers itself after every turn, like a 9P connection past its
/// quantum; returns after `turns` turns.
fn hog(
    sp: Spawner,
    log: Rc<RefCell<Vec<&'static str>>>,
    name: &'static str,
    turns: usize,
) -> impl Future<Output = ()> {
    let mut left = turns;
    core::future::poll_fn(move |cx| {
        log.borrow_mut().push(name);
        left -= 1;
        if left == 0 {
            return core::task::Poll::Ready(());
        }
        if !sp.defer_current() {
            cx.waker().wake_by_ref();
        }
        core::task::Poll::Pending
    })
}

#[test]
fn deferred_tasks_run_after_event_driven_ones_and_take_turns() {
    let (ex, _) = executor();
    let sp = ex.spawner();
    let log = Rc::new(RefCell::new(Vec::new()));
    let hogs: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|name| sp.spawn(hog(sp.clone(), log.clone(), name, 20)))
        .collect();
    // An event-driven task: woken (by the hog "a", standing in for an interrupt) while
    // every hog is busy, it must run within one hog turn of the wake-up.
    let event = Rc::new(IrqEvent::new());
    let waiter = {
        let (event, log) = (event.clone(), log.clone());
        sp.spawn(async move {
            for _ in 0..5 {
                event.wait().await;
                log.borrow_mut().push("event");
            }
        })
    };
    // Another CPU-bound task, which signals the event every fourth turn.
    let signaller = {
        let (event, log, sp2) = (event.clone(), log.clone(), sp.clone());
        let mut turn = 0;
        sp.spawn(core::future::poll_fn(move |cx| {
            turn += 1;
            if turn % 4 == 0 {
                log.borrow_mut().push("signal");
                event.signal();
                if turn == 20 {
                    return core::task::Poll::Ready(());
                }
            }
            if !sp2.defer_current() {
                cx.waker().wake_by_ref();
            }
            core::task::Poll::Pending
        }))
    };
    ex.block_on(async move {
        for h in hogs {
            h.await;
        }
        waiter.await;
        signaller.await;
    });
    let log = log.borrow();
    // After each signal, the waiter runs before more than one hog turn has passed.
    for (i, _) in log.iter().enumerate().filter(|(_, e)| **e == "signal") {
        let until = log[i..]
            .iter()
            .position(|e| *e == "event")
            .expect("event ran");
        let hog_turns = log[i..i + until].iter().filter(|e| e.len() == 1).count();
        assert!(
            hog_turns <= 1,
            "{hog_turns} hog turns between signal and event: {log:?}"
        );
    }
    // The hogs took turns: no hog ran twice while another one was waiting.
    let hog_order: Vec<_> = log.iter().filter(|e| e.len() == 1).collect();
    for w in hog_order[..57].windows(3) {
        assert!(
            w[0] != w[1] && w[1] != w[2] && w[0] != w[2],
            "{hog_order:?}"
        );
    }
    assert!(sp.stats().deferrals >= 57, "{:?}", sp.stats());
}

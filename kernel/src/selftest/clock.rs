//! Clock, timer interrupt and executor checks.

use alloc::format;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::Cell;
use core::time::Duration;

use super::{ensure, Verdict};
use crate::clock::{self, hpet::Hpet};
use crate::{irq, platform, task};

/// Monotonic over many reads, and within a factor of two of the HPET over 100 ms: that
/// catches a miscalibrated TSC (a wrong frequency is off by far more), while under TCG
/// on a loaded host the two emulated clocks drift apart by tens of percent (0.6 seen
/// with the host's two cores running three builds).
pub async fn clock() -> Verdict {
    let mut last = clock::now();
    for _ in 0..100_000 {
        let t = clock::now();
        ensure!(t >= last, "clock went backwards: {last} then {t}");
        last = t;
    }
    let Some(hpet) = platform::info().and_then(|p| p.hpet).and_then(Hpet::start) else {
        return Verdict::Pass(format!(
            "monotonic, TSC {} MHz; no HPET to compare with",
            clock::tsc_hz() / 1_000_000
        ));
    };
    let (h0, t0) = (hpet.nanos(), clock::now());
    task::sleep(Duration::from_millis(100)).await;
    let (h1, t1) = (hpet.nanos(), clock::now());
    let ours = (t1 - t0).as_nanos() as f64;
    let theirs = (h1 - h0) as f64;
    let ratio = ours / theirs;
    ensure!(
        (0.5..2.0).contains(&ratio),
        "clock measured {ours} ns while the HPET measured {theirs} ns"
    );
    Verdict::Pass(format!(
        "monotonic, TSC {} MHz, {:.1}% off the HPET ({} MHz) over 100 ms",
        clock::tsc_hz() / 1_000_000,
        (ratio - 1.0) * 100.0,
        hpet.hz() / 1_000_000
    ))
}

/// A sleep ends no earlier than asked, woken by the local APIC timer's interrupt.
pub async fn timer() -> Verdict {
    let irqs = irq::count(irq::TIMER_VECTOR);
    let start = clock::now();
    task::sleep(Duration::from_millis(20)).await;
    let slept = clock::now() - start;
    let delivered = irq::count(irq::TIMER_VECTOR) - irqs;
    ensure!(
        slept >= Duration::from_millis(20),
        "sleep(20 ms) returned after {slept:?}"
    );
    ensure!(delivered > 0, "no timer interrupt during a 20 ms sleep");
    Verdict::Pass(format!(
        "sleep(20 ms) took {} us, {delivered} timer interrupts",
        slept.as_micros()
    ))
}

/// Hundreds of tasks with timers, none woken early, all finished.
pub async fn executor() -> Verdict {
    let early = Rc::new(Cell::new(0u32));
    let before = task::current().stats();
    let handles: Vec<_> = (0..500u64)
        .map(|i| {
            let early = early.clone();
            task::spawn(async move {
                let d = Duration::from_millis((i * 37) % 50);
                let start = clock::now();
                task::sleep(d).await;
                if clock::now() - start < d {
                    early.set(early.get() + 1);
                }
                i
            })
        })
        .collect();
    let mut sum = 0;
    for h in handles {
        sum += h.await;
    }
    ensure!(
        sum == 499 * 500 / 2,
        "tasks returned the wrong values (sum {sum})"
    );
    ensure!(early.get() == 0, "{} sleeps ended early", early.get());
    let s = task::current().stats();
    ensure!(
        s.completed - before.completed >= 500,
        "tasks did not complete: {s:?}"
    );
    Verdict::Pass(format!(
        "500 tasks, {} polls, {} timers fired, {} idles",
        s.polls - before.polls,
        s.timers_fired - before.timers_fired,
        s.idles - before.idles
    ))
}

//! Work for another CPU: [`spawn_on`] sends a closure to a CPU's inbox; that CPU's
//! inbox task runs it there, where it spawns a task on the CPU's own executor, and the
//! caller awaits the result through a [`Remote`].

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::Ordering;
use core::task::{Context, Poll};

use atomic_waker::AtomicWaker;

use super::{is_online, CPUS, MAX_CPUS};
use crate::hal::percpu;
use crate::sync::IrqLock;
use crate::task;

type Job = Box<dyn FnOnce() + Send>;

/// A CPU's inbox: closures from other CPUs, and its inbox task's waker.
struct Inbox {
    jobs: IrqLock<VecDeque<Job>>,
    waker: AtomicWaker,
}

static INBOXES: [Inbox; MAX_CPUS] = [const {
    Inbox {
        jobs: IrqLock::new(VecDeque::new()),
        waker: AtomicWaker::new(),
    }
}; MAX_CPUS];

/// The result of work sent to another CPU; resolves once that CPU's task has finished.
#[derive(Debug)]
pub struct Remote<T> {
    shared: Arc<Shared<T>>,
}

#[derive(Debug)]
struct Shared<T> {
    value: IrqLock<Option<T>>,
    waker: AtomicWaker,
}

impl<T> Future for Remote<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.shared.waker.register(cx.waker());
        match self.shared.value.lock(Option::take) {
            Some(v) => Poll::Ready(v),
            None => Poll::Pending,
        }
    }
}

/// Why work could not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOffline(pub usize);

/// Runs `make()` on CPU `cpu` and spawns the future it returns there (the future itself
/// need not be `Send`: it is made where it runs); the [`Remote`] resolves to its output.
/// On the calling CPU itself that happens at once, without the inbox.
pub fn spawn_on<M, F>(cpu: usize, make: M) -> Result<Remote<F::Output>, CpuOffline>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future + 'static,
    F::Output: Send + 'static,
{
    if !is_online(cpu) {
        return Err(CpuOffline(cpu));
    }
    let shared = Arc::new(Shared {
        value: IrqLock::new(None),
        waker: AtomicWaker::new(),
    });
    let done = shared.clone();
    let job: Job = Box::new(move || {
        let future = make();
        task::spawn(async move {
            let v = future.await;
            done.value.lock(|slot| *slot = Some(v));
            done.waker.wake();
        });
    });
    if cpu == percpu::index() {
        job();
        return Ok(Remote { shared });
    }
    let inbox = &INBOXES[cpu];
    inbox.jobs.lock(|q| q.push_back(job));
    inbox.waker.wake();
    Ok(Remote { shared })
}

/// CPU `cpu`'s inbox task: runs each closure sent to it, forever.
pub async fn serve_inbox(cpu: usize) {
    let inbox = &INBOXES[cpu];
    core::future::poll_fn(|cx| {
        inbox.waker.register(cx.waker());
        while let Some(job) = inbox.jobs.lock(VecDeque::pop_front) {
            job();
            CPUS[cpu].remote_tasks.fetch_add(1, Ordering::Relaxed);
        }
        Poll::<()>::Pending
    })
    .await
}

//! Waiting for a spawned task's result.

use alloc::rc::Rc;
use core::cell::RefCell;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

struct State<T> {
    result: Option<T>,
    waker: Option<Waker>,
    taken: bool,
}

/// Resolves to the output of a task started with
/// [`Spawner::spawn`](super::Spawner::spawn). Dropping it detaches the task.
pub struct JoinHandle<T> {
    state: Rc<RefCell<State<T>>>,
}

impl<T> core::fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl<T> JoinHandle<T> {
    /// The task has finished (its result may already have been taken).
    pub fn is_finished(&self) -> bool {
        let s = self.state.borrow();
        s.result.is_some() || s.taken
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.state.borrow_mut();
        assert!(!s.taken, "JoinHandle polled after it completed");
        if let Some(v) = s.result.take() {
            s.taken = true;
            return Poll::Ready(v);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Splits `future` into the handle and the task body that stores the result for it.
pub(super) fn wrap<F>(future: F) -> (JoinHandle<F::Output>, impl Future<Output = ()>)
where
    F: Future,
{
    let state = Rc::new(RefCell::new(State {
        result: None,
        waker: None,
        taken: false,
    }));
    let task_state = state.clone();
    let body = async move {
        let v = future.await;
        let waker = {
            let mut s = task_state.borrow_mut();
            s.result = Some(v);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    };
    (JoinHandle { state }, body)
}

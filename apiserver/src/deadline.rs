//! Deadlines that hold whether or not the client reads: what serves a response is dropped
//! when the response's deadline passes before its body has ended.
//!
//! Ending a body is not enough to end its response. Once hyper holds a chunk that the
//! client gives no room for (an HTTP/2 stream whose flow-control window stays closed, an
//! HTTP/1 connection whose socket buffer is full), it waits for room and never polls the
//! body again (hyper 1.x, `PipeToSendStream::poll` and the HTTP/1 dispatcher): the stream,
//! the chunks queued behind it and the watch slot they hold live as long as the client
//! likes. Only dropping the future that serves the response frees them: for HTTP/2 the
//! stream's task (hyper spawns one per stream through the connection's executor; h2 then
//! resets the stream with `CANCEL`), for HTTP/1 the connection's.
//!
//! So every such future runs inside a [`Bounded`]: it polls the future with a task-local
//! deadline in scope, which the code answering the request sets ([`bound`]) and the body
//! clears when it ends; once the deadline passes, the future is dropped. [`Executor`] does
//! this for what hyper spawns (HTTP/2 streams), and the connection driver for an HTTP/1
//! connection. kube-apiserver's `timeoutSeconds` ends a watch only when the watch writes;
//! here it holds "regardless of any activity or inactivity", as the API reference says.

use std::{
    cell::Cell,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use tokio::time::{Instant, Sleep};

/// Time given past a body's own end to write its last frames before what serves it is
/// dropped: a client that reads gets the whole stream.
pub const GRACE: Duration = Duration::from_secs(2);

tokio::task_local! {
    /// The deadline of the response the running future serves, if any.
    static DEADLINE: Cell<Option<Instant>>;
}

/// Sets the deadline of the response being answered: `within` from now, plus [`GRACE`].
/// Called from the future that answers the request (inside a [`Bounded`]); elsewhere,
/// as in unit tests of the routes, it does nothing and says so (`false`). A `within` too
/// large to add to now sets none.
pub fn set(within: Duration) -> bool {
    let at = Instant::now()
        .checked_add(within)
        .and_then(|at| at.checked_add(GRACE));
    DEADLINE.try_with(|deadline| deadline.set(at)).is_ok()
}

/// Clears the deadline of the response being answered: its body has ended.
pub fn clear() {
    let _ = DEADLINE.try_with(|deadline| deadline.set(None));
}

/// `body`, with the deadline of the response it is the body of set to `within` (plus
/// [`GRACE`]) and cleared when it ends. Call it where the response is made, inside the
/// future that answers the request.
pub fn bound<S: Stream + Unpin>(body: S, within: Duration) -> Ending<S> {
    set(within);
    Ending { body }
}

/// A body that clears its response's deadline when it ends (see [`bound`]).
pub struct Ending<S> {
    body: S,
}

impl<S: Stream + Unpin> Stream for Ending<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let next = Pin::new(&mut self.body).poll_next(cx);
        if let Poll::Ready(None) = next {
            clear();
        }
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.body.size_hint()
    }
}

/// A future polled with a deadline in scope, and dropped when the deadline passes: its
/// output, or `None` when it was dropped.
pub struct Bounded<F> {
    /// `None` once dropped at the deadline.
    future: Option<Pin<Box<F>>>,
    deadline: Option<Instant>,
    /// Allocated when a deadline is first set.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<F: Future> Bounded<F> {
    /// `future`, with no deadline until it sets one.
    pub fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
            deadline: None,
            sleep: None,
        }
    }

    /// The future, unless it was dropped at its deadline.
    pub fn get_mut(&mut self) -> Option<Pin<&mut F>> {
        self.future.as_mut().map(Pin::as_mut)
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(future) = this.future.as_mut() else {
            return Poll::Ready(None);
        };
        let (polled, deadline) = DEADLINE.sync_scope(Cell::new(this.deadline), || {
            let polled = future.as_mut().poll(cx);
            (polled, DEADLINE.with(Cell::get))
        });
        this.deadline = deadline;
        if let Poll::Ready(output) = polled {
            this.future = None;
            return Poll::Ready(Some(output));
        }
        let Some(at) = deadline else {
            return Poll::Pending;
        };
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() != at {
            sleep.as_mut().reset(at);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            tracing::debug!("a response not written by its deadline was dropped");
            this.future = None;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// hyper's executor: spawns on the tokio runtime, as `hyper_util::rt::TokioExecutor`,
/// each future inside a [`Bounded`] (for an HTTP/2 server, each stream's task).
#[derive(Clone, Copy, Debug, Default)]
pub struct Executor;

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Bounded::new(future));
    }
}

#[cfg(test)]
mod tests;

//! The client's stream as hyper sees it: reads recorded in the connection's
//! [`Activity`] (and refused when the pool for unfinished heads cannot hold them), and
//! writes that must make progress.
//!
//! hyper has no write timeout: a client that never reads its answers keeps the
//! connection, its buffers and its slot for as long as it likes. [`Guarded`] starts a
//! timer when a write (or flush, or shutdown) cannot proceed and stops it when one
//! does; if the timer runs out first, the write fails with `TimedOut` and hyper drops
//! the connection. A slow reader that takes some bytes now and then is not cut; one
//! that takes none for the write timeout is.

use std::{
    future::Future as _,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

use super::lifetime::Activity;

/// A stream whose writes must make progress within `write_timeout`.
#[derive(Debug)]
pub(super) struct Guarded<I> {
    io: I,
    activity: Arc<Activity>,
    write_timeout: Duration,
    /// Runs while a write waits; allocated at the first wait.
    stalled: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<I> Guarded<I> {
    pub(super) fn new(io: I, activity: Arc<Activity>, write_timeout: Duration) -> Self {
        Self {
            io,
            activity,
            write_timeout,
            stalled: None,
            armed: false,
        }
    }

    /// The outcome of one write-side operation: a wait starts (or continues) the
    /// timer, anything else stops it.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + self.write_timeout;
        let stalled = match (&mut self.stalled, self.armed) {
            (Some(stalled), true) => stalled,
            (Some(stalled), false) => {
                stalled.as_mut().reset(deadline);
                stalled
            }
            (None, _) => self
                .stalled
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.armed = true;
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within the write timeout",
            )));
        }
        Poll::Pending
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0
            && let Err(exhausted) = self.activity.heard(read)
        {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::OutOfMemory, exhausted)));
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.progress(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.progress(cx, polled)
    }
}

#[cfg(test)]
mod tests;

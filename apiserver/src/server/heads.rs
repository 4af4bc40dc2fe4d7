//! The bytes of unfinished request heads all connections may hold together.
//!
//! hyper buffers a request head until it is complete, up to [`super::MAX_HEADER_BYTES`]
//! per connection; times `--max-connections` that is far more than a pod's memory. Each
//! connection may hold [`FREE_BYTES`] read since its last request began without asking
//! (every real client's head fits); beyond that, it takes bytes from one [`Pool`] shared
//! by every connection and gives them back when its next request begins or it ends. A
//! read the pool cannot cover fails, and the connection is closed: while heads hold the
//! whole pool, a client that sends a large head is turned away, and the server's memory
//! stays bounded whoever sends what.
//!
//! What is counted is what was read from the client since its last request began: the
//! head being received (HTTP/1), or frames (HTTP/2: a header block with its
//! continuations, settings, pings) — an upper bound of the unfinished head hyper holds.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

/// Bytes a connection may read between two requests without taking from the pool:
/// hyper's first read buffer, and more than any real client's request head.
pub(super) const FREE_BYTES: usize = 8 * 1024;

/// Bytes shared by every connection's unfinished head beyond [`FREE_BYTES`].
#[derive(Debug)]
pub(super) struct Pool {
    capacity: usize,
    used: AtomicUsize,
}

impl Pool {
    pub(super) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            used: AtomicUsize::new(0),
        })
    }

    /// Takes `bytes` if they are free.
    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.capacity)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Bytes in use.
    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One connection's share: bytes read since its last request began, and what it holds
/// of the pool for them.
#[derive(Debug)]
pub(super) struct Charge {
    pool: Arc<Pool>,
    unconsumed: AtomicUsize,
    held: AtomicUsize,
}

/// The pool cannot hold a connection's unfinished head.
#[derive(Debug, thiserror::Error)]
#[error("the request heads of all connections take the whole pool for unfinished heads")]
pub(super) struct Exhausted;

impl Charge {
    pub(super) fn new(pool: Arc<Pool>) -> Self {
        Self {
            pool,
            unconsumed: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }
    }

    /// `bytes` more were read.
    pub(super) fn read(&self, bytes: usize) -> Result<(), Exhausted> {
        let unconsumed = self.unconsumed.fetch_add(bytes, Ordering::AcqRel) + bytes;
        let needed = unconsumed.saturating_sub(FREE_BYTES);
        let held = self.held.load(Ordering::Acquire);
        if needed <= held {
            return Ok(());
        }
        if !self.pool.take(needed - held) {
            return Err(Exhausted);
        }
        // A request beginning meanwhile may have given back what was held: this share is
        // then given back at the next request or at the end, never lost.
        self.held.fetch_add(needed - held, Ordering::AcqRel);
        Ok(())
    }

    /// A request began: what was read is hyper's no more.
    pub(super) fn consumed(&self) {
        self.unconsumed.store(0, Ordering::Release);
        self.pool.give(self.held.swap(0, Ordering::AcqRel));
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.pool.give(*self.held.get_mut());
    }
}

#[cfg(test)]
mod tests;

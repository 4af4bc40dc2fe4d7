//! When a connection that is answering nothing is closed.
//!
//! hyper bounds a request head once HTTP/1 is chosen, but not the time before the
//! protocol is known (hyper-util's `auto` builder waits for the first bytes to tell
//! HTTP/1 from HTTP/2), nor an HTTP/2 connection without streams: a client that answers
//! pings keeps it forever. [`Activity`] records what a connection did (bytes heard,
//! requests started and ended) and [`Timeouts::next`] says, from that record alone, when
//! it is to be looked at again or closed:
//!
//! - no byte within the first-bytes timeout of the handshake: closed ([`CloseReason::Silent`]);
//! - no request within the first-request timeout of the handshake: closed
//!   ([`CloseReason::NoRequest`]: an HTTP/2 preface and nothing else, or half of it);
//! - no request in flight for the idle timeout since the last one ended: shut down
//!   gracefully ([`CloseReason::Idle`]: HTTP/2 `GOAWAY`, HTTP/1 closed), as kube-apiserver
//!   closes idle HTTP/2 connections after 90 s.
//!
//! Under connection pressure (few slots left) every one of these waits is shortened
//! to [`Timeouts::pressured`], so that the slots idle clients hold go to new ones.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::heads::{Charge, Exhausted, Pool};

/// What one connection did, shared by its IO, its requests and its driver.
#[derive(Debug)]
pub(super) struct Activity {
    /// When the TLS handshake ended.
    opened: Instant,
    /// Whether a byte was read after the handshake.
    heard: AtomicBool,
    /// Requests started.
    started: AtomicU64,
    /// Requests whose handler has not returned yet.
    in_flight: AtomicUsize,
    /// When the last request ended, in nanoseconds after `opened`.
    last_end: AtomicU64,
    /// Its share of the pool for unfinished heads.
    heads: Charge,
}

impl Activity {
    /// A connection whose handshake ended at `opened`, its unfinished heads held in
    /// `heads`.
    pub(super) fn new(opened: Instant, heads: Arc<Pool>) -> Arc<Self> {
        Arc::new(Self {
            opened,
            heard: AtomicBool::new(false),
            started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            heads: Charge::new(heads),
        })
    }

    /// `bytes` were read from the client; an error when the pool for unfinished heads
    /// cannot hold them.
    pub(super) fn heard(&self, bytes: usize) -> Result<(), Exhausted> {
        if !self.heard.load(Ordering::Relaxed) {
            self.heard.store(true, Ordering::Relaxed);
        }
        self.heads.read(bytes)
    }

    /// A request started; it is in flight until the guard is dropped.
    pub(super) fn request(self: &Arc<Self>) -> InFlight {
        self.heads.consumed();
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Requests whose handler has not returned yet.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether a byte was read.
    #[cfg(test)]
    pub(super) fn was_heard(&self) -> bool {
        self.heard.load(Ordering::Relaxed)
    }

    fn since_opened(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.opened).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A request in flight on its connection; see [`Activity::request`].
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // The end time first: whoever sees no request in flight sees when the last ended.
        let end = self.0.since_opened(Instant::now());
        self.0.last_end.fetch_max(end, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CloseReason {
    /// Not a byte after the handshake.
    Silent,
    /// Bytes, but no request.
    NoRequest,
    /// No request in flight for the idle timeout.
    Idle,
}

impl CloseReason {
    /// Whether the connection may still have something to finish (a response being
    /// written), so it is shut down gracefully rather than dropped.
    pub(super) fn graceful(self) -> bool {
        matches!(self, Self::Idle)
    }
}

/// What to do with a connection now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Look again at this time (or earlier, on pressure).
    At(Instant),
    /// Close it.
    Close(CloseReason),
}

/// The waits of [`Activity`]'s rules (see the module's documentation).
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    /// From the handshake to the first byte.
    pub(super) first_bytes: Duration,
    /// From the handshake to the first request.
    pub(super) first_request: Duration,
    /// From the end of the last request, with none in flight.
    pub(super) idle: Duration,
    /// The longest of any of these while the server is short of connection slots.
    pub(super) pressured: Duration,
}

impl Timeouts {
    /// When to look at a connection again, or whether to close it now.
    pub(super) fn next(&self, activity: &Activity, now: Instant, pressured: bool) -> Next {
        let started = activity.started.load(Ordering::SeqCst);
        let in_flight = activity.in_flight.load(Ordering::SeqCst);
        let (since, wait, reason) = if started == 0 {
            if activity.heard.load(Ordering::Relaxed) {
                (activity.opened, self.first_request, CloseReason::NoRequest)
            } else {
                (activity.opened, self.first_bytes, CloseReason::Silent)
            }
        } else if in_flight > 0 {
            // Busy: nothing to decide before the idle timeout could run out.
            return Next::At(now + self.idle);
        } else {
            let last_end = Duration::from_nanos(activity.last_end.load(Ordering::SeqCst));
            (activity.opened + last_end, self.idle, CloseReason::Idle)
        };
        let wait = if pressured {
            wait.min(self.pressured)
        } else {
            wait
        };
        let deadline = since + wait;
        if now >= deadline {
            Next::Close(reason)
        } else {
            Next::At(deadline)
        }
    }
}

#[cfg(test)]
mod tests;

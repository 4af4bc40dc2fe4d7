//! Waiting for what a test expects, without fixed sleeps: [`poll`] a probe
//! until it gives a value or a deadline passes. One interval ([`POLL`]) and
//! two deadlines ([`SOON`], [`SERVED`]) for every test, the test bed and the
//! `soak`/`bench` binaries.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Pause between two probes of a poll.
pub const POLL: Duration = Duration::from_millis(100);

/// Deadline for what should follow at once: a binding taking effect, a Status
/// or a log line showing, a small channel served.
pub const SOON: Duration = Duration::from_secs(60);

/// Deadline for channel data pulled, parsed and served by a debug build:
/// large generated channels, or a server under faults.
pub const SERVED: Duration = Duration::from_secs(90);

/// Polls `probe` every [`POLL`] until it gives a value, for at most [`SOON`].
/// Unlike [`poll`], an error from `probe` ends the poll at once: probes use
/// it for answers that must never be wrong while waiting.
pub async fn soon<T>(what: &str, mut probe: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + SOON;
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("{what}: not after {SOON:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `probe` every `interval` (usually [`POLL`]) until it gives a value,
/// failing after `deadline` (usually [`SOON`] or [`SERVED`]) with the last
/// thing it said; an error from `probe` is retried. Returns the value and the
/// time taken.
pub async fn poll<T, F, Fut>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<(T, Duration)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    loop {
        let last = match probe().await {
            Ok(Some(value)) => return Ok((value, started.elapsed())),
            Ok(None) => "not yet".to_owned(),
            Err(error) => format!("{error:#}"),
        };
        if started.elapsed() >= deadline {
            bail!("{what}: not reached after {deadline:?}; last: {last}");
        }
        tokio::time::sleep(interval).await;
    }
}

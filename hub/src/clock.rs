//! resourceVersions: numbers of this process, below 2^53 so that a JavaScript client (the
//! Rancher dashboard keeps them as Numbers) holds them exactly.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// Bits of the sequence: about 6.9 × 10^10 changes per process life (two years at 1,000
/// changes a second).
const SEQUENCE_BITS: u32 = 36;
/// Bits of the epoch: 131,071 values; with the sequence, every resourceVersion is below
/// 2^53 (JavaScript's `Number.MAX_SAFE_INTEGER` is 2^53 − 1).
const EPOCH_BITS: u32 = 17;

/// The largest integer a JavaScript Number holds exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The resourceVersions of this process: `epoch << 36 | sequence`, written in decimal. One
/// clock is shared by every hub of the process, so a resourceVersion names one instant of it.
#[derive(Debug)]
pub struct Clock {
    epoch: u64,
    last: AtomicU64,
}

/// A resourceVersion of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceVersion(u64);

impl ResourceVersion {
    /// As clients see it.
    pub fn text(self) -> String {
        self.0.to_string()
    }
}

impl std::fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Clock {
    /// A clock with a random epoch (never 0), so that two processes almost never share one
    /// (1 in 131,071).
    pub fn new() -> Arc<Self> {
        let epoch = (u64::from(rand_epoch()) % ((1 << EPOCH_BITS) - 1)) + 1;
        Arc::new(Self::with_epoch(epoch))
    }

    /// A clock with `epoch` (tests; taken modulo the epoch's bits).
    pub fn with_epoch(epoch: u64) -> Self {
        let epoch = epoch % (1 << EPOCH_BITS);
        Self {
            epoch,
            last: AtomicU64::new(epoch << SEQUENCE_BITS),
        }
    }

    /// The next resourceVersion. The sequence saturates at its end rather than running into
    /// the next epoch (after 6.9 × 10^10 changes every change would share the last number:
    /// restart the process long before).
    pub(crate) fn next(&self) -> ResourceVersion {
        let end = (self.epoch << SEQUENCE_BITS) | ((1 << SEQUENCE_BITS) - 1);
        let previous = self
            .last
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some((v + 1).min(end))
            })
            .unwrap_or(end);
        ResourceVersion((previous + 1).min(end))
    }

    /// The last resourceVersion given.
    pub fn now(&self) -> ResourceVersion {
        ResourceVersion(self.last.load(Ordering::SeqCst))
    }

    /// `text` as a resourceVersion of this process, or why it cannot be served. A number of
    /// this process not reached yet is one (a watch from it waits for it, as kube-apiserver's
    /// watch cache does).
    pub fn parse(&self, text: &str) -> Result<ResourceVersion, Expired> {
        let value: u64 = text.parse().map_err(|_| Expired::Invalid)?;
        if value >> SEQUENCE_BITS != self.epoch {
            return Err(Expired::OtherProcess);
        }
        Ok(ResourceVersion(value))
    }
}

fn rand_epoch() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    // Truncation intended: any 32 bits of the hash.
    #[allow(clippy::cast_possible_truncation)]
    let bits = hasher.finish() as u32;
    bits
}

/// Why a watch cannot start from the resourceVersion asked. Each is a `410 Expired` whose
/// message says "too old resource version", the words on which client-go and the Rancher
/// dashboard list again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Expired {
    /// Not a number.
    #[error("too old resource version: not a resourceVersion this server gave")]
    Invalid,
    /// A resourceVersion of another replica or of an earlier run of this one.
    #[error("too old resource version: it was given by another replica or before a restart")]
    OtherProcess,
    /// Older than the events this replica keeps.
    #[error("too old resource version: the events after it are no longer kept")]
    Compacted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_version_is_a_javascript_safe_integer() {
        for epoch in [1, 2, (1 << EPOCH_BITS) - 1, 12_345] {
            let clock = Clock::with_epoch(epoch);
            clock.last.store(
                (epoch << SEQUENCE_BITS) | ((1 << SEQUENCE_BITS) - 3),
                Ordering::SeqCst,
            );
            for _ in 0..5 {
                let rv = clock.next();
                assert!(rv.0 <= MAX_SAFE_INTEGER, "{rv}");
                // What a JavaScript Number makes of it is the same number.
                #[allow(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss
                )]
                let through_js = (rv.0 as f64) as u64;
                assert_eq!(through_js, rv.0);
                assert_eq!(clock.parse(&rv.text()), Ok(rv));
            }
            // Saturated, never into the next epoch.
            assert_eq!(clock.next(), clock.now());
        }
        let random = Clock::new();
        assert!(random.next().0 <= MAX_SAFE_INTEGER);
    }

    #[test]
    fn numbers_of_another_process_or_not_numbers_are_expired() {
        let clock = Clock::with_epoch(5);
        let other = Clock::with_epoch(6);
        assert_eq!(
            clock.parse(&other.next().text()),
            Err(Expired::OtherProcess)
        );
        assert_eq!(clock.parse("abc"), Err(Expired::Invalid));
        assert_eq!(clock.parse("-1"), Err(Expired::Invalid));
        // Not reached yet: a resourceVersion all the same (a watch from it waits).
        let future = ResourceVersion(clock.now().0 + 1000);
        assert_eq!(clock.parse(&future.text()), Ok(future));
    }
}

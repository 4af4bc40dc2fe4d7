//! The refusals' rate limit: a token bucket per source address (a burst of [`BURST`] lines,
//! then [`PER_SECOND`] a second), at most [`MAX_SOURCES`] sources tracked (the rest share
//! one bucket), and the lines left out counted per source for the summary.

use std::{collections::HashMap, fmt, net::IpAddr};

use tokio::time::Instant;

/// Lines one source may write at once.
pub const BURST: u32 = 50;
/// Lines one source may write a second after its burst.
pub const PER_SECOND: u32 = 1;
/// Sources tracked one by one; refusals from further ones share one bucket ([`Source::Others`]).
pub const MAX_SOURCES: usize = 1024;

/// Where refusals come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// A client address (without its port).
    Addr(IpAddr),
    /// A request whose address is not known.
    Unknown,
    /// Any source past [`MAX_SOURCES`].
    Others,
}

impl Source {
    /// The source of a request from `addr`.
    pub fn of(addr: Option<std::net::SocketAddr>) -> Self {
        addr.map_or(Self::Unknown, |addr| Self::Addr(addr.ip()))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(ip) => ip.fmt(f),
            Self::Unknown => f.write_str("an unknown address"),
            Self::Others => f.write_str("other sources"),
        }
    }
}

#[derive(Debug)]
struct Bucket {
    /// Lines it may write now, in thousandths.
    milli_tokens: u64,
    at: Instant,
    left_out: u64,
}

impl Bucket {
    fn full(now: Instant) -> Self {
        Self {
            milli_tokens: u64::from(BURST) * 1000,
            at: now,
            left_out: 0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at);
        let earned = u64::try_from(elapsed.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(PER_SECOND));
        self.milli_tokens = self
            .milli_tokens
            .saturating_add(earned)
            .min(u64::from(BURST) * 1000);
        self.at = now;
    }

    fn is_idle(&self) -> bool {
        self.left_out == 0 && self.milli_tokens >= u64::from(BURST) * 1000
    }
}

/// The buckets of the sources seen lately.
#[derive(Debug, Default)]
pub struct Limiter {
    sources: HashMap<Source, Bucket>,
}

impl Limiter {
    /// Whether a refusal from `source` may be written now; counted as left out when not.
    pub fn admit(&mut self, source: Source, now: Instant) -> bool {
        let source = if self.sources.contains_key(&source) || self.sources.len() < MAX_SOURCES {
            source
        } else {
            Source::Others
        };
        let bucket = self
            .sources
            .entry(source)
            .or_insert_with(|| Bucket::full(now));
        bucket.refill(now);
        if bucket.milli_tokens >= 1000 {
            bucket.milli_tokens -= 1000;
            true
        } else {
            bucket.left_out = bucket.left_out.saturating_add(1);
            false
        }
    }

    /// The refusals left out by source (sorted), reset; sources back to a full bucket with
    /// nothing left out are forgotten.
    pub fn drain(&mut self, now: Instant) -> Vec<(Source, u64)> {
        let mut out = Vec::new();
        for (source, bucket) in &mut self.sources {
            bucket.refill(now);
            if bucket.left_out > 0 {
                out.push((*source, std::mem::take(&mut bucket.left_out)));
            }
        }
        self.sources.retain(|_, bucket| !bucket.is_idle());
        out.sort();
        out
    }

    /// Sources tracked now.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether no source is tracked.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}

#[cfg(test)]
mod tests;

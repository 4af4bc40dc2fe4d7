use std::{net::Ipv4Addr, time::Duration};

use super::*;

fn addr(last: u8) -> Source {
    Source::Addr(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
}

/// A flood from one source writes its burst, then one line a second; the rest is counted,
/// and another source is not held back by it.
#[test]
fn a_flood_is_cut_to_its_rate_and_counted() {
    let start = Instant::now();
    let mut limiter = Limiter::default();
    let written = (0..10_000)
        .filter(|_| limiter.admit(addr(1), start))
        .count();
    assert_eq!(written, BURST as usize);
    assert!(
        limiter.admit(addr(2), start),
        "another source was held back"
    );
    // Ten seconds later, ten more lines of the next 10,000.
    let later = start + Duration::from_secs(10);
    let written = (0..10_000)
        .filter(|_| limiter.admit(addr(1), later))
        .count();
    assert_eq!(written, 10 * PER_SECOND as usize);
    let left_out = limiter.drain(later);
    assert_eq!(
        left_out,
        [(addr(1), 20_000 - (BURST + 10 * PER_SECOND) as u64)]
    );
    // Told once; a source back to its whole burst is forgotten (the second one), the
    // flooding one is not yet.
    assert_eq!(limiter.drain(later), []);
    assert_eq!(limiter.len(), 1);
    let _ = limiter.drain(later + Duration::from_secs(3600));
    assert!(limiter.is_empty());
}

/// Past the sources tracked, new ones share one bucket: the table is bounded.
#[test]
fn sources_are_bounded() {
    let now = Instant::now();
    let mut limiter = Limiter::default();
    for i in 0..(MAX_SOURCES as u32 + 5_000) {
        let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        for _ in 0..(BURST + 1) {
            limiter.admit(Source::Addr(ip), now);
        }
    }
    assert_eq!(limiter.len(), MAX_SOURCES + 1);
    let left_out = limiter.drain(now);
    let others = left_out
        .iter()
        .find(|(source, _)| *source == Source::Others)
        .map(|(_, n)| *n);
    assert_eq!(
        others,
        Some(5_000 * u64::from(BURST + 1) - u64::from(BURST))
    );
    assert_eq!(Source::Others.to_string(), "other sources");
    assert_eq!(Source::of(None).to_string(), "an unknown address");
}

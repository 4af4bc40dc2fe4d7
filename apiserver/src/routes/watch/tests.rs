//! Watch limits and timeouts: the slots' reserve (no small set of users takes every watch)
//! and `timeoutSeconds` read as kube-apiserver reads it, no value panicking.

use std::{sync::Arc, time::Duration};

use super::*;

fn take(slots: &Arc<WatchSlots>, user: &str) -> Result<WatchSlot, WatchLimit> {
    slots.take(user, Box::new(()))
}

/// Takes watches for `user` until one is refused: the slots held and the refusal.
fn fill(
    slots: &Arc<WatchSlots>,
    user: &str,
    at_most: usize,
) -> (Vec<WatchSlot>, Option<WatchLimit>) {
    let mut held = Vec::new();
    for _ in 0..at_most {
        match take(slots, user) {
            Ok(slot) => held.push(slot),
            Err(limit) => return (held, Some(limit)),
        }
    }
    (held, None)
}

/// The default limits (1,000, 100 per user): ten users asking 100 watches each get 900 in
/// all (the ninth fills what is not reserved, the tenth gets its reserved few), and then
/// 24 more users still get theirs.
#[test]
fn ten_users_cannot_take_every_watch() {
    let slots = WatchSlots::new(1000, 100);
    let mut held = Vec::new();
    for user in 0..10 {
        let (slots_held, refused) = fill(&slots, &format!("hog-{user}"), 100);
        let expected = if user < 9 { 100 } else { RESERVED_PER_USER };
        assert_eq!(slots_held.len(), expected, "hog-{user}");
        if user == 9 {
            assert_eq!(refused, Some(WatchLimit::Total));
        }
        held.extend(slots_held);
    }
    assert_eq!(slots.open(), 900 + RESERVED_PER_USER);
    // A hog gets nothing more: at its own limit, or at the reserve's share.
    assert_eq!(take(&slots, "hog-0").err(), Some(WatchLimit::PerUser));
    assert_eq!(take(&slots, "hog-9").err(), Some(WatchLimit::Total));
    // Everyone else does, up to the reserve's share each, until it is spent.
    for user in 0..24 {
        let (others, refused) = fill(&slots, &format!("user-{user}"), RESERVED_PER_USER + 1);
        assert_eq!(others.len(), RESERVED_PER_USER, "user-{user}");
        assert_eq!(refused, Some(WatchLimit::Total), "user-{user}");
        held.extend(others);
    }
    assert_eq!(slots.open(), 1000);
    assert_eq!(take(&slots, "late").err(), Some(WatchLimit::Total));
    // A watch that ends gives its slot back, to whoever is under the reserve's share.
    held.pop();
    assert!(take(&slots, "late").is_ok());
}

/// Below the reserve, only `--max-watches-per-user` limits one user; slots come back when
/// watches end, and a user's count with them.
#[test]
fn per_user_limit_and_slots_given_back() {
    let slots = WatchSlots::new(1000, 6);
    let (held, refused) = fill(&slots, "alice", 10);
    assert_eq!((held.len(), refused), (6, Some(WatchLimit::PerUser)));
    assert!(take(&slots, "bob").is_ok_and(|slot| {
        drop(slot);
        true
    }));
    drop(held);
    assert_eq!(slots.open(), 0);
    assert!(slots.lock().by_user.is_empty(), "no count is left behind");
    let (held, _) = fill(&slots, "alice", 10);
    assert_eq!(held.len(), 6);
}

/// Small limits: no reserve under ten slots, and the total holds.
#[test]
fn small_limits() {
    let slots = WatchSlots::new(3, 100);
    let (held, refused) = fill(&slots, "alice", 10);
    assert_eq!((held.len(), refused), (3, Some(WatchLimit::Total)));
    let none = WatchSlots::new(0, 100);
    assert_eq!(take(&none, "alice").err(), Some(WatchLimit::Total));
}

fn timeout_of(seconds: Option<i64>) -> Duration {
    timeout(&WatchParams {
        timeout_seconds: seconds,
        ..WatchParams::default()
    })
}

/// kube-apiserver's reading of `timeoutSeconds` (`handlers/get.go`): none or 0, the
/// default spread; negative, over at once; positive, that many seconds, here at most
/// [`MAX_WATCH_TIMEOUT`] (where kube-apiserver's multiplication would overflow).
#[test]
fn timeout_seconds_as_kube_apiserver_reads_them() {
    for default in [timeout_of(None), timeout_of(Some(0))] {
        assert!(
            (MIN_WATCH_TIMEOUT..=2 * MIN_WATCH_TIMEOUT).contains(&default),
            "{default:?}"
        );
    }
    assert_eq!(timeout_of(Some(-1)), Duration::ZERO);
    assert_eq!(timeout_of(Some(i64::MIN)), Duration::ZERO);
    assert_eq!(timeout_of(Some(5)), Duration::from_secs(5));
    assert_eq!(
        timeout_of(Some(9_223_372_036)),
        Duration::from_secs(9_223_372_036)
    );
    assert_eq!(MAX_WATCH_TIMEOUT, Duration::from_secs(9_223_372_036));
    for huge in [9_223_372_037, i64::MAX] {
        assert_eq!(timeout_of(Some(huge)), MAX_WATCH_TIMEOUT, "{huge}");
    }
}

/// Every `timeoutSeconds` gives a deadline the clock holds: `now` plus the longest is no
/// overflow (it was: `Instant + Duration::from_secs(i64::MAX)` panicked the watch task).
#[test]
fn every_timeout_is_a_deadline() {
    let now = tokio::time::Instant::now();
    for seconds in [i64::MIN, -1, 0, 1, 9_223_372_036, 9_223_372_037, i64::MAX] {
        assert!(
            now.checked_add(timeout_of(Some(seconds))).is_some(),
            "{seconds}"
        );
    }
}

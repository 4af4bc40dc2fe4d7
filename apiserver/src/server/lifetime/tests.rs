use std::time::Duration;

use tokio::time::Instant;

use super::{Activity, CloseReason, Next, Timeouts};
use crate::server::heads::Pool;

const TIMEOUTS: Timeouts = Timeouts {
    first_bytes: Duration::from_secs(10),
    first_request: Duration::from_secs(30),
    idle: Duration::from_secs(90),
    pressured: Duration::from_secs(5),
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_first_bytes_timeout() {
    let opened = Instant::now();
    let activity = Activity::new(opened, Pool::new(0));
    assert_eq!(
        TIMEOUTS.next(&activity, opened, false),
        Next::At(opened + secs(10))
    );
    assert_eq!(
        TIMEOUTS.next(&activity, opened + secs(10), false),
        Next::Close(CloseReason::Silent)
    );
}

#[tokio::test(start_paused = true)]
async fn bytes_without_a_request_are_closed_after_the_first_request_timeout() {
    let opened = Instant::now();
    let activity = Activity::new(opened, Pool::new(0));
    activity.heard(1).expect("free");
    assert_eq!(
        TIMEOUTS.next(&activity, opened + secs(10), false),
        Next::At(opened + secs(30))
    );
    assert_eq!(
        TIMEOUTS.next(&activity, opened + secs(31), false),
        Next::Close(CloseReason::NoRequest)
    );
}

#[tokio::test(start_paused = true)]
async fn idle_counts_from_the_end_of_the_last_request() {
    let opened = Instant::now();
    let activity = Activity::new(opened, Pool::new(0));
    activity.heard(1).expect("free");
    let request = activity.request();
    tokio::time::advance(secs(100)).await;
    // In flight for longer than the idle timeout: not idle.
    let now = Instant::now();
    assert_eq!(
        TIMEOUTS.next(&activity, now, false),
        Next::At(now + secs(90))
    );
    drop(request);
    let ended = Instant::now();
    assert_eq!(
        TIMEOUTS.next(&activity, ended + secs(89), false),
        Next::At(ended + secs(90))
    );
    assert_eq!(
        TIMEOUTS.next(&activity, ended + secs(90), false),
        Next::Close(CloseReason::Idle)
    );
    // A second request, overlapping another: idle from the end of the last one.
    tokio::time::advance(secs(10)).await;
    let first = activity.request();
    let second = activity.request();
    tokio::time::advance(secs(1)).await;
    drop(second);
    let now = Instant::now();
    assert_eq!(
        TIMEOUTS.next(&activity, now, false),
        Next::At(now + secs(90))
    );
    tokio::time::advance(secs(1)).await;
    drop(first);
    let ended = Instant::now();
    assert_eq!(
        TIMEOUTS.next(&activity, ended, false),
        Next::At(ended + secs(90))
    );
}

#[tokio::test(start_paused = true)]
async fn pressure_shortens_every_wait() {
    let opened = Instant::now();
    let activity = Activity::new(opened, Pool::new(0));
    assert_eq!(
        TIMEOUTS.next(&activity, opened, true),
        Next::At(opened + secs(5))
    );
    activity.heard(1).expect("free");
    assert_eq!(
        TIMEOUTS.next(&activity, opened + secs(5), true),
        Next::Close(CloseReason::NoRequest)
    );
    drop(activity.request());
    let ended = Instant::now();
    assert_eq!(
        TIMEOUTS.next(&activity, ended + secs(6), true),
        Next::Close(CloseReason::Idle)
    );
    // Pressure over: the full idle timeout again.
    assert_eq!(
        TIMEOUTS.next(&activity, ended + secs(6), false),
        Next::At(ended + secs(90))
    );
}

#[test]
fn only_idle_connections_are_shut_down_gracefully() {
    assert!(CloseReason::Idle.graceful());
    assert!(!CloseReason::Silent.graceful());
    assert!(!CloseReason::NoRequest.graceful());
}

//! The channel controller and workers, driven by watcher events and a fake
//! image source, on paused time.

use super::*;

#[test]
fn backoff_doubles_from_the_minimum_up_to_the_interval() {
    let hour = Duration::from_secs(3600);
    assert_eq!(next_wait(0, hour), hour);
    assert_eq!(next_wait(1, hour), Duration::from_secs(2));
    assert_eq!(next_wait(2, hour), Duration::from_secs(4));
    assert_eq!(next_wait(5, hour), Duration::from_secs(32));
    assert_eq!(next_wait(11, hour), Duration::from_secs(2048));
    assert_eq!(next_wait(12, hour), hour, "capped by the interval");
    assert_eq!(next_wait(u32::MAX, hour), hour, "no overflow");
    assert_eq!(next_wait(3, Duration::from_secs(5)), Duration::from_secs(5));
}

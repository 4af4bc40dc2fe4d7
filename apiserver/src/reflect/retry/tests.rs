//! Which errors a watch backs off from, and how long.

use std::time::Duration;

use kube::core::Status;

use super::*;

fn api(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(Status::failure("x", "").with_code(code)))
}

fn transport() -> kube::Error {
    kube::Error::ReadEvents(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
}

#[test]
fn causes() {
    let gone =
        Box::new(Status::failure("too old resource version: 1 (2)", "Expired").with_code(410));
    assert_eq!(Cause::of(&watcher::Error::WatchError(gone)), Cause::Expired);
    assert_eq!(
        Cause::of(&watcher::Error::InitialListFailed(api(410))),
        Cause::Expired
    );
    for code in [429, 500, 503, 504] {
        assert_eq!(
            Cause::of(&watcher::Error::WatchStartFailed(api(code))),
            Cause::Unavailable,
            "{code}"
        );
    }
    assert_eq!(
        Cause::of(&watcher::Error::WatchFailed(transport())),
        Cause::Unavailable
    );
    assert_eq!(
        Cause::of(&watcher::Error::InitialListFailed(kube::Error::Service(
            "connection refused".into()
        ))),
        Cause::Unavailable
    );
    for code in [400, 401, 403, 404] {
        assert_eq!(
            Cause::of(&watcher::Error::InitialListFailed(api(code))),
            Cause::Failed,
            "{code}"
        );
    }
    assert_eq!(Cause::of(&watcher::Error::NoResourceVersion), Cause::Failed);
}

/// A 410 lists again at once; another within a minute waits as a failure; one a minute
/// later lists at once again.
#[tokio::test(start_paused = true)]
async fn expired_lists_again_at_once_but_not_in_a_loop() {
    let mut retry = Retry::default();
    assert_eq!(retry.after(Cause::Expired), Duration::ZERO);
    let again = retry.after(Cause::Expired);
    assert!(again >= Duration::from_millis(800), "{again:?}");
    tokio::time::advance(EXPIRED_AGAIN).await;
    assert_eq!(retry.after(Cause::Expired), Duration::ZERO);
}

/// While kube-apiserver is unavailable the waits stay short (at most twice
/// [`UNAVAILABLE_MOST`] with jitter) however long it lasts; failures grow to kube-runtime's
/// 30 s (60 s with jitter); an event resets both.
#[tokio::test(start_paused = true)]
async fn unavailable_stays_short_failures_grow() {
    let mut retry = Retry::default();
    let waits: Vec<_> = (0..20).map(|_| retry.after(Cause::Unavailable)).collect();
    assert!(waits[0] >= UNAVAILABLE_FIRST && waits[0] <= 2 * UNAVAILABLE_FIRST);
    assert!(
        waits.iter().all(|w| *w <= 2 * UNAVAILABLE_MOST),
        "{waits:?}"
    );
    let failures: Vec<_> = (0..10).map(|_| retry.after(Cause::Failed)).collect();
    assert!(failures[9] >= Duration::from_secs(30), "{failures:?}");
    retry.reset();
    assert!(retry.after(Cause::Failed) <= Duration::from_millis(1600));
    assert!(retry.after(Cause::Unavailable) <= 2 * UNAVAILABLE_FIRST);
}

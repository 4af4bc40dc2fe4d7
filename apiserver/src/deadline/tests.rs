use std::time::Duration;

use futures::StreamExt as _;
use tokio::{sync::oneshot, time::Instant};

use super::{Bounded, Executor, GRACE, bound, clear, set};

/// Tells when it is dropped.
struct Guard(Option<oneshot::Sender<Instant>>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Instant::now());
        }
    }
}

fn guard() -> (Guard, oneshot::Receiver<Instant>) {
    let (tx, rx) = oneshot::channel();
    (Guard(Some(tx)), rx)
}

#[tokio::test(start_paused = true)]
async fn a_pending_future_is_dropped_at_its_deadline() {
    let (guard, dropped) = guard();
    let started = Instant::now();
    let output = Bounded::new(async move {
        let _guard = guard;
        assert!(set(Duration::from_secs(10)));
        std::future::pending::<()>().await;
    })
    .await;
    assert_eq!(output, None);
    let dropped = dropped.await.expect("the future was dropped");
    assert_eq!(dropped - started, Duration::from_secs(10) + GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_future_that_finishes_is_not_touched() {
    let started = Instant::now();
    let output = Bounded::new(async {
        set(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(5)).await;
        7
    })
    .await;
    assert_eq!(output, Some(7));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_future_without_a_deadline_runs_as_long_as_it_likes() {
    let started = Instant::now();
    let output = Bounded::new(async {
        tokio::time::sleep(Duration::from_secs(86_400)).await;
    })
    .await;
    assert_eq!(output, Some(()));
    assert_eq!(started.elapsed(), Duration::from_secs(86_400));
}

/// An HTTP/1 connection: a watch's body ended, then the connection serves on.
#[tokio::test(start_paused = true)]
async fn a_body_that_ended_clears_its_deadline() {
    let started = Instant::now();
    let output = Bounded::new(async {
        let body = bound(futures::stream::iter([1, 2, 3]), Duration::from_secs(1));
        let items: Vec<i32> = body.collect().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        items
    })
    .await;
    assert_eq!(output, Some(vec![1, 2, 3]));
    assert_eq!(started.elapsed(), Duration::from_secs(60));
}

/// An HTTP/1 connection: a body that has not ended when its deadline passes ends the
/// connection, however far its client got.
#[tokio::test(start_paused = true)]
async fn a_body_that_has_not_ended_is_dropped_at_its_deadline() {
    let (guard, dropped) = guard();
    let started = Instant::now();
    let output = Bounded::new(async move {
        let body = bound(
            futures::stream::iter([1, 2]).chain(futures::stream::pending()),
            Duration::from_secs(3),
        );
        let _guard = guard;
        body.collect::<Vec<i32>>().await
    })
    .await;
    assert_eq!(output, None);
    let dropped = dropped.await.expect("the future was dropped");
    assert_eq!(dropped - started, Duration::from_secs(3) + GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_later_deadline_replaces_an_earlier_one() {
    let started = Instant::now();
    let output = Bounded::new(async {
        set(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(500)).await;
        set(Duration::from_secs(10));
        std::future::pending::<()>().await;
    })
    .await;
    assert_eq!(output, None);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500) + Duration::from_secs(10) + GRACE
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_too_far_to_compute_is_none() {
    let started = Instant::now();
    let output = Bounded::new(async {
        assert!(set(Duration::MAX));
        assert!(set(Duration::from_secs(u64::MAX)));
        tokio::time::sleep(Duration::from_secs(86_400)).await;
    })
    .await;
    assert_eq!(output, Some(()));
    assert_eq!(started.elapsed(), Duration::from_secs(86_400));
}

#[tokio::test]
async fn outside_a_bounded_future_nothing_is_set() {
    assert!(!set(Duration::from_secs(1)));
    clear();
    let items: Vec<i32> = bound(futures::stream::iter([1, 2]), Duration::ZERO)
        .collect()
        .await;
    assert_eq!(items, [1, 2]);
}

/// What hyper spawns (an HTTP/2 stream's task) is dropped at the deadline its request set,
/// and only then; one that finishes first is not.
#[tokio::test(start_paused = true)]
async fn the_executor_drops_what_it_spawned_at_its_deadline() {
    use hyper::rt::Executor as _;
    let started = Instant::now();
    let (stuck, stuck_dropped) = guard();
    Executor.execute(async move {
        let _guard = stuck;
        set(Duration::from_secs(3));
        std::future::pending::<()>().await;
    });
    let (done_tx, done) = oneshot::channel();
    Executor.execute(async move {
        set(Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = done_tx.send(Instant::now());
    });
    let done = done.await.expect("the finishing future ran to its end");
    assert_eq!(done - started, Duration::from_secs(1));
    let dropped = stuck_dropped.await.expect("the stuck future was dropped");
    assert_eq!(dropped - started, Duration::from_secs(3) + GRACE);
}

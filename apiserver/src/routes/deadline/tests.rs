use super::*;

/// A request that waits for a compute slot past its deadline is refused by the wait
/// (counted as `compute_queue`), not by the request's own timeout (`request_timeout`).
#[tokio::test(start_paused = true)]
async fn a_wait_for_a_slot_ends_at_the_deadline_and_says_so() {
    let slots = Arc::new(Semaphore::new(1));
    let held = slots.clone().acquire_owned().await;
    let started = Instant::now();
    let outcome = within(Duration::from_secs(60), compute_slot(slots.clone())).await;
    assert_eq!(outcome.map(|r| r.err()), Some(Some(SlotRefused::Deadline)));
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    drop(held);
    // A free slot is had at once.
    let outcome = within(Duration::from_secs(60), compute_slot(slots)).await;
    assert!(matches!(outcome, Some(Ok(_))));
}

/// Anything else that outlasts the deadline is the request's own timeout.
#[tokio::test(start_paused = true)]
async fn other_work_past_the_deadline_is_the_request_timeout() {
    let outcome = within(
        Duration::from_secs(1),
        tokio::time::sleep(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(outcome, None);
}

/// Outside a request (a background render) a wait has no deadline.
#[tokio::test(start_paused = true)]
async fn without_a_request_the_wait_has_no_deadline() {
    let slots = Arc::new(Semaphore::new(1));
    let held = slots.clone().acquire_owned().await;
    let waiting = tokio::spawn(compute_slot(slots.clone()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!waiting.is_finished());
    drop(held);
    assert!(waiting.await.map(|r| r.is_ok()).unwrap_or(false));
    slots.close();
    assert_eq!(compute_slot(slots).await.err(), Some(SlotRefused::Closed));
}

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

/// What operations.md says `refused_total{limit="compute_queue"}` counts: a request whose wait
/// for a compute slot outlasted its deadline, answered 504 `Timeout`; nothing else counted.
#[tokio::test(start_paused = true)]
async fn a_request_past_its_deadline_for_a_slot_is_counted_as_compute_queue() {
    let registry = crate::metrics::Registry::default();
    let metrics: Arc<ServingMetrics> = registry.register();
    let slots = Arc::new(Semaphore::new(1));
    let held = slots.clone().acquire_owned().await;
    let answer = within(
        Duration::from_secs(60),
        request_slot(slots.clone(), &metrics),
    )
    .await;
    let error = answer
        .expect("the request's own timeout fired first")
        .expect_err("a slot was had");
    assert_eq!(error.code(), 504);
    let text = String::from_utf8(registry.encode()).unwrap_or_default();
    assert!(
        text.contains(r#"elemental_changelog_refused_total{limit="compute_queue"} 1"#),
        "{text}"
    );
    assert!(!text.contains(r#"limit="request_timeout""#), "{text}");
    drop(held);
    assert!(request_slot(slots, &metrics).await.is_ok());
}

//! The deadline of one request (`--request-timeout`), known to whatever waits on its behalf:
//! a wait for a compute slot (`--max-compute-concurrency`) ends at the deadline and is told
//! apart (`refused_total{limit="compute_queue"}`) from a request that ran out of time
//! elsewhere (`request_timeout`).

use std::{future::Future, sync::Arc, time::Duration};

use elemental_changelog_apiservice::status::StatusError;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use super::{
    RETRY_AFTER_TOO_MANY,
    metrics::{ServingLimit, ServingMetrics},
};

tokio::task_local! {
    /// When the request being answered must end.
    static DEADLINE: Instant;
}

/// Why no compute slot was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRefused {
    /// The request's deadline passed while it waited.
    Deadline,
    /// The slots are closed (the server is stopping).
    Closed,
}

/// Runs `answer` under a deadline `timeout` from now, which waits inside it know; `None`
/// when the deadline passed first. A wait that ends at the deadline itself (a compute slot)
/// is polled before the deadline here, so it answers for itself.
pub async fn within<F: Future>(timeout: Duration, answer: F) -> Option<F::Output> {
    let deadline = Instant::now() + timeout;
    tokio::time::timeout_at(deadline, DEADLINE.scope(deadline, answer))
        .await
        .ok()
}

/// Waits for a compute slot, until the request's deadline when there is one.
pub async fn compute_slot(slots: Arc<Semaphore>) -> Result<OwnedSemaphorePermit, SlotRefused> {
    let acquire = slots.acquire_owned();
    let acquired = match DEADLINE.try_with(|deadline| *deadline) {
        Ok(deadline) => tokio::time::timeout_at(deadline, acquire)
            .await
            .map_err(|_| SlotRefused::Deadline)?,
        Err(_) => acquire.await,
    };
    acquired.map_err(|_| SlotRefused::Closed)
}

/// A compute slot for a request: waited for until its deadline. A wait that outlasts it is a
/// 504 `Timeout` counted as `refused_total{limit="compute_queue"}`; closed slots a 429,
/// counted the same.
pub async fn request_slot(
    slots: Arc<Semaphore>,
    metrics: &ServingMetrics,
) -> Result<OwnedSemaphorePermit, StatusError> {
    compute_slot(slots).await.map_err(|refused| {
        metrics.request_refused(ServingLimit::ComputeQueue);
        match refused {
            SlotRefused::Deadline => {
                StatusError::timeout("request did not complete within the allotted timeout", None)
            }
            SlotRefused::Closed => StatusError::too_many_requests(RETRY_AFTER_TOO_MANY),
        }
    })
}

#[cfg(test)]
mod tests;

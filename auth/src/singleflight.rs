//! Single flight: concurrent calls for the same key share one run of the
//! work, as Go's `golang.org/x/sync/singleflight` (`DoChan`).
//!
//! The work runs in its own task, so a caller that goes away does not cancel
//! it for the others, and a run that panics is reported to every caller as a
//! [`tokio::task::JoinError`]. A key is in flight from the first call until
//! its task ends; the next call after that starts a new run. Used by the
//! review cache of the kube API webhooks (one TokenReview or
//! SubjectAccessReview per key).

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use futures::future::{BoxFuture, FutureExt as _, Shared};

/// The outcome of a run as every caller sees it: the work's output, or the
/// reason its task did not finish (a panic, or the runtime shutting down).
pub type Outcome<V> = Result<V, Arc<tokio::task::JoinError>>;

type Call<V> = Shared<BoxFuture<'static, Outcome<V>>>;

/// Runs of work in flight, by key. Cheap to clone; clones share the table.
pub struct SingleFlight<K, V> {
    calls: Arc<Mutex<HashMap<K, Call<V>>>>,
}

impl<K, V> Clone for SingleFlight<K, V> {
    fn clone(&self) -> Self {
        Self {
            calls: Arc::clone(&self.calls),
        }
    }
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        Self {
            calls: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<K, V> fmt::Debug for SingleFlight<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("in_flight", &lock(&self.calls).len())
            .finish()
    }
}

fn lock<K, V>(calls: &Mutex<HashMap<K, Call<V>>>) -> MutexGuard<'_, HashMap<K, Call<V>>> {
    // The critical sections only insert or remove one entry; a panic cannot
    // leave the map half done.
    calls.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a key out of the table when its task ends, panics included.
struct Leave<K: Eq + Hash, V> {
    calls: Arc<Mutex<HashMap<K, Call<V>>>>,
    key: K,
}

impl<K: Eq + Hash, V> Drop for Leave<K, V> {
    fn drop(&mut self) {
        lock(&self.calls).remove(&self.key);
    }
}

impl<K, V> SingleFlight<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The output of the run in flight for `key`, or else of `work`, started
    /// now in its own task. `work` is dropped unpolled when a run for `key`
    /// is already in flight.
    pub async fn run<F>(&self, key: K, work: F) -> Outcome<V>
    where
        F: Future<Output = V> + Send + 'static,
    {
        let call = {
            let mut calls = lock(&self.calls);
            if let Some(call) = calls.get(&key) {
                call.clone()
            } else {
                let leave = Leave {
                    calls: Arc::clone(&self.calls),
                    key: key.clone(),
                };
                // Spawned while the table is locked: the task's `Leave` cannot
                // remove the key before it is inserted below.
                let task = tokio::spawn(async move {
                    let output = work.await;
                    drop(leave);
                    output
                });
                let call = async move { task.await.map_err(Arc::new) }.boxed().shared();
                calls.insert(key, call.clone());
                call
            }
        };
        call.await
    }

    /// Whether a run for `key` is in flight.
    pub fn in_flight(&self, key: &K) -> bool {
        lock(&self.calls).contains_key(key)
    }

    /// How many runs are in flight.
    pub fn len(&self) -> usize {
        lock(&self.calls).len()
    }

    /// Whether no run is in flight.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn concurrent_calls_share_one_run() {
        let flights = SingleFlight::<&str, usize>::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = oneshot::channel::<()>();
        let work = |runs: Arc<AtomicUsize>, released: Option<oneshot::Receiver<()>>| async move {
            if let Some(released) = released {
                released.await.unwrap();
            }
            runs.fetch_add(1, Ordering::SeqCst) + 1
        };
        let first = tokio::spawn({
            let flights = flights.clone();
            let work = work(Arc::clone(&runs), Some(released));
            async move { flights.run("a", work).await }
        });
        while !flights.in_flight(&"a") {
            tokio::task::yield_now().await;
        }
        // Joins the running call: its own work is never run.
        let second = tokio::spawn({
            let flights = flights.clone();
            let work = work(Arc::clone(&runs), None);
            async move { flights.run("a", work).await }
        });
        // Another key runs on its own.
        assert_eq!(
            flights
                .run("b", work(Arc::clone(&runs), None))
                .await
                .unwrap(),
            1
        );
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 2);
        assert_eq!(second.await.unwrap().unwrap(), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(flights.is_empty());
        // Once done, the next call runs again.
        assert_eq!(
            flights
                .run("a", work(Arc::clone(&runs), None))
                .await
                .unwrap(),
            3
        );
    }

    #[tokio::test]
    async fn a_caller_going_away_does_not_cancel_the_run() {
        let flights = SingleFlight::<u8, u8>::new();
        let (release, released) = oneshot::channel::<()>();
        let (done, finished) = oneshot::channel::<()>();
        let caller = tokio::spawn({
            let flights = flights.clone();
            async move {
                flights
                    .run(1, async move {
                        released.await.unwrap();
                        done.send(()).unwrap();
                        7
                    })
                    .await
            }
        });
        while !flights.in_flight(&1) {
            tokio::task::yield_now().await;
        }
        caller.abort();
        release.send(()).unwrap();
        finished.await.unwrap();
        // The run completed for nobody and left the table.
        while !flights.is_empty() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_panic_reaches_every_caller_and_leaves_the_table() {
        let flights = SingleFlight::<u8, u8>::new();
        fn boom() -> u8 {
            panic!("boom")
        }
        let outcome = flights.run(1, async { boom() }).await;
        assert!(outcome.unwrap_err().is_panic());
        assert!(flights.is_empty());
        assert_eq!(flights.run(1, async { 2 }).await.unwrap(), 2);
    }
}

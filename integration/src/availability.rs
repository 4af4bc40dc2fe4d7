//! Whether our `APIService` stays Available: a watch that records every state
//! kube-apiserver reports, for checks that something (an upgrade, a CA
//! rotation) never made it unavailable.

use std::sync::{Arc, Mutex};

use anyhow::{Result, ensure};
use futures::StreamExt as _;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::runtime::watcher;

use crate::testbed::{APISERVICE_NAME, TestBed};

/// Records every state of our APIService from its start.
pub struct AvailabilityWatch {
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl AvailabilityWatch {
    /// Starts watching [`APISERVICE_NAME`].
    pub fn start(bed: &TestBed) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let api: Api<APIService> = Api::all(bed.client());
        let config = watcher::Config::default().fields(&format!("metadata.name={APISERVICE_NAME}"));
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config));
            while let Some(event) = events.next().await {
                let line = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => available(&o),
                    Ok(watcher::Event::Delete(_)) => "deleted".to_owned(),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                    Err(error) => format!("watch error: {error}"),
                };
                if let Ok(mut seen) = record.lock() {
                    seen.push(line);
                }
            }
        });
        Self { seen, task }
    }

    /// Fails unless every recorded state, and the current one, is Available.
    pub async fn finish(self, bed: &TestBed) -> Result<()> {
        let now: APIService = Api::all(bed.client()).get(APISERVICE_NAME).await?;
        self.task.abort();
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| anyhow::anyhow!("the availability watch panicked"))?
            .clone();
        seen.push(available(&now));
        ensure!(
            seen.iter().all(|state| state == "Available=True"),
            "the APIService was not always Available: {seen:?}"
        );
        eprintln!("APIService states seen: {}", seen.len());
        Ok(())
    }
}

/// `Available=True`, or the condition's status, reason and message.
pub fn available(apiservice: &APIService) -> String {
    let condition = apiservice
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Available"));
    match condition {
        Some(c) if c.status == "True" => "Available=True".to_owned(),
        Some(c) => format!(
            "Available={} {}: {}",
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ),
        None => "no Available condition".to_owned(),
    }
}

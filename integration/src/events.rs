//! A watch response read event by event, as a client of kube-apiserver reads it: one JSON
//! object per line (`{"type": ..., "object": ...}`), bookmarks told apart.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::testbed::TestBed;

/// A watch response read event by event.
pub struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Events {
    /// Opens the watch `path` (with its query) through kube-apiserver, as admin.
    pub async fn open(bed: &TestBed, path: &str) -> Result<Self> {
        let response = bed
            .apiserver_http(Some(&bed.pki().admin))?
            .get(format!("{}{path}", bed.apiserver_url()))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        ensure!(
            response.status() == 200,
            "GET {path}: {} {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
        Ok(Self {
            response,
            buffer: Vec::new(),
        })
    }

    /// The next event, or `None` when none comes within `wait` (or the stream ended).
    pub async fn next_within(&mut self, wait: Duration) -> Result<Option<Value>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(Some(serde_json::from_slice(&line).with_context(|| {
                    format!("event {}", String::from_utf8_lossy(&line))
                })?));
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) | Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Err(error)) => return Err(error.into()),
            }
        }
    }

    /// The next event that is not a BOOKMARK, within `wait`.
    pub async fn next(&mut self, wait: Duration, what: &str) -> Result<Value> {
        loop {
            let event = self
                .next_within(wait)
                .await?
                .with_context(|| format!("no event within {wait:?}: {what}"))?;
            if event["type"] != "BOOKMARK" {
                return Ok(event);
            }
        }
    }

    /// The objects of a `sendInitialEvents` watch: ADDED events up to the BOOKMARK annotated
    /// `k8s.io/initial-events-end`.
    pub async fn initial(&mut self, wait: Duration, what: &str) -> Result<Vec<Value>> {
        let mut objects = Vec::new();
        loop {
            let event = self
                .next_within(wait)
                .await?
                .with_context(|| what.to_owned())?;
            if event["type"] == "BOOKMARK" {
                ensure!(
                    event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"]
                        == "true",
                    "{what}: {event}"
                );
                return Ok(objects);
            }
            if event["type"] != "ADDED" {
                bail!("{what}: {event}");
            }
            objects.push(event["object"].clone());
        }
    }
}

impl Events {
    /// The names of a `sendInitialEvents` watch's initial objects (see [`Events::initial`]).
    pub async fn initial_names(&mut self, wait: Duration, what: &str) -> Result<Vec<String>> {
        let objects = self.initial(wait, what).await?;
        Ok(objects
            .iter()
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect())
    }

    /// Fails on any event but BOOKMARKs during `quiet`: nothing was sent.
    pub async fn quiet(&mut self, quiet: Duration, what: &str) -> Result<()> {
        let until = tokio::time::Instant::now() + quiet;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await? {
                None => return Ok(()),
                Some(event) if event["type"] == "BOOKMARK" => {}
                Some(event) => bail!("{what}: unexpected event {event}"),
            }
        }
    }
}

/// An event's type and its object's name.
pub fn kind_and_name(event: &Value) -> (String, String) {
    (
        event["type"].as_str().unwrap_or_default().to_owned(),
        event["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

//! Rancher's Steve (`github.com/rancher/steve`, the release pinned in
//! `integration/testbed/steve/go.mod`) in front of the test bed's kube-apiserver, as Rancher's
//! cluster explorer reaches a cluster: Steve builds its schemas from discovery, lists and watches
//! through kube-apiserver (and so through the aggregator to our server), and serves `/v1`.
//!
//! It runs as `admin` (`system:masters`) with Steve's header authentication: a request without
//! `Impersonate-User` is Steve's admin, one with it is that user, whom Steve impersonates towards
//! kube-apiserver and whose RBAC it reads, as Rancher does for every user. It serves plain HTTP on
//! one loopback port only (the test bed's wrapper of Steve's server, `integration/testbed/steve`).

use std::path::PathBuf;

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use super::{Process, TOKEN_USERS, TestBed, free_port, tools_dir, wait_until};

/// Where Steve keeps what it lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SteveCache {
    /// In memory, re-listed and watched per request (Steve's default up to Rancher 2.11).
    Memory,
    /// Steve's SQLite cache (`--sql-cache`, the default from Rancher 2.12): informers fill it,
    /// lists, sorts and counts are answered from it.
    Sql,
}

/// A running Steve, stopped when dropped.
#[derive(Debug)]
pub struct Steve {
    process: Process,
    port: u16,
    http: reqwest::Client,
}

impl Steve {
    /// Its base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The URL of its websocket, `ws://127.0.0.1:<port>/v1/subscribe`.
    pub fn subscribe_url(&self) -> String {
        format!("ws://127.0.0.1:{}/v1/subscribe", self.port)
    }

    /// Its process (log file, tail).
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// The headers that make a request `user`'s (a [`TOKEN_USERS`] name, with its groups and
    /// `system:authenticated`); none for Steve's admin.
    pub fn identity(user: Option<&str>) -> Result<Vec<(&'static str, String)>> {
        let Some(user) = user else {
            return Ok(Vec::new());
        };
        let (_, groups) = TOKEN_USERS
            .iter()
            .find(|(name, _)| *name == user)
            .with_context(|| format!("{user} is not a test bed token user"))?;
        let mut headers = vec![("Impersonate-User", user.to_owned())];
        headers.extend(
            groups
                .iter()
                .chain(&["system:authenticated"])
                .map(|g| ("Impersonate-Group", (*g).to_owned())),
        );
        Ok(headers)
    }

    /// GET `path` (with its query) as `user` (`None`: Steve's admin): the status and the body,
    /// parsed as JSON (an error naming both when it is not).
    pub async fn get(
        &self,
        user: Option<&str>,
        path: &str,
    ) -> Result<(reqwest::StatusCode, Value)> {
        let mut request = self.http.get(format!("{}{path}", self.url()));
        for (name, value) in Self::identity(user)? {
            request = request.header(name, value);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("Steve GET {path}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .with_context(|| format!("Steve GET {path}: {status}"))?;
        let value = serde_json::from_str(&body).with_context(|| {
            format!("Steve GET {path}: {status} with a body that is not JSON: {body}")
        })?;
        Ok((status, value))
    }

    /// [`Steve::get`] that must answer 200.
    pub async fn get_ok(&self, user: Option<&str>, path: &str) -> Result<Value> {
        let (status, value) = self.get(user, path).await?;
        ensure!(
            status == reqwest::StatusCode::OK,
            "Steve GET {path}: {status} {value}"
        );
        Ok(value)
    }
}

impl TestBed {
    /// Starts Steve against this test bed's kube-apiserver, as admin with header authentication,
    /// keeping what it lists as `cache` says, and waits until it serves its schemas. Steve's
    /// binary is `steve` next to the other test bed tools (`integration/testbed/build.sh`).
    pub async fn start_steve(&self, cache: SteveCache) -> Result<Steve> {
        let binary = tools_dir().join("steve");
        ensure!(
            binary.is_file(),
            "{} is missing: run `make tools` (integration/testbed/build.sh)",
            binary.display()
        );
        let port = free_port()?;
        let data = self.steve_dir(port)?;
        let mut args = vec![
            "--kubeconfig".into(),
            self.kubeconfig().as_os_str().to_owned(),
            "--listen".into(),
            format!("127.0.0.1:{port}").into(),
            "--data-dir".into(),
            data.into_os_string(),
            "--enable-header-auth".into(),
        ];
        if cache == SteveCache::Sql {
            args.push("--sql-cache".into());
        }
        let log = self.root().join(format!("logs/steve-{port}.log"));
        let mut process = Process::spawn("steve", &binary, args, &[], log)?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .context("building Steve's HTTP client")?;
        let schemas = format!("http://127.0.0.1:{port}/v1/schemas");
        wait_until(&mut process, "steve /v1/schemas", async || {
            Ok(http
                .get(&schemas)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success()))
        })
        .await?;
        Ok(Steve {
            process,
            port,
            http,
        })
    }

    /// A fresh working directory for one Steve (its SQL cache's database).
    fn steve_dir(&self, port: u16) -> Result<PathBuf> {
        let dir = self.root().join(format!("steve-{port}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }
}

/// A websocket to Steve's `/v1/subscribe`, as the Rancher dashboard holds one: it sends
/// subscriptions (`{"resourceType": …, "namespace": …, "resourceVersion": …}`) and reads
/// Steve's events (`resource.start`, `resource.create`/`change`/`remove`, `resource.error`,
/// `resource.stop`, `ping`).
pub struct Subscription {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Steve {
    /// Opens `/v1/subscribe` as `user` (`None`: Steve's admin).
    pub async fn subscribe(&self, user: Option<&str>) -> Result<Subscription> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut request = self
            .subscribe_url()
            .into_client_request()
            .context("a websocket request")?;
        for (name, value) in Self::identity(user)? {
            request
                .headers_mut()
                .append(name, value.parse().context("a header value")?);
        }
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .context("opening Steve's /v1/subscribe")?;
        Ok(Subscription { socket })
    }
}

impl Subscription {
    /// Sends one message (a subscription, or a stop with `"stop": true`).
    pub async fn send(&mut self, message: &Value) -> Result<()> {
        use futures::SinkExt as _;
        self.socket
            .send(tokio_tungstenite::tungstenite::Message::text(
                message.to_string(),
            ))
            .await
            .context("sending to Steve's /v1/subscribe")
    }

    /// The next event other than `ping`, or `None` when `within` passes first. An error when
    /// Steve closes the socket.
    pub async fn next(&mut self, within: std::time::Duration) -> Result<Option<Value>> {
        use futures::StreamExt as _;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let message = match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => anyhow::bail!("Steve closed /v1/subscribe"),
                Ok(Some(message)) => message.context("reading Steve's /v1/subscribe")?,
            };
            let tokio_tungstenite::tungstenite::Message::Text(text) = message else {
                continue;
            };
            let event: Value = serde_json::from_str(&text)
                .with_context(|| format!("an event that is not JSON: {text}"))?;
            if event["name"] != "ping" {
                return Ok(Some(event));
            }
        }
    }
}

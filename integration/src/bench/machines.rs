//! The fleet phase's machines and what both its halves ([`super::fleet`], [`super::pressure`])
//! measure them with: their namespace and names, the OS annotation they are registered with,
//! their API, a watcher of their answers (ours or the CRD's), and the server's CPU time.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::testbed::TestBed;

/// The namespace of the fleet phase's channels, machines and ConfigMaps.
pub const NAMESPACE: &str = "bench-fleet";

/// Bound on one watch event reaching every watcher.
pub const EVENT_DEADLINE: Duration = Duration::from_secs(60);

/// The annotation a machine's OS image is registered in.
pub const OS_IMAGE: &str = "elemental.cattle.io/os.image";

/// The machine whose annotation the watch latency and the follow samples change.
pub const CHANGED: &str = "m-00000";

/// The image a machine of channel `c` on version `version` reports.
pub fn os_image(channel: &str, version: &str) -> String {
    format!("registry.example.com/{channel}/os:{version}")
}

/// The MachineInventory API of [`NAMESPACE`].
pub fn machine_api(bed: &TestBed) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("elemental.cattle.io", "v1beta1", "MachineInventory"),
        "machineinventories",
    );
    Api::namespaced_with(bed.client(), NAMESPACE, &resource)
}

/// Which side a watcher is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// This server's machines through the aggregator.
    Ours,
    /// kube-apiserver's MachineInventory CRD.
    Kube,
    /// This server's machines straight to it (admin's client certificate): what the
    /// aggregator's proxy adds is the difference with [`Side::Ours`].
    Direct,
}

/// What a watcher saw: its side, when, and what marks the change (our answer's current
/// version name, the CRD object's `os.image` annotation), or why it ended.
pub type Seen = (Side, Instant, Result<String, String>);

/// The resourceVersion of the list at `url` as the reader (the items skipped).
pub async fn list_resource_version(bed: &TestBed, token: &str, url: &str) -> Result<String> {
    #[derive(serde::Deserialize)]
    struct List {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
    }
    let response = bed
        .apiserver_streaming_http(None)?
        .get(url)
        .bearer_auth(token)
        .send()
        .await?;
    ensure!(response.status() == 200, "{url}: {}", response.status());
    let list: List = serde_json::from_slice(&response.bytes().await?)?;
    Ok(list.metadata.resource_version)
}

/// One watcher: opens `url`, says so on `ready`, then sends what each event of [`CHANGED`]
/// marks, until the watch ends (the error says how).
pub async fn watcher(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    side: Side,
    tx: &mpsc::UnboundedSender<Seen>,
    ready: &mpsc::UnboundedSender<Result<()>>,
) -> Result<()> {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let mut response = request.send().await?;
    ensure!(response.status() == 200, "{url}: {}", response.status());
    let _ = ready.send(Ok(()));
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let at = Instant::now();
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let event: Value = serde_json::from_slice(&line)?;
            let object = &event["object"];
            match event["type"].as_str() {
                Some("ERROR") => bail!("{url}: ERROR event {object}"),
                Some("ADDED" | "MODIFIED") if object["metadata"]["name"] == CHANGED => {
                    let mark = match side {
                        Side::Ours | Side::Direct => &object["current"]["name"],
                        Side::Kube => &object["metadata"]["annotations"][OS_IMAGE],
                    };
                    let mark = mark.as_str().unwrap_or_default().to_owned();
                    if tx.send((side, at, Ok(mark))).is_err() {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
    }
    bail!("{url}: the watch ended")
}

/// The CPU time (user and system) process `pid` has used.
pub fn cpu_time(pid: u32, ticks_per_second: u64) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (in parentheses, which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("no command name in /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("field {} of /proc/{pid}/stat", i + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(
        total as f64 / ticks_per_second as f64,
    ))
}

/// Clock ticks per second (`getconf CLK_TCK`).
pub fn ticks_per_second() -> Result<u64> {
    let output = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("running getconf CLK_TCK")?;
    ensure!(output.status.success(), "getconf CLK_TCK failed");
    Ok(String::from_utf8(output.stdout)?.trim().parse()?)
}

//! The main job as a local demo: a real etcd and kube-apiserver on loopback,
//! elemental-changelog registered through its APIService, a sample channel,
//! and what kubectl sees. Runs until Ctrl-C, then tears everything down.
//!
//! `make demo` builds the tools and the server, then runs this.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use elemental_changelog_integration::testbed::elemental::{self, VersionEntry};
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, FLEET_NAMESPACE, TestBed, TestBedOptions, tools_dir,
};
use serde_json::Value;
use tokio::signal::unix::{SignalKind, signal};

/// The sample channel the demo shows, by name and the names of its versions.
struct SampleChannel {
    name: String,
    versions: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    // Registered before anything starts, so Ctrl-C at any moment tears down
    // what exists (the test bed's processes are in their own process groups
    // and never see the terminal's SIGINT themselves).
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let stop = async {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    };
    tokio::pin!(stop);

    let mut bed = tokio::select! {
        bed = start() => bed?,
        () = &mut stop => {
            println!("\nInterrupted while starting; everything started is stopped.");
            return Ok(());
        }
    };
    let result = tokio::select! {
        result = run(&mut bed) => result,
        () = &mut stop => Ok(()),
    };
    println!("\nTearing down ...");
    bed.finish(result)
}

async fn start() -> Result<TestBed> {
    let started = Instant::now();
    println!("Starting etcd and kube-apiserver on 127.0.0.1 ...");
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    println!("Control plane ready in {:.1?}.", started.elapsed());
    println!("Starting elemental-changelog-apiserver and registering {APISERVICE_NAME} ...");
    bed.start_server(&[]).await?;
    println!(
        "Registered and Available after {:.1?}.\n",
        started.elapsed()
    );
    Ok(bed)
}

/// Shows the demo, then watches the test bed until a process of it dies.
async fn run(bed: &mut TestBed) -> Result<()> {
    show(bed).await?;
    let mut check = tokio::time::interval(Duration::from_secs(2));
    loop {
        check.tick().await;
        bed.ensure_running()?;
    }
}

async fn show(bed: &TestBed) -> Result<()> {
    let channel = sample_channel(bed).await?;

    print_command(bed, &["get", "apiservice", APISERVICE_NAME]).await?;
    print_command(
        bed,
        &[
            "get",
            "--raw",
            "/apis/changelog.elemental.cattle.io/v1beta1",
        ],
    )
    .await?;
    print_command(
        bed,
        &[
            "get",
            "managedosversions.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
        ],
    )
    .await?;
    let mut changelog = String::new();
    if let Some(version) = channel.versions.last() {
        changelog = format!(
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/managedosversions/{version}/changelog"
        );
        print_request(bed, &changelog).await?;
    }

    println!("The test bed keeps running. In another shell:\n");
    println!("  export KUBECONFIG={}", bed.kubeconfig().display());
    println!("  export PATH={}:$PATH", tools_dir().display());
    println!("  kubectl get apiservice {APISERVICE_NAME} -o yaml");
    println!("  kubectl api-resources --api-group=changelog.elemental.cattle.io");
    println!(
        "  kubectl get managedosversionchannel {} -n {FLEET_NAMESPACE} -o yaml",
        channel.name
    );
    if !changelog.is_empty() {
        println!("  kubectl get --raw '{changelog}?format=text'");
    }
    println!("  kubectl get --raw /openapi/v3 | head -c 600");
    println!(
        "  kubectl --kubeconfig {} get --raw /apis/changelog.elemental.cattle.io/v1beta1   # a user with no role",
        bed.user_kubeconfig("alice")?.display()
    );
    if let Some(server) = bed.server() {
        println!(
            "\nOur server listens on {} (log: {}).",
            server.url(),
            server.process().log().display()
        );
    }
    println!("Logs and certificates: {}", bed.root().display());
    println!("\nPress Ctrl-C to stop everything.");
    Ok(())
}

/// HOOK (demo::sample_channel): make the sample channel the demo shows.
///
/// Today it creates a `custom` channel whose image is not served anywhere, and
/// its ManagedOSVersions as the operator would, so the changelog request shows
/// the error a user gets before the data is available. To be replaced by: start
/// a local registry (`elemental_changelog_integration::registry`), build and
/// push a channel image with changelog data (`…::image`), and point the
/// channel at it, so the demo prints a real changelog.
async fn sample_channel(bed: &TestBed) -> Result<SampleChannel> {
    let name = "sl-micro-6.1-base";
    let channel = elemental::apply_custom_channel(
        &bed.client(),
        FLEET_NAMESPACE,
        name,
        "localhost:5000/elemental/sl-micro-6.1-base-channel:demo",
    )
    .await?;
    let entries: Vec<VersionEntry> = [
        ("v2.2.0-4.56", 1_738_000_000),
        ("v2.2.0-4.57", 1_740_000_000),
    ]
    .into_iter()
    .map(|(version, created)| VersionEntry {
        name: format!("{name}-{version}"),
        version: version.to_owned(),
        upgrade_image: format!(
            "registry.suse.com/suse/sl-micro/6.1/baremetal-os-container:{version}"
        ),
        created: Some(created),
    })
    .collect();
    elemental::sync_channel(&bed.client(), &channel, &entries).await?;
    Ok(SampleChannel {
        name: name.to_owned(),
        versions: entries.into_iter().map(|e| e.name).collect(),
    })
}

async fn print_command(bed: &TestBed, args: &[&str]) -> Result<()> {
    println!("$ kubectl {}", args.join(" "));
    let output = bed.kubectl(args).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{}", pretty(&stdout).trim_end());
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    println!();
    Ok(())
}

/// One GET through kube-apiserver as admin, shown with its status line: unlike
/// `kubectl get --raw`, it does not retry a 503 that carries `Retry-After`.
async fn print_request(bed: &TestBed, path: &str) -> Result<()> {
    println!("$ GET {path}   (through kube-apiserver, as admin)");
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let response = http
        .get(format!("{}{path}", bed.apiserver_url()))
        .send()
        .await?;
    println!("HTTP {}", response.status());
    if let Some(retry) = response.headers().get("retry-after") {
        println!("Retry-After: {}", retry.to_str().unwrap_or("?"));
    }
    let body = response.text().await?;
    println!("{}\n", pretty(&body).trim_end());
    Ok(())
}

/// JSON indented for reading; anything else as it is.
fn pretty(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| text.to_owned())
}

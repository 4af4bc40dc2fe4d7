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

/// The sample channel the demo shows, by name and the names of its versions.
struct SampleChannel {
    name: String,
    versions: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
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

    let result = show(&bed).await;
    let result = match result {
        Ok(()) => watch_until_ctrl_c(&mut bed).await,
        Err(err) => Err(err),
    };
    println!("\nTearing down ...");
    bed.finish(result)
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
        print_command(bed, &["get", "--raw", &changelog]).await?;
    }

    let kubectl = tools_dir().join("kubectl");
    println!("The test bed keeps running. In another shell:\n");
    println!("  export KUBECONFIG={}", bed.kubeconfig().display());
    println!("  alias kubectl={}", kubectl.display());
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
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.stdout.ends_with(b"\n") {
        println!();
    }
    println!();
    Ok(())
}

/// Waits for Ctrl-C, failing early when a process of the test bed dies.
async fn watch_until_ctrl_c(bed: &mut TestBed) -> Result<()> {
    let mut check = tokio::time::interval(Duration::from_secs(2));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            signal = &mut ctrl_c => return signal.context("waiting for Ctrl-C"),
            _ = check.tick() => bed.ensure_running()?,
        }
    }
}

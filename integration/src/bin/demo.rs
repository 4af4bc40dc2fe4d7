//! The main job as a local demo: a real etcd and kube-apiserver on loopback,
//! elemental-changelog registered through its APIService, a sample channel,
//! a few registered machines (the fleet view), and what kubectl sees. Runs
//! until Ctrl-C, then tears everything down.
//!
//! `make demo` builds the tools and the server, then runs this.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use elemental_changelog_integration::paths::changelog_path;
use elemental_changelog_integration::registry::{self, Registry};
use elemental_changelog_integration::testbed::elemental;
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, FLEET_NAMESPACE, TestBed, TestBedOptions, tools_dir, workspace_root,
};
use elemental_changelog_integration::wait::soon;
use elemental_changelog_integration::{image, sample};
use serde_json::Value;
use tokio::signal::unix::{SignalKind, signal};

/// The sample channel the demo shows, by name and the names of its versions.
struct SampleChannel {
    name: String,
    versions: Vec<String>,
    /// The OS images the machines report, oldest version first.
    images: Vec<String>,
}

/// The MachineInventories the demo registers: on the oldest version, on the newest, and one
/// that reports no OS (Unknown).
const MACHINES: [&str; 3] = ["machine-old", "machine-new", "machine-unknown"];

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

    let (mut bed, registry) = tokio::select! {
        started = start() => started?,
        () = &mut stop => {
            println!("\nInterrupted while starting; everything started is stopped.");
            return Ok(());
        }
    };
    let result = tokio::select! {
        result = run(&mut bed, &registry) => result,
        () = &mut stop => Ok(()),
    };
    println!("\nTearing down ...");
    bed.finish(result)
}

async fn start() -> Result<(TestBed, Registry)> {
    let started = Instant::now();
    println!("Starting etcd and kube-apiserver on 127.0.0.1 ...");
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    println!("Control plane ready in {:.1?}.", started.elapsed());
    registry::install_crypto_provider();
    let registry = Registry::start_plain().await?;
    println!(
        "OCI registry (Debian's docker-registry) at {}.",
        registry.host()
    );
    println!("Starting elemental-changelog-apiserver and registering {APISERVICE_NAME} ...");
    bed.start_server_reading(&registry, &[]).await?;
    println!(
        "Registered and Available after {:.1?}.\n",
        started.elapsed()
    );
    Ok((bed, registry))
}

/// Shows the demo, then watches the test bed until a process of it dies.
async fn run(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    show(bed, registry).await?;
    let mut check = tokio::time::interval(Duration::from_secs(2));
    loop {
        check.tick().await;
        bed.ensure_running()?;
    }
}

async fn show(bed: &TestBed, registry: &Registry) -> Result<()> {
    let channel = sample_channel(bed, registry).await?;

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
    let newest = channel.versions.last().cloned().unwrap_or_default();
    let oldest = channel.versions.first().cloned().unwrap_or_default();
    let changelog = changelog_path(FLEET_NAMESPACE, &newest);
    wait_for_data(bed, &changelog).await?;
    print_command(bed, &["get", "--raw", &changelog]).await?;
    print_command(
        bed,
        &[
            "get",
            "--raw",
            &format!("{changelog}?format=text&from={oldest}"),
        ],
    )
    .await?;
    print_command(
        bed,
        &[
            "get",
            "managedosversions.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
        ],
    )
    .await?;
    register_machines(bed, &channel).await?;
    print_command(
        bed,
        &[
            "get",
            "machineinventories.changelog.elemental.cattle.io",
            "-n",
            FLEET_NAMESPACE,
            "-o",
            "wide",
        ],
    )
    .await?;
    hints(bed, &channel, &changelog, &newest)
}

/// What to try next, each command as it is pasted into a shell.
fn hints(bed: &TestBed, channel: &SampleChannel, changelog: &str, newest: &str) -> Result<()> {
    println!("The test bed keeps running. In another shell:\n");
    println!("  export KUBECONFIG={}", bed.kubeconfig().display());
    // kubectl and helm, and the `kubectl elemental` plugin (`make demo` builds it).
    let plugin_dir = workspace_root().join("target/debug");
    println!(
        "  export PATH={}:{}:$PATH",
        tools_dir().display(),
        plugin_dir.display()
    );
    println!("  kubectl get apiservice {APISERVICE_NAME} -o yaml");
    println!("  kubectl api-resources --api-group=changelog.elemental.cattle.io");
    println!(
        "  kubectl get managedosversionchannel {} -n {FLEET_NAMESPACE} -o yaml",
        channel.name
    );
    println!(
        "  kubectl get --raw {}",
        shell_quoted(&format!("{changelog}?format=markdown"))
    );
    println!(
        "  kubectl get --raw {}",
        shell_quoted(
            "/apis/changelog.elemental.cattle.io/v1beta1/managedosversions?cve=CVE-2024-42101"
        )
    );
    println!("  kubectl get managedosversions.changelog.elemental.cattle.io -A -o wide");
    println!("  kubectl get --raw /openapi/v3 | head -c 600");
    println!(
        "  kubectl --kubeconfig {} get --raw /apis/changelog.elemental.cattle.io/v1beta1   # a user with no role",
        bed.user_kubeconfig("alice")?.display()
    );
    println!("  kubectl elemental changelog {newest} -n {FLEET_NAMESPACE}   # the kubectl plugin");
    println!("\nThe fleet view (the machines registered above):\n");
    println!("  kubectl get machineinventories.changelog.elemental.cattle.io -A -o wide");
    println!(
        "  kubectl get machineinventories.changelog.elemental.cattle.io -n {FLEET_NAMESPACE} -w   # then re-annotate a machine"
    );
    println!(
        "  kubectl annotate machineinventories.elemental.cattle.io -n {FLEET_NAMESPACE} {} --overwrite elemental.cattle.io/os.image={}",
        MACHINES[0],
        shell_quoted(channel.images.last().map_or("", String::as_str))
    );
    println!(
        "  kubectl get --raw {}",
        shell_quoted(&format!(
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/machineinventories/{}/changelog?format=text",
            MACHINES[0]
        ))
    );
    println!(
        "  kubectl get --raw {}",
        shell_quoted(
            "/apis/changelog.elemental.cattle.io/v1beta1/machineinventories?cve=CVE-2024-42101"
        )
    );
    println!("  kubectl elemental machines -n {FLEET_NAMESPACE}   # the kubectl plugin");
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

/// The sample channel: pushes its image (real upstream channel.json, package
/// lists, updateinfo.xml and the precomputed files they give) to the local
/// registry, then creates the channel and its ManagedOSVersions as
/// elemental-operator does.
async fn sample_channel(bed: &TestBed, registry: &Registry) -> Result<SampleChannel> {
    let name = "sl-micro-6.1-base";
    let pushed = image::push(
        registry,
        "elemental/sl-micro-6.1-base-channel:demo",
        &sample::image()?,
    )
    .await?;
    let image_ref = registry.image("elemental/sl-micro-6.1-base-channel:demo");
    println!(
        "Pushed the sample channel image {image_ref} ({}).\n",
        pushed.digest
    );
    let channel =
        elemental::apply_custom_channel(&bed.client(), FLEET_NAMESPACE, name, &image_ref).await?;
    let entries = sample::entries()?;
    elemental::sync_channel(&bed.client(), &channel, &entries).await?;
    let versions = sample::os_versions()?;
    let images = versions
        .iter()
        .filter_map(|v| entries.iter().find(|e| e.name == *v))
        .map(|e| e.upgrade_image.clone())
        .collect();
    Ok(SampleChannel {
        name: name.to_owned(),
        versions,
        images,
    })
}

/// Registers [`MACHINES`] as elemental-operator does when machines register (MachineInventories
/// with the `elemental.cattle.io/os.image` annotation the machine reports), and waits until the
/// fleet view lists them.
async fn register_machines(bed: &TestBed, channel: &SampleChannel) -> Result<()> {
    let reported = [channel.images.first(), channel.images.last(), None];
    let mut yaml = String::new();
    for (name, image) in MACHINES.iter().zip(reported) {
        let annotations = image.map_or_else(
            || "{}".to_owned(),
            |image| format!("{{elemental.cattle.io/os.image: \"{image}\"}}"),
        );
        yaml.push_str(&format!(
            "---\napiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  namespace: {FLEET_NAMESPACE}\n  annotations: {annotations}\nspec: {{}}\n"
        ));
    }
    bed.kubectl_stdin(&["apply", "-f", "-"], &yaml).await?;
    let path = format!(
        "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/{FLEET_NAMESPACE}/machineinventories"
    );
    soon("the machines in the fleet view", async || {
        let (status, list) = bed.admin_get_value(&path).await?;
        let resolved = list["items"].as_array().is_some_and(|items| {
            items.len() == MACHINES.len()
                && items
                    .iter()
                    .all(|m| m["state"] != "Unknown" || m["reason"] == "NoAnnotation")
        });
        Ok((status.is_success() && resolved).then_some(()))
    })
    .await
}

/// Waits (bounded) until the server has fetched the channel image: the first
/// fetch happens when the channel appears, within a second here.
async fn wait_for_data(bed: &TestBed, path: &str) -> Result<()> {
    soon("the sample changelog served", async || {
        Ok(bed.admin_get(path).await?.0.is_success().then_some(()))
    })
    .await
}

async fn print_command(bed: &TestBed, args: &[&str]) -> Result<()> {
    let quoted: Vec<String> = args.iter().map(|a| shell_quoted(a)).collect();
    println!("$ kubectl {}", quoted.join(" "));
    let output = bed.kubectl(args).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{}", pretty(&stdout).trim_end());
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    println!();
    Ok(())
}

/// `arg` as a shell reads it back: as it is when it holds only characters no shell treats
/// specially, else in single quotes (a `&` unquoted would send the command to the background).
fn shell_quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// JSON indented for reading; anything else as it is.
fn pretty(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_commands_read_back_as_pasted() {
        assert_eq!(shell_quoted("get"), "get");
        assert_eq!(shell_quoted("/apis/a/v1beta1"), "/apis/a/v1beta1");
        assert_eq!(
            shell_quoted("/x?format=text&from=v1"),
            "'/x?format=text&from=v1'"
        );
        assert_eq!(shell_quoted("it's"), r"'it'\''s'");
        assert_eq!(shell_quoted(""), "''");
    }
}

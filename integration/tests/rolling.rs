//! A rolling update loses no request (issue 9, item 9): load goes through kube-apiserver's
//! aggregator to two real replicas behind the test's round-robin proxy while one replica
//! is stopped the way the kubelet stops a pod: SIGTERM; `/readyz` fails at once and the
//! proxy stops sending it new connections (the endpoints controller's part); the server
//! keeps serving for `--shutdown-delay-duration`, then stops accepting, drains and exits 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::generated::{Channel, Spec};
use elemental_changelog_integration::paths::changelog_path;
use elemental_changelog_integration::publish;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::{FLEET_NAMESPACE, TestBed, TestBedOptions};
use reqwest::StatusCode;

const SHUTDOWN_DELAY: &str = "3s";
const LOAD_LOOPS: usize = 4;

#[tokio::test]
async fn a_replica_stopped_by_sigterm_loses_no_request() -> Result<()> {
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    let mut flags = registry.server_flags()?;
    flags.extend([
        format!("--shutdown-delay-duration={SHUTDOWN_DELAY}"),
        "--shutdown-grace-period=10s".to_owned(),
    ]);
    bed.start_replicas(2, &flags).await?;
    let result = rolling_stop(&mut bed, &registry).await;
    bed.finish(result)
}

async fn rolling_stop(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    let channel = Channel::generate(&Spec::new("rolling", 6, 40, 5));
    // Waits until kube-apiserver lists every version as available.
    publish::generated_channel(bed, registry, FLEET_NAMESPACE, &channel).await?;
    let newest = &channel.versions.last().context("no versions")?.name;
    let url = format!(
        "{}{}",
        bed.apiserver_url(),
        changelog_path(FLEET_NAMESPACE, newest)
    );
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    // Both replicas must have the data before the load starts.
    for _ in 0..20 {
        let status = http.get(&url).send().await?.status();
        ensure!(status == StatusCode::OK, "before the stop: {status}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let loops: Vec<_> = (0..LOAD_LOOPS)
        .map(|_| {
            let (http, url, stop, ok, failures) = (
                http.clone(),
                url.clone(),
                stop.clone(),
                ok.clone(),
                failures.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match http.get(&url).send().await {
                        Ok(r) if r.status() == StatusCode::OK => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => {
                            let status = r.status();
                            let body = r.text().await.unwrap_or_default();
                            if let Ok(mut f) = failures.lock() {
                                f.push(format!("{status}: {body}"));
                            }
                        }
                        Err(e) => {
                            if let Ok(mut f) = failures.lock() {
                                f.push(e.to_string());
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // Some load on both replicas first.
    while ok.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = ok.load(Ordering::Relaxed);
    let (status, not_ready, exited) = bed.terminate_replica(1, Duration::from_secs(30)).await?;
    let during = ok.load(Ordering::Relaxed) - before;
    // And after: the other replica carries everything.
    let after_stop = ok.load(Ordering::Relaxed);
    while ok.load(Ordering::Relaxed) < after_stop + 50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in loops {
        task.await?;
    }
    let failures = failures.lock().map(|f| f.clone()).unwrap_or_default();
    let total = ok.load(Ordering::Relaxed);
    eprintln!(
        "rolling stop: {total} requests answered 200 ({during} while the replica shut down), {} failed; readiness failed {not_ready:?} after SIGTERM, exited {exited:?} after it ({status})",
        failures.len()
    );
    ensure!(failures.is_empty(), "failed requests: {failures:?}");
    ensure!(status.success(), "the replica exited with {status}");
    ensure!(
        exited >= Duration::from_secs(3),
        "the replica exited {exited:?} after SIGTERM, before its shutdown delay"
    );
    ensure!(
        during > 0,
        "no request was answered while the replica shut down"
    );
    Ok(())
}

//! The walking skeleton end to end (issue 2): our server registered with a real
//! kube-apiserver through an `APIService`, seen by kubectl and by the
//! aggregation layer's discovery and OpenAPI, with the operator's own
//! `elemental.cattle.io` objects still answering to `kubectl get managedosversions`.
//!
//! One test bed for the whole file: the checks run in sequence against it.

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::fixtures::expect_status;
use elemental_changelog_integration::paths::{GROUP_VERSION, changelog_path, summaries_path};
use elemental_changelog_integration::testbed::elemental::{self, VersionEntry};
use elemental_changelog_integration::testbed::{
    AGGREGATED_DISCOVERY, APISERVICE_NAME, FLEET_NAMESPACE, TestBed, TestBedOptions,
};
use elemental_changelog_integration::timing::Phases;
use elemental_changelog_integration::wait::soon;
use serde_json::Value;

#[tokio::test]
async fn skeleton_end_to_end() -> Result<()> {
    let phases = Phases::start();
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    phases.mark("control plane ready");
    bed.start_server(&[]).await?;
    phases.mark("server registered and Available");
    let result = checks(&bed).await;
    phases.mark("skeleton checks done");
    bed.finish(result)
}

async fn checks(bed: &TestBed) -> Result<()> {
    apiservice_is_available(bed).await?;
    kubectl_lists_our_resource(bed).await?;
    discovery_through_the_aggregator(bed).await?;
    answers_reach_clients_whole(bed).await?;
    aggregated_discovery_includes_our_group(bed).await?;
    openapi_v3_lists_our_group_version(bed).await?;
    operator_objects_keep_their_name(bed).await?;
    missing_version_is_a_not_found_status(bed).await?;
    direct_requests(bed).await?;
    Ok(())
}

async fn apiservice_is_available(bed: &TestBed) -> Result<()> {
    let status = bed
        .kubectl_ok(&[
            "get",
            "apiservice",
            APISERVICE_NAME,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])
        .await?;
    ensure!(status == "True", "APIService Available={status:?}");
    Ok(())
}

async fn kubectl_lists_our_resource(bed: &TestBed) -> Result<()> {
    let out = bed
        .kubectl_ok(&[
            "api-resources",
            "--api-group=changelog.elemental.cattle.io",
            "-o",
            "name",
        ])
        .await?;
    ensure!(
        out.lines()
            .any(|l| l == "managedosversions.changelog.elemental.cattle.io"),
        "kubectl api-resources did not list our resource:\n{out}"
    );
    Ok(())
}

async fn discovery_through_the_aggregator(bed: &TestBed) -> Result<()> {
    let list: Value =
        serde_json::from_str(&bed.kubectl_ok(&["get", "--raw", GROUP_VERSION]).await?)
            .context("our APIResourceList is not JSON")?;
    ensure!(list["kind"] == "APIResourceList", "{list}");
    ensure!(
        list["groupVersion"] == "changelog.elemental.cattle.io/v1beta1",
        "{list}"
    );
    let resources = list["resources"].as_array().context("no resources")?;
    let find = |name: &str| resources.iter().find(|r| r["name"] == name).cloned();
    let summaries = find("managedosversions").context("no managedosversions")?;
    ensure!(summaries["namespaced"] == true, "{summaries}");
    ensure!(
        summaries["kind"] == "ManagedOSVersionChangelogSummary",
        "{summaries}"
    );
    ensure!(verbs(&summaries) == ["get", "list", "watch"], "{summaries}");
    let changelog =
        find("managedosversions/changelog").context("no managedosversions/changelog")?;
    ensure!(
        changelog["kind"] == "ManagedOSVersionChangelog",
        "{changelog}"
    );
    ensure!(verbs(&changelog) == ["get"], "{changelog}");
    Ok(())
}

/// Through the aggregator, our group-version document reaches a client that did not ask for
/// gzip whole, with our `Content-Length`, and a HEAD gets its head and nothing else.
///
/// kube-apiserver's proxy asks us for gzip when its client did not; had we compressed the
/// document (we did from 512 bytes, which it passed when the fleet view grew it to five
/// resources), it would decompress it, drop the `Content-Length` and stream it: the head
/// flushed ahead of the body, so that a client dropping the response after the head made the
/// proxy abort the handler ("net/http: abort Handler", a `Panic` audit event). Over HTTP/2,
/// hyper sent the body of a HEAD answer as DATA frames, which Go's client refuses as a
/// protocol error. Both are read from kube-apiserver's log after clients that do just that.
async fn answers_reach_clients_whole(bed: &TestBed) -> Result<()> {
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let url = format!("{}{GROUP_VERSION}", bed.apiserver_url());
    let get = http.get(&url).send().await?;
    ensure!(get.status() == 200, "GET {GROUP_VERSION}: {}", get.status());
    ensure!(header(&get, "content-encoding").is_empty());
    let length = header(&get, "content-length");
    let body = get.bytes().await?;
    ensure!(
        length == body.len().to_string(),
        "{GROUP_VERSION}: content-length {length:?} for {} bytes: kube-apiserver streamed it",
        body.len()
    );
    // Clients that read the head only, GET and HEAD, through the aggregator and directly.
    let server = bed.server().context("our server is not running")?;
    let direct = bed.server_http(Some(&bed.pki().admin))?;
    for _ in 0..20 {
        let dropped = http.get(&url).send().await?;
        ensure!(dropped.status() == 200, "{}", dropped.status());
        drop(dropped);
        let head = http.head(&url).send().await?;
        ensure!(
            head.status() == 200,
            "HEAD {GROUP_VERSION}: {}",
            head.status()
        );
        ensure!(
            header(&head, "content-length") == length,
            "HEAD content-length"
        );
        ensure!(head.bytes().await?.is_empty(), "a body to HEAD");
        let head = direct
            .head(format!("{}{GROUP_VERSION}", server.url()))
            .send()
            .await?;
        ensure!(
            head.version() == reqwest::Version::HTTP_2,
            "{:?}",
            head.version()
        );
        ensure!(
            header(&head, "content-length") == length,
            "HEAD content-length"
        );
        ensure!(head.bytes().await?.is_empty(), "a body to HEAD, directly");
    }
    // A last complete request: kube-apiserver has logged whatever the dropped ones did.
    ensure!(http.get(&url).send().await?.bytes().await?.len() == body.len());
    let log = std::fs::read_to_string(bed.root().join("logs/kube-apiserver.log"))?;
    let complaints: Vec<&str> = log
        .lines()
        .filter(|line| {
            line.contains("received DATA on a HEAD request")
                || (line.contains("abort") && line.contains(GROUP_VERSION))
        })
        .collect();
    ensure!(
        complaints.is_empty(),
        "kube-apiserver:\n{}",
        complaints.join("\n")
    );
    Ok(())
}

/// kube-apiserver's merged `/apis` in the aggregated (v2) format carries our
/// group with both resources once the aggregator has synced our discovery.
async fn aggregated_discovery_includes_our_group(bed: &TestBed) -> Result<()> {
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let url = format!("{}/apis", bed.apiserver_url());
    // Until the aggregator has synced our discovery ([`soon`]).
    soon(
        "aggregated discovery lists our group's resources",
        async || {
            let response = http
                .get(&url)
                .header("Accept", AGGREGATED_DISCOVERY)
                .send()
                .await?;
            ensure!(response.status() == 200, "GET /apis: {}", response.status());
            let content_type = header(&response, "content-type");
            ensure!(
                content_type.contains("as=APIGroupDiscoveryList"),
                "GET /apis answered {content_type}"
            );
            let body: Value = response.json().await?;
            let group = body["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|g| g["metadata"]["name"] == "changelog.elemental.cattle.io");
            if let Some(group) = group {
                let version = &group["versions"][0];
                ensure!(version["version"] == "v1beta1", "{group}");
                let resource = version["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["resource"] == "managedosversions");
                if let Some(resource) = resource {
                    ensure!(resource["scope"] == "Namespaced", "{resource}");
                    let subresources: Vec<&str> = resource["subresources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s["subresource"].as_str())
                        .collect();
                    ensure!(subresources == ["changelog"], "{resource}");
                    ensure!(version["freshness"] != "Stale", "{group}");
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )
    .await
}

/// The aggregator downloads our OpenAPI v3 and lists our group-version in
/// kube-apiserver's own `/openapi/v3`, whose document describes our kinds.
async fn openapi_v3_lists_our_group_version(bed: &TestBed) -> Result<()> {
    let relative_url = soon("/openapi/v3 lists our group-version", async || {
        let root: Value =
            serde_json::from_str(&bed.kubectl_ok(&["get", "--raw", "/openapi/v3"]).await?)?;
        Ok(
            root["paths"]["apis/changelog.elemental.cattle.io/v1beta1"]["serverRelativeURL"]
                .as_str()
                .map(str::to_owned),
        )
    })
    .await?;
    let document = bed.kubectl_ok(&["get", "--raw", &relative_url]).await?;
    for kind in [
        "ManagedOSVersionChangelog",
        "ManagedOSVersionChangelogSummary",
    ] {
        ensure!(
            document.contains(kind),
            "our OpenAPI v3 document lacks {kind}"
        );
    }
    Ok(())
}

/// With our group registered at a low priority, `managedosversions` still
/// means the operator's `elemental.cattle.io` resource.
async fn operator_objects_keep_their_name(bed: &TestBed) -> Result<()> {
    let channel = elemental::apply_custom_channel(
        &bed.client(),
        FLEET_NAMESPACE,
        "skeleton",
        "localhost:1/skeleton:v1",
    )
    .await?;
    elemental::sync_channel(
        &bed.client(),
        &channel,
        &[VersionEntry {
            name: "skeleton-v1.0.0".to_owned(),
            version: "v1.0.0".to_owned(),
            upgrade_image: "localhost:1/os:v1.0.0".to_owned(),
            created: Some(1_700_000_000),
        }],
    )
    .await?;
    let list: Value = serde_json::from_str(
        &bed.kubectl_ok(&[
            "get",
            "managedosversions",
            "-n",
            FLEET_NAMESPACE,
            "-o",
            "json",
        ])
        .await?,
    )?;
    let items = list["items"].as_array().context("no items")?;
    ensure!(items.len() == 1, "{list}");
    ensure!(
        items[0]["apiVersion"] == "elemental.cattle.io/v1beta1",
        "{list}"
    );
    ensure!(items[0]["metadata"]["name"] == "skeleton-v1.0.0", "{list}");
    ensure!(items[0]["spec"]["version"] == "v1.0.0", "{list}");
    Ok(())
}

/// A changelog of a ManagedOSVersion that does not exist is a 404 `Status`,
/// through the aggregator, both for kubectl and on the wire.
async fn missing_version_is_a_not_found_status(bed: &TestBed) -> Result<()> {
    let path = changelog_path(FLEET_NAMESPACE, "nope");
    let out = bed.kubectl(&["get", "--raw", &path]).await?;
    ensure!(!out.status.success(), "kubectl get --raw {path} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("NotFound"), "kubectl said: {stderr}");

    let (code, status) = bed.admin_get_value(&path).await?;
    ensure!(code == 404, "{path}: {code}");
    expect_status(&status, 404, "NotFound")?;
    ensure!(status["details"]["name"] == "nope", "{status}");
    Ok(())
}

/// Straight to our server, as the aggregator would talk to it.
async fn direct_requests(bed: &TestBed) -> Result<()> {
    let server = bed.server().context("our server is not running")?;
    let http = bed.server_http(Some(&bed.pki().admin))?;

    let livez = http.get(format!("{}/livez", server.url())).send().await?;
    ensure!(livez.status() == 200, "/livez: {}", livez.status());

    let unknown = http
        .get(format!("{}/no/such/path", server.url()))
        .send()
        .await?;
    ensure!(
        unknown.status() == 404,
        "unknown path: {}",
        unknown.status()
    );
    expect_status(&unknown.json().await?, 404, "NotFound")?;

    let collection = format!("{}{}", server.url(), summaries_path(FLEET_NAMESPACE));
    let post = http.post(&collection).body("{}").send().await?;
    ensure!(post.status() == 405, "POST: {}", post.status());
    expect_status(&post.json().await?, 405, "MethodNotAllowed")?;
    Ok(())
}

fn verbs(resource: &Value) -> Vec<&str> {
    resource["verbs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

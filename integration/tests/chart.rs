//! The Helm chart against a real kube-apiserver: `helm install` creates
//! objects the API server accepts, the APIService trusts the CA of the
//! generated serving certificate, `helm upgrade` keeps that certificate, and
//! `helm uninstall` removes everything. No pod runs (the test bed has no
//! kubelet), so availability is the skeleton test's business.

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, SERVER_NAMESPACE, TestBed, TestBedOptions, workspace_root,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;

const RELEASE: &str = "elemental-changelog";

#[tokio::test]
async fn chart_installs_upgrades_and_uninstalls() -> Result<()> {
    let bed = TestBed::start(TestBedOptions::default()).await?;
    let result = chart_lifecycle(&bed).await;
    bed.finish(result)
}

async fn chart_lifecycle(bed: &TestBed) -> Result<()> {
    let chart = workspace_root().join("charts/elemental-changelog");
    let chart = chart.to_string_lossy();
    let helm = |verb: &'static str| {
        [
            verb,
            RELEASE,
            &*chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--set",
            "image.tag=test",
        ]
    };
    helm_ok(bed, &helm("install")).await?;

    let secrets: Api<Secret> = Api::namespaced(bed.client(), SERVER_NAMESPACE);
    let secret = secrets.get("elemental-changelog-tls").await?;
    let ca = secret_key(&secret, "ca.crt")?;
    ensure!(secret_key(&secret, "tls.key")?.contains("PRIVATE KEY"));

    let apiservice: APIService = Api::all(bed.client()).get(APISERVICE_NAME).await?;
    let spec = apiservice.spec.context("APIService without spec")?;
    let ca_bundle = spec.ca_bundle.context("APIService without caBundle")?;
    ensure!(
        ca_bundle.0 == ca.as_bytes(),
        "caBundle is not the generated CA"
    );
    ensure!(spec.group_priority_minimum == 100);
    ensure!(spec.insecure_skip_tls_verify != Some(true));
    let service = spec.service.context("APIService without service")?;
    ensure!(service.name.as_deref() == Some(RELEASE));
    ensure!(service.namespace.as_deref() == Some(SERVER_NAMESPACE));
    ensure!(service.port == Some(443));

    let deployment: Deployment = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(RELEASE)
        .await?;
    let pod = deployment
        .spec
        .template
        .spec
        .context("pod template without spec")?;
    ensure!(pod.service_account_name.as_deref() == Some(RELEASE));
    let container = pod.containers.first().context("no container")?;
    ensure!(container.image.as_deref() == Some("ghcr.io/rancher/elemental-changelog:test"));
    let args = container.args.clone().unwrap_or_default();
    ensure!(args.iter().any(|a| a == "--secure-port=8443"), "{args:?}");
    let security = container.security_context.clone().unwrap_or_default();
    ensure!(security.read_only_root_filesystem == Some(true));

    let viewer: ClusterRole = Api::all(bed.client())
        .get("elemental-changelog-viewer")
        .await?;
    let labels = viewer.metadata.labels.unwrap_or_default();
    ensure!(
        labels
            .get("rbac.authorization.k8s.io/aggregate-to-view")
            .map(String::as_str)
            == Some("true")
    );

    // An upgrade keeps the certificate kube-apiserver already trusts.
    helm_ok(bed, &helm("upgrade")).await?;
    let after = secrets.get("elemental-changelog-tls").await?;
    ensure!(
        secret_key(&after, "ca.crt")? == ca,
        "helm upgrade replaced the CA"
    );
    ensure!(secret_key(&after, "tls.crt")? == secret_key(&secret, "tls.crt")?);

    helm_ok(
        bed,
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            SERVER_NAMESPACE,
            "--wait",
        ],
    )
    .await?;
    ensure!(
        Api::<APIService>::all(bed.client())
            .get_opt(APISERVICE_NAME)
            .await?
            .is_none(),
        "the APIService outlived helm uninstall"
    );
    Ok(())
}

async fn helm_ok(bed: &TestBed, args: &[&str]) -> Result<()> {
    let output = bed.helm(args).await?;
    ensure!(
        output.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn secret_key(secret: &Secret, key: &str) -> Result<String> {
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("Secret without {key}"))?;
    String::from_utf8(value.0.clone()).with_context(|| format!("{key} is not text"))
}

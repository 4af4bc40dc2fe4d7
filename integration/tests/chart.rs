//! The Helm chart against a real kube-apiserver: `helm install` creates
//! objects the API server accepts, the APIService trusts the CA of the
//! generated serving certificate, `helm upgrade` keeps that certificate, and
//! `helm uninstall` removes everything. No pod runs (the test bed has no
//! kubelet); for availability, a second test installs and upgrades the chart
//! over the test bed's running server and watches the APIService stay
//! Available. A third lints and renders the chart as Rancher's Apps page
//! installs it (system default registry, proxy, cert-manager, monitoring,
//! Rancher's role API) and checks its Rancher catalog metadata.

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::API_VERSION;
use elemental_changelog_integration::availability::AvailabilityWatch;
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, SERVER_NAMESPACE, SERVICE_NAME, TestBed, TestBedOptions, tools_dir,
    workspace_root,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::api::PostParams;
use serde::Deserialize as _;
use serde_yaml::Value;

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
    for role in ["view", "edit", "admin"] {
        ensure!(
            labels
                .get(&format!("rbac.authorization.k8s.io/aggregate-to-{role}"))
                .map(String::as_str)
                == Some("true"),
            "the viewer ClusterRole is not aggregated to {role}: {labels:?}"
        );
    }

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

// ---------------------------------------------------------------------------
// Install and upgrade over a running server

/// A Helm post-renderer plugin (`postrenderer/v1`) for the test bed, which has
/// no kube-proxy: the chart's Service becomes `ExternalName` → `localhost`, as
/// the test bed registers its own, so kube-apiserver reaches the server.
const EXTERNAL_NAME_PLUGIN: &str = r#"name: "externalname"
version: "0.1.0"
type: postrenderer/v1
apiVersion: v1
runtime: subprocess
runtimeConfig:
  platformCommand:
    - command: "${HELM_PLUGIN_DIR}/render.sh"
"#;
const EXTERNAL_NAME_SCRIPT: &str = "#!/bin/sh\nexec sed 's/^  type: ClusterIP$/  type: ExternalName\\n  externalName: localhost/'\n";

/// `helm install` and `helm upgrade` of the chart over the test bed's running
/// server keep the APIService Available: the chart adopts the serving
/// certificate already in its Secret (`lookup`), so its APIService trusts the
/// same CA, and every state a watch records from before the install to after
/// the upgrade is Available.
#[tokio::test]
async fn install_and_upgrade_keep_the_apiservice_available() -> Result<()> {
    let mut bed = TestBed::start(TestBedOptions::default()).await?;
    bed.start_server(&[]).await?;
    let result = install_and_upgrade(&bed).await;
    bed.finish(result)
}

async fn install_and_upgrade(bed: &TestBed) -> Result<()> {
    let server = bed.server().context("the server is not running")?;
    let port = server.port().to_string();
    // The Secret the chart looks up: the running server's certificate and its CA.
    let secrets: Api<Secret> = Api::namespaced(bed.client(), SERVER_NAMESPACE);
    let tls_secret = format!("{SERVICE_NAME}-tls");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(tls_secret.clone()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            [
                ("ca.crt", bed.pki().server_ca.cert_pem()),
                ("tls.crt", server.serving().cert_pem.clone()),
                ("tls.key", server.serving().key_pem.clone()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
            .collect(),
        ),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await?;
    let plugin = bed.root().join("cache/helm/data/plugins/externalname");
    std::fs::create_dir_all(&plugin)?;
    std::fs::write(plugin.join("plugin.yaml"), EXTERNAL_NAME_PLUGIN)?;
    write_executable(&plugin.join("render.sh"), EXTERNAL_NAME_SCRIPT)?;

    let watch = AvailabilityWatch::start(bed);
    let chart = workspace_root().join("charts/elemental-changelog");
    let chart = chart.to_string_lossy();
    let service_port = format!("service.port={port}");
    let helm = |verb: &'static str, extra: &'static str| {
        [
            verb,
            SERVICE_NAME,
            &*chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--post-renderer",
            "externalname",
            // The test bed registered the Service and APIService first.
            "--take-ownership",
            "--force-conflicts",
            "--set",
            &*service_port,
            "--set",
            extra,
        ]
    };
    // Rancher-style values that need no CRD beyond the test bed's.
    helm_ok(
        bed,
        &helm(
            "install",
            "global.cattle.systemDefaultRegistry=registry.example.com:5000,proxy=http://proxy.example.com:3128",
        ),
    )
    .await?;
    let apiservices: Api<APIService> = Api::all(bed.client());
    let installed = apiservices.get(APISERVICE_NAME).await?;
    let labels = installed.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("Helm"),
        "the APIService is not the chart's: {labels:?}"
    );
    let spec = installed.spec.context("APIService without spec")?;
    ensure!(
        spec.ca_bundle.map(|b| b.0) == Some(bed.pki().server_ca.cert_pem().into_bytes()),
        "the chart's caBundle is not the CA of the certificate in its Secret"
    );
    // Requests reach the server through the chart's APIService.
    let listed = bed
        .kubectl_ok(&[
            "get",
            "--raw",
            "/apis/changelog.elemental.cattle.io/v1beta1/managedosversions",
        ])
        .await?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    ensure!(
        listed["kind"] == "ManagedOSVersionChangelogSummaryList",
        "{listed}"
    );
    let deployment: Deployment = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(SERVICE_NAME)
        .await?;
    let image = deployment
        .spec
        .template
        .spec
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default();
    ensure!(
        image.starts_with("registry.example.com:5000/rancher/elemental-changelog:"),
        "{image}"
    );

    helm_ok(bed, &helm("upgrade", "replicaCount=3")).await?;
    let after = secrets.get(&tls_secret).await?;
    ensure!(
        after.data == secret.data,
        "helm upgrade replaced the serving certificate"
    );
    watch.finish(bed).await
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Rancher's Apps page

/// Runs the test bed's helm offline (no cluster), with its own homes.
async fn helm_offline(home: &Path, args: &[&str]) -> Result<String> {
    let output = tokio::process::Command::new(tools_dir().join("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", home.join("no-kubeconfig"))
        .kill_on_drop(true)
        .output()
        .await
        .context("running helm")?;
    ensure!(
        output.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

fn yaml_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// The documents of a rendered chart.
fn documents(rendered: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(rendered) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

fn find<'a>(documents: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    documents
        .iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .with_context(|| format!("no {kind} {name} rendered"))
}

fn string<'a>(value: &'a Value, what: &str) -> Result<&'a str> {
    value
        .as_str()
        .with_context(|| format!("{what} is not a string: {value:?}"))
}

#[tokio::test]
async fn rancher_chart_lints_and_renders() -> Result<()> {
    let home = tempfile::tempdir()?;
    let home = home.path();
    let chart_dir = workspace_root().join("charts/elemental-changelog");
    let chart = chart_dir.to_string_lossy();
    let rancher_values = chart_dir.join("ci/rancher-values.yaml");
    let rancher = rancher_values.to_string_lossy();
    helm_offline(home, &["lint", "--strict", &chart, "--values", &rancher]).await?;

    // Rancher's catalog metadata, as the elemental-operator chart has it.
    let meta = yaml_file(&chart_dir.join("Chart.yaml"))?;
    let annotation = |key: &str| meta["annotations"][format!("catalog.cattle.io/{key}")].as_str();
    ensure!(annotation("namespace") == Some(SERVER_NAMESPACE));
    ensure!(annotation("release-name") == Some(SERVICE_NAME));
    ensure!(annotation("provides-gvr") == Some(API_VERSION));
    ensure!(annotation("requires-gvr") == Some("elemental.cattle.io/v1beta1"));
    ensure!(annotation("type") == Some("cluster-tool"));
    ensure!(annotation("os") == Some("linux"));
    for key in ["display-name", "kube-version", "rancher-version"] {
        ensure!(annotation(key).is_some_and(|v| !v.is_empty()), "no {key}");
    }
    ensure!(
        meta["icon"]
            .as_str()
            .is_some_and(|i| i.starts_with("https://"))
    );
    ensure!(
        !std::fs::read_to_string(chart_dir.join("app-readme.md"))?
            .trim()
            .is_empty()
    );

    // Every question of the Apps form sets a value the chart has.
    let values = yaml_file(&chart_dir.join("values.yaml"))?;
    let questions = yaml_file(&chart_dir.join("questions.yaml"))?;
    let mut variables = Vec::new();
    for q in questions["questions"]
        .as_sequence()
        .context("no questions")?
    {
        variables.push(string(&q["variable"], "variable")?.to_owned());
        for sub in q["subquestions"].as_sequence().into_iter().flatten() {
            variables.push(string(&sub["variable"], "variable")?.to_owned());
        }
    }
    for wanted in [
        "replicaCount",
        "server.namespaces",
        "resources.limits.memory",
        "tls.certManager.enabled",
        "registry.configSecret",
        "registry.caConfigMap",
        "proxy",
    ] {
        ensure!(
            variables.iter().any(|v| v == wanted),
            "no question sets {wanted}"
        );
    }
    for variable in &variables {
        let mut node = &values;
        for part in variable.split('.') {
            node = &node[part];
        }
        // issuerRef is an empty map by default: its keys are documented in values.yaml.
        ensure!(
            !node.is_null() || variable.starts_with("tls.certManager.issuerRef."),
            "question {variable} is not a value of values.yaml"
        );
    }

    let render = async |extra: &[&str]| -> Result<Vec<Value>> {
        let mut args = vec![
            "template",
            SERVICE_NAME,
            &*chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--values",
            &*rancher,
        ];
        args.extend_from_slice(extra);
        let rendered = helm_offline(home, &args).await?;
        documents(&rendered)
    };
    let docs = render(&[]).await?;
    let rancher_values = yaml_file(&rancher_values)?;
    let registry = string(
        &rancher_values["global"]["cattle"]["systemDefaultRegistry"],
        "registry",
    )?;
    let repository = string(&values["image"]["repository"], "image.repository")?;
    let app_version = string(&meta["appVersion"], "appVersion")?;

    let deployment = find(&docs, "Deployment", SERVICE_NAME)?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    ensure!(
        container["image"].as_str()
            == Some(format!("{registry}/{repository}:{app_version}").as_str()),
        "image {:?} is not from the system default registry",
        container["image"]
    );
    ensure!(
        pod["imagePullSecrets"] == rancher_values["imagePullSecrets"],
        "{:?}",
        pod["imagePullSecrets"]
    );
    ensure!(deployment["spec"]["replicas"] == rancher_values["replicaCount"]);
    ensure!(
        container["resources"]["limits"]["memory"]
            == rancher_values["resources"]["limits"]["memory"]
    );
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|e| e["name"].as_str() == Some(name))
            .map(|e| e["value"].clone())
    };
    for (variable, value) in [
        ("HTTP_PROXY", "proxy"),
        ("HTTPS_PROXY", "proxy"),
        ("NO_PROXY", "noProxy"),
    ] {
        ensure!(
            env(variable).as_ref() == Some(&rancher_values[value]),
            "{variable}: {:?}",
            env(variable)
        );
    }
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for namespace in string(&rancher_values["server"]["namespaces"], "namespaces")?.split(',') {
        let flag = format!("--namespace={}", namespace.trim());
        ensure!(args.contains(&flag.as_str()), "{flag} not in {args:?}");
    }
    ensure!(
        pod["tolerations"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|t| t["key"].as_str() == Some("cattle.io/os")
                && t["value"].as_str() == Some("linux")
                && t["effect"].as_str() == Some("NoSchedule")),
        "no cattle.io/os=linux toleration: {:?}",
        pod["tolerations"]
    );

    let service_dns = format!("{SERVICE_NAME}.{SERVER_NAMESPACE}.svc");
    let cluster_domain = string(&rancher_values["clusterDomain"], "clusterDomain")?;
    let certificate = find(&docs, "Certificate", SERVICE_NAME)?;
    let fqdn = format!("{service_dns}.{cluster_domain}");
    ensure!(
        certificate["spec"]["dnsNames"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|n| n.as_str() == Some(fqdn.as_str())),
        "{fqdn} not in the certificate"
    );
    let apiservice = find(&docs, "APIService", APISERVICE_NAME)?;
    let annotations = &apiservice["metadata"]["annotations"];
    ensure!(annotations["cert-manager.io/inject-ca-from"].is_string());
    for (key, value) in rancher_values["apiService"]["annotations"]
        .as_mapping()
        .context("apiService.annotations")?
    {
        ensure!(
            &annotations[key] == value,
            "APIService annotation {key:?} missing"
        );
    }

    // The ServiceMonitor scrapes with a token of its own and verifies the CA.
    let monitor = find(&docs, "ServiceMonitor", SERVICE_NAME)?;
    let endpoint = &monitor["spec"]["endpoints"][0];
    let token_secret = string(
        &endpoint["authorization"]["credentials"]["name"],
        "credentials",
    )?;
    let token = find(&docs, "Secret", token_secret)?;
    ensure!(token["type"].as_str() == Some("kubernetes.io/service-account-token"));
    let scraper = string(
        &token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "SA",
    )?;
    find(&docs, "ServiceAccount", scraper)?;
    let binding = find(
        &docs,
        "ClusterRoleBinding",
        &format!("{SERVICE_NAME}-metrics-reader"),
    )?;
    ensure!(binding["subjects"][0]["name"].as_str() == Some(scraper));
    let metrics_reader = find(
        &docs,
        "ClusterRole",
        string(&binding["roleRef"]["name"], "roleRef")?,
    )?;
    ensure!(metrics_reader["rules"][0]["nonResourceURLs"][0].as_str() == Some("/metrics"));
    let endpoint_keys = endpoint.as_mapping().context("endpoint")?;
    ensure!(
        !endpoint_keys.contains_key("bearerTokenFile"),
        "bearerTokenFile is deprecated"
    );
    let tls = &endpoint["tlsConfig"];
    ensure!(
        tls.as_mapping()
            .is_some_and(|t| !t.contains_key("insecureSkipVerify")),
        "the scrape must verify the server: {tls:?}"
    );
    ensure!(
        tls["ca"]["secret"]["name"].as_str() == Some(format!("{SERVICE_NAME}-tls").as_str())
            && tls["ca"]["secret"]["key"].as_str() == Some("ca.crt"),
        "{tls:?}"
    );
    ensure!(tls["serverName"].as_str() == Some(service_dns.as_str()));

    // The viewer is aggregated to view, edit and admin; Rancher's roles only
    // where Rancher's API exists, with the viewer's rules.
    let viewer = find(&docs, "ClusterRole", "elemental-changelog-viewer")?;
    for role in ["view", "edit", "admin"] {
        ensure!(
            viewer["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")]
                .as_str()
                == Some("true")
        );
    }
    for kind in ["RoleTemplate", "GlobalRole"] {
        ensure!(
            docs.iter().all(|d| d["kind"].as_str() != Some(kind)),
            "{kind} rendered without Rancher"
        );
    }
    let on_rancher = render(&[
        "--api-versions",
        "management.cattle.io/v3/RoleTemplate",
        "--api-versions",
        "management.cattle.io/v3/GlobalRole",
    ])
    .await?;
    for kind in ["RoleTemplate", "GlobalRole"] {
        let role = find(&on_rancher, kind, "elemental-changelog-viewer")?;
        ensure!(
            role["rules"] == viewer["rules"],
            "{kind} rules differ from the viewer's"
        );
        ensure!(role["displayName"].as_str() == Some("Elemental Changelog Reader"));
    }
    ensure!(
        find(&on_rancher, "RoleTemplate", "elemental-changelog-viewer")?["context"].as_str()
            == Some("cluster")
    );
    let disabled = render(&[
        "--api-versions",
        "management.cattle.io/v3/RoleTemplate",
        "--set",
        "rancher.roleTemplate.enabled=false",
    ])
    .await?;
    ensure!(
        disabled
            .iter()
            .all(|d| d["kind"].as_str() != Some("RoleTemplate"))
    );
    Ok(())
}

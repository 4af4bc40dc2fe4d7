//! The Helm chart against a real kube-apiserver: `helm install` creates
//! objects the API server accepts, the APIService trusts the CA of the
//! generated serving certificate, `helm upgrade` keeps that certificate, and
//! `helm uninstall` removes everything. No pod runs (the test bed has no
//! kubelet); for availability, a second test installs and upgrades the chart
//! over the test bed's running server and watches the APIService stay
//! Available. A third lints and renders the chart as Rancher's Apps page
//! installs it (system default registry, proxy, cert-manager, monitoring,
//! Rancher's role API) and checks its Rancher catalog metadata. A fourth renders it
//! with every answer Rancher's form can send (each question at its default and at
//! another value) and checks the issuer, memory and replica settings. A fifth
//! installs it next to Rancher's UIPlugin CRD and fetches every file of the built UI
//! extension from the endpoint the UIPlugin names, as Rancher does, then installs it
//! on a Rancher too old for the extension (its `server-version` Setting) and finds no
//! UIPlugin. A sixth renders values that must mean what they say: memory sizes reach
//! the server's flags as the same bytes, the smallest memory limit named in the error
//! renders, `noProxy` works without `proxy`.

use std::path::Path;

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_apiservice::API_VERSION;
use elemental_changelog_integration::availability::AvailabilityWatch;
use elemental_changelog_integration::testbed::{
    APISERVICE_NAME, SERVER_NAMESPACE, SERVICE_NAME, TestBed, TestBedOptions, tools_dir,
    workspace_root,
};
use elemental_changelog_registry::config::parse_byte_size;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
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
    // The server runs in the chart as on the test bed (and in the image).
    for (variable, value) in elemental_changelog_integration::testbed::MALLOC {
        ensure!(
            env(variable)
                .and_then(|v| v.as_str().map(str::to_owned))
                .as_deref()
                == Some(value),
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
    let watched: Vec<String> = string(&rancher_values["server"]["namespaces"], "namespaces")?
        .split(',')
        .map(|n| n.trim().to_owned())
        .collect();
    credentials_granted_narrowly(&render, &watched).await?;
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

    // The ServiceMonitor scrapes with Prometheus's own ServiceAccount token (no long-lived
    // token Secret), which is granted /metrics, and verifies the CA (issue 26).
    let monitor = find(&docs, "ServiceMonitor", SERVICE_NAME)?;
    let endpoint = &monitor["spec"]["endpoints"][0];
    ensure!(
        docs.iter()
            .all(|d| d["type"].as_str() != Some("kubernetes.io/service-account-token")),
        "a long-lived ServiceAccount token Secret is rendered"
    );
    ensure!(
        endpoint["bearerTokenFile"].as_str()
            == Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
            && endpoint["authorization"].is_null(),
        "the scrape does not use Prometheus's own token: {endpoint:?}"
    );
    let binding = find(
        &docs,
        "ClusterRoleBinding",
        &format!("{SERVICE_NAME}-metrics-reader"),
    )?;
    ensure!(
        binding["subjects"][0]["name"].as_str() == Some("rancher-monitoring-prometheus")
            && binding["subjects"][0]["namespace"].as_str() == Some("cattle-monitoring-system"),
        "{binding:?}"
    );
    let metrics_reader = find(
        &docs,
        "ClusterRole",
        string(&binding["roleRef"]["name"], "roleRef")?,
    )?;
    ensure!(metrics_reader["rules"][0]["nonResourceURLs"][0].as_str() == Some("/metrics"));
    let other = render(&[
        "--set",
        "serviceMonitor.prometheusServiceAccount.name=kps-kube-prometheus-prometheus",
        "--set",
        "serviceMonitor.prometheusServiceAccount.namespace=monitoring",
    ])
    .await?;
    let binding = find(
        &other,
        "ClusterRoleBinding",
        &format!("{SERVICE_NAME}-metrics-reader"),
    )?;
    ensure!(
        binding["subjects"][0]["name"].as_str() == Some("kps-kube-prometheus-prometheus")
            && binding["subjects"][0]["namespace"].as_str() == Some("monitoring"),
        "{binding:?}"
    );
    let unbound = render(&["--set", "serviceMonitor.prometheusServiceAccount.name="]).await?;
    ensure!(
        unbound
            .iter()
            .all(|d| d["kind"].as_str() != Some("ClusterRoleBinding")
                || d["metadata"]["name"].as_str()
                    != Some(&format!("{SERVICE_NAME}-metrics-reader"))),
        "bound with no Prometheus ServiceAccount named"
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

    // The changelog viewer is aggregated to view, edit and admin; the fleet view's machine
    // and plan readers are roles of their own, aggregated to nothing by default (machine data
    // the elemental-operator grants to no built-in role). Rancher's roles only where Rancher's
    // API exists, one per ClusterRole with its rules.
    let viewer = find(&docs, "ClusterRole", "elemental-changelog-viewer")?;
    let machine_reader = find(&docs, "ClusterRole", "elemental-changelog-machine-reader")?;
    let plan_reader = find(&docs, "ClusterRole", "elemental-changelog-plan-reader")?;
    let grants = |role: &serde_yaml::Value, group: &str, resource: &str, verb: &str| {
        role["rules"].as_sequence().is_some_and(|rules| {
            rules.iter().any(|r| {
                r["apiGroups"]
                    .as_sequence()
                    .is_some_and(|g| g.iter().any(|g| g.as_str() == Some(group)))
                    && r["resources"]
                        .as_sequence()
                        .is_some_and(|x| x.iter().any(|x| x.as_str() == Some(resource)))
                    && r["verbs"]
                        .as_sequence()
                        .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(verb)))
            })
        })
    };
    for (role, name, resource, verb) in [
        (
            machine_reader,
            "machine reader",
            "machineinventories",
            "get",
        ),
        (
            machine_reader,
            "machine reader",
            "machineinventories",
            "list",
        ),
        (
            machine_reader,
            "machine reader",
            "machineinventories/changelog",
            "get",
        ),
        (
            plan_reader,
            "plan reader",
            "managedosimages/changelog",
            "get",
        ),
        (viewer, "viewer", "managedosversions", "list"),
        (viewer, "viewer", "managedosversions/changelog", "get"),
    ] {
        ensure!(
            grants(role, "changelog.elemental.cattle.io", resource, verb),
            "the {name} lacks {verb} on {resource}"
        );
    }
    for resource in [
        "machineinventories",
        "machineinventories/changelog",
        "managedosimages/changelog",
    ] {
        ensure!(
            !grants(viewer, "changelog.elemental.cattle.io", resource, "get")
                && !grants(viewer, "changelog.elemental.cattle.io", resource, "list"),
            "the aggregated viewer grants the fleet view's {resource}"
        );
    }
    let aggregated_to = |role: &serde_yaml::Value| -> Vec<String> {
        role["metadata"]["labels"]
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                let role = k
                    .as_str()?
                    .strip_prefix("rbac.authorization.k8s.io/aggregate-to-")?;
                (v.as_str() == Some("true")).then(|| role.to_owned())
            })
            .collect()
    };
    ensure!(
        aggregated_to(viewer) == ["view", "edit", "admin"],
        "{viewer:?}"
    );
    for role in [machine_reader, plan_reader] {
        ensure!(
            aggregated_to(role).is_empty(),
            "the fleet view is aggregated by default: {role:?}"
        );
    }
    let opted_in = render(&["--set", "rbac.fleetView.aggregateTo={view}"]).await?;
    for name in [
        "elemental-changelog-machine-reader",
        "elemental-changelog-plan-reader",
    ] {
        ensure!(
            aggregated_to(find(&opted_in, "ClusterRole", name)?) == ["view"],
            "{name} not aggregated to view with rbac.fleetView.aggregateTo"
        );
    }
    let server_role = find(&docs, "ClusterRole", RELEASE)?;
    for resource in [
        "machineinventories",
        "machineinventoryselectors",
        "managedosimages",
    ] {
        for verb in ["list", "watch"] {
            ensure!(
                grants(server_role, "elemental.cattle.io", resource, verb),
                "the server lacks {verb} on {resource}"
            );
        }
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
        for (cluster_role, display) in [
            (viewer, "Elemental Changelog Reader"),
            (machine_reader, "Elemental Machine Reader"),
            (plan_reader, "Elemental Upgrade Plan Reader"),
        ] {
            let name = string(&cluster_role["metadata"]["name"], "name")?;
            let role = find(&on_rancher, kind, name)?;
            ensure!(
                role["rules"] == cluster_role["rules"],
                "{kind} {name}: rules differ from the ClusterRole's"
            );
            ensure!(role["displayName"].as_str() == Some(display));
            if kind == "RoleTemplate" {
                ensure!(role["context"].as_str() == Some("cluster"));
            }
        }
    }
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
    pods_and_peers_are_narrow(&render).await
}

/// Issue 26: the server's pods run at `system-cluster-critical` unless told otherwise; its
/// NetworkPolicy admits kube-apiserver's peers (required) and the monitoring namespace when
/// scraped, the extension's only Rancher's namespace.
async fn pods_and_peers_are_narrow(
    render: &impl AsyncFn(&[&str]) -> Result<Vec<Value>>,
) -> Result<()> {
    let pod_spec = |docs: &[Value]| -> Result<Value> {
        Ok(find(docs, "Deployment", SERVICE_NAME)?["spec"]["template"]["spec"].clone())
    };
    ensure!(
        pod_spec(&render(&[]).await?)?["priorityClassName"].as_str()
            == Some("system-cluster-critical")
    );
    ensure!(
        pod_spec(&render(&["--set", "priorityClassName=tenant-high"]).await?)?["priorityClassName"]
            .as_str()
            == Some("tenant-high")
    );
    ensure!(
        pod_spec(&render(&["--set", "priorityClassName="]).await?)?["priorityClassName"].is_null()
    );

    // Enabled without kube-apiserver's peers: refused, naming the value.
    let refused = render(&["--set", "networkPolicy.enabled=true"]).await;
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("networkPolicy.from")),
        "a NetworkPolicy admitting every source renders: {refused:?}"
    );
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.from[0].ipBlock.cidr=10.0.0.0/24",
        "--api-versions",
        "catalog.cattle.io/v1/UIPlugin",
    ])
    .await?;
    let policies: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("NetworkPolicy"))
        .collect();
    ensure!(policies.len() == 2, "{policies:?}");
    for policy in &policies {
        for rule in policy["spec"]["ingress"].as_sequence().context("ingress")? {
            ensure!(
                rule["from"].as_sequence().is_some_and(|f| !f.is_empty()),
                "an ingress rule admits every source: {policy:?}"
            );
        }
    }
    let server = find(&docs, "NetworkPolicy", SERVICE_NAME)?;
    let rules = server["spec"]["ingress"].as_sequence().context("ingress")?;
    ensure!(
        rules[0]["from"][0]["ipBlock"]["cidr"].as_str() == Some("10.0.0.0/24"),
        "{server:?}"
    );
    // The ci values enable the ServiceMonitor: Prometheus's namespace is admitted too.
    ensure!(
        rules.len() == 2
            && rules[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                .as_str()
                == Some("cattle-monitoring-system"),
        "{server:?}"
    );
    let extension = policies
        .iter()
        .find(|p| p["metadata"]["name"].as_str() != Some(SERVICE_NAME))
        .context("the extension's NetworkPolicy")?;
    ensure!(
        extension["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
            ["kubernetes.io/metadata.name"]
            .as_str()
            == Some("cattle-system"),
        "{extension:?}"
    );
    Ok(())
}

/// The `--registry-credential-namespace` flags of the Deployment `render` gives with `extra`.
async fn credential_namespaces(
    render: &impl AsyncFn(&[&str]) -> Result<Vec<Value>>,
    extra: &[&str],
) -> Result<Vec<String>> {
    let docs = render(extra).await?;
    let deployment = find(&docs, "Deployment", SERVICE_NAME)?;
    Ok(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|arg| arg.strip_prefix("--registry-credential-namespace="))
            .map(str::to_owned)
            .collect(),
    )
}

/// Issue 32: credentials that name no namespace go to the watched namespaces, else to
/// `fleet-default` only; every namespace only when asked for.
async fn credentials_granted_narrowly(
    render: &impl AsyncFn(&[&str]) -> Result<Vec<Value>>,
    watched: &[String],
) -> Result<()> {
    let secret = ["--set", "registry.configSecret=registry-credentials"];
    let granted = credential_namespaces(render, &secret).await?;
    ensure!(granted == watched, "{granted:?}, watched {watched:?}");
    let all = [&secret[..], &["--set", "server.namespaces="]].concat();
    let granted = credential_namespaces(render, &all).await?;
    ensure!(granted == ["fleet-default"], "{granted:?}");
    let wide = [&all[..], &["--set", "registry.credentialNamespaces={*}"]].concat();
    let granted = credential_namespaces(render, &wide).await?;
    ensure!(granted == ["*"], "{granted:?}");
    Ok(())
}

// ---------------------------------------------------------------------------
// Every answer of Rancher's form

/// A non-default value for a string question, and the answers that must come with it
/// for it to be used (a CA bundle needs its Secret, a bundle key its ConfigMap).
fn other_string(variable: &str) -> Option<(Value, Vec<(&'static str, Value)>)> {
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let s = |v: &str| Value::String(v.to_owned());
    Some(match variable {
        "server.namespaces" => (s("fleet-default, elemental-edge"), vec![]),
        "resources.limits.memory" => (s("512Mi"), vec![]),
        "server.memoryBudget" => (s("136Mi"), vec![]),
        "server.answerCacheSize" => (s("16Mi"), vec![]),
        "server.maxKeptTotal" => (s("8Mi"), vec![]),
        "tls.certManager.issuerRef.name" => (s("my-issuer"), vec![]),
        "tls.existingSecret" => (s("my-tls"), vec![("tls.caBundle", s(PEM))]),
        "tls.caBundle" => (s(PEM), vec![("tls.existingSecret", s("my-tls"))]),
        "registry.configSecret" => (s("registry-credentials"), vec![]),
        "registry.caConfigMap" => (s("registry-ca"), vec![]),
        "registry.caBundleKey" => (
            s("bundle.pem"),
            vec![("registry.caConfigMap", s("registry-ca"))],
        ),
        "proxy" => (s("http://proxy.example.com:3128"), vec![]),
        "noProxy" => (s("127.0.0.0/8,.svc,.cluster.local"), vec![]),
        _ => return None,
    })
}

/// One question of questions.yaml: its variable, default and type, and for a subquestion
/// the parent's variable and the value that shows it.
struct Question {
    variable: String,
    default: Value,
    kind: String,
    options: Vec<Value>,
    min: Option<i64>,
    shown_by: Option<(String, Value)>,
}

fn questions(file: &Value) -> Result<Vec<Question>> {
    let mut out = Vec::new();
    let read = |q: &Value, shown_by: Option<(String, Value)>| -> Result<Question> {
        Ok(Question {
            variable: string(&q["variable"], "variable")?.to_owned(),
            default: q["default"].clone(),
            kind: string(&q["type"], "type")?.to_owned(),
            options: q["options"].as_sequence().cloned().unwrap_or_default(),
            min: q["min"].as_i64(),
            shown_by,
        })
    };
    for q in file["questions"].as_sequence().context("no questions")? {
        let parent = read(q, None)?;
        for sub in q["subquestions"].as_sequence().into_iter().flatten() {
            let shown = q["show_subquestion_if"].clone();
            out.push(read(sub, Some((parent.variable.clone(), shown)))?);
        }
        out.push(parent);
    }
    Ok(out)
}

/// Sets `variable` (dotted) to `value` in a values map.
fn set(values: &mut Value, variable: &str, value: Value) {
    let mut node = values;
    let parts: Vec<&str> = variable.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        if !node[*part].is_mapping() {
            node[*part] = Value::Mapping(serde_yaml::Mapping::new());
        }
        node = &mut node[*part];
    }
    node[parts[parts.len() - 1]] = value;
}

fn get<'a>(values: &'a Value, variable: &str) -> &'a Value {
    variable.split('.').fold(values, |node, part| &node[part])
}

/// Bytes of a `--flag=<size>` argument, as the server parses it.
fn size_arg(args: &[&str], flag: &str) -> Result<u64> {
    let value = args
        .iter()
        .find_map(|a| a.strip_prefix(flag))
        .with_context(|| format!("no {flag} in {args:?}"))?;
    parse_byte_size(value).with_context(|| format!("the server refuses {flag}{value}"))
}

/// Bytes the chart counts for `machines` expected MachineInventories
/// (`fleet.expectedMachines`, 3Ki each, the figure `make bench` measured).
fn machines_bytes(machines: u64) -> u64 {
    machines * 3 * 1024
}

/// Bytes of a Kubernetes memory quantity of the forms the chart's values use.
fn quantity(text: &str) -> Result<u64> {
    for (suffix, factor) in [
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
    ] {
        if let Some(n) = text.strip_suffix(suffix) {
            return Ok(n.parse::<u64>()? * factor);
        }
    }
    Ok(text.parse()?)
}

const MIB: u64 = 1 << 20;

/// What a rendering of the chart with `answers` must hold.
fn check_rendering(docs: &[Value], answers: &Value) -> Result<()> {
    let fullname = SERVICE_NAME;
    // cert-manager: a Certificate always names an issuer; an empty name means our own CA.
    if get(answers, "tls.certManager.enabled").as_bool() == Some(true) {
        let certificate = find(docs, "Certificate", fullname)?;
        let issuer = &certificate["spec"]["issuerRef"];
        let name = string(&issuer["name"], "issuerRef.name")?;
        let asked = get(answers, "tls.certManager.issuerRef.name")
            .as_str()
            .unwrap_or_default();
        if asked.is_empty() {
            ensure!(name == format!("{fullname}-ca"), "issuerRef {issuer:?}");
            find(docs, "Issuer", &format!("{fullname}-ca"))?;
            find(docs, "Certificate", &format!("{fullname}-ca"))?;
        } else {
            ensure!(name == asked, "issuerRef {issuer:?}");
            ensure!(issuer["kind"] == *get(answers, "tls.certManager.issuerRef.kind"));
            ensure!(
                docs.iter().all(|d| d["kind"].as_str() != Some("Issuer")),
                "an Issuer was rendered although {asked} was named"
            );
        }
    }
    for doc in docs {
        if doc["kind"].as_str() == Some("Certificate") {
            ensure!(
                doc["spec"]["issuerRef"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty()),
                "Certificate {:?} with an empty issuer",
                doc["metadata"]["name"]
            );
        }
    }
    // Replicas and memory settings.
    let deployment = find(docs, "Deployment", fullname)?;
    ensure!(deployment["spec"]["replicas"] == *get(answers, "replicaCount"));
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let budget = size_arg(&args, "--memory-budget=")?;
    let answer_cache = size_arg(&args, "--answer-cache-size=")?;
    let kept = size_arg(&args, "--max-kept-total=")?;
    let limit = quantity(string(
        &container["resources"]["limits"]["memory"],
        "memory limit",
    )?)?;
    ensure!(
        budget >= 128 * MIB,
        "--memory-budget={budget} is below 128Mi"
    );
    // The process's 64Mi and what the expected machines take outside the budget.
    let overhead =
        64 * MIB + machines_bytes(get(answers, "fleet.expectedMachines").as_u64().unwrap_or(0));
    ensure!(
        budget + answer_cache + kept + overhead <= limit,
        "budget {budget} + answer cache {answer_cache} + kept data {kept} + {overhead} > limit {limit}"
    );
    // Each value exactly as given, or derived exactly from the limit.
    let given = |variable: &str| -> Result<Option<u64>> {
        match get(answers, variable) {
            Value::Null => Ok(None),
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) => Ok(Some(quantity(s)?)),
            Value::Number(n) => Ok(n.as_u64()),
            other => bail!("{variable}: {other:?}"),
        }
    };
    ensure!(answer_cache == given("server.answerCacheSize")?.unwrap_or(limit / 8));
    ensure!(kept == given("server.maxKeptTotal")?.unwrap_or(limit / 16));
    ensure!(
        budget == given("server.memoryBudget")?.unwrap_or(limit - overhead - answer_cache - kept)
    );
    // The extension, on a cluster with Rancher's UIPlugin API.
    let plugin = find(docs, "UIPlugin", "elemental-changelog")?;
    ensure!(plugin["metadata"]["namespace"].as_str() == Some("cattle-ui-plugin-system"));
    ensure!(
        string(&plugin["spec"]["plugin"]["endpoint"], "endpoint")?.starts_with(&format!(
            "http://{fullname}-extension.{SERVER_NAMESPACE}.svc."
        ))
    );
    Ok(())
}

#[tokio::test]
async fn every_rancher_question_renders_at_its_default_and_another_value() -> Result<()> {
    let home = tempfile::tempdir()?;
    let chart_dir = workspace_root().join("charts/elemental-changelog");
    let chart = chart_dir.to_string_lossy().into_owned();
    let questions = questions(&yaml_file(&chart_dir.join("questions.yaml"))?)?;

    // Rancher's form sends an answer for every question, at its default unless changed.
    let mut defaults = Value::Mapping(serde_yaml::Mapping::new());
    for q in &questions {
        set(&mut defaults, &q.variable, q.default.clone());
    }
    let render = async |answers: &Value| -> Result<Vec<Value>> {
        let file = home.path().join("answers.yaml");
        std::fs::write(&file, serde_yaml::to_string(answers)?)?;
        let file = file.to_string_lossy().into_owned();
        let rendered = helm_offline(
            home.path(),
            &[
                "template",
                SERVICE_NAME,
                &chart,
                "--namespace",
                SERVER_NAMESPACE,
                "--values",
                &file,
                "--api-versions",
                "catalog.cattle.io/v1/UIPlugin",
            ],
        )
        .await?;
        documents(&rendered)
    };
    check_rendering(&render(&defaults).await?, &defaults)
        .context("all answers at their defaults")?;

    for q in &questions {
        let mut answers = defaults.clone();
        if let Some((parent, shown)) = &q.shown_by {
            set(&mut answers, parent, shown.clone());
        }
        let other = match q.kind.as_str() {
            "boolean" => Value::Bool(!q.default.as_bool().context("boolean default")?),
            "int" => {
                let default = q.default.as_i64().context("int default")?;
                Value::from(q.min.filter(|m| *m != default).unwrap_or(default + 1))
            }
            "enum" => q
                .options
                .iter()
                .find(|o| **o != q.default)
                .cloned()
                .context("an enum with one option")?,
            "string" | "multiline" => {
                let (value, with) = other_string(&q.variable).with_context(|| {
                    format!(
                        "question {}: add a non-default value to other_string()",
                        q.variable
                    )
                })?;
                for (variable, value) in with {
                    set(&mut answers, variable, value);
                }
                value
            }
            kind => bail!("question {}: type {kind} is not covered", q.variable),
        };
        set(&mut answers, &q.variable, other.clone());
        let docs = render(&answers)
            .await
            .with_context(|| format!("{} = {other:?}", q.variable))?;
        check_rendering(&docs, &answers).with_context(|| format!("{} = {other:?}", q.variable))?;
    }

    // The cert-manager answer of the bug: the form's empty issuer creates our own CA.
    let mut answers = defaults.clone();
    set(&mut answers, "tls.certManager.enabled", Value::Bool(true));
    set(
        &mut answers,
        "tls.certManager.issuerRef.name",
        Value::String(String::new()),
    );
    set(
        &mut answers,
        "tls.certManager.issuerRef.kind",
        Value::String("ClusterIssuer".into()),
    );
    check_rendering(&render(&answers).await?, &answers).context("empty ClusterIssuer")?;

    // A memory limit too small for the budget the server needs fails the install, saying why.
    let mut answers = defaults.clone();
    set(
        &mut answers,
        "resources.limits.memory",
        Value::String("200Mi".into()),
    );
    let error = render(&answers).await.expect_err("a 200Mi limit rendered");
    ensure!(format!("{error:#}").contains("at least 237Mi"), "{error:#}");
    let mut answers = defaults.clone();
    set(
        &mut answers,
        "server.memoryBudget",
        Value::String("512Mi".into()),
    );
    let error = render(&answers)
        .await
        .expect_err("a budget over the limit rendered");
    ensure!(format!("{error:#}").contains("do not fit"), "{error:#}");

    // The memory formula counts machines: 50,000 expected MachineInventories take 3Ki each
    // outside the budget, so the default 256Mi limit no longer leaves the budget the server
    // needs, and a limit that holds them leaves the budget less what they take.
    let mut answers = defaults.clone();
    set(&mut answers, "fleet.expectedMachines", Value::from(50_000));
    let error = render(&answers)
        .await
        .expect_err("50,000 machines rendered within 256Mi");
    ensure!(format!("{error:#}").contains("memory budget"), "{error:#}");
    set(
        &mut answers,
        "resources.limits.memory",
        Value::String("1Gi".into()),
    );
    let docs = render(&answers).await?;
    check_rendering(&docs, &answers).context("50,000 machines in 1Gi")?;
    let deployment = find(&docs, "Deployment", SERVICE_NAME)?;
    let args: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // 1024Mi - 64Mi - 50,000 x 3Ki (150000Ki) - 128Mi (answers) - 64Mi (kept), exactly.
    let budget = size_arg(&args, "--memory-budget=")?;
    ensure!(
        budget == 1024 * MIB - 64 * MIB - 150_000 * 1024 - 128 * MIB - 64 * MIB,
        "--memory-budget={budget} for 50,000 machines in 1Gi"
    );
    // Machines are a count: anything else is refused by the values schema, with its name.
    for bad in [Value::from(-1), Value::String("many".into())] {
        let mut answers = defaults.clone();
        set(&mut answers, "fleet.expectedMachines", bad.clone());
        let error = render(&answers)
            .await
            .expect_err("a bad fleet.expectedMachines rendered");
        ensure!(
            format!("{error:#}").contains("expectedMachines"),
            "{bad:?}: {error:#}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Values that mean what they say

/// Environment variables as name and value.
type Env = Vec<(String, String)>;

/// The server container of a rendering: its args and its env.
fn server_container(docs: &[Value]) -> Result<(Vec<String>, Env)> {
    let container =
        &find(docs, "Deployment", SERVICE_NAME)?["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let env = container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    Ok((args, env))
}

#[tokio::test]
async fn chart_values_mean_what_they_say() -> Result<()> {
    let home = tempfile::tempdir()?;
    let chart_dir = workspace_root().join("charts/elemental-changelog");
    let chart = chart_dir.to_string_lossy().into_owned();
    let render = async |set: &[&str]| -> Result<Vec<Value>> {
        let mut args = vec![
            "template",
            SERVICE_NAME,
            &*chart,
            "--namespace",
            SERVER_NAMESPACE,
        ];
        for s in set {
            args.extend(["--set-string", s]);
        }
        documents(&helm_offline(home.path(), &args).await?)
    };
    let arg = |args: &[String], flag: &str| -> Result<String> {
        args.iter()
            .find_map(|a| a.strip_prefix(flag))
            .map(str::to_owned)
            .with_context(|| format!("no {flag} in {args:?}"))
    };

    // Memory sizes: every unit the schema takes reaches the server as the same number of
    // bytes (the bug: 512Ki was rendered 0Mi, which turned the answer cache off).
    for (value, flag, given) in [
        ("server.answerCacheSize", "--answer-cache-size=", "512Ki"),
        ("server.answerCacheSize", "--answer-cache-size=", "0"),
        ("server.answerCacheSize", "--answer-cache-size=", "1000000"),
        ("server.answerCacheSize", "--answer-cache-size=", "1536KiB"),
        ("server.maxKeptTotal", "--max-kept-total=", "1536Ki"),
        ("server.maxKeptTotal", "--max-kept-total=", "3Mi"),
        ("server.memoryBudget", "--memory-budget=", "131073Ki"),
        ("server.memoryBudget", "--memory-budget=", "140MiB"),
    ] {
        let docs = render(&[&format!("{value}={given}")])
            .await
            .with_context(|| format!("{value}={given}"))?;
        let (args, _) = server_container(&docs)?;
        let rendered = arg(&args, flag)?;
        let bytes = parse_byte_size(&rendered)
            .with_context(|| format!("{value}={given}: the server refuses {flag}{rendered}"))?;
        let expected = parse_byte_size(given)?;
        ensure!(
            bytes == expected,
            "{value}={given} ({expected} bytes) is rendered {flag}{rendered} ({bytes} bytes)"
        );
    }
    // Derived from a decimal limit: exact too.
    let (args, _) = server_container(&render(&["resources.limits.memory=1G"]).await?)?;
    ensure!(
        parse_byte_size(&arg(&args, "--answer-cache-size=")?)? == 125_000_000,
        "{args:?}"
    );
    ensure!(
        parse_byte_size(&arg(&args, "--max-kept-total=")?)? == 62_500_000,
        "{args:?}"
    );
    ensure!(
        parse_byte_size(&arg(&args, "--memory-budget=")?)?
            == 1_000_000_000 - 64 * MIB - 125_000_000 - 62_500_000,
        "{args:?}"
    );

    // The smallest memory limit the chart names renders, and 1Mi less fails naming it,
    // with the sizes derived and with each given.
    for extra in [
        vec![],
        vec!["server.answerCacheSize=100Mi"],
        vec!["server.maxKeptTotal=40Mi"],
        vec!["server.answerCacheSize=1Mi", "server.maxKeptTotal=1Mi"],
    ] {
        let mut set = extra.clone();
        set.push("resources.limits.memory=130Mi");
        let error = render(&set).await.expect_err("a 130Mi limit rendered");
        let text = format!("{error:#}");
        let least: u64 = text
            .split("at least ")
            .nth(1)
            .and_then(|rest| rest.split("Mi").next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{extra:?}: no smallest limit named: {text}"))?;
        let mut set = extra.clone();
        let at_least = format!("resources.limits.memory={least}Mi");
        set.push(&at_least);
        render(&set)
            .await
            .with_context(|| format!("{extra:?}: the named smallest limit {least}Mi"))?;
        let mut set = extra.clone();
        let below = format!("resources.limits.memory={}Mi", least - 1);
        set.push(&below);
        ensure!(
            render(&set).await.is_err(),
            "{extra:?}: {}Mi rendered, below the named {least}Mi",
            least - 1
        );
        if extra.is_empty() {
            ensure!(least == 237, "the smallest default limit is {least}Mi");
            // What users read says the same.
            for (file, text) in [
                ("docs/install.md", format!("at least {least}Mi")),
                (
                    "docs/operations.md",
                    format!("the smallest limit is {least} MiB"),
                ),
                (
                    "charts/elemental-changelog/questions.yaml",
                    format!("at least {least}Mi"),
                ),
            ] {
                ensure!(
                    std::fs::read_to_string(workspace_root().join(file))?.contains(&text),
                    "{file} does not say `{text}`, the smallest memory limit the chart renders"
                );
            }
        }
    }

    // noProxy on its own (a proxy set through extraEnv), and proxy without noProxy.
    let (_, env) = server_container(&render(&["proxy=", "noProxy=.example.com"]).await?)?;
    ensure!(
        env.contains(&("NO_PROXY".to_owned(), ".example.com".to_owned())),
        "{env:?}"
    );
    ensure!(
        env.iter()
            .all(|(name, _)| name != "HTTP_PROXY" && name != "HTTPS_PROXY"),
        "{env:?}"
    );
    let (_, env) = server_container(&render(&["proxy=http://proxy:3128", "noProxy="]).await?)?;
    ensure!(
        env.contains(&("HTTPS_PROXY".to_owned(), "http://proxy:3128".to_owned())),
        "{env:?}"
    );
    ensure!(env.iter().all(|(name, _)| name != "NO_PROXY"), "{env:?}");

    // The UIPlugin: only with Rancher's UIPlugin API, and the Rancher versions the chart
    // declares are the ones the extension loads in.
    let meta = yaml_file(&chart_dir.join("Chart.yaml"))?;
    let package: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        workspace_root().join("ui/rancher/pkg/elemental-changelog/package.json"),
    )?)?;
    let key = "catalog.cattle.io/rancher-version";
    ensure!(
        meta["annotations"][key].as_str() == package["rancher"]["annotations"][key].as_str(),
        "Chart.yaml's {key} {:?} is not the extension's {:?} (ui/rancher/pkg/elemental-changelog/package.json)",
        meta["annotations"][key],
        package["rancher"]["annotations"][key]
    );
    let docs = render(&[]).await?;
    ensure!(
        docs.iter().all(|d| d["kind"].as_str() != Some("UIPlugin")),
        "a UIPlugin without Rancher"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The Rancher UI extension

/// Rancher's check of a files.txt entry (pkg/controllers/dashboard/plugin: no leading `/`
/// or `.`, no `..`).
fn rancher_accepts(entry: &str) -> bool {
    !entry.starts_with('/') && !entry.starts_with('.') && !entry.contains("..")
}

#[tokio::test]
async fn ui_extension_is_served_as_its_uiplugin_names_it() -> Result<()> {
    let bed = TestBed::start(TestBedOptions::default()).await?;
    let result = ui_extension(&bed).await;
    bed.finish(result)
}

async fn ui_extension(bed: &TestBed) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = workspace_root();
    let package_file = root.join("ui/rancher/pkg/elemental-changelog/package.json");
    let package_text = std::fs::read_to_string(&package_file)?;
    ensure!(
        std::fs::read_to_string(
            root.join("charts/elemental-changelog/files/ui-extension-package.json")
        )? == package_text,
        "charts/elemental-changelog/files/ui-extension-package.json differs from {}: copy it",
        package_file.display()
    );
    let package: serde_json::Value = serde_json::from_str(&package_text)?;
    let name = package["name"].as_str().context("package name")?;
    let version = package["version"].as_str().context("package version")?;
    let dist = root.join(format!("ui/rancher/dist-pkg/{name}-{version}"));
    ensure!(
        dist.join(format!("{name}-{version}.umd.min.js")).exists(),
        "{} holds no built extension: run `make ui-extension`",
        dist.display()
    );

    // Rancher's UIPlugin CRD and namespace, then the chart.
    bed.kubectl_stdin(
        &["apply", "-f", "-"],
        include_str!("../crds/rancher/catalog.cattle.io_uiplugins.yaml"),
    )
    .await?;
    bed.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/uiplugins.catalog.cattle.io",
        "--timeout=60s",
    ])
    .await?;
    bed.kubectl_ok(&["create", "namespace", "cattle-ui-plugin-system"])
        .await?;
    let chart = root.join("charts/elemental-changelog");
    let chart = chart.to_string_lossy();
    helm_ok(
        bed,
        &[
            "install",
            RELEASE,
            &chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--set",
            "image.tag=test",
        ],
    )
    .await?;

    // The UIPlugin as kube-apiserver stored it (validated against Rancher's schema).
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("catalog.cattle.io", "v1", "UIPlugin"),
        "uiplugins",
    );
    let plugins: Api<DynamicObject> =
        Api::namespaced_with(bed.client(), "cattle-ui-plugin-system", &resource);
    let plugin = plugins.get(name).await?;
    let spec = &plugin.data["spec"]["plugin"];
    ensure!(spec["name"] == name && spec["version"] == version, "{spec}");
    ensure!(spec["noCache"] == false, "{spec}");
    ensure!(
        spec["metadata"] == package["rancher"]["annotations"],
        "UIPlugin metadata {} is not the package's rancher.annotations",
        spec["metadata"]
    );
    let endpoint = spec["endpoint"].as_str().context("endpoint")?;
    let service_name = format!("{RELEASE}-extension");
    ensure!(
        endpoint == format!("http://{service_name}.{SERVER_NAMESPACE}.svc.cluster.local:80"),
        "endpoint {endpoint}"
    );

    // The Service and Deployment behind the endpoint.
    let service: Service = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(&service_name)
        .await?;
    let service_spec = service.spec.context("Service without spec")?;
    let port = service_spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.port == 80)
        .context("no port 80 on the extension's Service")?;
    let deployment: Deployment = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(&service_name)
        .await?;
    let template = deployment.spec.template;
    let pod_labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
    let selector = service_spec.selector.unwrap_or_default();
    ensure!(
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the Service does not select the extension's pods"
    );
    let server_service: Service = Api::namespaced(bed.client(), SERVER_NAMESPACE)
        .get(RELEASE)
        .await?;
    let server_selector = server_service
        .spec
        .and_then(|s| s.selector)
        .unwrap_or_default();
    ensure!(
        !server_selector
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the server's Service would select the extension's pods"
    );
    let container = template
        .spec
        .context("pod template without spec")?
        .containers
        .into_iter()
        .next()
        .context("no container")?;
    let container_port = container
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| {
            Some(IntOrString::String(p.name.clone().unwrap_or_default())) == port.target_port
                || Some(IntOrString::Int(p.container_port)) == port.target_port
        })
        .context("the Service's targetPort is no port of the container")?
        .container_port;
    let command = container.command.unwrap_or_default();
    let binary = Path::new(command.first().context("no command")?)
        .file_name()
        .context("command")?
        .to_owned();
    let args = container.args.unwrap_or_default();
    ensure!(
        args.contains(&format!("--port={container_port}")),
        "{args:?}"
    );

    // Run the container's command as the pod would, on loopback, with the local build
    // in place of the image's folder.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let local_port = listener.local_addr()?.port();
    drop(listener);
    let local_args: Vec<String> = args
        .iter()
        .map(|a| {
            if a.starts_with("--dir=") {
                format!("--dir={}", dist.display())
            } else if a.starts_with("--port=") {
                format!("--port={local_port}")
            } else {
                a.clone()
            }
        })
        .chain(["--bind-address=127.0.0.1".to_owned()])
        .collect();
    let binary = root.join("target/debug").join(binary);
    let mut server = tokio::process::Command::new(&binary)
        .args(&local_args)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("{} (make server builds it)", binary.display()))?;
    let base = format!("http://127.0.0.1:{local_port}");
    let http = reqwest::Client::new();
    let started = std::time::Instant::now();
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        ensure!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the extension server did not answer"
        );
        ensure!(server.try_wait()?.is_none(), "the extension server exited");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // What Rancher's controller does: package.json, files.txt, then every file listed.
    let fetch = async |path: &str| -> Result<(String, Vec<u8>)> {
        let response = http.get(format!("{base}/{path}")).send().await?;
        ensure!(response.status() == 200, "{path}: {}", response.status());
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Ok((content_type, response.bytes().await?.to_vec()))
    };
    let (content_type, body) = fetch("plugin/package.json").await?;
    ensure!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let served: serde_json::Value = serde_json::from_slice(&body)?;
    ensure!(
        served["version"] == version,
        "served version {}",
        served["version"]
    );
    let (content_type, body) = fetch("files.txt").await?;
    ensure!(content_type.starts_with("text/plain"), "{content_type}");
    let listing = String::from_utf8(body)?;
    let entries: Vec<&str> = listing.lines().filter(|l| !l.is_empty()).collect();
    for wanted in [
        "plugin/package.json".to_owned(),
        format!("plugin/{name}-{version}.umd.min.js"),
    ] {
        ensure!(
            entries.contains(&wanted.as_str()),
            "{wanted} not in files.txt: {entries:?}"
        );
    }
    for entry in &entries {
        ensure!(
            rancher_accepts(entry),
            "Rancher refuses the files.txt entry {entry}"
        );
        let (content_type, body) = fetch(entry).await?;
        let expected = match entry.rsplit_once('.').map(|(_, e)| e) {
            Some("js") => "application/javascript",
            Some("json" | "map") => "application/json",
            Some("css") => "text/css",
            Some("html") => "text/html",
            Some("svg") => "image/svg+xml",
            other => bail!("{entry}: no content type expected for {other:?}"),
        };
        ensure!(
            content_type.starts_with(expected),
            "{entry} served as {content_type}, not {expected}"
        );
        let local = std::fs::read(dist.join(entry.trim_start_matches("plugin/")))?;
        ensure!(body == local, "{entry} differs from the build");
    }
    ensure!(
        http.get(format!("{base}/plugin/report.html"))
            .send()
            .await?
            .status()
            == 404,
        "the bundle report is served"
    );
    // Every answer, errors included, forbids content sniffing (issue 26).
    for (method, path) in [
        (reqwest::Method::GET, "files.txt"),
        (reqwest::Method::GET, "healthz"),
        (reqwest::Method::GET, "plugin/report.html"),
        (reqwest::Method::POST, "files.txt"),
    ] {
        let response = http
            .request(method.clone(), format!("{base}/{path}"))
            .send()
            .await?;
        ensure!(
            response
                .headers()
                .get("x-content-type-options")
                .is_some_and(|v| v == "nosniff"),
            "{method} /{path} ({}) without X-Content-Type-Options: nosniff",
            response.status()
        );
    }
    server.kill().await?;

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
        plugins.get_opt(name).await?.is_none(),
        "the UIPlugin outlived helm uninstall"
    );

    // On a Rancher the extension does not load in (its package.json's rancher-version),
    // read from Rancher's server-version Setting, nothing of it is installed and the
    // notes say why; on one it loads in, the UIPlugin is there.
    bed.kubectl_stdin(
        &["apply", "-f", "-"],
        include_str!("../crds/rancher/management.cattle.io_settings.yaml"),
    )
    .await?;
    bed.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/settings.management.cattle.io",
        "--timeout=60s",
    ])
    .await?;
    let setting = |version: &str| {
        format!(
            "apiVersion: management.cattle.io/v3\nkind: Setting\nmetadata:\n  name: server-version\nvalue: {version}\ndefault: \"\"\n"
        )
    };
    bed.kubectl_stdin(&["apply", "-f", "-"], &setting("v2.9.5"))
        .await?;
    let install = [
        "install",
        RELEASE,
        &*chart,
        "--namespace",
        SERVER_NAMESPACE,
        "--set",
        "image.tag=test",
    ];
    let output = bed.helm(&install).await?;
    ensure!(
        output.status.success(),
        "helm install on Rancher v2.9.5: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let notes = String::from_utf8_lossy(&output.stdout);
    ensure!(
        notes.contains("The Rancher UI extension was not installed: Rancher v2.9.5 is older than"),
        "the notes do not say why the extension is missing: {notes}"
    );
    ensure!(
        plugins.get_opt(name).await?.is_none(),
        "a UIPlugin on Rancher v2.9.5"
    );
    ensure!(
        Api::<Deployment>::namespaced(bed.client(), SERVER_NAMESPACE)
            .get_opt(&service_name)
            .await?
            .is_none(),
        "the extension's file server on Rancher v2.9.5"
    );
    bed.kubectl_stdin(&["apply", "-f", "-"], &setting("v2.10.1"))
        .await?;
    helm_ok(
        bed,
        &[
            "upgrade",
            RELEASE,
            &chart,
            "--namespace",
            SERVER_NAMESPACE,
            "--set",
            "image.tag=test",
        ],
    )
    .await?;
    ensure!(
        plugins.get_opt(name).await?.is_some(),
        "no UIPlugin on Rancher v2.10.1"
    );
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
    Ok(())
}

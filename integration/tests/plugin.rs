//! The `kubectl elemental` plugin (issue 12) with the real kubectl, which
//! finds `kubectl-elemental` on `PATH`, against the real control plane: every
//! subcommand prints what the API serves, checked against the generated
//! channels' model and against kubectl's own output for the same request
//! (`kubectl get`, `kubectl get --raw`), errors included. Also what
//! `kubectl explain` shows of the OpenAPI schema, and that every query
//! parameter the OpenAPI document declares is one the server honours.
//!
//! Channels: `plug` (13 versions, so its recurring CVE is fixed twice) in
//! fleet-default and a copy in `elemental-edge`, which also has `edge`, so
//! the two namespaces' tables differ.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_integration::generated::{Channel, Spec};
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::{
    FLEET_NAMESPACE, TestBed, TestBedOptions, tools_dir, workspace_root,
};
use elemental_changelog_integration::{publish, table};
use serde_json::Value;

const API: &str = "/apis/changelog.elemental.cattle.io/v1beta1";
const RESOURCE: &str = "managedosversions.changelog.elemental.cattle.io";
const EDGE_NAMESPACE: &str = "elemental-edge";
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The plugin binary: `KUBECTL_ELEMENTAL_BIN`, else `target/debug/kubectl-elemental`.
fn plugin_binary() -> PathBuf {
    std::env::var_os("KUBECTL_ELEMENTAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/kubectl-elemental"))
}

/// kubectl with `kubectl-elemental` on its `PATH`, as a user of a kubeconfig.
struct Kubectl {
    path: OsString,
    cache: PathBuf,
}

impl Kubectl {
    fn new(bed: &TestBed) -> Result<Self> {
        let binary = plugin_binary();
        ensure!(
            binary.is_file(),
            "{} is missing: run `cargo build -p kubectl-elemental` (make test does)",
            binary.display()
        );
        // A directory holding only the plugin, the whole PATH: kubectl finds
        // nothing else (and warns of nothing else in `kubectl plugin list`).
        let dir = bed.root().join("plugins");
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::symlink(&binary, dir.join("kubectl-elemental"))?;
        Ok(Self {
            path: dir.into_os_string(),
            cache: bed.root().join("cache/kube"),
        })
    }

    /// `kubectl <args>` with `KUBECONFIG=kubeconfig` (a plugin only sees the
    /// environment: kubectl's flags must follow the plugin's name).
    async fn run(&self, kubeconfig: &Path, args: &[&str]) -> Result<Output> {
        tokio::process::Command::new(tools_dir().join("kubectl"))
            .args(args)
            .env("PATH", &self.path)
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", &self.cache)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("running kubectl {}", args.join(" ")))
    }

    /// Its stdout; fails unless it succeeds with nothing on stderr.
    async fn ok(&self, kubeconfig: &Path, args: &[&str]) -> Result<String> {
        let out = self.run(kubeconfig, args).await?;
        ensure!(
            out.status.success() && out.stderr.is_empty(),
            "kubectl {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// The stderr of `kubectl <ours>`, which must fail exactly as `kubectl <theirs>`.
    async fn same_failure(
        &self,
        kubeconfig: &Path,
        ours: &[&str],
        theirs: &[&str],
    ) -> Result<String> {
        let printed = self.fails(kubeconfig, ours).await?;
        let expected = self.fails(kubeconfig, theirs).await?;
        ensure!(
            printed == expected,
            "{ours:?}:\n  ours:    {printed}\n  kubectl: {expected}"
        );
        Ok(printed)
    }

    /// Its stderr; fails unless it fails (exit 1) with nothing on stdout.
    async fn fails(&self, kubeconfig: &Path, args: &[&str]) -> Result<String> {
        let out = self.run(kubeconfig, args).await?;
        ensure!(
            out.status.code() == Some(1) && out.stdout.is_empty(),
            "kubectl {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        Ok(String::from_utf8(out.stderr)?.trim_end().to_owned())
    }
}

#[tokio::test]
async fn kubectl_elemental_plugin() -> Result<()> {
    let started = Instant::now();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![FLEET_NAMESPACE.to_owned(), EDGE_NAMESPACE.to_owned()],
        ..TestBedOptions::default()
    })
    .await?;
    bed.start_server_reading(&registry, &["--architecture", "x86_64"])
        .await?;
    let result = checks(&bed, &registry).await;
    eprintln!("plugin checks done after {:?}", started.elapsed());
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry) -> Result<()> {
    let channel = Channel::generate(&Spec::new("plug", 13, 60, 21));
    for namespace in [FLEET_NAMESPACE, EDGE_NAMESPACE] {
        publish::generated_channel(bed, registry, namespace, &channel).await?;
    }
    // A channel only elemental-edge has, so its tables differ from fleet-default's.
    let edge_only = Channel::generate(&Spec::new("edge", 3, 30, 22));
    publish::generated_channel(bed, registry, EDGE_NAMESPACE, &edge_only).await?;
    let kubectl = Kubectl::new(bed)?;
    let admin = bed.kubeconfig();

    let plugins = kubectl
        .ok(admin, &["plugin", "list", "--name-only"])
        .await?;
    ensure!(
        plugins.lines().any(|l| l.trim() == "kubectl-elemental"),
        "kubectl does not find the plugin: {plugins}"
    );
    versions(bed, &kubectl, &channel, &edge_only).await?;
    changelogs(bed, &kubectl, &channel).await?;
    cve(&kubectl, admin, &channel).await?;
    errors_as_kubectl_prints_them(bed, &kubectl, &channel).await?;
    explain(bed, &kubectl).await?;
    declared_query_parameters_are_honoured(bed, &channel).await
}

/// The table without its `AGE` column (seconds tick between two commands).
fn without_age(out: &str) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let (mut header, mut rows) = table::parse(out)?;
    let age = header
        .iter()
        .position(|h| h == "AGE")
        .context("no AGE column")?;
    header.remove(age);
    for row in &mut rows {
        row.remove(age);
    }
    Ok((header, rows))
}

async fn versions(
    bed: &TestBed,
    kubectl: &Kubectl,
    channel: &Channel,
    edge_only: &Channel,
) -> Result<()> {
    let admin = bed.kubeconfig();
    let names_of = |channels: &[&Channel]| -> Vec<String> {
        let mut names: Vec<String> = channels
            .iter()
            .flat_map(|c| c.versions.iter().map(|v| v.name.clone()))
            .collect();
        names.sort();
        names
    };
    let fleet_names = names_of(&[channel]);
    let edge_names = names_of(&[channel, edge_only]);
    let all_names = names_of(&[channel, channel, edge_only]);
    for (plugin, get, expected) in [
        (
            vec!["elemental", "versions", "-n", FLEET_NAMESPACE],
            vec!["get", RESOURCE, "-n", FLEET_NAMESPACE],
            &fleet_names,
        ),
        (
            vec!["elemental", "versions", "-A"],
            vec!["get", RESOURCE, "-A"],
            &all_names,
        ),
        (
            vec!["elemental", "versions", "-n", EDGE_NAMESPACE, "-o", "wide"],
            vec!["get", RESOURCE, "-n", EDGE_NAMESPACE, "-o", "wide"],
            &edge_names,
        ),
    ] {
        let ours = kubectl.ok(admin, &plugin).await?;
        let theirs = kubectl.ok(admin, &get).await?;
        let (header, rows) = without_age(&ours)?;
        ensure!(
            (header.clone(), rows.clone()) == without_age(&theirs)?,
            "{plugin:?} differs from kubectl {get:?}:\n{ours}\n{theirs}"
        );
        // Same layout: the header line is the same when AGE is the last column.
        if !plugin.contains(&"wide") {
            ensure!(ours.lines().next() == theirs.lines().next());
        }
        let name = header.iter().position(|h| h == "NAME").context("no NAME")?;
        let mut names: Vec<String> = rows.iter().map(|r| r[name].clone()).collect();
        names.sort();
        ensure!(
            names == *expected,
            "{plugin:?}: {names:?}, want {expected:?}"
        );
    }

    // The namespace of the kubeconfig's context, and --context.
    let edge = bed.root().join("edge-kubeconfig");
    std::fs::copy(admin, &edge)?;
    let edge_path = edge.to_string_lossy();
    kubectl
        .ok(
            &edge,
            &[
                "config",
                "set-context",
                "--current",
                "--namespace",
                EDGE_NAMESPACE,
                "--kubeconfig",
                &edge_path,
            ],
        )
        .await?;
    let ours = kubectl.ok(&edge, &["elemental", "versions"]).await?;
    let theirs = kubectl
        .ok(admin, &["elemental", "versions", "-n", EDGE_NAMESPACE])
        .await?;
    ensure!(
        without_age(&ours)? == without_age(&theirs)?,
        "the context's namespace is not the default:\n{ours}"
    );
    let fleet_table = kubectl
        .ok(admin, &["elemental", "versions", "-n", FLEET_NAMESPACE])
        .await?;
    ensure!(without_age(&fleet_table)? != without_age(&theirs)?);
    // --kubeconfig wins over KUBECONFIG.
    let flagged = kubectl
        .ok(
            admin,
            &["elemental", "versions", "--kubeconfig", &edge_path],
        )
        .await?;
    ensure!(
        without_age(&flagged)? == without_age(&theirs)?,
        "--kubeconfig was not used:\n{flagged}"
    );
    // --context picks another context of the file, with its namespace.
    let field = |path: &str| {
        let jsonpath = format!("-o=jsonpath={{.contexts[0].context.{path}}}");
        let edge = edge.clone();
        async move {
            kubectl
                .ok(&edge, &["config", "view", "--minify", &jsonpath])
                .await
        }
    };
    let (cluster, user) = (field("cluster").await?, field("user").await?);
    kubectl
        .ok(
            &edge,
            &[
                "config",
                "set-context",
                "fleet",
                "--cluster",
                &cluster,
                "--user",
                &user,
                "--namespace",
                FLEET_NAMESPACE,
            ],
        )
        .await?;
    let fleet = kubectl
        .ok(&edge, &["elemental", "versions", "--context", "fleet"])
        .await?;
    ensure!(
        without_age(&fleet)? == without_age(&fleet_table)?,
        "--context was not used:\n{fleet}"
    );
    let missing = kubectl
        .fails(
            &edge,
            &["elemental", "versions", "--context", "no-such-context"],
        )
        .await?;
    ensure!(missing.contains("no-such-context"), "{missing}");
    Ok(())
}

async fn changelogs(bed: &TestBed, kubectl: &Kubectl, channel: &Channel) -> Result<()> {
    let admin = bed.kubeconfig();
    let v = &channel.versions;
    let newest = v.len() - 1;
    for (from, explicit) in [(newest - 1, false), (1, true)] {
        let name = &v[newest].name;
        let mut args = vec![
            "elemental",
            "changelog",
            name.as_str(),
            "-n",
            FLEET_NAMESPACE,
        ];
        let mut query = String::new();
        if explicit {
            args.extend(["--from", v[from].name.as_str()]);
            query = format!("from={}&", v[from].name);
        }
        let path = format!("{API}/namespaces/{FLEET_NAMESPACE}/managedosversions/{name}/changelog");
        let raw = |format: &str| format!("{path}?{query}format={format}");

        // Text (the default) and Markdown read exactly as the server renders them.
        let text = kubectl.ok(admin, &args).await?;
        ensure!(
            text == kubectl.ok(admin, &["get", "--raw", &raw("text")]).await?,
            "text differs"
        );
        let mut markdown_args = args.clone();
        markdown_args.extend(["-o", "markdown"]);
        let markdown = kubectl.ok(admin, &markdown_args).await?;
        ensure!(
            markdown
                == kubectl
                    .ok(admin, &["get", "--raw", &raw("markdown")])
                    .await?,
            "markdown differs"
        );

        // JSON and YAML are the object as served, with the model's advisories.
        let mut json_args = args.clone();
        json_args.extend(["-o", "json"]);
        let json: Value = serde_json::from_str(&kubectl.ok(admin, &json_args).await?)?;
        let served: Value =
            serde_json::from_str(&kubectl.ok(admin, &["get", "--raw", &raw("json")]).await?)?;
        ensure!(json == served, "-o json is not the object served");
        let mut yaml_args = args.clone();
        yaml_args.extend(["-o", "yaml"]);
        let yaml: Value = serde_yaml::from_str(&kubectl.ok(admin, &yaml_args).await?)?;
        ensure!(yaml == served, "-o yaml is not the object served");
        let ids: BTreeSet<String> = json["advisories"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["id"].as_str().map(str::to_owned))
            .collect();
        let expected = channel.expected_advisories(from, newest);
        ensure!(ids == expected, "{args:?}: {ids:?}, want {expected:?}");
        ensure!(json["from"]["name"] == v[from].name.as_str());
        for id in &expected {
            ensure!(
                text.contains(id.as_str()) && markdown.contains(id.as_str()),
                "{id} not printed"
            );
        }
    }
    Ok(())
}

async fn cve(kubectl: &Kubectl, admin: &Path, channel: &Channel) -> Result<()> {
    let cve = channel.recurring_cve();
    let fixing: Vec<&str> = channel
        .fixing_versions(&cve)
        .into_iter()
        .map(|i| channel.versions[i].name.as_str())
        .collect();
    ensure!(fixing.len() > 1, "{cve}: the model fixes it {fixing:?}");
    let out = kubectl
        .ok(admin, &["elemental", "cve", &cve, "-n", FLEET_NAMESPACE])
        .await?;
    let (header, rows) = table::parse(&out)?;
    ensure!(header[0] == "NAME", "{header:?}");
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    ensure!(
        names == fixing,
        "cve {cve}: {names:?}, want {fixing:?} (first fix first)"
    );

    let out = kubectl
        .ok(admin, &["elemental", "cve", &cve.to_lowercase(), "-A"])
        .await?;
    let (header, rows) = table::parse(&out)?;
    ensure!(header[..2] == ["NAMESPACE", "NAME"], "{header:?}");
    for namespace in [EDGE_NAMESPACE, FLEET_NAMESPACE] {
        let here: Vec<&str> = rows
            .iter()
            .filter(|r| r[0] == namespace)
            .map(|r| r[1].as_str())
            .collect();
        ensure!(here == fixing, "cve -A in {namespace}: {here:?}");
    }
    ensure!(rows.len() == 2 * fixing.len(), "{out}");

    // Nobody fixes it: nothing on stdout, a note on stderr, success.
    let out = kubectl
        .run(
            admin,
            &["elemental", "cve", "CVE-1999-0001", "-n", FLEET_NAMESPACE],
        )
        .await?;
    ensure!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("CVE-1999-0001"));
    Ok(())
}

/// Failures print what kubectl prints for the same request, and exit 1.
async fn errors_as_kubectl_prints_them(
    bed: &TestBed,
    kubectl: &Kubectl,
    channel: &Channel,
) -> Result<()> {
    let admin = bed.kubeconfig();
    let name = &channel.versions[1].name;
    let path = |version: &str| {
        format!("{API}/namespaces/{FLEET_NAMESPACE}/managedosversions/{version}/changelog")
    };
    for (plugin, raw) in [
        // 404 from our server.
        (
            vec![
                "elemental",
                "changelog",
                "no-such-version",
                "-n",
                FLEET_NAMESPACE,
            ],
            path("no-such-version"),
        ),
        // 400 from our server: an architecture it does not read.
        (
            vec![
                "elemental",
                "changelog",
                name.as_str(),
                "-n",
                FLEET_NAMESPACE,
                "--arch",
                "aarch64",
            ],
            format!("{}?arch=aarch64", path(name)),
        ),
        // 400: --from a newer version.
        (
            vec![
                "elemental",
                "changelog",
                name.as_str(),
                "-n",
                FLEET_NAMESPACE,
                "--from",
                channel.versions[3].name.as_str(),
            ],
            format!("{}?from={}", path(name), channel.versions[3].name),
        ),
        // 400: not a CVE id.
        (
            vec!["elemental", "cve", "GHSA-1234", "-n", FLEET_NAMESPACE],
            format!("{API}/namespaces/{FLEET_NAMESPACE}/managedosversions?cve=GHSA-1234"),
        ),
    ] {
        let raw = ["get", "--raw", raw.as_str()];
        let ours = kubectl.same_failure(admin, &plugin, &raw).await?;
        ensure!(ours.starts_with("Error from server ("), "{ours}");
    }

    // 403 from kube-apiserver for a user without a role: as `kubectl get` prints it.
    let alice = bed.user_kubeconfig("alice")?;
    let ours = kubectl
        .same_failure(
            &alice,
            &["elemental", "versions", "-n", FLEET_NAMESPACE],
            &["get", RESOURCE, "-n", FLEET_NAMESPACE],
        )
        .await?;
    ensure!(
        ours.starts_with("Error from server (Forbidden):") && ours.contains(r#"User "alice""#),
        "{ours}"
    );
    kubectl
        .same_failure(
            &alice,
            &["elemental", "changelog", name, "-n", FLEET_NAMESPACE],
            &["get", "--raw", &path(name)],
        )
        .await?;
    Ok(())
}

/// `kubectl explain` reads a complete schema with the standard ObjectMeta.
async fn explain(bed: &TestBed, kubectl: &Kubectl) -> Result<()> {
    let admin = bed.kubeconfig();
    let out = kubectl.ok(admin, &["explain", RESOURCE]).await?;
    ensure!(out.contains("ManagedOSVersionChangelogSummary"), "{out}");
    let document: Value = serde_json::from_str(
        &kubectl
            .ok(
                admin,
                &[
                    "get",
                    "--raw",
                    "/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1",
                ],
            )
            .await?,
    )?;
    let schemas = &document["components"]["schemas"];
    let summary =
        &schemas["io.cattle.elemental.changelog.v1beta1.ManagedOSVersionChangelogSummary"];
    let fields = |text: &str| -> BTreeSet<String> {
        // kubectl explain lists each field indented by two spaces, then a tab and its type.
        text.lines()
            .filter_map(|l| l.strip_prefix("  "))
            .filter(|l| !l.starts_with(' '))
            .filter_map(|l| l.split_once('\t').map(|(f, _)| f.to_owned()))
            .collect()
    };
    let keys = |schema: &Value| -> BTreeSet<String> {
        schema["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    };
    ensure!(
        fields(&out) == keys(summary),
        "explain lists {:?}",
        fields(&out)
    );
    ensure!(out.contains("metadata\t<ObjectMeta>"), "{out}");

    let metadata = kubectl
        .ok(admin, &["explain", &format!("{RESOURCE}.metadata")])
        .await?;
    let meta_keys = keys(&schemas[OBJECT_META]);
    ensure!(
        fields(&metadata) == meta_keys,
        "explain metadata lists {:?}",
        fields(&metadata)
    );
    for standard in [
        "uid",
        "resourceVersion",
        "ownerReferences",
        "managedFields",
        "labels",
        "annotations",
    ] {
        ensure!(
            meta_keys.contains(standard),
            "ObjectMeta without {standard}"
        );
    }
    let owner = kubectl
        .ok(
            admin,
            &["explain", &format!("{RESOURCE}.metadata.ownerReferences")],
        )
        .await?;
    ensure!(owner.contains("uid\t<string> -required-"), "{owner}");
    let changelog_meta = &schemas["io.cattle.elemental.changelog.v1beta1.ManagedOSVersionChangelog"]
        ["properties"]["metadata"];
    ensure!(
        changelog_meta.to_string().contains(OBJECT_META),
        "the changelog's metadata is not the standard ObjectMeta: {changelog_meta}"
    );
    Ok(())
}

/// Every query parameter the served OpenAPI document declares is read by the
/// server: an invalid value of each is a 400 (and a valid request is a 200). A watch option
/// is sent on a watch (`watch=true&timeoutSeconds=1`); `watch` itself has no invalid value
/// (any but `0`/`false` starts a watch: its stream of events is checked), and an invalid
/// `resourceVersion` ends the watch with one `410 Expired` event, as kube-apiserver's cache.
async fn declared_query_parameters_are_honoured(bed: &TestBed, channel: &Channel) -> Result<()> {
    let http = bed.apiserver_http(Some(&bed.pki().admin))?;
    let get = async |path: &str, accept: Option<&str>| -> Result<(u16, Value)> {
        let mut request = http.get(format!("{}{path}", bed.apiserver_url()));
        if let Some(accept) = accept {
            request = request.header("Accept", accept);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let body = response.bytes().await?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    };
    let (_, document) = get(
        "/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1",
        None,
    )
    .await?;
    let name = &channel.versions[2].name;
    let invalid = |parameter: &str| -> Option<String> {
        Some(match parameter {
            "labelSelector" => "a in (b".to_owned(),
            "fieldSelector" => "spec.version=1".to_owned(),
            "cve" => "GHSA-1234".to_owned(),
            "package" => "perl(Foo)".to_owned(),
            // A bound alone: it needs `package`.
            "packageAtLeast" => "5.6.0".to_owned(),
            "packageBelow" => "a:1".to_owned(),
            "arch" => "sparc64".to_owned(),
            "includeObject" => "Everything".to_owned(),
            // A newer version of the channel.
            "from" => channel.versions[4].name.clone(),
            "format" => "html".to_owned(),
            // A machine's changelog: not a ManagedOSVersion name.
            "to" => "Not_A_Version".to_owned(),
            // Watch options, on a watch.
            "resourceVersionMatch" => "Exact".to_owned(),
            "sendInitialEvents" | "allowWatchBookmarks" | "watch" => "maybe".to_owned(),
            // Past 64 bits (a negative one is valid: it ends the watch at once, as kube-apiserver).
            "timeoutSeconds" => "9223372036854775808".to_owned(),
            "resourceVersion" => "abc".to_owned(),
            _ => return None,
        })
    };
    let mut checked = 0;
    for (template, item) in document["paths"].as_object().context("no paths")? {
        let path = template
            .replace("{namespace}", FLEET_NAMESPACE)
            .replace("{name}", name);
        let parameters = item["get"]["parameters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for parameter in parameters.iter().filter(|p| p["in"] == "query") {
            let key = parameter["name"]
                .as_str()
                .context("a parameter without a name")?;
            let value = invalid(key)
                .with_context(|| format!("{template}: no invalid value known for {key}"))?;
            let query: String = form_urlencoded_pair(key, &value);
            let watch = watch_prefix(key);
            let url = format!("{}{path}?{watch}{query}", bed.apiserver_url());
            let response = http.get(&url).send().await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            ensure!(
                refused_as_documented(key, status, &text),
                "{template}?{watch}{key}={value}: {status} {text}"
            );
            checked += 1;
        }
        if template.starts_with(API) && template != &format!("{API}/") {
            let (status, body) = get(&path, None).await?;
            // No MachineInventory nor ManagedOSImage exists here: one by name is a 404.
            let named_fleet_object = template.contains("/machineinventories/{name}")
                || template.contains("/managedosimages/{name}");
            let expected = if named_fleet_object { 404 } else { 200 };
            ensure!(status == expected, "{path}: {status} {body}");
        }
    }
    // ManagedOSVersions: lists (2 x 14: 5, the 3 of ?package= and the 6 watch options), the
    // summary (2) and the changelog (3); the fleet view: machine lists (2 x 14), one machine
    // (3), its changelog (3), a ManagedOSImage's plan (1).
    ensure!(checked == 68, "{checked} query parameters declared");
    Ok(())
}

/// What a parameter is sent with: a watch option on a watch that ends within a second.
fn watch_prefix(key: &str) -> &'static str {
    match key {
        "watch" => "timeoutSeconds=1&",
        "timeoutSeconds" => "watch=true&",
        "resourceVersion"
        | "resourceVersionMatch"
        | "sendInitialEvents"
        | "allowWatchBookmarks" => "watch=true&timeoutSeconds=1&",
        _ => "",
    }
}

/// Whether the answer to an invalid value of `key` is what api.md says: a 400 `Status`; for
/// `watch`, a stream of events (none, or bookmarks, within its second); for
/// `resourceVersion`, a watch whose one event is a `410 Expired`.
fn refused_as_documented(key: &str, status: u16, text: &str) -> bool {
    let first: Value = text
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    match key {
        "watch" => {
            status == 200
                && text
                    .lines()
                    .all(|l| serde_json::from_str::<Value>(l).is_ok_and(|e| e["type"].is_string()))
        }
        "resourceVersion" => {
            status == 200
                && first["type"] == "ERROR"
                && first["object"]["code"] == 410
                && first["object"]["message"]
                    == "too old resource version: not a resourceVersion this server gave"
        }
        _ => status == 400 && first["kind"] == "Status",
    }
}

fn form_urlencoded_pair(key: &str, value: &str) -> String {
    let escape = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    format!("{}={}", escape(key), escape(value))
}

//! The UI (`ui/`) end to end, and the fixtures its unit tests run on.
//!
//! One test bed serves three channels: the demo's sample channel and a
//! generated one in `fleet-default`, a channel whose image tag is missing
//! (`FetchFailed`) and one whose registry accepts connections and never
//! answers (`NotFetched`). The test
//!
//! 1. writes real answers of the server (changelogs, summaries, a `cve=`
//!    list, `Status` errors) as `ui/fixtures/*.json`, with run-specific
//!    values (registry addresses, creation times) replaced by fixed ones,
//!    and fails when the committed fixtures differ (`UPDATE_UI_FIXTURES=1`
//!    rewrites them), so a change of the JSON contract reaches the UI's unit
//!    tests;
//! 2. builds the UI's test harness, serves it with `kubectl proxy` under
//!    `/k8s/clusters/local/static/` next to the API under
//!    `/k8s/clusters/local/` (the prefix Rancher's proxy uses), once as admin
//!    and once as alice, who may read the operator's ManagedOSVersions but
//!    not changelogs;
//! 3. runs `ui/e2e/browser.mjs` (playwright-core driving Debian's
//!    `chromium`): the panel shows the advisories the server answers,
//!    "compare with" changes the answer (`from=`), the CVE search finds the
//!    first fixing version of the generated channel's model, alice sees the
//!    forbidden state, and the admin sees the states of an image that cannot
//!    be fetched, of one not fetched yet (and its retry), and of an ISO; the
//!    machine panel of a MachineInventory running the sample channel's oldest
//!    version shows its target (the newest) and the changelog between them,
//!    and the CVE page lists a machine of the generated channel that is still
//!    exposed under the version that fixes it for it; both pages follow
//!    changes live (the watch): the exposed machine re-annotated on the
//!    fixing version leaves the CVE page, the pending machine re-annotated
//!    on its target shows `UpToDate`, without a reload.
//!    Screenshots land in `target/ui-artifacts/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use elemental_changelog_integration::generated::{Channel, Spec};
use elemental_changelog_integration::image::{self, Compression, Format, Image};
use elemental_changelog_integration::paths::{
    GROUP_VERSION, all_summaries_path, changelog_path, summaries_path,
};
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::sample;
use elemental_changelog_integration::testbed::process::Process;
use elemental_changelog_integration::testbed::{
    FLEET_NAMESPACE, TestBed, TestBedOptions, elemental, tools_dir, workspace_root,
};
use elemental_changelog_integration::timing::Phases;
use elemental_changelog_integration::ui_fixtures::{self, UPDATE_ENV, updating};
use elemental_changelog_integration::wait::{POLL, SERVED, poll};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Where the API appears to the page: Rancher's proxy path of the local cluster.
const CLUSTER_PREFIX: &str = "/k8s/clusters/local/";
/// Where the built harness is served.
const STATIC_PREFIX: &str = "/k8s/clusters/local/static/";
/// The sample channel's name, as in the demo.
const SAMPLE_CHANNEL: &str = "sl-micro-6.1-base";
/// Namespace of the channel whose image tag does not exist.
const BROKEN_NAMESPACE: &str = "elemental-broken";
/// Namespace of the channel whose registry never answers.
const PENDING_NAMESPACE: &str = "elemental-pending";
/// The machine on the sample channel's oldest version (updates pending).
const PENDING_MACHINE: &str = "ui-pending";
/// The machine on the generated channel's version before the first that fixes its recurring CVE.
const EXPOSED_MACHINE: &str = "ui-exposed";
/// The machine on the generated channel's first version that fixes it.
const FIXED_MACHINE: &str = "ui-fixed";
/// The user who may read ManagedOSVersions but not their changelogs.
const NO_CHANGELOG_USER: &str = "alice";
/// Bound on a build of the harness or the browser run.
const NODE_DEADLINE: Duration = Duration::from_secs(300);
/// The fixed values run-specific ones are replaced with in fixtures (besides those of
/// `ui_fixtures`; `UPDATE_UI_FIXTURES=1` also rewrites `docs/img/ui-panel.png` and
/// `docs/img/ui-machine.png`).
const FIXED_REGISTRY: &str = "registry.example.com";
const FIXED_UNREACHABLE: &str = "unreachable.example.com:5000";

/// A TCP listener on loopback that accepts connections and never answers:
/// a registry the server cannot fetch from until its timeout.
struct BlackHole {
    host: String,
    task: JoinHandle<()>,
}

impl BlackHole {
    async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let host = listener.local_addr()?.to_string();
        let task = tokio::spawn(async move {
            let mut held: Vec<TcpStream> = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Ok(Self { host, task })
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the test publishes and the browser checks.
struct Published {
    /// The sample channel's OS versions, oldest first.
    sample: Vec<String>,
    /// The sample channel's ISO versions (no changelog).
    sample_isos: Vec<String>,
    generated: Channel,
    /// Name of the generated channel's version the exposed machine runs, and of the one that
    /// fixes the recurring CVE for it.
    exposed_runs: String,
    fixed_in: String,
    /// The `os.image` of the sample channel's newest version and of the generated channel's
    /// version `fixed_in`: what the live checks re-register the pending and the exposed machine with.
    newest_image: String,
    fixed_image: String,
    /// The `os.image` of the version before `fixed_in` (the exposed machine's first).
    exposed_image: String,
}

#[tokio::test]
async fn ui_end_to_end() -> Result<()> {
    let ui = workspace_root().join("ui");
    ensure!(
        ui.join("node_modules/.bin/vite").exists()
            && ui.join("node_modules/playwright-core").exists(),
        "{}/node_modules is missing: run `npm ci --prefix ui` (`.ci/deps` does)",
        ui.display()
    );
    let chromium = chromium()?;
    let phases = Phases::start();
    let registry = Registry::start_plain().await?;
    let hole = BlackHole::start().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![
            FLEET_NAMESPACE.to_owned(),
            BROKEN_NAMESPACE.to_owned(),
            PENDING_NAMESPACE.to_owned(),
        ],
        ..TestBedOptions::default()
    })
    .await?;
    let mut flags = registry.server_flags()?;
    // The black hole's channel stays NotFetched for the whole test: the
    // fetch ends only at the fetch timeout (5 minutes).
    flags.extend([
        "--insecure-registry".to_owned(),
        hole.host.clone(),
        "--registry-read-timeout".to_owned(),
        "10m".to_owned(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    bed.start_server(&flags).await?;
    phases.mark("test bed and server ready");
    let result = checks(&bed, &registry, &hole, &ui, &chromium).await;
    phases.mark("ui end-to-end checks done");
    bed.finish(result)
}

async fn checks(
    bed: &TestBed,
    registry: &Registry,
    hole: &BlackHole,
    ui: &Path,
    chromium: &Path,
) -> Result<()> {
    let published = publish(bed, registry, hole).await?;
    let fixtures = capture_fixtures(bed, &published).await?;
    let stale = ui_fixtures::check(
        &ui.join("fixtures"),
        &fixtures,
        &[
            (registry.host(), FIXED_REGISTRY),
            (&hole.host, FIXED_UNREACHABLE),
        ],
    )?;
    grant_managedosversions_only(bed).await?;

    let www = bed.root().join("www");
    run_node(
        ui,
        &ui.join("node_modules/.bin/vite"),
        &[
            "build",
            "--outDir",
            &www.display().to_string(),
            "--emptyOutDir",
        ],
        &[],
    )
    .await
    .context("building the UI harness")?;
    let admin = KubectlProxy::start(bed, "admin", bed.kubeconfig(), &www).await?;
    let alice = KubectlProxy::start(
        bed,
        NO_CHANGELOG_USER,
        &bed.user_kubeconfig(NO_CHANGELOG_USER)?,
        &www,
    )
    .await?;

    let artifacts = workspace_root().join("target/ui-artifacts");
    std::fs::create_dir_all(&artifacts)?;
    let expect = expectations(bed, &fixtures, &published, &admin, &alice)?;
    let expect_file = bed.root().join("ui-expect.json");
    std::fs::write(&expect_file, serde_json::to_vec_pretty(&expect)?)?;
    let step = Instant::now();
    // The pinned Node that `make deps` installs (.ci/node), else whatever `node` is on PATH.
    let pinned = workspace_root().join("target/tools/node/node_modules/.bin/node");
    let node = if pinned.exists() {
        pinned
    } else {
        PathBuf::from("node")
    };
    run_node(
        ui,
        &node,
        &["e2e/browser.mjs"],
        &[
            ("UI_EXPECT", expect_file.as_os_str()),
            ("UI_ARTIFACTS", artifacts.as_os_str()),
            ("UI_CHROMIUM", chromium.as_os_str()),
        ],
    )
    .await
    .context("the browser test")?;
    eprintln!(
        "browser checks passed in {:?}; screenshots in {}",
        step.elapsed(),
        artifacts.display()
    );
    if updating() {
        let image = workspace_root().join("docs/img/ui-panel.png");
        std::fs::create_dir_all(image.parent().context("docs/img")?)?;
        std::fs::copy(artifacts.join("panel-compare.png"), &image)?;
        std::fs::copy(
            artifacts.join("machine.png"),
            workspace_root().join("docs/img/ui-machine.png"),
        )?;
        eprintln!(
            "{UPDATE_ENV}=1: copied the panel screenshot to {}",
            image.display()
        );
    }
    ensure!(
        stale.is_empty(),
        "ui/fixtures/ is out of date with the server's answers: {}. Run `{UPDATE_ENV}=1 cargo test -p \
         elemental-changelog-integration --test ui`, check the diff, rerun `make ui-test` and commit",
        stale.join(", ")
    );
    Ok(())
}

/// `UI_CHROMIUM`, else Debian's `/usr/bin/chromium`.
fn chromium() -> Result<PathBuf> {
    let path = std::env::var_os("UI_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    ensure!(
        path.exists(),
        "{} is missing: install Debian's chromium (`.ci/deps` does) or set UI_CHROMIUM",
        path.display()
    );
    Ok(path)
}

/// Pushes the images, creates the channels and versions as the operator
/// does, and waits until every channel is in the state the fixtures need.
async fn publish(bed: &TestBed, registry: &Registry, hole: &BlackHole) -> Result<Published> {
    let generated = Channel::generate(&Spec::new("gen", 12, 40, 5));
    image::push(registry, "elemental/sample:1", &sample::image()?).await?;
    let files = generated.raw_files("updateinfo.xml")?;
    image::push(
        registry,
        "elemental/gen:1",
        &Image::channel(Format::Oci, Compression::Gzip, &files),
    )
    .await?;

    let client = bed.client();
    let sample_entries = sample::entries()?;
    for (namespace, name, image, entries) in [
        (
            FLEET_NAMESPACE,
            SAMPLE_CHANNEL,
            registry.image("elemental/sample:1"),
            &sample_entries,
        ),
        (
            FLEET_NAMESPACE,
            generated.name.as_str(),
            registry.image("elemental/gen:1"),
            &generated.entries(),
        ),
        (
            BROKEN_NAMESPACE,
            SAMPLE_CHANNEL,
            registry.image("elemental/missing:1"),
            &sample_entries,
        ),
        (
            PENDING_NAMESPACE,
            SAMPLE_CHANNEL,
            format!("{}/elemental/sample:1", hole.host),
            &sample_entries,
        ),
    ] {
        let channel = elemental::apply_custom_channel(&client, namespace, name, &image).await?;
        elemental::sync_channel(&client, &channel, entries).await?;
    }

    let sample = sample::os_versions()?;
    let sample_isos: Vec<String> = sample_entries
        .iter()
        .map(|e| e.name.clone())
        .filter(|n| !sample.contains(n))
        .collect();
    let served: Vec<String> = sample
        .iter()
        .chain(generated.versions.iter().map(|v| &v.name))
        .cloned()
        .collect();
    let took = wait_for_summaries(bed, FLEET_NAMESPACE, &served, "available", |s| {
        s["available"] == true
    })
    .await?;
    eprintln!("fleet-default served after {took:?}");
    for (namespace, reason) in [
        (PENDING_NAMESPACE, "NotFetched"),
        (BROKEN_NAMESPACE, "FetchFailed"),
    ] {
        wait_for_summaries(bed, namespace, &sample, reason, |s| s["reason"] == reason).await?;
    }

    // Machines, as the operator registers them: one on the sample channel's oldest version, one
    // on the generated channel just before the first version that fixes its recurring CVE, one
    // on that version.
    let cve = generated.recurring_cve();
    let first_fix = *generated
        .fixing_versions(&cve)
        .first()
        .with_context(|| format!("the model fixes {cve} nowhere"))?;
    ensure!(first_fix > 0, "{cve} is fixed in the first version");
    let oldest_image = sample_entries
        .iter()
        .find(|e| e.name == sample[0])
        .map(|e| e.upgrade_image.clone())
        .context("the sample's oldest version has no entry")?;
    let newest_image = sample_entries
        .iter()
        .find(|e| Some(&e.name) == sample.last())
        .map(|e| e.upgrade_image.clone())
        .context("the sample's newest version has no entry")?;
    let generated_entries = generated.entries();
    let image_of = |i: usize| generated_entries[i].upgrade_image.clone();
    let mut yaml = String::new();
    for (name, image) in [
        (PENDING_MACHINE, oldest_image),
        (EXPOSED_MACHINE, image_of(first_fix - 1)),
        (FIXED_MACHINE, image_of(first_fix)),
    ] {
        yaml.push_str(&format!(
            "apiVersion: elemental.cattle.io/v1beta1\nkind: MachineInventory\nmetadata:\n  name: {name}\n  \
             namespace: {FLEET_NAMESPACE}\n  annotations: {{\"elemental.cattle.io/os.image\": {}}}\nspec: {{}}\n---\n",
            serde_json::to_string(&image)?
        ));
    }
    bed.kubectl_stdin(&["apply", "-f", "-"], &yaml).await?;
    let machines = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/machineinventories");
    poll("the machines resolved", SERVED, POLL, async || {
        let list = admin_get(bed, &machines).await?.ok()?;
        let resolved = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["state"] != "Unknown")
            .count();
        Ok((resolved == 3).then_some(()))
    })
    .await?;
    Ok(Published {
        sample,
        sample_isos,
        exposed_runs: generated.versions[first_fix - 1].name.clone(),
        fixed_in: generated.versions[first_fix].name.clone(),
        newest_image,
        fixed_image: image_of(first_fix),
        exposed_image: image_of(first_fix - 1),
        generated,
    })
}

/// Waits until the summaries of `names` in `namespace` all pass `accept`
/// (described by `what`); returns the time it took.
async fn wait_for_summaries(
    bed: &TestBed,
    namespace: &str,
    names: &[String],
    what: &str,
    accept: impl Fn(&Value) -> bool,
) -> Result<Duration> {
    let path = summaries_path(namespace);
    let (_, took) = poll(
        &format!("{namespace}: {names:?} {what}"),
        SERVED,
        POLL,
        || async {
            let list = admin_get(bed, &path).await?.ok()?;
            Ok(names
                .iter()
                .all(|name| summary(&list, name).is_some_and(&accept))
                .then_some(()))
        },
    )
    .await?;
    Ok(took)
}

/// A summary of `list` by name.
fn summary<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list["items"]
        .as_array()?
        .iter()
        .find(|i| i["metadata"]["name"] == name)
}

/// An answer: HTTP status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    /// The body of a 200, else an error naming the answer.
    fn ok(self) -> Result<Value> {
        ensure!(self.status == 200, "{}: {}", self.status, self.body);
        Ok(self.body)
    }

    fn expect(self, status: u16, what: &str) -> Result<Value> {
        ensure!(
            self.status == status,
            "{what}: {} (want {status}): {}",
            self.status,
            self.body
        );
        Ok(self.body)
    }
}

/// GET through the aggregator, as admin or with a static user's token.
async fn get_as(bed: &TestBed, user: Option<&str>, path: &str) -> Result<Answer> {
    let http = bed.apiserver_http(match user {
        None => Some(&bed.pki().admin),
        Some(_) => None,
    })?;
    let mut request = http.get(format!("{}{path}", bed.apiserver_url()));
    if let Some(user) = user {
        request = request.bearer_auth(bed.token(user)?);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await?;
    let body = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "GET {path}: {status} with a body that is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    })?;
    Ok(Answer { status, body })
}

async fn admin_get(bed: &TestBed, path: &str) -> Result<Answer> {
    get_as(bed, None, path).await
}

/// The server's answers the UI unit tests run on, by fixture file name.
async fn capture_fixtures(bed: &TestBed, published: &Published) -> Result<BTreeMap<String, Value>> {
    let sample = &published.sample;
    let (oldest, newest) = (&sample[0], &sample[sample.len() - 1]);
    let newest_path = changelog_path(FLEET_NAMESPACE, newest);
    let mut out = BTreeMap::new();
    // The transient one first: the black hole holds the fetch until the server's timeout.
    out.insert(
        "status-not-fetched".to_owned(),
        admin_get(bed, &changelog_path(PENDING_NAMESPACE, newest))
            .await?
            .expect(503, "a changelog whose image is not fetched yet")?,
    );
    out.insert(
        "changelog".to_owned(),
        admin_get(bed, &newest_path).await?.ok()?,
    );
    out.insert(
        "changelog-from".to_owned(),
        admin_get(bed, &format!("{newest_path}?from={oldest}"))
            .await?
            .ok()?,
    );
    out.insert(
        "changelog-oldest".to_owned(),
        admin_get(bed, &changelog_path(FLEET_NAMESPACE, oldest))
            .await?
            .ok()?,
    );
    out.insert(
        "summaries".to_owned(),
        admin_get(bed, &summaries_path(FLEET_NAMESPACE))
            .await?
            .ok()?,
    );
    out.insert(
        "cve".to_owned(),
        admin_get(
            bed,
            &format!(
                "{}?cve={}",
                all_summaries_path(),
                published.generated.recurring_cve()
            ),
        )
        .await?
        .ok()?,
    );
    // The machine panel lists its machine by name (and watches that list).
    let machines = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/machineinventories");
    out.insert(
        "machine-by-name".to_owned(),
        admin_get(
            bed,
            &format!("{machines}?fieldSelector=metadata.name%3D{PENDING_MACHINE}"),
        )
        .await?
        .ok()?,
    );
    out.insert(
        "machine-changelog".to_owned(),
        admin_get(bed, &format!("{machines}/{PENDING_MACHINE}/changelog"))
            .await?
            .ok()?,
    );
    out.insert(
        "machines-cve".to_owned(),
        admin_get(
            bed,
            &format!(
                "{GROUP_VERSION}/machineinventories?cve={}",
                published.generated.recurring_cve()
            ),
        )
        .await?
        .ok()?,
    );
    out.insert(
        "status-forbidden".to_owned(),
        get_as(bed, Some(NO_CHANGELOG_USER), &newest_path)
            .await?
            .expect(403, "a changelog without the right to read it")?,
    );
    out.insert(
        "status-not-found".to_owned(),
        admin_get(bed, &changelog_path(FLEET_NAMESPACE, "no-such-version"))
            .await?
            .expect(404, "the changelog of a missing version")?,
    );
    let iso = published
        .sample_isos
        .first()
        .context("the sample channel has no ISO entry")?;
    out.insert(
        "status-no-changelog-data".to_owned(),
        admin_get(bed, &changelog_path(FLEET_NAMESPACE, iso))
            .await?
            .expect(404, "the changelog of an ISO")?,
    );
    out.insert(
        "status-fetch-failed".to_owned(),
        admin_get(bed, &changelog_path(BROKEN_NAMESPACE, newest))
            .await?
            .expect(503, "a changelog whose image cannot be fetched")?,
    );
    out.insert(
        "status-from-not-older".to_owned(),
        admin_get(
            bed,
            &format!("{}?from={newest}", changelog_path(FLEET_NAMESPACE, oldest)),
        )
        .await?
        .expect(400, "from= a newer version")?,
    );
    for (name, cause) in [
        ("status-not-fetched", "NotFetched"),
        ("status-no-changelog-data", "NoChangelogData"),
        ("status-fetch-failed", "FetchFailed"),
        ("status-from-not-older", "FieldValueInvalid"),
    ] {
        ensure!(
            out[name]["details"]["causes"][0]["reason"] == cause,
            "{name}: want cause {cause}: {}",
            out[name]
        );
    }
    Ok(out)
}

/// alice may read the operator's ManagedOSVersions in fleet-default (so the
/// detail page exists for her) but holds no role of changelog.elemental.cattle.io.
async fn grant_managedosversions_only(bed: &TestBed) -> Result<()> {
    let manifests = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: managedosversion-reader
  namespace: {FLEET_NAMESPACE}
rules:
  - apiGroups: ["elemental.cattle.io"]
    resources: ["managedosversions"]
    verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: managedosversion-reader-{NO_CHANGELOG_USER}
  namespace: {FLEET_NAMESPACE}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: managedosversion-reader
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: {NO_CHANGELOG_USER}
"#
    );
    bed.kubectl_stdin(&["apply", "-f", "-"], &manifests)
        .await
        .context("granting alice ManagedOSVersions only")?;
    Ok(())
}

/// `kubectl proxy` serving the built harness under [`STATIC_PREFIX`] and
/// the API under [`CLUSTER_PREFIX`], on a free loopback port.
struct KubectlProxy {
    url: String,
    _process: Process,
}

impl KubectlProxy {
    async fn start(bed: &TestBed, user: &str, kubeconfig: &Path, www: &Path) -> Result<Self> {
        let log = bed.root().join(format!("logs/kubectl-proxy-{user}.log"));
        let process = Process::spawn(
            &format!("kubectl proxy ({user})"),
            &tools_dir().join("kubectl"),
            [
                format!("--kubeconfig={}", kubeconfig.display()),
                "proxy".to_owned(),
                "--address=127.0.0.1".to_owned(),
                "--port=0".to_owned(),
                format!("--www={}", www.display()),
                format!("--www-prefix={STATIC_PREFIX}"),
                format!("--api-prefix={CLUSTER_PREFIX}"),
            ],
            &[],
            log.clone(),
        )?;
        let (address, _) = poll(
            &format!("kubectl proxy ({user}) listening"),
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                Ok(text
                    .lines()
                    .find_map(|l| l.strip_prefix("Starting to serve on "))
                    .map(|a| a.trim().to_owned()))
            },
        )
        .await?;
        Ok(Self {
            url: format!("http://{address}"),
            _process: process,
        })
    }
}

/// What the browser test checks, all from the server's answers or the
/// generated channel's model.
fn expectations(
    bed: &TestBed,
    fixtures: &BTreeMap<String, Value>,
    published: &Published,
    admin: &KubectlProxy,
    alice: &KubectlProxy,
) -> Result<Value> {
    // The command that re-registers a machine as the operator does when it reports another OS:
    // the page must follow it without a reload (the watch).
    let annotate = |machine: &str, image: &str| {
        json!([
            tools_dir().join("kubectl"),
            format!("--kubeconfig={}", bed.kubeconfig().display()),
            "annotate",
            "--overwrite",
            "-n",
            FLEET_NAMESPACE,
            format!("machineinventories.elemental.cattle.io/{machine}"),
            format!("elemental.cattle.io/os.image={image}"),
        ])
    };
    let ids = |changelog: &Value| -> Vec<String> {
        changelog["advisories"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["id"].as_str().map(str::to_owned))
            .collect()
    };
    let sample = &published.sample;
    let (oldest, newest) = (&sample[0], &sample[sample.len() - 1]);
    let iso = published
        .sample_isos
        .first()
        .context("the sample channel has no ISO entry")?;
    let default_ids = ids(&fixtures["changelog"]);
    let from_ids = ids(&fixtures["changelog-from"]);
    ensure!(
        !default_ids.is_empty() && from_ids.len() > default_ids.len(),
        "the sample channel should have more advisories since {oldest} than since the previous \
         version: {default_ids:?} / {from_ids:?}"
    );

    // The generated channel's model says which versions fix the recurring
    // CVE; the server must list them oldest first, and so must the page.
    let generated = &published.generated;
    let cve = generated.recurring_cve();
    let fixing: Vec<String> = generated
        .fixing_versions(&cve)
        .into_iter()
        .map(|i| generated.versions[i].name.clone())
        .collect();
    ensure!(
        fixing.len() >= 2,
        "the model fixes {cve} only in {fixing:?}"
    );
    let served: Vec<&str> = fixtures["cve"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    ensure!(
        served == fixing.iter().map(String::as_str).collect::<Vec<_>>(),
        "cve={cve}: the server lists {served:?}, the model {fixing:?}"
    );
    // The pending machine runs the oldest version and is headed for the newest: its changelog is
    // the one from the oldest, which the sample's panel compares with.
    let by_name = fixtures["machine-by-name"]["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    ensure!(
        by_name.len() == 1,
        "fieldSelector=metadata.name={PENDING_MACHINE}: {}",
        fixtures["machine-by-name"]
    );
    let machine = &by_name[0];
    ensure!(
        machine["state"] == "UpdatesAvailable"
            && machine["current"]["name"] == oldest.as_str()
            && machine["target"]["name"] == newest.as_str(),
        "{PENDING_MACHINE}: {machine}"
    );
    let machine_ids = ids(&fixtures["machine-changelog"]);
    ensure!(
        machine_ids == from_ids,
        "{PENDING_MACHINE}'s changelog {machine_ids:?}, from {oldest} {from_ids:?}"
    );
    let exposure = |name: &str| {
        fixtures["machines-cve"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["metadata"]["name"] == name)
            .map(|m| m["cve"].clone())
            .unwrap_or_default()
    };
    ensure!(
        exposure(EXPOSED_MACHINE)["state"] == "Exposed"
            && exposure(EXPOSED_MACHINE)["fixedIn"]["name"] == published.fixed_in.as_str()
            && exposure(FIXED_MACHINE)["state"] == "Fixed",
        "cve={cve}: {EXPOSED_MACHINE} (on {}) {}, {FIXED_MACHINE} {}",
        published.exposed_runs,
        exposure(EXPOSED_MACHINE),
        exposure(FIXED_MACHINE)
    );
    ensure!(fixing.first() == Some(&published.fixed_in));
    let package = package_expectations(published, admin, &annotate)?;
    let panel = |base: &str| {
        format!("{base}{STATIC_PREFIX}index.html?namespace={FLEET_NAMESPACE}&name={newest}")
    };
    Ok(json!({
        "panel": {
            "url": panel(&admin.url),
            "version": fixtures["changelog"]["version"],
            "fromVersion": fixtures["changelog"]["from"]["version"],
            "highestSeverity": fixtures["changelog"]["summary"]["highestSeverity"],
            "advisories": default_ids,
            "compareWith": oldest,
            "compareVersion": fixtures["changelog-from"]["from"]["version"],
            "compareAdvisories": from_ids,
        },
        "cve": {
            "url": format!("{}{STATIC_PREFIX}index.html?page=cve", admin.url),
            "id": cve,
            "namespace": FLEET_NAMESPACE,
            "channel": generated.name,
            "versions": fixing,
            // Under the version that fixes it for them, the machines still exposed.
            "fixedIn": published.fixed_in,
            "exposed": [EXPOSED_MACHINE],
            // Re-registered on the version that fixes it, it leaves the exposed machines.
            "live": { "annotate": annotate(EXPOSED_MACHINE, &published.fixed_image), "machine": EXPOSED_MACHINE },
        },
        "package": package,
        "machine": {
            "url": format!("{}{STATIC_PREFIX}index.html?page=machine&namespace={FLEET_NAMESPACE}&name={PENDING_MACHINE}", admin.url),
            "current": oldest,
            "target": newest,
            "advisories": machine_ids,
            "highestSeverity": machine["summary"]["highestSeverity"],
            // Re-registered on its target, it is up to date and runs it.
            "live": { "annotate": annotate(PENDING_MACHINE, &published.newest_image), "state": "UpToDate", "current": newest },
        },
        "forbidden": { "url": panel(&alice.url) },
        // Error states of the admin's panel: an image that cannot be fetched,
        // one not fetched yet (with a retry), and an ISO.
        "states": [
            {
                "kind": "fetchFailed",
                "url": format!("{}{STATIC_PREFIX}index.html?namespace={BROKEN_NAMESPACE}&name={newest}", admin.url),
            },
            {
                "kind": "notFetched",
                "url": format!("{}{STATIC_PREFIX}index.html?namespace={PENDING_NAMESPACE}&name={newest}", admin.url),
                "retry": true,
            },
            {
                "kind": "noData",
                "url": format!("{}{STATIC_PREFIX}index.html?namespace={FLEET_NAMESPACE}&name={iso}", admin.url),
            },
        ],
    }))
}

/// What the package page shows, from the generated channel's model: a package (not the
/// multi-version kernel) that version `fixed_in` upgrades, searched from its EVR there on;
/// the versions carrying it in that range (a package climbs its ladder, whose EVRs rise in RPM
/// order with its step), the package of each, and the machines on `fixed_in` once the CVE
/// page's live step moved the exposed one there.
fn package_expectations(
    published: &Published,
    admin: &KubectlProxy,
    annotate: &dyn Fn(&str, &str) -> Value,
) -> Result<Value> {
    let generated = &published.generated;
    let at = |name: &str| {
        generated
            .position(name)
            .context("a version not in the model")
    };
    let (fix, before) = (at(&published.fixed_in)?, at(&published.exposed_runs)?);
    let (name, installed) = generated.versions[fix]
        .installed
        .iter()
        .find(|(name, p)| {
            name.as_str() != elemental_changelog_integration::generated::MULTI_VERSION_PACKAGE
                && generated.versions[before]
                    .installed
                    .get(*name)
                    .is_some_and(|old| old.ladder == p.ladder && old.step < p.step)
        })
        .with_context(|| format!("{} upgrades no package", published.fixed_in))?;
    let carrying: Vec<(&str, String)> = generated
        .versions
        .iter()
        .filter_map(|v| {
            let p = v.installed.get(name)?;
            (p.ladder == installed.ladder && p.step >= installed.step).then(|| {
                (
                    v.name.as_str(),
                    format!("{name}-{}.{}", p.evr().display(), p.arch),
                )
            })
        })
        .collect();
    ensure!(
        carrying.iter().any(|(v, _)| *v == published.fixed_in)
            && !carrying.iter().any(|(v, _)| *v == published.exposed_runs),
        "{name} from {}: {carrying:?}",
        installed.evr().display()
    );
    Ok(json!({
        "url": format!("{}{STATIC_PREFIX}index.html?page=package", admin.url),
        "name": name,
        "atLeast": installed.evr().display(),
        "namespace": FLEET_NAMESPACE,
        "channel": generated.name,
        "versions": carrying.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        "texts": carrying.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
        "machinesOn": published.fixed_in,
        "machines": [EXPOSED_MACHINE, FIXED_MACHINE],
        // Re-registered on the version before, below the range: it leaves the page.
        "live": { "annotate": annotate(EXPOSED_MACHINE, &published.exposed_image), "machine": EXPOSED_MACHINE },
    }))
}

/// Runs `program` in `dir` with `args` and `envs`, bounded by
/// [`NODE_DEADLINE`]; prints its output; fails unless it succeeds.
async fn run_node(
    dir: &Path,
    program: &Path,
    args: &[&str],
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<()> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = tokio::time::timeout(NODE_DEADLINE, command.output())
        .await
        .with_context(|| {
            format!(
                "{} {args:?}: not done after {NODE_DEADLINE:?}",
                program.display()
            )
        })?
        .with_context(|| format!("running {}", program.display()))?;
    eprintln!(
        "{} {args:?}:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!("{} {args:?} failed: {}", program.display(), output.status);
    }
    Ok(())
}

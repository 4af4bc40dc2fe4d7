//! Changelogs between any two versions, "which version fixes this CVE?",
//! summaries and kubectl tables (issue 5), end to end: generated channels
//! (see `elemental_changelog_integration::generated`) pushed to a real
//! registry, the operator's objects in a real kube-apiserver, every request
//! through the aggregation layer. Expectations come from the generator's
//! model, never from the server's own compute code.
//!
//! Channels of the shared test bed:
//! - `gen` (fleet-default): 24 versions, raw data only (package lists and
//!   `updateinfo.xml.zst`): computed changelogs;
//! - `gen-shifted` (fleet-default): 8 versions, upstream's shifted
//!   `updates.log` files only;
//! - `gen` (elemental-precomputed): the same 24 versions with only the
//!   `updates.log` files the `compute` command wrote from `gen`'s raw data;
//! - `gen-shifted` (elemental-mixed): raw data and upstream's shifted files.
//!
//! The `compute` command alone is checked offline by its own test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiservice::types::{
    ManagedOSVersionChangelog, ManagedOSVersionChangelogSummary, PackageChange, Severity, Source,
};
use elemental_changelog_integration::generated::{Change, Channel, Spec};
use elemental_changelog_integration::image::{self, Compression};
use elemental_changelog_integration::paths::{all_summaries_path, changelog_path, summaries_path};
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::elemental::{self, CHANNEL_LABEL};
use elemental_changelog_integration::testbed::{
    FLEET_NAMESPACE, TestBed, TestBedOptions, server_binary,
};
use elemental_changelog_integration::timing::Phases;
use elemental_changelog_integration::{publish, table};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

const RESOURCE: &str = "managedosversions.changelog.elemental.cattle.io";
/// What `kubectl get -o name` prints before a summary's name.
const SUMMARY_NAME_PREFIX: &str = "managedosversionchangelogsummary.changelog.elemental.cattle.io/";
/// Namespace of the channel served from the `compute` command's files.
const PRECOMPUTED_NAMESPACE: &str = "elemental-precomputed";
/// Namespace of the channel with both raw data and upstream's shifted files.
const MIXED_NAMESPACE: &str = "elemental-mixed";
/// Pairs of version indexes (from, to) checked with `?from=`.
const PAIRS: [(usize, usize); 6] = [(2, 14), (0, 23), (13, 14), (0, 1), (9, 19), (5, 23)];

/// The generated channels and where they are served.
struct Fixture {
    main: Channel,
    shifted: Channel,
    /// Digest of `gen`'s image.
    main_digest: String,
}

#[tokio::test]
async fn generated_channels_end_to_end() -> Result<()> {
    let mut phases = Phases::start();
    let registry = Registry::start_plain().await?;
    let mut bed = TestBed::start(TestBedOptions {
        namespaces: vec![
            FLEET_NAMESPACE.to_owned(),
            PRECOMPUTED_NAMESPACE.to_owned(),
            MIXED_NAMESPACE.to_owned(),
        ],
        ..TestBedOptions::default()
    })
    .await?;
    bed.start_server_reading(&registry, &["--architecture", "x86_64"])
        .await?;
    phases.done("test bed and server");
    let result = checks(&bed, &registry, &mut phases).await;
    phases.mark("compute end-to-end checks done");
    bed.finish(result)
}

async fn checks(bed: &TestBed, registry: &Registry, phases: &mut Phases) -> Result<()> {
    let fixture = publish(bed, registry).await?;
    phases.done("channels published and served");
    changelogs_from_any_version(bed, &fixture.main).await?;
    from_errors(bed, &fixture).await?;
    phases.done("from= checks");
    cve_finds_the_first_fixing_version(bed, &fixture.main).await?;
    phases.done("cve= checks");
    kubectl_tables(bed, &fixture).await?;
    phases.done("kubectl checks");
    precomputed_files_of_the_compute_command(bed, &fixture.main).await?;
    shifted_files_get_a_warning(bed, &fixture.shifted).await?;
    raw_data_wins_over_shifted_files(bed, &fixture.shifted).await?;
    phases.done("precomputed and shifted checks");
    Ok(())
}

/// Pushes the four channel images, creates the channels and versions as the
/// operator does, and waits until the server serves every version.
async fn publish(bed: &TestBed, registry: &Registry) -> Result<Fixture> {
    let main = Channel::generate(&Spec::new("gen", 24, 300, 1));
    let shifted = Channel::generate(&Spec::new("gen-shifted", 8, 120, 2));
    let work = tempfile::tempdir()?;
    let precomputed = run_compute(&main, work.path()).await?;

    let raw = main.raw_files("updateinfo.xml.zst")?;
    let main_digest = image::push_channel(registry, "gen/raw:1", Compression::Gzip, &raw).await?;
    let mut files = vec![("channel.json".to_owned(), main.channel_json())];
    files.extend(
        precomputed
            .into_iter()
            .map(|(name, data)| (format!("changelogs/{name}"), data)),
    );
    image::push_channel(registry, "gen/precomputed:1", Compression::Gzip, &files).await?;
    image::push_channel(
        registry,
        "gen/shifted:1",
        Compression::Gzip,
        &shifted.shifted_files(),
    )
    .await?;
    let mut mixed = shifted.raw_files("updateinfo.xml")?;
    mixed.extend(shifted.shifted_files().into_iter().skip(1));
    image::push_channel(registry, "gen/mixed:1", Compression::Gzip, &mixed).await?;

    for (namespace, channel, image) in [
        (FLEET_NAMESPACE, &main, "gen/raw:1"),
        (FLEET_NAMESPACE, &shifted, "gen/shifted:1"),
        (PRECOMPUTED_NAMESPACE, &main, "gen/precomputed:1"),
        (MIXED_NAMESPACE, &shifted, "gen/mixed:1"),
    ] {
        let object = elemental::apply_custom_channel(
            &bed.client(),
            namespace,
            &channel.name,
            &registry.image(image),
        )
        .await?;
        elemental::sync_channel(&bed.client(), &object, &channel.entries()).await?;
    }
    for (namespace, channel) in [
        (FLEET_NAMESPACE, &main),
        (FLEET_NAMESPACE, &shifted),
        (PRECOMPUTED_NAMESPACE, &main),
        (MIXED_NAMESPACE, &shifted),
    ] {
        let took = publish::wait_served(bed, namespace, channel).await?;
        eprintln!("{namespace}/{} served after {took:?}", channel.name);
    }
    Ok(Fixture {
        main,
        shifted,
        main_digest,
    })
}

/// Writes `channel`'s raw data under `dir`, runs `elemental-changelog-apiserver
/// compute` on it, and returns the files it wrote (file name → content).
async fn run_compute(channel: &Channel, dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let packages = dir.join("packages");
    let output = dir.join("out");
    std::fs::create_dir_all(&packages)?;
    std::fs::write(dir.join("channel.json"), channel.channel_json())?;
    for (i, v) in channel.versions.iter().enumerate() {
        std::fs::write(
            packages.join(format!("{}.packages", v.name)),
            channel.packages_file(i),
        )?;
    }
    // A file that is not a package list is skipped.
    std::fs::write(packages.join("README"), "not a package list")?;
    let updateinfo = dir.join("updateinfo.xml.gz");
    std::fs::write(
        &updateinfo,
        image::compress(Compression::Gzip, &channel.updateinfo_xml())?,
    )?;
    let out = compute_command(&[
        "--channel".as_ref(),
        dir.join("channel.json").as_os_str(),
        "--packages".as_ref(),
        packages.as_os_str(),
        "--updateinfo".as_ref(),
        updateinfo.as_os_str(),
        "--output".as_ref(),
        output.as_os_str(),
    ])
    .await?;
    ensure!(
        out.status.success(),
        "compute failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&output)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("a file name that is not UTF-8")?
            .to_owned();
        files.insert(name, std::fs::read(&path)?);
    }
    Ok(files)
}

async fn compute_command(args: &[&std::ffi::OsStr]) -> Result<std::process::Output> {
    tokio::process::Command::new(server_binary())
        .arg("compute")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .context("running elemental-changelog-apiserver compute")
}

async fn changelog(
    bed: &TestBed,
    namespace: &str,
    name: &str,
    from: Option<&str>,
) -> Result<ManagedOSVersionChangelog> {
    let mut path = changelog_path(namespace, name);
    if let Some(from) = from {
        path.push_str(&format!("?from={from}"));
    }
    bed.admin_get_json(&path).await
}

fn ids(changelog: &ManagedOSVersionChangelog) -> BTreeSet<String> {
    changelog.advisories.iter().map(|a| a.id.clone()).collect()
}

fn changes(list: &[PackageChange]) -> Vec<Change> {
    let mut out: Vec<Change> = list
        .iter()
        .map(|c| (c.name.clone(), c.arch.clone(), c.from.clone(), c.to.clone()))
        .collect();
    out.sort();
    out
}

/// Every advisory is served with the generated fields, newest first, once.
fn check_advisories(channel: &Channel, served: &ManagedOSVersionChangelog) -> Result<()> {
    let name = &served.metadata.name;
    ensure!(
        ids(served).len() == served.advisories.len(),
        "{name}: an advisory is listed twice"
    );
    for a in &served.advisories {
        let model = channel
            .advisory(&a.id)
            .with_context(|| format!("{name}: {} is not generated", a.id))?;
        ensure!(a.type_ == model.kind, "{}: type {}", a.id, a.type_);
        ensure!(a.severity == model.severity, "{}: {:?}", a.id, a.severity);
        let mut cves = a.cves.clone();
        cves.sort();
        ensure!(cves == model.cves, "{}: cves {cves:?}", a.id);
        ensure!(a.bugs == model.bugs, "{}: bugs {:?}", a.id, a.bugs);
        let issued = Timestamp::from_second(model.issued)?;
        ensure!(a.issued == Some(issued), "{}: issued {:?}", a.id, a.issued);
        ensure!(
            a.packages.len() == model.packages.len(),
            "{}: packages",
            a.id
        );
    }
    let issued: Vec<&Option<Timestamp>> = served.advisories.iter().map(|a| &a.issued).collect();
    ensure!(
        issued.windows(2).all(|w| w[0] >= w[1]),
        "{name}: advisories not newest first"
    );
    Ok(())
}

/// `?from=` on the raw-data channel: the advisories whose packages landed
/// after `from` up to the version, and every package change, computed.
async fn changelogs_from_any_version(bed: &TestBed, channel: &Channel) -> Result<()> {
    let v = &channel.versions;
    for (from, to) in PAIRS {
        let served = changelog(bed, FLEET_NAMESPACE, &v[to].name, Some(&v[from].name)).await?;
        let what = format!("{} from {}", v[to].name, v[from].name);
        ensure!(
            served.source == Source::Computed,
            "{what}: {:?}",
            served.source
        );
        ensure!(
            served.from.as_ref().map(|f| f.name.as_str()) == Some(v[from].name.as_str()),
            "{what}: from {:?}",
            served.from
        );
        ensure!(
            served.version == v[to].version,
            "{what}: version {}",
            served.version
        );
        ensure!(served.warnings.is_empty(), "{what}: {:?}", served.warnings);
        let expected = channel.expected_advisories(from, to);
        let got = ids(&served);
        ensure!(
            got == expected,
            "{what}: missing {:?}, unexpected {:?}",
            expected.difference(&got).collect::<Vec<_>>(),
            got.difference(&expected).collect::<Vec<_>>()
        );
        check_advisories(channel, &served)?;
        ensure!(
            served.summary.advisories == expected.len(),
            "{what}: summary"
        );
        let packages = served.packages.as_ref().context("no package changes")?;
        let model = channel.expected_changes(from, to);
        ensure!(
            changes(&packages.upgraded) == model.upgraded,
            "{what}: upgraded {:?}",
            packages.upgraded
        );
        ensure!(
            changes(&packages.downgraded) == model.downgraded,
            "{what}: downgraded {:?}",
            packages.downgraded
        );
        ensure!(
            changes(&packages.added) == model.added,
            "{what}: added {:?}",
            packages.added
        );
        ensure!(
            changes(&packages.removed) == model.removed,
            "{what}: removed {:?}",
            packages.removed
        );
        eprintln!(
            "  {what}: {} advisories, {} upgraded, {} downgraded, {} added, {} removed",
            got.len(),
            model.upgraded.len(),
            model.downgraded.len(),
            model.added.len(),
            model.removed.len()
        );
    }
    // Without `from`: against the previous version, for every version.
    for (i, version) in v.iter().enumerate() {
        let served = changelog(bed, FLEET_NAMESPACE, &version.name, None).await?;
        let expected = match i {
            0 => BTreeSet::new(),
            _ => channel.expected_advisories(i - 1, i),
        };
        ensure!(
            ids(&served) == expected,
            "{}: {:?}",
            version.name,
            ids(&served)
        );
        ensure!(served.source == Source::Computed, "{}", version.name);
        let previous = i.checked_sub(1).map(|p| v[p].name.as_str());
        ensure!(
            served.from.as_ref().map(|f| f.name.as_str()) == previous,
            "{}: from {:?}",
            version.name,
            served.from
        );
    }
    Ok(())
}

/// `from` newer, the version itself, in another channel, or unknown: 400 saying which.
async fn from_errors(bed: &TestBed, fixture: &Fixture) -> Result<()> {
    let v = &fixture.main.versions;
    let other = &fixture.shifted.versions[1].name;
    let cases = [
        (&v[20].name, "not older"),
        (&v[15].name, "not older"),
        (other, "gen-shifted"),
        (&"gen-v9.9.9-os".to_owned(), "does not exist"),
    ];
    for (from, says) in cases {
        let path = format!(
            "{}?from={from}",
            changelog_path(FLEET_NAMESPACE, &v[15].name)
        );
        let (status, body) = bed.admin_get_value(&path).await?;
        ensure!(status == 400, "from={from}: {status} {body}");
        ensure!(
            body["kind"] == "Status" && body["code"] == 400 && body["reason"] == "BadRequest",
            "from={from}: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains(says) && message.contains(from.as_str()),
            "from={from}: {message}"
        );
    }
    Ok(())
}

fn names(list: &Value) -> Vec<(String, String)> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                i["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// `?cve=` lists the versions whose changelog fixes the CVE, oldest first.
async fn cve_finds_the_first_fixing_version(bed: &TestBed, channel: &Channel) -> Result<()> {
    let recurring = channel.recurring_cve();
    // A CVE fixed once, in a version whose name sorts before the newest ones.
    let single = channel
        .advisories
        .iter()
        .filter(|a| a.lands.len() == 1 && a.lands.iter().all(|&l| l >= 9))
        .flat_map(|a| &a.cves)
        .find(|c| channel.fixing_versions(c).len() == 1)
        .context("no CVE fixed in one version")?
        .clone();
    for cve in [recurring.clone(), single, recurring.to_lowercase()] {
        let fixing = channel.fixing_versions(&cve.to_uppercase());
        ensure!(!fixing.is_empty(), "{cve}: the model fixes it nowhere");
        let expected: Vec<(String, String)> = fixing
            .iter()
            .map(|&i| (FLEET_NAMESPACE.to_owned(), channel.versions[i].name.clone()))
            .collect();
        let (status, list) = bed
            .admin_get_value(&format!("{}?cve={cve}", summaries_path(FLEET_NAMESPACE)))
            .await?;
        ensure!(status == 200, "cve={cve}: {status} {list}");
        ensure!(
            list["kind"] == "ManagedOSVersionChangelogSummaryList",
            "{list}"
        );
        ensure!(
            names(&list) == expected,
            "cve={cve}: {:?}, want {expected:?}",
            names(&list)
        );
        eprintln!("  {cve}: first fixed in {}", expected[0].1);

        // Cluster-wide: the precomputed copy of the channel fixes it in the same versions.
        let (status, all) = bed
            .admin_get_value(&format!("{}?cve={cve}", all_summaries_path()))
            .await?;
        ensure!(status == 200, "cve={cve}: {status} {all}");
        let all = names(&all);
        for namespace in [FLEET_NAMESPACE, PRECOMPUTED_NAMESPACE] {
            let here: Vec<&String> = all
                .iter()
                .filter(|(ns, _)| ns == namespace)
                .map(|(_, n)| n)
                .collect();
            let want: Vec<&String> = expected.iter().map(|(_, n)| n).collect();
            ensure!(
                here == want,
                "cluster-wide cve={cve} in {namespace}: {here:?}"
            );
        }
        ensure!(
            all.len() == 2 * expected.len(),
            "cluster-wide cve={cve}: {all:?}"
        );
    }
    // With a label selector: only the versions of the selected channels.
    let fixing = channel.fixing_versions(&recurring);
    for (selector, want) in [
        // Both copies of the channel are named `gen`.
        (
            format!("{CHANNEL_LABEL}%3D{}", channel.name),
            2 * fixing.len(),
        ),
        (format!("{CHANNEL_LABEL}%21%3D{}", channel.name), 0),
    ] {
        let (status, list) = bed
            .admin_get_value(&format!(
                "{}?cve={recurring}&labelSelector={selector}",
                all_summaries_path()
            ))
            .await?;
        ensure!(status == 200, "{selector}: {status} {list}");
        let found = names(&list);
        ensure!(
            found.len() == want,
            "cve={recurring}&labelSelector={selector}: {found:?}"
        );
    }
    // A CVE nobody fixes, and one that is not a CVE id.
    let (status, none) = bed
        .admin_get_value(&format!(
            "{}?cve=CVE-1999-0001",
            summaries_path(FLEET_NAMESPACE)
        ))
        .await?;
    ensure!(status == 200 && names(&none).is_empty(), "{status} {none}");
    let (status, bad) = bed
        .admin_get_value(&format!("{}?cve=GHSA-1234", all_summaries_path()))
        .await?;
    ensure!(status == 400 && bad["kind"] == "Status", "{status} {bad}");
    Ok(())
}

async fn kubectl_tables(bed: &TestBed, fixture: &Fixture) -> Result<()> {
    let channel = &fixture.main;
    let expected_counts = |name: &str| channel.position(name).map(|i| (i, channel.counts(i)));

    let out = bed
        .kubectl_ok(&["get", RESOURCE, "-n", FLEET_NAMESPACE])
        .await?;
    let (header, rows) = table::parse(&out)?;
    ensure!(
        header
            == [
                "NAME",
                "CHANNEL",
                "VERSION",
                "ADVISORIES",
                "SECURITY",
                "CVES",
                "SEVERITY",
                "AGE"
            ],
        "{out}"
    );
    ensure!(
        rows.len() == channel.versions.len() + fixture.shifted.versions.len(),
        "{out}"
    );
    let mut checked = 0;
    for row in &rows {
        ensure!(row.len() == 8, "row {row:?}");
        if row[1] != channel.name {
            continue;
        }
        let (i, counts) = expected_counts(&row[0]).with_context(|| format!("row {row:?}"))?;
        let want = [
            channel.versions[i].version.clone(),
            counts.advisories.to_string(),
            counts.security.to_string(),
            counts.cves.to_string(),
            counts.severity.as_str().to_owned(),
        ];
        ensure!(row[2..7] == want, "row {row:?}, want {want:?}");
        checked += 1;
    }
    ensure!(checked == channel.versions.len(), "{out}");
    let severities: BTreeSet<Severity> = (1..channel.versions.len())
        .map(|i| channel.counts(i).severity)
        .collect();
    ensure!(
        severities.len() >= 3,
        "little variety in the table: {severities:?}"
    );

    // -o wide: the previous version, package counts, availability, reason, digest.
    let out = bed
        .kubectl_ok(&[
            "get",
            RESOURCE,
            "-n",
            FLEET_NAMESPACE,
            "-o",
            "wide",
            "-l",
            &format!("{CHANNEL_LABEL}={}", channel.name),
        ])
        .await?;
    let (header, rows) = table::parse(&out)?;
    ensure!(
        header
            == [
                "NAME",
                "CHANNEL",
                "VERSION",
                "ADVISORIES",
                "SECURITY",
                "CVES",
                "SEVERITY",
                "AGE",
                "FROM",
                "PACKAGES",
                "AVAILABLE",
                "REASON",
                "DIGEST"
            ],
        "{out}"
    );
    ensure!(
        rows.len() == channel.versions.len(),
        "-l kept other channels:\n{out}"
    );
    let digest = &fixture.main_digest[..19];
    for row in &rows {
        let (i, counts) = expected_counts(&row[0]).with_context(|| format!("row {row:?}"))?;
        let from = i
            .checked_sub(1)
            .map_or(String::new(), |p| channel.versions[p].name.clone());
        let packages = counts
            .packages
            .map_or(String::new(), |(u, a, r)| format!("{u}/{a}/{r}"));
        // kubectl prints a null cell (no previous version, no reason) as nothing.
        let want = [
            from,
            packages,
            "true".to_owned(),
            String::new(),
            digest.to_owned(),
        ];
        ensure!(row[8..] == want, "wide row {row:?}, want {want:?}");
    }

    // Label selectors: equality, inequality and set-based.
    for (selector, want) in [
        (
            format!("{CHANNEL_LABEL}={}", fixture.shifted.name),
            &fixture.shifted,
        ),
        (
            format!("{CHANNEL_LABEL}!={}", channel.name),
            &fixture.shifted,
        ),
        (
            format!("{CHANNEL_LABEL} notin ({})", fixture.shifted.name),
            channel,
        ),
    ] {
        let out = bed
            .kubectl_ok(&[
                "get",
                RESOURCE,
                "-n",
                FLEET_NAMESPACE,
                "-l",
                &selector,
                "-o",
                "name",
            ])
            .await?;
        // `-o name` prints <kind>.<group>/<name>, the kind being the summary's.
        let got: BTreeSet<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix(SUMMARY_NAME_PREFIX))
            .collect();
        let expected: BTreeSet<&str> = want.versions.iter().map(|v| v.name.as_str()).collect();
        ensure!(got == expected, "-l {selector}:\n{out}");
    }

    // All namespaces: a NAMESPACE column first, both copies of `gen`.
    let out = bed.kubectl_ok(&["get", RESOURCE, "-A"]).await?;
    let (header, rows) = table::parse(&out)?;
    ensure!(
        header.first().map(String::as_str) == Some("NAMESPACE"),
        "{out}"
    );
    let precomputed = rows
        .iter()
        .filter(|r| r[0] == PRECOMPUTED_NAMESPACE)
        .count();
    ensure!(precomputed == channel.versions.len(), "{out}");

    // A field selector.
    let name = &channel.versions[14].name;
    let out = bed
        .kubectl_ok(&[
            "get",
            RESOURCE,
            "-n",
            FLEET_NAMESPACE,
            "--field-selector",
            &format!("metadata.name={name}"),
        ])
        .await?;
    let (_, rows) = table::parse(&out)?;
    ensure!(rows.len() == 1 && &rows[0][0] == name, "{out}");

    // One object as JSON: a ManagedOSVersionChangelogSummary.
    let out = bed
        .kubectl_ok(&["get", RESOURCE, name, "-n", FLEET_NAMESPACE, "-o", "json"])
        .await?;
    let value: Value = serde_json::from_str(&out)?;
    ensure!(value["kind"] == "ManagedOSVersionChangelogSummary", "{out}");
    ensure!(
        value["apiVersion"] == "changelog.elemental.cattle.io/v1beta1",
        "{out}"
    );
    let summary: ManagedOSVersionChangelogSummary = serde_json::from_value(value)?;
    let counts = channel.counts(14);
    let s = summary.summary.context("no summary")?;
    ensure!(
        summary.available
            && summary.channel.name == channel.name
            && summary.channel.digest.as_deref() == Some(fixture.main_digest.as_str())
            && summary.created.as_deref()
                == Some(
                    Timestamp::from_second(channel.versions[14].created)?
                        .to_string()
                        .as_str()
                )
            && summary.from.map(|f| f.name) == Some(channel.versions[13].name.clone())
            && s.advisories == counts.advisories
            && s.cves == counts.cves
            && s.highest_severity == counts.severity
            && s.by_type.get("security").copied().unwrap_or_default() == counts.security
            && counts.packages
                == Some((
                    s.packages_upgraded.unwrap_or_default(),
                    s.packages_added.unwrap_or_default(),
                    s.packages_removed.unwrap_or_default()
                )),
        "{out}"
    );
    Ok(())
}

/// The files the `compute` command wrote, served as the only data of a
/// channel: each version's changelog equals the computed one, and `from=`
/// is the union of the files in between, each advisory once.
async fn precomputed_files_of_the_compute_command(bed: &TestBed, channel: &Channel) -> Result<()> {
    for (i, version) in channel.versions.iter().enumerate() {
        let served = changelog(bed, PRECOMPUTED_NAMESPACE, &version.name, None).await?;
        let computed = changelog(bed, FLEET_NAMESPACE, &version.name, None).await?;
        ensure!(
            served.source == Source::Precomputed,
            "{}: {:?}",
            version.name,
            served.source
        );
        ensure!(
            served.packages.is_none(),
            "{}: package changes without lists",
            version.name
        );
        ensure!(
            served.warnings.is_empty(),
            "{}: {:?}",
            version.name,
            served.warnings
        );
        ensure!(
            served.advisories == computed.advisories,
            "{}: precomputed {:?}, computed {:?}",
            version.name,
            ids(&served),
            ids(&computed)
        );
        let expected = match i {
            0 => BTreeSet::new(),
            _ => channel.expected_advisories(i - 1, i),
        };
        ensure!(ids(&served) == expected, "{}", version.name);
    }
    let mut spanning = 0;
    for (from, to) in PAIRS {
        let v = &channel.versions;
        let served =
            changelog(bed, PRECOMPUTED_NAMESPACE, &v[to].name, Some(&v[from].name)).await?;
        let what = format!("precomputed {} from {}", v[to].name, v[from].name);
        ensure!(
            served.source == Source::Precomputed,
            "{what}: {:?}",
            served.source
        );
        ensure!(served.warnings.is_empty(), "{what}: {:?}", served.warnings);
        ensure!(
            served.from.as_ref().map(|f| &f.name) == Some(&v[from].name),
            "{what}"
        );
        let expected = channel.expected_advisories(from, to);
        ensure!(ids(&served) == expected, "{what}: {:?}", ids(&served));
        check_advisories(channel, &served)?;
        // Listed in two files of the range, served once.
        spanning += channel
            .advisories
            .iter()
            .filter(|a| a.lands.iter().filter(|&&l| l > from && l <= to).count() > 1)
            .count();
    }
    ensure!(
        spanning > 0,
        "no advisory spans two files of a checked range"
    );
    Ok(())
}

/// Upstream's shifted files alone: served with a warning.
async fn shifted_files_get_a_warning(bed: &TestBed, channel: &Channel) -> Result<()> {
    for (i, version) in channel.versions.iter().enumerate() {
        let served = changelog(bed, FLEET_NAMESPACE, &version.name, None).await?;
        ensure!(served.source == Source::Precomputed, "{}", version.name);
        ensure!(
            ids(&served) == channel.shifted_ids(i),
            "{}: {:?}",
            version.name,
            ids(&served)
        );
        ensure!(
            served.warnings.iter().any(|w| w.contains("shifted")),
            "{}: no shifted warning: {:?}",
            version.name,
            served.warnings
        );
    }
    // The warnings are Warning headers too, which kubectl prints on stderr.
    let newest = &channel.versions.last().context("no versions")?.name;
    let path = changelog_path(FLEET_NAMESPACE, newest);
    let out = bed.kubectl(&["get", "--raw", &path]).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "kubectl get --raw {path}: {stderr}");
    ensure!(
        stderr
            .lines()
            .any(|l| l.starts_with("Warning: ") && l.contains("shifted")),
        "kubectl printed no shifted warning: {stderr:?}"
    );
    Ok(())
}

/// The `compute` command alone: one file per version, the oldest empty,
/// each with the advisories the model says landed in that version; bad input
/// fails naming the file.
#[tokio::test]
async fn compute_command_writes_updates_logs() -> Result<()> {
    let channel = Channel::generate(&Spec::new("gen", 24, 300, 1));
    let dir = tempfile::tempdir()?;
    let files = run_compute(&channel, dir.path()).await?;
    let expected_names: BTreeSet<String> = channel
        .versions
        .iter()
        .map(|v| format!("{}.updates.log", v.name))
        .collect();
    ensure!(
        files.keys().cloned().collect::<BTreeSet<_>>() == expected_names,
        "{:?}",
        files.keys()
    );
    for (i, v) in channel.versions.iter().enumerate() {
        let list: Vec<Value> = serde_json::from_slice(&files[&format!("{}.updates.log", v.name)])?;
        let got: BTreeSet<String> = list
            .iter()
            .map(|a| a["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        let expected = match i {
            0 => BTreeSet::new(),
            _ => channel.expected_advisories(i - 1, i),
        };
        ensure!(got == expected, "{}: {got:?}, want {expected:?}", v.name);
        for a in &list {
            let id = a["id"].as_str().unwrap_or_default();
            let model = channel.advisory(id).context("unknown id")?;
            // Upstream's format: date as a string of unix seconds.
            ensure!(
                a["date"].as_str() == Some(model.issued.to_string().as_str()),
                "{id}: date {}",
                a["date"]
            );
            ensure!(a["type"] == model.kind, "{id}: type {}", a["type"]);
        }
    }

    // A package list for a version channel.json does not have.
    let packages = dir.path().join("packages");
    std::fs::write(packages.join("nobody.packages"), channel.packages_file(0))?;
    let out = compute_command(&[
        "--channel".as_ref(),
        dir.path().join("channel.json").as_os_str(),
        "--packages".as_ref(),
        packages.as_os_str(),
        "--updateinfo".as_ref(),
        dir.path().join("updateinfo.xml.gz").as_os_str(),
        "--output".as_ref(),
        dir.path().join("out2").as_os_str(),
    ])
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("nobody"),
        "{stderr}"
    );
    ensure!(
        !dir.path().join("out2").exists(),
        "files written despite the error"
    );

    // Without the package list of one version, it and the next one fall back
    // to the date window (issued after the previous `created`, up to their own).
    std::fs::remove_file(packages.join("nobody.packages"))?;
    let missing = 10;
    std::fs::remove_file(packages.join(format!("{}.packages", channel.versions[missing].name)))?;
    let out = compute_command(&[
        "--channel".as_ref(),
        dir.path().join("channel.json").as_os_str(),
        "--packages".as_ref(),
        packages.as_os_str(),
        "--updateinfo".as_ref(),
        dir.path().join("updateinfo.xml.gz").as_os_str(),
        "--output".as_ref(),
        dir.path().join("out3").as_os_str(),
    ])
    .await?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (i, v) in channel.versions.iter().enumerate() {
        let list: Vec<Value> = serde_json::from_slice(&std::fs::read(
            dir.path()
                .join("out3")
                .join(format!("{}.updates.log", v.name)),
        )?)?;
        let got: BTreeSet<String> = list
            .iter()
            .map(|a| a["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        let expected = match i {
            0 => BTreeSet::new(),
            i if i == missing || i == missing + 1 => channel.window_ids(i),
            i => channel.expected_advisories(i - 1, i),
        };
        ensure!(
            got == expected,
            "without {missing}'s list, {}: {got:?}, want {expected:?}",
            v.name
        );
    }
    Ok(())
}

/// Raw data beside upstream's shifted files: the computed answer, no warning.
async fn raw_data_wins_over_shifted_files(bed: &TestBed, channel: &Channel) -> Result<()> {
    let mut differ = 0;
    for (i, version) in channel.versions.iter().enumerate() {
        let served = changelog(bed, MIXED_NAMESPACE, &version.name, None).await?;
        ensure!(
            served.source == Source::Computed,
            "{}: {:?} {:?}",
            version.name,
            served.source,
            served.warnings
        );
        ensure!(
            served.warnings.iter().all(|w| !w.contains("shifted")),
            "{}: {:?}",
            version.name,
            served.warnings
        );
        let expected = match i {
            0 => BTreeSet::new(),
            _ => channel.expected_advisories(i - 1, i),
        };
        ensure!(
            ids(&served) == expected,
            "{}: {:?}",
            version.name,
            ids(&served)
        );
        differ += usize::from(expected != channel.shifted_ids(i));
    }
    ensure!(differ > 0, "the shifted files hold the computed answer");
    Ok(())
}

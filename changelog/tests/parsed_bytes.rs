//! Calibrates [`ChannelData::parsed_bytes`], the estimate the server's `--max-kept-total`
//! counts, against the heap the parsed data really holds, measured with a counting global
//! allocator: for each kind of file (package lists, `updates.log`, `updateinfo.xml`) and for
//! a whole image, the estimate must be neither below what is held (the bound would let more
//! in than it says) nor far above it (it would refuse channels that fit).
//!
//! The heap held is what the allocator was asked for and not given back while the data lives
//! (requested sizes, so neither the allocator's rounding nor its retained free memory: those
//! are why a process's RSS grows more than the estimate; see `docs/reliability.md`).

use elemental_changelog::data::ChannelData;

// dhat's allocator counts the bytes currently allocated (this workspace forbids the `unsafe`
// a hand-written counting allocator needs).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes currently allocated on the heap.
fn live() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

/// Versions of the generated image.
const VERSIONS: usize = 12;
/// Packages per version's list.
const PACKAGES: usize = 600;
/// Advisories per version's `updates.log`, and in the `updateinfo.xml`.
const ADVISORIES: usize = 150;
/// The estimate over the heap held: never less (the bound would let in more than it says),
/// at most twice (it would refuse channels that fit). It is above 1 by design: it counts an
/// allocation header for each allocation (16 bytes, as glibc's malloc takes), which requested
/// sizes do not include.
const RATIO: std::ops::RangeInclusive<f64> = 1.0..=2.0;

fn channel_json() -> Vec<u8> {
    let entries: Vec<String> = (0..VERSIONS)
        .map(|v| {
            format!(
                r#"{{"metadata":{{"name":"v{v}"}},"spec":{{"version":"v1.{v}.0","type":"container","metadata":{{"upgradeImage":"registry.example/os:v1.{v}.0","displayName":"OS v1.{v}.0","created":{}}}}}}}"#,
                1_732_723_652 + v * 86_400
            )
        })
        .collect();
    format!("[{}]", entries.join(",")).into_bytes()
}

/// A package list as the channel images ship it (`name|epoch|version|release|arch|disturl|license`);
/// each version upgrades a tenth of the packages.
fn packages(version: usize) -> Vec<u8> {
    let mut out = String::new();
    for p in 0..PACKAGES {
        let release = if p % 10 == version % 10 { version } else { 0 };
        out.push_str(&format!(
            "package-{p}|(none)|{}.{}.{}|slfo.1.1_{release}.1|x86_64|obs://build.suse.de/SUSE:SLFO:1.1:Build/standard/{p:032x}-package-{p}|GPL-2.0-or-later\n",
            1 + p % 7,
            p % 13,
            p % 5
        ));
    }
    out.into_bytes()
}

/// An `updates.log` of the JSON form the images ship.
fn updates_log(version: usize) -> Vec<u8> {
    let advisories: Vec<String> = (0..ADVISORIES)
        .map(|a| {
            let id = version * ADVISORIES + a;
            format!(
                r#"{{"id":"SUSE-SLE-Micro-6.1-2024-{id}","type":"security","severity":"important","title":"Security update for package-{a}","issued":"2024-05-01T00:00:00Z","description":"This update for package-{a} fixes the following issues: a buffer overflow in the parser (bsc#{id}).","references":[{{"id":"CVE-2024-{id:05}","type":"cve","href":"https://www.suse.com/security/cve/CVE-2024-{id:05}/","title":"CVE-2024-{id:05}"}},{{"id":"{id}","type":"bugzilla","href":"https://bugzilla.suse.com/show_bug.cgi?id={id}","title":"VUL-0: CVE-2024-{id:05}"}}],"packages":[{{"name":"package-{a}","version":"1.{a}.0","release":"{version}.1","arch":"x86_64"}},{{"name":"package-{a}-devel","version":"1.{a}.0","release":"{version}.1","arch":"x86_64"}}]}}"#
            )
        })
        .collect();
    format!("[{}]", advisories.join(",")).into_bytes()
}

fn updateinfo_xml() -> Vec<u8> {
    let mut out = String::from("<updates>\n");
    for a in 0..ADVISORIES * 4 {
        out.push_str(&format!(
            r#"<update from="maint-coord@suse.de" status="stable" type="security" version="1">
  <id>SUSE-SLE-Micro-6.1-2024-{a}</id>
  <title>Security update for package-{a}</title>
  <severity>important</severity>
  <release>SUSE Updates SLE-Micro 6.1 x86_64</release>
  <issued date="1724154426" />
  <references>
    <reference href="https://bugzilla.suse.com/show_bug.cgi?id={a}" id="{a}" title="VUL-0: CVE-2024-{a:05}: package-{a}: a buffer overflow" type="bugzilla" />
    <reference href="https://www.suse.com/security/cve/CVE-2024-{a:05}/" id="CVE-2024-{a:05}" title="CVE-2024-{a:05}" type="cve" />
  </references>
  <description>This update for package-{a} fixes the following issues: a buffer overflow in the parser.</description>
  <pkglist><collection>
    <package name="package-{a}" epoch="0" version="1.{a}.0" release="3.1" arch="x86_64" src="x86_64/package-{a}-1.{a}.0-3.1.x86_64.rpm"><filename>package-{a}-1.{a}.0-3.1.x86_64.rpm</filename></package>
  </collection></pkglist>
</update>
"#
        ));
    }
    out.push_str("</updates>\n");
    out.into_bytes()
}

/// The estimate and the heap held by the data parsed from `files`.
fn measure(files: &[(String, Vec<u8>)]) -> (u64, u64) {
    let before = live();
    // The copy handed to the parse is consumed by it (freed within the window).
    let data = ChannelData::from_files(files.to_vec())
        .unwrap_or_else(|e| panic!("the generated image parses: {e}"));
    let held = live().saturating_sub(before);
    let estimate = data.parsed_bytes();
    drop(data);
    (estimate, held)
}

fn check(what: &str, files: &[(String, Vec<u8>)], failures: &mut Vec<String>) {
    let raw: usize = files.iter().map(|(_, bytes)| bytes.len()).sum();
    let (estimate, held) = measure(files);
    let ratio = estimate as f64 / held.max(1) as f64;
    println!(
        "{what:<22} raw {raw:>9} B, heap held {held:>9} B, estimate {estimate:>9} B: estimate/held {ratio:.2}"
    );
    if !RATIO.contains(&ratio) {
        failures.push(format!(
            "{what}: estimate {estimate} B for {held} B held ({ratio:.2}, outside {RATIO:?})"
        ));
    }
}

/// One test (the allocator counts every thread: tests running in parallel would count each
/// other's allocations).
#[test]
fn the_estimate_matches_the_heap_held() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let channel = ("channel.json".to_owned(), channel_json());
    let lists: Vec<_> = (0..VERSIONS)
        .map(|v| (format!("changelogs/v{v}.packages"), packages(v)))
        .collect();
    let logs: Vec<_> = (0..VERSIONS)
        .map(|v| (format!("changelogs/v{v}.updates.log"), updates_log(v)))
        .collect();
    let updateinfo = ("changelogs/updateinfo.xml".to_owned(), updateinfo_xml());
    let with = |more: &[(String, Vec<u8>)]| {
        let mut files = vec![channel.clone()];
        files.extend_from_slice(more);
        files
    };
    let mut failures = Vec::new();
    check("channel.json only", &with(&[]), &mut failures);
    check("package lists", &with(&lists), &mut failures);
    check("updates.log", &with(&logs), &mut failures);
    check(
        "updateinfo.xml",
        &with(std::slice::from_ref(&updateinfo)),
        &mut failures,
    );
    let mut all = lists.clone();
    all.extend(logs.iter().cloned());
    all.push(updateinfo.clone());
    check("the whole image", &with(&all), &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

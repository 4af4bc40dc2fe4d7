//! `docs/performance.md` from one run's [`Results`]. Everything above
//! [`NOTES_MARKER`] is regenerated; what follows it (people's notes, such
//! as before/after figures of a change) is kept as it is.

use std::fmt::Write as _;
use std::time::Duration;

use super::fleet::FleetResults;
use super::load::{Measured, Protocol, percentile};
use super::{Cell, Phase, Results, Settings, Size, Target};

/// Median of `values` (0 when empty).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The fleet view's section: setup times, the list cells with their ratios to the baselines,
/// cached vs uncached, RSS and bytes per machine, watch event latency next to kube-apiserver's,
/// the poller's CPU, and how fast a machine follows a change.
pub fn fleet_section(w: &mut String, f: &FleetResults) {
    let _ = writeln!(
        w,
        "## Fleet view: {} machines\n\n{} MachineInventories in one namespace over {} channels of {} \
         versions (machine `i` on version `i / {}` of channel `i % {}`), as many ConfigMaps each \
         holding as many bytes as a machine's mean size in the machine list, metadata counted, \
         as the baseline. Every client sends the reader's bearer token (token review and \
         authorization on) and `Accept-Encoding: gzip` (as kubectl). Lists: machines {} (JSON), \
         ConfigMaps {}.\n",
        f.machines,
        f.machines,
        f.channels,
        f.versions,
        f.channels,
        f.channels,
        bytes(f.list_bytes.0 as f64),
        bytes(f.list_bytes.1 as f64)
    );
    if !f.setup.is_empty() {
        let _ = writeln!(w, "| setup step | took |\n|---|---|");
        for (step, took) in &f.setup {
            let _ = writeln!(w, "| {step} | {:.1} s |", took.as_secs_f64());
        }
        let _ = writeln!(w);
    }
    let find = |prefix: &str| {
        f.cells
            .iter()
            .find(|c| c.label.starts_with(prefix))
            .map(|c| c.measured)
    };
    let cm_json = find("(a) ConfigMap list, JSON");
    let cm_table = find("(a) ConfigMap list, Table");
    let _ = writeln!(
        w,
        "Lists of all machines are asked one at a time, the five lists taking turns in each round \
         (a first round unmeasured), so both sides see the same load; with under 100 rounds, p99 \
         is the slowest. The `?cve=` (c) and `?package=` (p) lists follow, each on its own once \
         kept (asked twice before its unmeasured round). The small answers (v, m) are loaded with `wrk` (HTTP/1.1, 2 threads).\n\n\
         | request | how | req/s | p50 | p99 | bytes/response | errors | p99 ÷ (a) of the same format | req/s ÷ (a) |\n|---|---|---|---|---|---|---|---|---|"
    );
    for c in &f.cells {
        let m = &c.measured;
        let baseline = if c.label.contains("Table") {
            cm_table
        } else {
            cm_json
        };
        let (p99, rps) = match baseline {
            Some(b)
                if !c.label.starts_with("(a)") && b.p99_ms > 0.0 && b.requests_per_second > 0.0 =>
            {
                (
                    format!("{:.2}", m.p99_ms / b.p99_ms),
                    format!("{:.2}", m.requests_per_second / b.requests_per_second),
                )
            }
            _ => ("1 (baseline)".to_owned(), "1".to_owned()),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {} | {} | {p99} | {rps} |",
            c.label,
            c.how,
            rate(m.requests_per_second),
            m.p50_ms,
            m.p99_ms,
            bytes(m.bytes_per_response),
            m.errors
        );
    }
    let (uncached, cached) = (median(&f.uncached_ms), median(&f.cached_ms));
    let _ = writeln!(
        w,
        "\nCached vs uncached, the same `?cve=` machine list directly (median of {}): the first \
         request renders it (every machine resolved, its pending summary and its exposure) in \
         {uncached:.1} ms; the third is the kept answer, in {cached:.1} ms ({:.1}× faster). (A full \
         answer cache may drop a new answer at once and keep it when it is asked for again: the \
         second request may render too.)\n",
        f.uncached_ms.len(),
        if cached > 0.0 { uncached / cached } else { 0.0 }
    );
    let (package_uncached, package_cached) =
        (median(&f.package_uncached_ms), median(&f.package_cached_ms));
    let _ = writeln!(
        w,
        "The same for a `?package=` list of the same machines (`package=bash&packageBelow=1.N`, \
         every machine on a resolved version: the package index built on the first, then each \
         machine's block looked up from its version; median of {}): {package_uncached:.1} ms \
         uncached ({:.2}× the `?cve=` list's), {package_cached:.1} ms kept.\n",
        f.package_uncached_ms.len(),
        if uncached > 0.0 {
            package_uncached / uncached
        } else {
            0.0
        }
    );
    let (before, after, end) = (f.rss.0, f.rss.1, f.rss_end);
    let per_machine = per_machine_bytes(f);
    let _ = writeln!(
        w,
        "Memory of the whole server (`/proc/<pid>/status`): VmRSS {:.1} MiB before the machines \
         (the four channels served), {:.1} MiB with them resolved and served, {:.1} MiB at the end \
         of the phase (after the lists, the watches and the poller); VmHWM (the peak) {:.1} MiB \
         with the machines, {:.1} MiB at the end. **{per_machine:.0} bytes per machine** (RSS \
         growth from the machines ÷ {}).\n",
        mib(before.rss_kib),
        mib(after.rss_kib),
        mib(end.rss_kib),
        mib(after.peak_kib),
        mib(end.peak_kib),
        f.machines
    );
    let (plain_before, plain_after) = f.plain_lists.rss;
    let _ = writeln!(
        w,
        "{} lists of all machines at once, straight to the server, by clients that do not accept \
         gzip ({} bytes each; the list is kept gzipped and streamed to them decompressed, 64 KiB at \
         a time): VmRSS {:.1} MiB before, {:.1} MiB after; VmHWM {:.1} MiB before, {:.1} MiB \
         after.\n",
        super::fleet::PLAIN_CLIENTS,
        f.plain_lists.bytes,
        mib(plain_before.rss_kib),
        mib(plain_after.rss_kib),
        mib(plain_before.peak_kib),
        mib(plain_after.peak_kib)
    );
    let _ = writeln!(
        w,
        "Watch event latency: {} watchers on each side, all open at once, from the list's \
         resourceVersion; machine `m-00000`'s `os.image` annotation changed {} times (between an \
         older version and the newest, so its state changes each time; one change before them \
         not counted), each timed from just before its PATCH is sent to its event at each \
         watcher.\n\n| watch | events | p50 | p99 | max |\n|---|---|---|---|---|",
        super::fleet::WATCHERS,
        f.watch_changes
    );
    let mut watch_p99 = Vec::new();
    for side in &f.watch {
        let mut sorted = side.latencies.clone();
        sorted.sort();
        if sorted.is_empty() {
            continue;
        }
        let p99 = percentile(&sorted, 0.99);
        watch_p99.push(p99);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} |",
            side.label,
            sorted.len(),
            ms(percentile(&sorted, 0.50)),
            ms(p99),
            ms(sorted[sorted.len() - 1])
        );
    }
    if let [ours, kube, ..] = watch_p99[..] {
        let _ = writeln!(
            w,
            "\np99 ÷ kube-apiserver's: {:.2}.",
            ours.as_secs_f64() / kube.as_secs_f64().max(1e-6)
        );
    }
    if let [_, kube, direct] = watch_p99[..] {
        let _ = writeln!(
            w,
            "Straight to the server (d), 100 more watchers as admin, no proxy: p99 ÷ \
             kube-apiserver's {:.2}.",
            direct.as_secs_f64() / kube.as_secs_f64().max(1e-6)
        );
    }
    let p = &f.poller;
    let mut list_ms = p.list_ms.clone();
    list_ms.sort_by(f64::total_cmp);
    let _ = writeln!(
        w,
        "\nRancher-style poller (a LIST of all machines through the aggregator, JSON, gzip, every \
         {} s): {} lists in {:.0} s; the server used {:.2} CPU seconds over the run ({:.3} s per \
         list), {:.2} s of them while a list was being answered ({:.3} s per list); a list took \
         {:.0} ms (median), {:.0} ms at most.\n",
        super::fleet::POLL_PERIOD.as_secs(),
        p.lists,
        p.took.as_secs_f64(),
        p.cpu_total.as_secs_f64(),
        p.cpu_total.as_secs_f64() / p.lists.max(1) as f64,
        p.cpu_in_lists.as_secs_f64(),
        p.cpu_in_lists.as_secs_f64() / p.lists.max(1) as f64,
        median(&list_ms),
        list_ms.last().copied().unwrap_or(0.0)
    );
    let follow_max = f.follow.iter().max().copied().unwrap_or_default();
    let mut follow: Vec<Duration> = f.follow.clone();
    follow.sort();
    let follow_median = follow.get(follow.len() / 2).copied().unwrap_or_default();
    let _ = writeln!(
        w,
        "A re-registered machine (its `os.image` annotation changed) is answered with its new \
         version after {} (median of {}), {} at most.\n",
        ms(follow_median),
        f.follow.len(),
        ms(follow_max)
    );
    pressure_section(w, f);
    let b_json = find("(b) machine list, JSON");
    let b_table = find("(b) machine list, Table");
    let ratio = |b: Option<Measured>, a: Option<Measured>| {
        b.zip(a)
            .map_or(f64::INFINITY, |(b, a)| b.p99_ms / a.p99_ms.max(1e-6))
    };
    let (json_ratio, table_ratio) = (ratio(b_json, cm_json), ratio(b_table, cm_table));
    let ours_watch = watch_p99.first().copied();
    let checks = [
        (
            format!(
                "machine list JSON (b) p99 ÷ ConfigMap list JSON (a) p99 ≤ 1.0: {json_ratio:.2}"
            ),
            json_ratio <= 1.0,
        ),
        (
            format!(
                "machine list Table (b) p99 ÷ ConfigMap list Table (a) p99 ≤ 1.0: {table_ratio:.2}"
            ),
            table_ratio <= 1.0,
        ),
        (
            format!(
                "VmRSS with the machines ≤ {FLEET_RSS_GOAL_MIB} MiB (the chart's limit): {:.1} MiB",
                mib(after.rss_kib.max(end.rss_kib))
            ),
            mib(after.rss_kib.max(end.rss_kib)) <= FLEET_RSS_GOAL_MIB,
        ),
        (
            format!(
                "VmHWM (the peak) ≤ {FLEET_RSS_GOAL_MIB} MiB: {:.1} MiB",
                mib(end.peak_kib)
            ),
            mib(end.peak_kib) <= FLEET_RSS_GOAL_MIB,
        ),
        (
            format!(
                "watch event p99 (b) ≤ {}: {}",
                ms(FLEET_FOLLOW_GOAL),
                ours_watch.map_or("none".to_owned(), ms)
            ),
            ours_watch.is_some_and(|p| p <= FLEET_FOLLOW_GOAL),
        ),
        (
            format!(
                "a machine follows its annotations within {}",
                ms(FLEET_FOLLOW_GOAL)
            ),
            !f.follow.is_empty() && follow_max <= FLEET_FOLLOW_GOAL,
        ),
    ];
    let _ = writeln!(w, "| goal | met |\n|---|---|");
    for (goal, ok) in checks
        .into_iter()
        .chain(pressure_goals(f, &watch_p99, find))
    {
        let _ = writeln!(w, "| {goal} | {} |", verdict(ok));
    }
    let _ = writeln!(w);
    for (title, profile) in [
        (
            format!(
                "Where the server spends its time on a machine's change ({} more changes, \
                 recorded with `perf record -g`, self time)",
                super::fleet::PROFILED_CHANGES
            ),
            &f.watch_profile,
        ),
        (
            format!(
                "Where the server spends its time answering the poller ({} more lists)",
                super::fleet::PROFILED_LISTS
            ),
            &f.poller_profile,
        ),
    ] {
        if let Some(profile) = profile {
            let _ = writeln!(w, "{title}:\n\n```\n{profile}\n```\n");
        }
    }
}

/// Issue 35's and issue 34's figures of the fleet under pressure: CPU per change at two fleet
/// sizes, zero-window watches, the PATCH loop, the package lists and their index.
fn pressure_section(w: &mut String, f: &FleetResults) {
    use super::pressure::{
        PACKAGE_CHANNELS, PACKAGE_PACKAGES, PATCHES_PER_SECOND, ZERO_WINDOW_TIMEOUT,
        ZERO_WINDOW_WATCHES, ZeroWindow, p99,
    };
    if !f.change_cpu.is_empty() {
        let _ = writeln!(
            w,
            "CPU of a single-machine change: machine `m-00000`'s `os.image` annotation changed \
             (between an older version and the newest), each change awaited at a watcher through \
             the aggregator before the next; the server's CPU (user and system, \
             `/proc/<pid>/stat`) from the first PATCH to the last event.\n\n\
             | machines | changes | server CPU | per change | wall time |\n|---|---|---|---|---|"
        );
        for c in &f.change_cpu {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.2} ms | {:.1} s |",
                c.machines,
                c.changes,
                ms(c.cpu),
                c.per_change().as_secs_f64() * 1000.0,
                c.took.as_secs_f64()
            );
        }
        if let [small, all] = &f.change_cpu[..] {
            let _ = writeln!(
                w,
                "\nPer change with {} machines ÷ with {}: {:.2}.\n",
                all.machines,
                small.machines,
                all.per_change().as_secs_f64() / small.per_change().as_secs_f64().max(1e-9)
            );
        }
    }
    if !f.zero_window.is_empty() {
        let _ = writeln!(
            w,
            "{ZERO_WINDOW_WATCHES} HTTP/2 watches of every machine from `resourceVersion=0` (each \
             machine an initial event), `timeoutSeconds={}`, straight to the server on 4 \
             connections whose client never opens its flow-control window; VmRSS before, the \
             highest sampled every 50 ms while they were held, after. RSS counts what the \
             allocator takes from the system: memory freed earlier (the lists of the phase) is \
             used again first, so the run with a fifth of the machines, before any large list, \
             shows more of what the watches hold.\n\n\
             | machines | how they ended | VmRSS before | held (max) | growth | after | ended by the deadline (within {}) |\n|---|---|---|---|---|---|---|",
            ZERO_WINDOW_TIMEOUT.as_secs(),
            ms(ZeroWindow::bound())
        );
        for z in &f.zero_window {
            let _ = writeln!(
                w,
                "| {} | {} | {:.1} MiB | {:.1} MiB | **{:.1} MiB** | {:.1} MiB | {} |",
                z.machines,
                z.summary,
                mib(z.before.rss_kib),
                mib(z.held_kib),
                mib(z.growth_kib()),
                mib(z.after.rss_kib),
                if z.ended_by_deadline {
                    "all"
                } else {
                    "**not all**"
                }
            );
        }
        let _ = writeln!(w);
    }
    if let Some(l) = &f.patch_loop {
        let _ = writeln!(
            w,
            "PATCH loop: machine `m-00000`'s `os.image` annotation changed {PATCHES_PER_SECOND} \
             times a second for {} s ({} PATCHes answered, {} failed), while other clients GET \
             machines `m-00001`… (and, as the baseline, ConfigMaps `cm-00001`… from \
             kube-apiserver) 20 times a second each, every GET sent on its schedule; the \
             same GETs for as long with no loop first. The server's CPU: {} idle, {} with the \
             loop ({:.2} ms per PATCH more).\n\n\
             | GETs | idle p50 | idle p99 | with the loop p50 | with the loop p99 | p99 ÷ idle | errors |\n|---|---|---|---|---|---|---|",
            l.duration.as_secs(),
            l.patches.0,
            l.patches.1,
            ms(l.cpu.0),
            ms(l.cpu.1),
            l.cpu.1.saturating_sub(l.cpu.0).as_secs_f64() * 1000.0 / l.patches.0.max(1) as f64
        );
        for (idle, loaded) in l.idle.iter().zip(&l.loaded) {
            let (mut a, mut b) = (idle.ms.clone(), loaded.ms.clone());
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            let _ = writeln!(
                w,
                "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} | {} |",
                idle.label,
                median(&a),
                p99(&a),
                median(&b),
                p99(&b),
                p99(&b) / p99(&a).max(1e-6),
                idle.errors + loaded.errors
            );
        }
        let _ = writeln!(w);
    }
    if let Some(p) = &f.package_memory {
        let _ = writeln!(
            w,
            "Package lists and their index (issue 34): {PACKAGE_CHANNELS} more channels of {} \
             versions × {PACKAGE_PACKAGES} packages ({} raw) published in the same namespace, then \
             every version of the namespace listed with `?package=bash` straight to the server \
             (the package index built for every channel by the first list). VmRSS {:.1} MiB \
             before them, {:.1} MiB with them served, {:.1} MiB with their index built and \
             the first answers kept ({:+.1} MiB; RSS, not the index's own bytes); the first `?package=` list {:.1} ms, kept {:.1} ms (median of \
             {}).\n",
            p.versions,
            bytes(p.raw_bytes as f64),
            mib(p.rss.0.rss_kib),
            mib(p.rss.1.rss_kib),
            mib(p.rss.2.rss_kib),
            mib(p.rss.2.rss_kib) - mib(p.rss.1.rss_kib),
            p.first_ms,
            median(&p.kept_ms),
            p.kept_ms.len()
        );
    }
}

/// The goals of issues 34 and 35 over [`pressure_section`]'s figures and the lists.
fn pressure_goals(
    f: &FleetResults,
    watch_p99: &[Duration],
    find: impl Fn(&str) -> Option<Measured>,
) -> Vec<(String, bool)> {
    let mut goals = Vec::new();
    if let [ours, kube, ..] = watch_p99 {
        let ratio = ours.as_secs_f64() / kube.as_secs_f64().max(1e-6);
        goals.push((
            format!("watch event p99 (b) ÷ kube-apiserver's CRD watch (a) ≤ 1.5: {ratio:.2}"),
            ratio <= 1.5,
        ));
    }
    if let [small, all] = &f.change_cpu[..] {
        let ratio = all.per_change().as_secs_f64() / small.per_change().as_secs_f64().max(1e-9);
        goals.push((
            format!(
                "CPU per single-machine change with {} machines ÷ with {} ≤ 1.5: {ratio:.2}",
                all.machines, small.machines
            ),
            ratio <= 1.5,
        ));
    }
    for z in &f.zero_window {
        goals.push((
            format!(
                "{} zero-window watches of {} machines from resourceVersion=0: RSS growth ≤ 16 MiB: {:.1} MiB",
                super::pressure::ZERO_WINDOW_WATCHES,
                z.machines,
                mib(z.growth_kib())
            ),
            mib(z.growth_kib()) <= 16.0,
        ));
        goals.push((
            format!(
                "zero-window watches of {} machines: every one ended by its timeoutSeconds",
                z.machines
            ),
            z.ended_by_deadline,
        ));
    }
    if let Some(l) = &f.patch_loop
        && let (Some(idle), Some(loaded)) = (l.idle.first(), l.loaded.first())
    {
        let ratio = super::pressure::p99(&loaded.ms) / super::pressure::p99(&idle.ms).max(1e-6);
        goals.push((
            format!(
                "GETs straight to the server during the PATCH loop: p99 ÷ idle ≤ 1.5: {ratio:.2}"
            ),
            ratio <= 1.5 && idle.errors + loaded.errors == 0,
        ));
    }
    let plain_peak = mib(f.plain_lists.rss.1.peak_kib);
    goals.push((
        format!(
            "{} lists without gzip at once: VmHWM after them ≤ {FLEET_RSS_GOAL_MIB} MiB: {plain_peak:.1} MiB",
            super::fleet::PLAIN_CLIENTS
        ),
        plain_peak <= FLEET_RSS_GOAL_MIB,
    ));
    if let Some(p) = find("(p) machine list ?package=") {
        goals.push((
            format!(
                "`?package=` machine list (p) kept, p99 ≤ 100 ms: {:.1} ms",
                p.p99_ms
            ),
            p.p99_ms <= 100.0,
        ));
    }
    if let Some(first) = f.package_uncached_ms.iter().copied().reduce(f64::max) {
        goals.push((
            format!("`?package=` machine list, first answer ≤ 1 s: {first:.0} ms (the slowest)"),
            first <= 1000.0,
        ));
    }
    goals
}

/// Bytes each machine added to the server's RSS (0 when it shrank).
pub fn per_machine_bytes(f: &FleetResults) -> f64 {
    f.rss.1.rss_kib.saturating_sub(f.rss.0.rss_kib) as f64 * 1024.0 / f.machines.max(1) as f64
}

/// The line after which the document is written by hand and kept.
pub const NOTES_MARKER: &str = "<!-- Notes below this line are kept by `make bench`. -->";

/// Goal: (d) throughput at least this share of (n)'s.
pub const DIRECT_THROUGHPUT_GOAL: f64 = 0.8;
/// Goal: (d) p99 at most this multiple of (n)'s.
pub const DIRECT_P99_GOAL: f64 = 1.5;
/// Goal: (b) p99 at most this multiple of (a)'s.
pub const AGGREGATED_P99_GOAL: f64 = 1.2;
/// Goal: RSS of the server with the fleet phase's machines, MiB (the chart's memory limit).
pub const FLEET_RSS_GOAL_MIB: f64 = 256.0;
/// Goal: a machine's answer follows a change of its annotations, and its watch event reaches
/// a watcher (p99), within this long.
pub const FLEET_FOLLOW_GOAL: Duration = Duration::from_secs(1);
/// Goal: RSS with no channel, MiB.
pub const IDLE_RSS_GOAL_MIB: f64 = 20.0;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn rate(r: f64) -> String {
    if r >= 1000.0 {
        format!("{:.1}k", r / 1000.0)
    } else {
        format!("{r:.0}")
    }
}

fn bytes(b: f64) -> String {
    if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

fn find(
    cells: &[Cell],
    size: Size,
    protocol: Protocol,
    gzip: bool,
    target: Target,
) -> Option<&Measured> {
    cells
        .iter()
        .find(|c| c.size == size && c.protocol == protocol && c.gzip == gzip && c.target == target)
        .map(|c| &c.measured)
}

/// The ratios a goal is judged on, for one row.
struct Ratios {
    throughput: f64,
    direct_p99: f64,
    aggregated_p99: f64,
}

fn ratios(cells: &[Cell], size: Size, protocol: Protocol, gzip: bool) -> Option<Ratios> {
    let get = |t| find(cells, size, protocol, gzip, t);
    let (a, b, d, n) = (
        get(Target::ConfigMap)?,
        get(Target::Aggregated)?,
        get(Target::Direct)?,
        get(Target::Nginx)?,
    );
    Some(Ratios {
        throughput: d.requests_per_second / n.requests_per_second,
        direct_p99: d.p99_ms / n.p99_ms,
        aggregated_p99: b.p99_ms / a.p99_ms,
    })
}

/// Renders the document; `notes` is the kept part of the previous one.
pub fn render(r: &Results, notes: &str) -> String {
    let mut out = String::new();
    let w = &mut out;
    let s = &r.settings;
    let _ = writeln!(w, "# Performance\n");
    let _ = writeln!(
        w,
        "Written by `make bench` ({}); do not edit above the notes marker, run it again. \
         Each section names the commit it ran on and the command; a section from another run, \
         spliced in, names its own. One run on the real test bed (etcd, kube-apiserver, this server with token review and \
         authorization on, a `docker-registry`, nginx), everything on the one machine below, \
         the load generators included. See [development.md](development.md#benchmarks) for how \
         it works and the settings.\n",
        if s.quick { "quick mode" } else { "full run" }
    );
    let _ = writeln!(w, "## Machine\n\n| | |\n|---|---|");
    for (k, v) in &r.machine {
        let _ = writeln!(w, "| {k} | {} |", v.replace('|', "\\|"));
    }
    let _ = writeln!(
        w,
        "| load average (1, 5, 15 min) before / after | {} / {} |",
        r.load_average.0, r.load_average.1
    );
    let _ = writeln!(
        w,
        "| run | {:.1} min; cells of {} s, {} client threads, {} connections (HTTP/2: one stream per connection) |\n",
        r.took.as_secs_f64() / 60.0,
        s.cell.as_secs(),
        s.threads,
        s.connections
    );
    let load_note = r
        .load_average
        .0
        .split_whitespace()
        .next()
        .and_then(|l| l.parse::<f64>().ok())
        .filter(|l| *l > 0.5);
    if let Some(load) = load_note {
        let _ = writeln!(
            w,
            "The machine was not idle (1-minute load {load:.1} at the start): other work shares the \
             cores, so absolute figures are low and noisy; the ratios compare cells measured one \
             after the other under the same conditions.\n"
        );
    }

    let _ = writeln!(
        w,
        "## Answers\n\n| size | request (channel of {} versions × {} packages, computed from package lists and `updateinfo.xml`) | JSON bytes |\n|---|---|---|",
        super::ANSWER_CHANNEL.0,
        super::ANSWER_CHANNEL.1
    );
    for a in &r.answers {
        let _ = writeln!(
            w,
            "| {} | `{}` | {} |",
            a.size.label(),
            a.path(),
            a.body.len()
        );
    }
    let _ = writeln!(
        w,
        "\n(a) `GET /api/v1/namespaces/fleet-default/configmaps/bench-<size>` (the ConfigMap's \
         `data` holds the same JSON); (b) the request above through kube-apiserver; (d) the \
         request above to this server directly; (n) `GET /<size>.json` from nginx (`gzip_static`: \
         a `.gz` file next to it). Every request carries the same bearer token (a static-token \
         user bound to a reader role) and `Accept: application/json`.\n"
    );

    let _ = writeln!(w, "## Throughput and latency\n");
    if r.cells.is_empty() {
        let _ = writeln!(w, "Not measured in this run (`BENCH_PHASES`).\n");
    }
    let _ = writeln!(
        w,
        "Each cell: requests per second, p50 / p99 latency, bytes received per response \
         (headers included). Ratios: (d)/(n) throughput, (d)/(n) p99, (b)/(a) p99.\n"
    );
    for size in Size::ALL.into_iter().filter(|_| !r.cells.is_empty()) {
        let _ = writeln!(w, "### {} answer\n", size.label());
        let _ = write!(w, "| protocol | gzip |");
        for t in Target::ALL {
            let _ = write!(w, " ({}) {} |", t.letter(), t.label());
        }
        let _ = writeln!(w, " d/n req/s | d/n p99 | b/a p99 |");
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
        for protocol in [Protocol::Http1, Protocol::Http2] {
            for gzip in [false, true] {
                let _ = write!(
                    w,
                    "| {} | {} |",
                    protocol.label(),
                    if gzip { "yes" } else { "no" }
                );
                for t in Target::ALL {
                    match find(&r.cells, size, protocol, gzip, t) {
                        Some(m) => {
                            let errors = if m.errors > 0 {
                                format!(", **{} errors**", m.errors)
                            } else {
                                String::new()
                            };
                            let _ = write!(
                                w,
                                " {} req/s, {:.2} / {:.2} ms, {}{errors} |",
                                rate(m.requests_per_second),
                                m.p50_ms,
                                m.p99_ms,
                                bytes(m.bytes_per_response)
                            );
                        }
                        None => {
                            let _ = write!(w, " – |");
                        }
                    }
                }
                match ratios(&r.cells, size, protocol, gzip) {
                    Some(x) => {
                        let _ = writeln!(
                            w,
                            " {:.2}× | {:.2}× | {:.2}× |",
                            x.throughput, x.direct_p99, x.aggregated_p99
                        );
                    }
                    None => {
                        let _ = writeln!(w, " – | – | – |");
                    }
                }
            }
        }
        let _ = writeln!(w);
    }

    let _ = writeln!(w, "## Goals\n");
    let _ = writeln!(
        w,
        "| answer | protocol | gzip | (d) ≥ {DIRECT_THROUGHPUT_GOAL}× (n) req/s | (d) p99 ≤ {DIRECT_P99_GOAL}× (n) | (b) p99 ≤ {AGGREGATED_P99_GOAL}× (a) |\n|---|---|---|---|---|---|"
    );
    let (mut met, mut total) = (0, 0);
    for size in Size::ALL {
        for protocol in [Protocol::Http1, Protocol::Http2] {
            for gzip in [false, true] {
                let Some(x) = ratios(&r.cells, size, protocol, gzip) else {
                    continue;
                };
                let checks = [
                    x.throughput >= DIRECT_THROUGHPUT_GOAL,
                    x.direct_p99 <= DIRECT_P99_GOAL,
                    x.aggregated_p99 <= AGGREGATED_P99_GOAL,
                ];
                met += checks.iter().filter(|c| **c).count();
                total += checks.len();
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | {} ({:.2}×) | {} ({:.2}×) | {} ({:.2}×) |",
                    size.label(),
                    protocol.label(),
                    if gzip { "yes" } else { "no" },
                    verdict(checks[0]),
                    x.throughput,
                    verdict(checks[1]),
                    x.direct_p99,
                    verdict(checks[2]),
                    x.aggregated_p99
                );
            }
        }
    }
    let _ = writeln!(w, "\n{met} of {total} latency and throughput checks met.\n");

    let _ = writeln!(w, "## Re-sync → served\n");
    let mut sorted = r.resync.clone();
    sorted.sort();
    if sorted.is_empty() {
        let _ = writeln!(w, "Not measured.\n");
    } else {
        let _ = writeln!(
            w,
            "From pointing the channel at a new image (one more version) and recording the sync \
             as the operator does, until this server serves the new version's changelog \
             (polled every 5 ms), over {} re-syncs of a channel of {}–{} versions × 800 packages: \
             median **{}**, min {}, p90 {}, max {}.\n",
            sorted.len(),
            41,
            40 + sorted.len(),
            ms(percentile(&sorted, 0.5)),
            ms(sorted[0]),
            ms(percentile(&sorted, 0.9)),
            ms(sorted[sorted.len() - 1]),
        );
    }

    let _ = writeln!(w, "## Memory\n");
    let (versions, packages) = s.memory_shape;
    let _ = writeln!(
        w,
        "RSS of the server process (`VmRSS` once it stops changing; peak is `VmHWM`). Memory \
         channels: {versions} versions × {packages} packages each, every one generated from its \
         own seed (no two share data), raw files as in the image: package lists, \
         `updateinfo.xml` (counted uncompressed) and `channel.json`. \"Bytes per raw byte\" is \
         (RSS − RSS with no channel) / raw bytes; \"ready answers\" are the bytes of rendered \
         answers kept (default answers rendered ahead of requests while the cache is under half of \
         `--answer-cache-size`), part of the RSS.\n"
    );
    let _ = writeln!(
        w,
        "| state | raw | RSS | peak | bytes per raw byte | ready answers |\n|---|---|---|---|---|---|"
    );
    let _ = writeln!(
        w,
        "| no channel, first start | – | {:.1} MiB | {:.1} MiB | – | – |",
        mib(r.idle.rss_kib),
        mib(r.idle.peak_kib)
    );
    if let Some(serving) = r.serving {
        let _ = writeln!(
            w,
            "| after the load and re-syncs: the answer channel ({}×{}) and the re-synced channel, caches warm | – | {:.1} MiB | {:.1} MiB | – | – |",
            super::ANSWER_CHANNEL.0,
            super::ANSWER_CHANNEL.1,
            mib(serving.rss_kib),
            mib(serving.peak_kib)
        );
    }
    let base = r.memory_idle.unwrap_or(r.idle);
    if r.memory_idle.is_some() && !r.memory.is_empty() && r.serving.is_some() {
        let _ = writeln!(
            w,
            "| no channel, server restarted for the memory channels | – | {:.1} MiB | {:.1} MiB | – | – |",
            mib(base.rss_kib),
            mib(base.peak_kib)
        );
    }
    let per_raw = |m: &super::MemoryStage| {
        (m.rss.rss_kib.saturating_sub(base.rss_kib) as f64 * 1024.0) / m.raw_bytes as f64
    };
    for m in &r.memory {
        let _ = writeln!(
            w,
            "| {} channel{} | {:.0} MiB | {:.1} MiB | {:.1} MiB | {:.2} | {:.1} MiB |",
            m.channels,
            if m.channels == 1 { "" } else { "s" },
            m.raw_bytes as f64 / 1048576.0,
            mib(m.rss.rss_kib),
            mib(m.rss.peak_kib),
            per_raw(m),
            m.answer_cache_bytes as f64 / 1048576.0
        );
    }
    let idle_mib = mib(r.idle.rss_kib.max(base.rss_kib));
    let _ = writeln!(
        w,
        "\nGoal RSS with no channel ≤ {IDLE_RSS_GOAL_MIB} MiB: {} ({idle_mib:.1} MiB).",
        verdict(idle_mib <= IDLE_RSS_GOAL_MIB)
    );
    if let Some(last) = r.memory.last() {
        let per = per_raw(last);
        let _ = writeln!(
            w,
            "Goal parsed data no larger than the raw files (≤ 1 byte per raw byte, measured as \
             RSS growth, which also holds the operator's objects in the server's reflectors, caches \
             and allocator slack): {} ({per:.2} with {} channels).",
            verdict(per <= 1.0),
            last.channels
        );
        let _ = writeln!(
            w,
            "The last memory channel was served {} after it was created.",
            ms(last.last_served_after)
        );
    }
    let _ = writeln!(w);

    if let Some(fleet) = &r.fleet {
        fleet_section(w, fleet);
    }

    let _ = writeln!(w, "## Where (d) spends its time\n");
    match &r.profile {
        Some(p) => {
            let _ = writeln!(
                w,
                "`perf record -F 999` of the server during a {} s HTTP/1.1 load of the small \
                 answer (no gzip), `perf report --no-children --sort dso,symbol`, entries of 1 % \
                 or more:\n\n```\n{p}\n```\n",
                s.cell.as_secs()
            );
        }
        None if r.cells.is_empty() => {
            let _ = writeln!(w, "Not measured in this run.\n");
        }
        None => {
            let _ = writeln!(w, "No profile: `perf` is missing or not allowed here.\n");
        }
    }

    let _ = writeln!(
        w,
        "## Compute benchmarks\n\n`cargo bench -p elemental-changelog --bench compute` (criterion{}):\n\n| benchmark | median | mean |\n|---|---|---|",
        if s.quick { ", quick settings" } else { "" }
    );
    if r.criterion.is_empty() {
        let _ = writeln!(w, "| not run in this run | | |");
    }
    for (title, median, mean) in &r.criterion {
        let _ = writeln!(w, "| {title} | {} | {} |", nanos(*median), nanos(*mean));
    }
    let _ = writeln!(w, "\n{NOTES_MARKER}");
    let mut out = with_provenance(&out, &provenance(r));
    out.push_str(notes);
    out
}

/// Where the figures come from: the commit measured and the command, as each section says it
/// (docs/development.md's rule, checked by `integration/tests/docs.rs`).
fn provenance(r: &Results) -> String {
    let commit = r
        .machine
        .iter()
        .find(|(k, _)| k == "commit")
        .map_or("unknown", |(_, v)| v.as_str());
    format!("Measured at {commit}: `{}`.", command(&r.settings))
}

/// The `make bench` command line that runs with `settings`.
fn command(s: &Settings) -> String {
    let mut words = Vec::new();
    if s.quick {
        words.push("BENCH_QUICK=1".to_owned());
    }
    if s.phases != Phase::ALL {
        let names: Vec<&str> = s.phases.iter().map(|p| p.name()).collect();
        words.push(format!("BENCH_PHASES={}", names.join(",")));
    }
    if let Some(machines) = s.machines {
        words.push(format!("BENCH_MACHINES={machines}"));
    }
    if s.cell != Duration::from_secs(if s.quick { 2 } else { 8 }) {
        words.push(format!("BENCH_SECONDS={}", s.cell.as_secs()));
    }
    let stages: &[usize] = if s.quick { &[1, 2] } else { &[1, 10, 50] };
    if s.memory_stages != stages {
        let stages: Vec<String> = s.memory_stages.iter().map(ToString::to_string).collect();
        words.push(format!("BENCH_MEMORY_CHANNELS={}", stages.join(",")));
    }
    words.push("make bench".to_owned());
    words.join(" ")
}

/// `text` with `line` after every second-level heading.
fn with_provenance(text: &str, line: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for l in text.lines() {
        out.push_str(l);
        out.push('\n');
        if l.starts_with("## ") {
            out.push('\n');
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn nanos(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The kept part of an existing document: everything after [`NOTES_MARKER`].
pub fn kept_notes(existing: &str) -> &str {
    existing
        .split_once(NOTES_MARKER)
        .map_or("", |(_, notes)| notes.strip_prefix('\n').unwrap_or(notes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_section_says_its_commit_and_command() {
        let text = with_provenance(
            "# P\n\n## A\n\nx\n\n### b\n",
            "Measured at abc1234: `make bench`.",
        );
        assert_eq!(
            text,
            "# P\n\n## A\n\nMeasured at abc1234: `make bench`.\n\nx\n\n### b\n"
        );
    }

    #[test]
    fn keeps_notes_after_the_marker() {
        let doc = format!("# generated\n\n{NOTES_MARKER}\n## Before/after\nkept\n");
        assert_eq!(kept_notes(&doc), "## Before/after\nkept\n");
        assert_eq!(kept_notes("no marker"), "");
    }

    #[test]
    fn units() {
        assert_eq!(nanos(1_500.0), "1.5 µs");
        assert_eq!(nanos(2_500_000.0), "2.50 ms");
        assert_eq!(rate(24_900.0), "24.9k");
        assert_eq!(bytes(2048.0), "2.0 KiB");
    }
}

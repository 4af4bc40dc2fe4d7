//! What the package index costs (issue 34): 4 channels of 500 versions of 800 packages, each
//! version upgrading a few packages as a real channel does (the generated channels of the
//! end-to-end tests and `make bench` upgrade 6 to 14 per version), parsed as the server parses
//! them, then indexed as the first `?package=` query indexes them. The heap the indexes hold
//! is measured with a counting global allocator, set against the package lists' own heap, and
//! bounded per run (a run: consecutive versions carrying the same packages of one name). A
//! worst case, every package changing in every version, is measured too and printed.
//!
//! The heap held is what the allocator was asked for and not given back (requested sizes).

use elemental_changelog::compute::IndexedChannel;
use elemental_changelog::data::ChannelData;

// dhat's allocator counts the bytes currently allocated (this workspace forbids the `unsafe`
// a hand-written counting allocator needs).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const CHANNELS: usize = 4;
const VERSIONS: usize = 500;
const PACKAGES: usize = 800;
/// Packages upgraded by each version of the typical channel.
const UPGRADES: usize = 10;

/// Most heap bytes per run: the run (16 bytes) and its package pointer (8) with a little
/// headroom for the per-name bound and the vectors' ends. A per-version, per-package index
/// would cost 800 × 500 entries however little the lists change.
const MAX_BYTES_PER_RUN: f64 = 26.0;

/// Bytes currently allocated on the heap.
fn live() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

/// A deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// The files of one channel: `channel.json` and one package list per version; `changed`
/// packages get a new release in each version.
fn channel(
    seed: u64,
    versions: usize,
    changed: impl Fn(&mut Rng) -> Vec<usize>,
) -> Vec<(String, Vec<u8>)> {
    let entries: Vec<String> = (0..versions)
        .map(|v| {
            format!(
                r#"{{"metadata":{{"name":"v{v}"}},"spec":{{"version":"v1.{v}.0","type":"container","metadata":{{"upgradeImage":"registry.example/os:v1.{v}.0","created":{}}}}}}}"#,
                1_700_000_000 + v * 86_400
            )
        })
        .collect();
    let mut files = vec![(
        "channel.json".to_owned(),
        format!("[{}]", entries.join(",")).into_bytes(),
    )];
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut releases = vec![1usize; PACKAGES];
    for v in 0..versions {
        for p in changed(&mut rng) {
            releases[p] += 1;
        }
        let mut list = String::new();
        for (p, release) in releases.iter().enumerate() {
            let arch = if p % 5 == 3 { "noarch" } else { "x86_64" };
            list.push_str(&format!(
                "package-{p:04}|(none)|{}.{}.{}|150600.{release}.1|{arch}|obs://build.suse.de/SUSE:SLFO:1.1:Build/standard/{seed:032x}-package-{p:04}|GPL-2.0-or-later\n",
                1 + p % 7,
                p % 13,
                p % 5
            ));
        }
        files.push((format!("changelogs/v{v}.packages"), list.into_bytes()));
    }
    files
}

/// The channels parsed, the heap their data holds, then the heap their indexes add.
fn measure(
    what: &str,
    (count, versions): (usize, usize),
    changed: impl Fn(&mut Rng) -> Vec<usize> + Copy,
) -> (u64, u64, usize) {
    let before = live();
    let channels: Vec<IndexedChannel> = (0..count as u64)
        .map(|seed| {
            let files = channel(seed, versions, changed);
            IndexedChannel::new(ChannelData::from_files(files).expect("the channel parses"))
        })
        .collect();
    for c in &channels {
        c.order();
    }
    let data = live() - before;
    let before = live();
    let runs: usize = channels.iter().map(|c| c.package_index().runs()).sum();
    let index = live() - before;
    for c in &channels {
        // Every version's answer is there: the newest carries the last package.
        let newest = c.order().last().expect("versions");
        assert!(c.presence(newest, "package-0799").is_some());
        assert_eq!(c.package_index().versions(), versions);
        assert_eq!(c.package_index().names(), PACKAGES);
    }
    println!(
        "{what}: {count} channels x {versions} versions x {PACKAGES} packages: data {data} B, index {index} B ({:.1}% of the data), {runs} runs, {:.1} B per run",
        100.0 * index as f64 / data as f64,
        index as f64 / runs as f64
    );
    (data, index, runs)
}

/// One test (the allocator counts every thread: tests running in parallel would count each
/// other's allocations).
#[test]
fn the_index_costs_a_few_bytes_per_change() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let (data, index, runs) = measure("typical", (CHANNELS, VERSIONS), |rng| {
        (0..UPGRADES).map(|_| rng.below(PACKAGES)).collect()
    });
    let per_run = index as f64 / runs as f64;
    assert!(
        per_run <= MAX_BYTES_PER_RUN,
        "{per_run:.1} B per run, more than {MAX_BYTES_PER_RUN}"
    );
    assert!(
        runs <= CHANNELS * (PACKAGES + VERSIONS * UPGRADES),
        "{runs} runs: versions that carry the same package must share one"
    );
    assert!(
        index * 20 < data,
        "the index ({index} B) must cost under a twentieth of the package lists ({data} B)"
    );
    // The worst case: every package changes in every version, one run per version and name
    // (one channel of 100 versions: its 80,000 distinct packages cost far more than the index).
    let (_, worst, worst_runs) = measure("every package changes every version", (1, 100), |_| {
        (0..PACKAGES).collect()
    });
    assert_eq!(worst_runs, 100 * PACKAGES);
    assert!(worst as f64 / worst_runs as f64 <= MAX_BYTES_PER_RUN);
}

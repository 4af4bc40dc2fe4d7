//! Issue 17, "Connections that never become requests": each kind is closed within its
//! timeout plus a margin while discovery on a new connection answers; all kinds at once
//! leave the server's RSS under the chart's memory limit. Issue 35: watches whose client
//! never reads end at their deadline.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use elemental_changelog_apiserver::deadline::GRACE;
use elemental_changelog_integration::bench::rss;
use elemental_changelog_integration::registry::Registry;
use elemental_changelog_integration::testbed::{CertPair, FLEET_NAMESPACE, TestBed};
use elemental_changelog_integration::wait::{POLL, SERVED, poll};
use futures::{StreamExt as _, stream};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use super::GROUP_VERSION;
use elemental_changelog_integration::stalled::{Dialer, Tls, zero_window_watches};

use super::clients::{H2_HEADERS, h2_get, h2_preface, until_closed};

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// What a close may take past its timeout on a shared 2-core machine.
const MARGIN: Duration = Duration::from_secs(2);
/// Connections of each kind (the all-at-once test uses them all together).
const EACH: usize = 300;
/// Unfinished heads sent at once: more than the pool holds.
const HEADS: usize = 400;
/// The server's pool for unfinished heads, and what each connection reads without it.
const HEAD_POOL_BYTES: usize = 16 * 1024 * 1024;
const HEAD_FREE_BYTES: usize = 8 * 1024;
/// Connections that do not read their answers.
const UNREAD: usize = 20;
/// Handshakes in progress at once from the attacker.
const DIALS_AT_ONCE: usize = 16;
/// The chart's memory limit.
const CONTAINER_LIMIT_MIB: u64 = 256;
/// RSS growth allowed with every kind at once (see `docs/reliability.md`): the heads
/// (the 16 MiB pool and 8 KiB for each connection) plus about 40 KiB of TLS and HTTP
/// state for each of the 940 connections (37 MiB), rounded up.
const GROWTH_LIMIT_MIB: u64 = 64;
/// A request head the server buffers whole (under its 64 KiB limit), never finished.
const UNFINISHED_HEAD_BYTES: usize = 60 * 1024;
/// A pipelined request (as admin) whose answer, the summaries of the 40 versions of the
/// `flood` channel, is tens of KiB: the server's socket buffers fill within a second.
fn pipelined() -> Vec<u8> {
    format!(
        "GET {GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/managedosversions HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    .into_bytes()
}

/// Each kind against short timeouts, 300 connections at a time (20 for unread answers).
pub async fn kind_by_kind(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    bed.start_server_reading(
        registry,
        &[
            &format!("--header-read-timeout={}s", HEADER_READ_TIMEOUT.as_secs()),
            &format!("--idle-connection-timeout={}s", IDLE_TIMEOUT.as_secs()),
            &format!("--write-timeout={}s", WRITE_TIMEOUT.as_secs()),
            "--max-connections=2000",
        ],
    )
    .await?;
    let dialer = Dialer::new(bed, None)?;
    large_heads_under_the_limit_are_answered(&dialer).await?;
    silent_connections_are_closed(bed, &dialer).await?;
    idle_h2_connections_are_closed(bed, &dialer).await?;
    h2_prefaces_without_requests_are_closed(bed, &dialer).await?;
    unread_h1_answers_end_their_connections(bed).await?;
    unread_h2_answers_end_their_connections(bed, &dialer).await?;
    Ok(())
}

/// Opens `count` connections, `DIALS_AT_ONCE` at a time, each prepared by `prepare`
/// (given the connection, it returns when its attack is in place).
async fn open<F, Fut>(
    dialer: &Dialer,
    count: usize,
    receive_buffer: Option<u32>,
    prepare: F,
) -> Result<Vec<(Tls, Instant)>>
where
    F: Fn(Tls) -> Fut,
    Fut: Future<Output = Result<Tls>>,
{
    stream::iter(0..count)
        .map(|_| async {
            let tls = dialer.connect(receive_buffer).await?;
            let tls = prepare(tls).await?;
            Ok::<_, anyhow::Error>((tls, Instant::now()))
        })
        .buffer_unordered(DIALS_AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Connections watched from the moment each is prepared: their closes are seen as they
/// happen, not when every connection of the attack is open (under load, opening 300 TLS
/// connections takes seconds, and an HTTP/2 client that reads late also answers the
/// server's closing PING late).
type Watched = Vec<tokio::task::JoinHandle<Result<(Duration, bool)>>>;

/// [`open`], then a task per connection that reads it until it is closed, at most
/// `limit` after it was prepared (see [`all_closed`]).
async fn open_watched<F, Fut>(
    dialer: &Dialer,
    count: usize,
    prepare: F,
    h2: bool,
    limit: Duration,
) -> Result<Watched>
where
    F: Fn(Tls) -> Fut,
    Fut: Future<Output = Result<Tls>>,
{
    stream::iter(0..count)
        .map(|_| async {
            let tls = dialer.connect(None).await?;
            let mut tls = prepare(tls).await?;
            let since = Instant::now();
            Ok::<_, anyhow::Error>(tokio::spawn(async move {
                let closed = until_closed(&mut tls, h2, since + limit).await?;
                Ok((closed.at - since, closed.goaway))
            }))
        })
        .buffer_unordered(DIALS_AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Waits until every watched connection is closed, each within the `limit` of
/// [`open_watched`] from the time it was prepared; returns the fastest and slowest close
/// and how many came with a GOAWAY.
async fn all_closed(watched: Watched, limit: Duration) -> Result<(Duration, Duration, usize)> {
    let mut slowest = Duration::ZERO;
    let mut fastest = Duration::MAX;
    let mut goaways = 0;
    let mut open = 0;
    for watcher in watched {
        match watcher.await? {
            Ok((after, goaway)) => {
                slowest = slowest.max(after);
                fastest = fastest.min(after);
                goaways += usize::from(goaway);
            }
            Err(_) => open += 1,
        }
    }
    ensure!(
        open == 0,
        "{open} connections were still open {limit:?} after their attack began"
    );
    Ok((fastest, slowest, goaways))
}

/// Discovery on a new connection (admin), as kube-apiserver's availability check.
async fn discovery_answers(bed: &TestBed) -> Result<Duration> {
    let started = Instant::now();
    let status = bed
        .server_http(Some(&bed.pki().admin))?
        .get(format!(
            "{}{GROUP_VERSION}",
            bed.server().context("server")?.url()
        ))
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .status();
    ensure!(
        status == StatusCode::OK,
        "discovery during the attack: {status}"
    );
    Ok(started.elapsed())
}

/// A request with a 60 KiB header (as a front-proxied user with a thousand groups) is
/// under the head limit; 70 KiB is a 431.
async fn large_heads_under_the_limit_are_answered(dialer: &Dialer) -> Result<()> {
    for (size, expected) in [(60 * 1024, "HTTP/1.1 200"), (70 * 1024, "HTTP/1.1 431")] {
        let mut tls = dialer.connect(None).await?;
        let request = format!(
            "GET /livez HTTP/1.1\r\nHost: x\r\nX-Remote-Group: {}\r\nConnection: close\r\n\r\n",
            "g".repeat(size)
        );
        let _ = tls.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        ensure!(
            text.starts_with(expected),
            "answer to a {size}-byte header: {:?}",
            text.lines().next()
        );
    }
    Ok(())
}

/// TLS connections that send nothing after the handshake: closed after the first-bytes
/// timeout (here the header-read timeout, 2 s, shorter than 10 s).
async fn silent_connections_are_closed(bed: &TestBed, dialer: &Dialer) -> Result<()> {
    let limit = HEADER_READ_TIMEOUT + MARGIN;
    let conns = open_watched(dialer, EACH, |tls| async { Ok(tls) }, false, limit).await?;
    let discovery = discovery_answers(bed).await?;
    let (fastest, slowest, _) = all_closed(conns, limit).await?;
    eprintln!(
        "{EACH} silent TLS connections: closed {fastest:?} to {slowest:?} after their handshake; discovery meanwhile in {discovery:?}"
    );
    ensure!(
        fastest >= HEADER_READ_TIMEOUT - Duration::from_millis(200),
        "closed too early: {fastest:?}"
    );
    Ok(())
}

/// HTTP/2 connections that make one request, read its answer, then only answer pings
/// and settings: a GOAWAY and a close after the idle timeout (3 s).
async fn idle_h2_connections_are_closed(bed: &TestBed, dialer: &Dialer) -> Result<()> {
    let limit = IDLE_TIMEOUT + MARGIN;
    let conns = open_watched(dialer, EACH, h2_one_answer, true, limit).await?;
    let discovery = discovery_answers(bed).await?;
    let (fastest, slowest, goaways) = all_closed(conns, limit).await?;
    eprintln!(
        "{EACH} idle HTTP/2 connections: {goaways} GOAWAYs, closed {fastest:?} to {slowest:?} after their answer; discovery meanwhile in {discovery:?}"
    );
    ensure!(
        goaways == EACH,
        "{goaways} of {EACH} idle HTTP/2 connections got a GOAWAY"
    );
    ensure!(
        fastest >= IDLE_TIMEOUT - Duration::from_millis(200),
        "closed too early: {fastest:?}"
    );
    Ok(())
}

/// The preface, then one request whose answer's HEADERS are read.
async fn h2_one_answer(mut tls: Tls) -> Result<Tls> {
    let mut hello = h2_preface(None);
    hello.extend(h2_get(1, "/livez"));
    tls.write_all(&hello).await?;
    super::clients::h2_until(&mut tls, H2_HEADERS, 1, Duration::from_secs(10)).await?;
    Ok(tls)
}

/// HTTP/2 prefaces and settings, then nothing: closed when no request came within the
/// header-read timeout of the handshake.
async fn h2_prefaces_without_requests_are_closed(bed: &TestBed, dialer: &Dialer) -> Result<()> {
    let limit = HEADER_READ_TIMEOUT + MARGIN;
    let prepare = |mut tls: Tls| async {
        tls.write_all(&h2_preface(None)).await?;
        Ok(tls)
    };
    let conns = open_watched(dialer, EACH, prepare, true, limit).await?;
    let discovery = discovery_answers(bed).await?;
    let (fastest, slowest, _) = all_closed(conns, limit).await?;
    eprintln!(
        "{EACH} HTTP/2 prefaces without a request: closed {fastest:?} to {slowest:?} after their preface; discovery meanwhile in {discovery:?}"
    );
    Ok(())
}

/// The size of the answer to [`pipelined`], read whole on one connection.
async fn answer_size(admin: &Dialer) -> Result<usize> {
    let mut tls = admin.connect(None).await?;
    let mut request = pipelined();
    request.truncate(request.len() - 2);
    request.extend_from_slice(b"Connection: close\r\n\r\n");
    tls.write_all(&request).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    ensure!(
        answer.starts_with(b"HTTP/1.1 200"),
        "the pipelined request: {:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(200)])
    );
    Ok(answer.len())
}

/// HTTP/1.1 connections with a 4 KiB receive buffer that pipeline requests and never
/// read: the server's writes stall, and the write timeout (2 s) ends each connection.
/// The attacker sees it as its own writes failing (the server reset the connection).
async fn unread_h1_answers_end_their_connections(bed: &TestBed) -> Result<()> {
    let admin = Dialer::new(bed, Some(&bed.pki().admin))?;
    let answer = answer_size(&admin).await?;
    let conns = open(&admin, UNREAD, Some(4096), |tls| async { Ok(tls) }).await?;
    let started = Instant::now();
    // The server's writes stall once the socket buffers are full (about 3 MB of
    // requests in, 1.7–2.9 s measured), then the write timeout runs.
    let limit = Duration::from_secs(2) + WRITE_TIMEOUT + MARGIN;
    let writers: Vec<_> = conns
        .into_iter()
        .map(|(mut tls, _)| {
            tokio::spawn(async move {
                let chunk = pipelined().repeat(100);
                let deadline = Instant::now() + limit + Duration::from_secs(5);
                let mut sent = 0_usize;
                loop {
                    match tokio::time::timeout_at(deadline, tls.write_all(&chunk)).await {
                        Err(_) => return (None, sent),
                        Ok(Err(_)) => return (Some(Instant::now()), sent),
                        Ok(Ok(())) => sent += 100,
                    }
                }
            })
        })
        .collect();
    let discovery = discovery_answers(bed).await?;
    let mut slowest = Duration::ZERO;
    let mut most_sent = 0;
    for writer in writers {
        let (closed, sent) = writer.await?;
        most_sent = most_sent.max(sent);
        let closed = closed.context("a connection that does not read was kept")?;
        slowest = slowest.max(closed - started);
    }
    eprintln!(
        "{UNREAD} HTTP/1.1 connections that never read ({answer}-byte answers): cut {slowest:?} after the attack began (at most {most_sent} requests written); discovery meanwhile in {discovery:?}"
    );
    ensure!(
        slowest <= limit,
        "cut after {slowest:?}, more than {limit:?}"
    );
    Ok(())
}

/// HTTP/2 connections that give the server no flow-control window: the answer cannot be
/// sent, the connection idles (3 s), gets a GOAWAY, and is closed after the write timeout
/// (2 s) as the stream still cannot finish.
async fn unread_h2_answers_end_their_connections(bed: &TestBed, dialer: &Dialer) -> Result<()> {
    let limit = IDLE_TIMEOUT + WRITE_TIMEOUT + MARGIN;
    let prepare = |mut tls: Tls| async {
        let mut hello = h2_preface(Some(0));
        hello.extend(h2_get(1, "/readyz?verbose"));
        tls.write_all(&hello).await?;
        super::clients::h2_until(&mut tls, H2_HEADERS, 1, Duration::from_secs(10)).await?;
        Ok(tls)
    };
    let conns = open_watched(dialer, UNREAD, prepare, true, limit).await?;
    let discovery = discovery_answers(bed).await?;
    let (fastest, slowest, goaways) = all_closed(conns, limit).await?;
    eprintln!(
        "{UNREAD} HTTP/2 connections with no window: {goaways} GOAWAYs, closed {fastest:?} to {slowest:?} after their answer's headers; discovery meanwhile in {discovery:?}"
    );
    ensure!(goaways == UNREAD, "{goaways} of {UNREAD} got a GOAWAY");
    Ok(())
}

/// Every kind at once against a fresh server with the default timeouts' order of
/// magnitude (so that nothing is closed while the attack is being set up): 400
/// unfinished 60 KiB heads (the pool holds about 310 of them and closes the others),
/// 300 idle HTTP/2 connections, 20 + 20 unread answers and 300 silent connections. RSS stays under the container's limit and grows by less than
/// [`GROWTH_LIMIT_MIB`]; discovery answers on a new connection meanwhile.
pub async fn all_at_once(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    bed.start_server_reading(
        registry,
        &[
            "--header-read-timeout=60s",
            "--idle-connection-timeout=60s",
            "--write-timeout=60s",
            "--max-connections=2000",
        ],
    )
    .await?;
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("server pid")?;
    let dialer = Dialer::new(bed, None)?;
    let before = rss(pid)?;
    let started = Instant::now();
    let head = format!(
        "GET /livez HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
        "a".repeat(UNFINISHED_HEAD_BYTES)
    );
    let heads = open(&dialer, HEADS, None, |mut tls| {
        let head = head.clone();
        async move {
            // The server closes the connections the pool cannot hold, maybe mid-write.
            let _ = tls.write_all(head.as_bytes()).await;
            let _ = tls.flush().await;
            Ok(tls)
        }
    })
    .await?;
    // Those the pool refused are closed at once; the others are still open after a second.
    let checked = stream::iter(heads)
        .map(|(mut tls, since)| async move {
            let mut buf = [0_u8; 64];
            let refused = matches!(
                tokio::time::timeout(Duration::from_secs(1), tls.read(&mut buf)).await,
                Ok(Ok(0) | Err(_))
            );
            (tls, since, refused)
        })
        .buffer_unordered(1024)
        .collect::<Vec<_>>()
        .await;
    let mut held = Vec::new();
    let mut refused = 0;
    for (tls, since, closed) in checked {
        if closed {
            refused += 1;
        } else {
            held.push((tls, since));
        }
    }
    let held_heads = held.len();
    // Each head takes its size less the 8 KiB every connection has, from a 16 MiB pool.
    let fit = HEAD_POOL_BYTES / (head.len() - HEAD_FREE_BYTES);
    ensure!(
        held_heads <= fit && held_heads + 5 >= fit,
        "{held_heads} unfinished heads held ({refused} refused), the pool holds {fit}"
    );
    held.extend(open(&dialer, EACH, None, h2_one_answer).await?);
    held.extend(
        open(&dialer, UNREAD, None, |mut tls| async {
            let mut hello = h2_preface(Some(0));
            hello.extend(h2_get(1, "/readyz?verbose"));
            tls.write_all(&hello).await?;
            Ok(tls)
        })
        .await?,
    );
    // Unread HTTP/1.1 answers: as much pipelined as the socket takes in a second.
    let admin = Dialer::new(bed, Some(&bed.pki().admin))?;
    held.extend(
        open(&admin, UNREAD, Some(4096), |mut tls| async {
            let chunk = pipelined().repeat(100);
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                loop {
                    tls.write_all(&chunk).await?;
                }
                #[allow(unreachable_code)]
                Ok::<_, std::io::Error>(())
            })
            .await;
            Ok(tls)
        })
        .await?,
    );
    held.extend(open(&dialer, EACH, None, |tls| async { Ok(tls) }).await?);
    let opened = started.elapsed();
    // Let the server read what was sent (the heads are 18 MB in all).
    let discovery = discovery_answers(bed).await?;
    let open_connections = open_connections(bed).await?;
    eprintln!("unfinished heads: {held_heads} held, {refused} refused by the pool");
    let during = rss(pid)?;
    let count = held.len();
    drop(held);
    let after = rss(pid)?;
    let mib = |kib: u64| kib / 1024;
    eprintln!(
        "{count} hostile connections at once (opened in {opened:?}, {open_connections} open at the server): RSS {} MiB before, {} MiB during, peak {} MiB, {} MiB after; discovery meanwhile in {discovery:?}",
        mib(before.rss_kib),
        mib(during.rss_kib),
        mib(after.peak_kib),
        mib(after.rss_kib)
    );
    ensure!(
        open_connections >= count,
        "only {open_connections} of {count} hostile connections were open at once"
    );
    ensure!(
        mib(after.peak_kib) < CONTAINER_LIMIT_MIB,
        "peak RSS {} MiB, over the container's {CONTAINER_LIMIT_MIB} MiB",
        mib(after.peak_kib)
    );
    let growth = mib(after.peak_kib.saturating_sub(before.rss_kib));
    ensure!(
        growth < GROWTH_LIMIT_MIB,
        "RSS grew by {growth} MiB, more than {GROWTH_LIMIT_MIB} MiB"
    );
    Ok(())
}

/// The connection cap in [`under_pressure`], and the server's own constants: fewer than
/// one slot in 8 free is pressure, and then idle connections are closed after 5 s.
const PRESSURE_MAX_CONNECTIONS: usize = 40;
const PRESSURED_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle HTTP/2 connections taking every slot of `--max-connections` (40) under a long
/// idle timeout (60 s): the server, short of slots, closes those idle for 5 s, so that
/// discovery on a new connection is served from a full slot (200) instead of the
/// probe-only pool (429). Meanwhile a watch on a probe-only connection is a 429 too.
pub async fn under_pressure(bed: &mut TestBed, registry: &Registry) -> Result<()> {
    bed.start_server_reading(
        registry,
        &[
            "--idle-connection-timeout=60s",
            &format!("--max-connections={PRESSURE_MAX_CONNECTIONS}"),
        ],
    )
    .await?;
    let dialer = Dialer::new(bed, None)?;
    let conns = open(&dialer, PRESSURE_MAX_CONNECTIONS, None, h2_one_answer).await?;
    let last_answer = conns
        .iter()
        .map(|(_, since)| *since)
        .max()
        .context("no connection")?;
    let watched: Vec<_> = conns
        .into_iter()
        .map(|(mut tls, since)| {
            tokio::spawn(async move {
                until_closed(&mut tls, true, since + PRESSURED_IDLE_TIMEOUT + MARGIN)
                    .await
                    .ok()
                    .map(|closed| closed.at - since)
            })
        })
        .collect();
    // A watch on a new connection while every slot is taken (a probe-only connection):
    // the 429 every other request gets there, not a stream holding the connection.
    let watch = bed
        .server_http(Some(&bed.pki().admin))?
        .get(format!(
            "{}{GROUP_VERSION}/managedosversions?watch=true&timeoutSeconds=5",
            bed.server().context("server")?.url()
        ))
        .send()
        .await?;
    ensure!(
        watch.status() == StatusCode::TOO_MANY_REQUESTS
            && watch.headers().get("retry-after").is_some(),
        "a watch on a probe-only connection: {} {:?}",
        watch.status(),
        watch.headers()
    );
    drop(watch);
    // Discovery from kube-apiserver's point of view: a new connection, until it is
    // served from a full slot.
    let deadline = last_answer + PRESSURED_IDLE_TIMEOUT + MARGIN;
    let mut refused = 0;
    let served = loop {
        let status = bed
            .server_http(Some(&bed.pki().admin))?
            .get(format!(
                "{}{GROUP_VERSION}",
                bed.server().context("server")?.url()
            ))
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .status();
        if status == StatusCode::OK {
            break last_answer.elapsed();
        }
        ensure!(
            status == StatusCode::TOO_MANY_REQUESTS,
            "discovery under pressure: {status}"
        );
        refused += 1;
        ensure!(
            Instant::now() < deadline,
            "discovery still refused (429) {:?} after the idle connections' last answer",
            last_answer.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut closed = Vec::new();
    for watched in watched {
        closed.extend(watched.await?);
    }
    let slowest = closed.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{PRESSURE_MAX_CONNECTIONS} idle HTTP/2 connections at --max-connections {PRESSURE_MAX_CONNECTIONS} (idle timeout 60 s): {} closed within {slowest:?} of their answer; discovery on a new connection served {served:?} after the last answer ({refused} times 429 before)",
        closed.len()
    );
    ensure!(
        !closed.is_empty(),
        "no idle connection was closed under pressure"
    );
    Ok(())
}

/// The server's `open_connections` gauge.
async fn open_connections(bed: &TestBed) -> Result<usize> {
    let metrics = bed.server_metrics().await?;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("elemental_changelog_open_connections "))
        .context("no open_connections gauge")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("gauge without a value")?
        .parse::<f64>()? as usize)
}

/// Watches of `zero_window_watchers_end_at_their_deadline`: as many as `--max-watches`, over
/// a few HTTP/2 connections.
const WATCHERS: usize = 100;
const WATCH_CONNECTIONS: usize = 4;
/// `timeoutSeconds` of those watches.
const WATCH_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/1.1 watches whose client reads nothing.
const H1_WATCHERS: usize = 10;
/// Machines of the HTTP/1.1 watches, each with about 7 KB of labels: their events (4 MB)
/// are more than loopback's socket buffers take (about 3 MB), so the server's writes stall.
const BIG_MACHINES: usize = 600;

/// Issue 35: a watch whose client reads nothing is ended at its `timeoutSeconds` (plus the
/// server's grace), its stream reset and its slot given back. 100 HTTP/2 watches of the 40
/// versions' summaries whose client never opens its window (all that `--max-watches` leaves
/// to one user past its reserved tenth, so one more is refused while they are held), straight to the server; then as many through
/// kube-apiserver's aggregator (all served: the slots came back), whose proxy reads on its
/// client's behalf; then HTTP/1.1 watches of 4 MB of machines that are never read.
pub async fn zero_window_watchers_end_at_their_deadline(
    bed: &mut TestBed,
    registry: &Registry,
) -> Result<()> {
    bed.start_server_reading(
        registry,
        &[
            // A user already holding watches gets all but the reserved tenth: 111 leaves
            // exactly 100 to the one user of this phase.
            &format!("--max-watches={}", WATCHERS * 10 / 9),
            &format!("--max-watches-per-user={WATCHERS}"),
            // Only the watch's deadline ends what follows.
            "--idle-connection-timeout=60s",
            "--write-timeout=60s",
            "--max-connections=2000",
        ],
    )
    .await?;
    let admin = bed.pki().admin.clone();
    let pid = bed
        .server()
        .and_then(|s| s.process().pid())
        .context("server pid")?;
    let limit = WATCH_TIMEOUT + GRACE + MARGIN;
    let versions = |timeout: Duration| {
        format!(
            "{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/managedosversions?watch=true&resourceVersion=0&timeoutSeconds={}",
            timeout.as_secs()
        )
    };
    let before = rss(pid)?;
    let direct = Dialer::new(bed, Some(&admin))?;
    let watches = zero_window_watches(
        &direct,
        &versions(WATCH_TIMEOUT),
        WATCHERS,
        WATCH_CONNECTIONS,
        limit,
    )
    .await?;
    let one_more = bed
        .server_http(Some(&admin))?
        .get(format!("{}{}", bed.server_url()?, versions(WATCH_TIMEOUT)))
        .send()
        .await?
        .status();
    let during = rss(pid)?;
    let ends = watches.ends().await?;
    let after = rss(pid)?;
    eprintln!(
        "{WATCHERS} HTTP/2 watches with no window, timeoutSeconds {}, straight to the server: {}; one more meanwhile {one_more}; RSS {} MiB before, {} MiB held, {} MiB after",
        WATCH_TIMEOUT.as_secs(),
        ends.summary(),
        before.rss_kib / 1024,
        during.rss_kib / 1024,
        after.rss_kib / 1024,
    );
    ensure!(
        one_more == StatusCode::TOO_MANY_REQUESTS,
        "a watch past the {WATCHERS} held: {one_more}"
    );
    ends.all_reset_between(WATCH_TIMEOUT, limit)?;

    // Through the aggregator: all served (every slot came back), then what the client sees.
    let aggregator = Dialer::apiserver(bed, &admin)?;
    let watches = zero_window_watches(
        &aggregator,
        &versions(WATCH_TIMEOUT),
        WATCHERS,
        WATCH_CONNECTIONS,
        limit,
    )
    .await?;
    let ends = watches.ends().await?;
    eprintln!(
        "{WATCHERS} HTTP/2 watches with no window through kube-apiserver's aggregator: {}",
        ends.summary()
    );
    // What reached the server was read: its watches ended, and their slots came back.
    let again = zero_window_watches(
        &direct,
        &versions(Duration::from_secs(1)),
        WATCHERS,
        WATCH_CONNECTIONS,
        limit,
    )
    .await?;
    let ends = again.ends().await?;
    eprintln!(
        "{WATCHERS} more HTTP/2 watches with no window, timeoutSeconds 1: {}",
        ends.summary()
    );
    ends.all_reset_between(
        Duration::from_secs(1),
        Duration::from_secs(1) + GRACE + MARGIN,
    )?;
    unread_h1_watches_end_their_connections(bed, &admin).await
}

/// HTTP/1.1 watches of [`BIG_MACHINES`] machines that are never read: the server's writes
/// stall, and the watch's deadline ends the connection (the write timeout is 60 s).
async fn unread_h1_watches_end_their_connections(bed: &TestBed, admin: &CertPair) -> Result<()> {
    create_big_machines(bed).await?;
    let path = format!(
        "{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/machineinventories?watch=true&resourceVersion=0&timeoutSeconds={}",
        WATCH_TIMEOUT.as_secs()
    );
    let dialer = Dialer::http1(bed, admin)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let conns = open(&dialer, H1_WATCHERS, Some(4096), |mut tls| {
        let request = request.clone();
        async move {
            tls.write_all(request.as_bytes()).await?;
            Ok(tls)
        }
    })
    .await?;
    let last = conns.iter().map(|(_, at)| *at).max().context("none")?;
    tokio::time::sleep_until(last + WATCH_TIMEOUT + GRACE + MARGIN).await;
    // Now read: a connection the server dropped ends with what its buffers held; one it kept
    // would send the rest of its watch and stay open (keep-alive).
    let mut kept = 0;
    let mut read = Vec::new();
    for (mut tls, _) in conns {
        let mut answer = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer))
            .await
            .is_ok();
        kept += usize::from(!ended || answer.ends_with(b"\r\n0\r\n\r\n"));
        read.push(answer.len());
    }
    eprintln!(
        "{H1_WATCHERS} HTTP/1.1 watches of {BIG_MACHINES} machines never read, timeoutSeconds {}: {} closed by {:?} after their request ({kept} kept or finished), {:?} bytes read after",
        WATCH_TIMEOUT.as_secs(),
        H1_WATCHERS - kept,
        WATCH_TIMEOUT + GRACE + MARGIN,
        read
    );
    ensure!(
        kept == 0,
        "{kept} of {H1_WATCHERS} unread HTTP/1.1 watches were not cut"
    );
    Ok(())
}

/// [`BIG_MACHINES`] MachineInventories, each with 60 labels of about 115 bytes, served.
async fn create_big_machines(bed: &TestBed) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("elemental.cattle.io", "v1beta1", "MachineInventory"),
        "machineinventories",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(bed.client(), FLEET_NAMESPACE, &resource);
    let labels: serde_json::Map<String, serde_json::Value> = (0..60)
        .map(|i| {
            (
                format!("example.com/label-{i:02}-{}", "k".repeat(30)),
                "v".repeat(63).into(),
            )
        })
        .collect();
    stream::iter(0..BIG_MACHINES)
        .map(|i| {
            let api = api.clone();
            let object = serde_json::from_value::<DynamicObject>(serde_json::json!({
                "apiVersion": "elemental.cattle.io/v1beta1",
                "kind": "MachineInventory",
                "metadata": {"name": format!("big-{i:04}"), "labels": labels},
                "spec": {},
            }));
            async move {
                api.create(&PostParams::default(), &object?).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(DIALS_AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let path = format!("{GROUP_VERSION}/namespaces/{FLEET_NAMESPACE}/machineinventories");
    poll("the big machines served", SERVED, POLL, || async {
        let list: serde_json::Value = bed.admin_get_json(&path).await?;
        let served = list["items"].as_array().map_or(0, Vec::len);
        Ok((served >= BIG_MACHINES).then_some(()))
    })
    .await?;
    Ok(())
}

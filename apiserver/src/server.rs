//! The HTTPS listener: TLS handshakes (rustls), HTTP/1.1 and HTTP/2 on the same
//! port, bounded connections, graceful shutdown. Every request goes to
//! [`crate::routes::App`] with the client certificate chain the peer presented, if any.
//!
//! What a client can make the server hold is bounded here (see [`ServingLimits`]):
//! the TLS handshake time; the wait for the first bytes and the first request
//! (`lifetime`); the time to send a request head (which also ends idle
//! keep-alive connections); an idle connection's life, HTTP/2 included (`lifetime`);
//! the time a response may wait for the client to read it (`io`); the head's size
//! (431 above it), HTTP/2 streams per connection and header list size, and the number
//! of connections. Past the connection cap a few more are admitted for health probes
//! only; past that, new connections are closed at once. In-flight requests and the
//! per-request deadline are enforced by the app.
//!
//! Memory: a connection buffers at most [`MAX_HEADER_BYTES`] of request head, and all
//! connections together at most 8 KiB each plus one shared pool (`heads`,
//! 16 MiB); an answer nobody reads holds at most one TLS record besides
//! its body, for the write timeout. So what any number of hostile connections can make
//! the server hold is bounded by `--max-connections`, whoever sends them.
//!
//! The serving certificate is reloaded when its files change ([`reload_certificates`]).

mod heads;
mod io;
mod lifetime;

use std::{
    future::Future,
    net::SocketAddr,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use elemental_changelog_certs::serving::{self, ReloadingResolver};
use http::Request;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use prometheus::IntCounterVec;
use rustls::pki_types::CertificateDer;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::{debug, info, warn};

use self::{
    heads::Pool,
    io::Guarded,
    lifetime::{Activity, Next, Timeouts},
};
use crate::{metrics::family, request::Peer, routes::App, telemetry::error_chain};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections admitted past `--max-connections`, for health probes only.
const PROBE_CONNECTIONS: usize = 32;
/// How long a probe-only connection may take for its handshake, and then to send its
/// request head: a probe sends at once, a slow client is out in a second.
const PROBE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest life of a probe-only connection: an idle HTTP/2 connection, which the head
/// timeout does not end, must not keep a probe slot.
const PROBE_CONNECTION_LIFETIME: Duration = Duration::from_secs(10);
/// How long a client has, after its handshake, to send a first byte: kube-apiserver
/// closes a TLS connection that sends nothing after 10 s (Go's HTTP/2 preface
/// timeout). The header-read timeout, when shorter, is used instead.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// While fewer than one slot in [`PRESSURE_FRACTION`] of `--max-connections` is free,
/// connections with no request in flight are closed after this long without one, so
/// that idle clients do not turn kube-apiserver's new connections to the probe pool.
const PRESSURED_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
const PRESSURE_FRACTION: usize = 8;
/// How often, at most, connections are told to look at their waits again under
/// pressure.
const PRESSURE_NOTICE_INTERVAL: Duration = Duration::from_millis(500);
/// Largest request head (request line and headers) a connection buffers; larger is a
/// 431. kube-apiserver accepts 1 MiB, but no client of this server sends more than a
/// few KiB: kube-apiserver's proxy (user, groups and extras as `X-Remote-*` headers:
/// 64 KiB is about a thousand groups of 50 characters), probes and Prometheus. What
/// all connections hold together is bounded by `HEAD_POOL_BYTES`. hyper's minimum
/// is 8 KiB.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Bytes of unfinished request heads all connections may hold together beyond the
/// first 8 KiB of each ([`heads`]): with `--max-connections` 1,024, heads hold at most
/// 8 MiB + 16 MiB, whatever the clients send.
const HEAD_POOL_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of TLS records a connection may have waiting to be sent (rustls' default is
/// 64 KiB): what an answer nobody reads holds in TLS, one full record.
const TLS_SEND_BUFFER_BYTES: usize = 16 * 1024 + 256;
/// HTTP/2 streams a connection may have open at once (Go's http2 default is 250;
/// kube-apiserver sets 100 for the aggregator's long-lived connections).
const MAX_CONCURRENT_STREAMS: u32 = 100;
/// Interval of HTTP/2 keep-alive pings, which reap dead connections.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serving limits, named after kube-apiserver's flags where they overlap.
#[derive(Clone, Debug, clap::Args)]
pub struct ServingLimits {
    /// Connections served at once; past it, a few more are admitted for health probes only.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Requests answered at once (health probes excepted); past it, 429 with Retry-After.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_MAX_REQUESTS_INFLIGHT",
        default_value_t = 400
    )]
    pub max_requests_inflight: usize,
    /// Watches served at once (they do not count as requests in flight); past it, 429 with
    /// Retry-After.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_MAX_WATCHES", default_value_t = 1000)]
    pub max_watches: usize,
    /// Watches one user may hold at once; past it, 429 with Retry-After.
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_MAX_WATCHES_PER_USER",
        default_value_t = 100
    )]
    pub max_watches_per_user: usize,
    /// Deadline of one request; past it, 504.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REQUEST_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Time a client has to send a request head (the first one counted from the end of
    /// the TLS handshake); also ends idle keep-alive connections.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// A connection (HTTP/2 included) with no request in flight for this long is closed:
    /// HTTP/2 gets a GOAWAY, HTTP/1 is closed.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_IDLE_CONNECTION_TIMEOUT", default_value = "90s", value_parser = humantime::parse_duration)]
    pub idle_connection_timeout: Duration,
    /// A response the client reads nothing of for this long ends its connection; so does
    /// a connection still busy this long after it was closed for being idle.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_WRITE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub write_timeout: Duration,
    /// Changelog ranges, summary lists and CVE searches computed at once, off the async
    /// threads (0: one per CPU).
    #[arg(
        long,
        env = "ELEMENTAL_CHANGELOG_MAX_COMPUTE_CONCURRENCY",
        default_value_t = 0
    )]
    pub max_compute_concurrency: usize,
    /// Bytes of rendered answers kept ready (`32MiB`, `32Mi`; 0: none): bodies and their gzip
    /// forms, shared by every request for the same answer until the data they came from is
    /// replaced. While it is less than half full, each version's default changelog is rendered ahead of
    /// requests.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_ANSWER_CACHE_SIZE", default_value = "32MiB", value_parser = elemental_changelog_registry::config::parse_byte_size)]
    pub answer_cache_size: u64,
    /// Bytes of recent watch events kept per watched resource and architecture (`32MiB`,
    /// `32Mi`): what they hold of their own. A watcher that reads behind the newest events, or
    /// resumes from an older resourceVersion, is served from them; one that falls behind the
    /// oldest is ended and its client lists again.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_WATCH_CACHE_SIZE", default_value = "32MiB", value_parser = elemental_changelog_registry::config::parse_byte_size)]
    pub watch_cache_size: u64,
    /// On SIGTERM, how long to keep serving with `/readyz` failing, so that endpoints
    /// drop this replica before it stops accepting (kube-apiserver's flag).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_SHUTDOWN_DELAY_DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    pub shutdown_delay_duration: Duration,
    /// Then, time given to in-flight requests to finish.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_SHUTDOWN_GRACE_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace_period: Duration,
}

/// Which connection pool a connection was admitted to.
enum Admission {
    /// Below the connection cap.
    Full(#[allow(dead_code)] OwnedSemaphorePermit),
    /// Past it: health probes only, short header timeout, no keep-alive.
    ProbeOnly(#[allow(dead_code)] OwnedSemaphorePermit),
}

/// Serves `app` on `listener` until `shutdown` completes, then lets in-flight
/// requests finish for up to the limits' grace period.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
    limits: &ServingLimits,
) {
    let gate = Arc::new(Gate::new(limits));
    let acceptor = TlsAcceptor::from(tls);
    // Every connection holds a receiver: `closed()` tells when the last one ended.
    let (stopping, stop) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE: back off briefly rather than spin.
                    warn!(error = %error_chain(&error), "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers are written whole; Nagle's algorithm would hold the last segment of
        // each HTTP/2 frame for the peer's delayed ACK (about 40 ms).
        if let Err(error) = tcp.set_nodelay(true) {
            debug!(%addr, %error, "TCP_NODELAY not set");
        }
        let Some(admission) = gate.admit() else {
            app.metrics.connection_refused();
            debug!(%addr, "connection limit reached; closing");
            continue;
        };
        let connection = Connection {
            tcp,
            addr,
            admission,
            gate: gate.clone(),
            stop: stop.clone(),
        };
        tokio::spawn(connection.serve(acceptor.clone(), app.clone()));
    }
    drop(listener);
    drop(stop);
    let grace = limits.shutdown_grace_period;
    info!(grace = ?grace, "stopped accepting; waiting for in-flight requests");
    let _ = stopping.send(true);
    if tokio::time::timeout(grace, stopping.closed())
        .await
        .is_err()
    {
        warn!("in-flight requests did not finish within the grace period");
    }
}

/// The connection cap with its probe-only overflow, and the HTTP settings and
/// timeouts of each.
struct Gate {
    connections: Arc<Semaphore>,
    probe_connections: Arc<Semaphore>,
    /// Free slots at or under which the server is short of connections.
    pressure_mark: usize,
    /// Woken when the server is short of connections (at most once per
    /// [`PRESSURE_NOTICE_INTERVAL`], so that a flood of connects wakes no storm).
    pressure: Notify,
    /// When `pressure` was last woken, in milliseconds after `started`.
    pressure_noticed: AtomicU64,
    started: Instant,
    full: Admitted,
    probe: Admitted,
    /// Unfinished request heads, all connections together.
    heads: Arc<Pool>,
}

/// What a connection of one pool is allowed.
struct Admitted {
    builder: auto::Builder<TokioExecutor>,
    handshake_timeout: Duration,
    timeouts: Timeouts,
    write_timeout: Duration,
    /// Longest life of any connection of the pool.
    lifetime: Option<Duration>,
}

impl Gate {
    fn new(limits: &ServingLimits) -> Self {
        let full = Timeouts {
            first_bytes: FIRST_BYTES_TIMEOUT.min(limits.header_read_timeout),
            first_request: limits.header_read_timeout,
            idle: limits.idle_connection_timeout,
            pressured: PRESSURED_IDLE_TIMEOUT.min(limits.idle_connection_timeout),
        };
        let probe = Timeouts {
            first_bytes: PROBE_HEADER_TIMEOUT,
            first_request: PROBE_HEADER_TIMEOUT,
            idle: PROBE_HEADER_TIMEOUT,
            pressured: PROBE_HEADER_TIMEOUT,
        };
        Self {
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            probe_connections: Arc::new(Semaphore::new(PROBE_CONNECTIONS)),
            pressure_mark: limits.max_connections / PRESSURE_FRACTION,
            pressure: Notify::new(),
            pressure_noticed: AtomicU64::new(0),
            started: Instant::now(),
            full: Admitted {
                builder: builder(limits.header_read_timeout, true),
                handshake_timeout: HANDSHAKE_TIMEOUT,
                timeouts: full,
                write_timeout: limits.write_timeout,
                lifetime: None,
            },
            probe: Admitted {
                builder: builder(PROBE_HEADER_TIMEOUT, false),
                handshake_timeout: PROBE_HANDSHAKE_TIMEOUT,
                timeouts: probe,
                write_timeout: limits.write_timeout.min(PROBE_CONNECTION_LIFETIME),
                lifetime: Some(PROBE_CONNECTION_LIFETIME),
            },
            heads: Pool::new(HEAD_POOL_BYTES),
        }
    }

    /// A slot for one more connection; `None` when both pools are full.
    fn admit(&self) -> Option<Admission> {
        if let Ok(permit) = self.connections.clone().try_acquire_owned() {
            if self.pressured() {
                self.notice_pressure();
            }
            return Some(Admission::Full(permit));
        }
        self.notice_pressure();
        let permit = self.probe_connections.clone().try_acquire_owned().ok()?;
        Some(Admission::ProbeOnly(permit))
    }

    /// Tells every connection to look at its timeouts again, under pressure.
    fn notice_pressure(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.pressure_noticed.load(Ordering::Relaxed);
        let interval = u64::try_from(PRESSURE_NOTICE_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if (last == 0 || now.saturating_sub(last) >= interval)
            && self
                .pressure_noticed
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.pressure.notify_waiters();
        }
    }

    /// Whether few connection slots are left.
    fn pressured(&self) -> bool {
        self.connections.available_permits() <= self.pressure_mark
    }

    fn pool(&self, admission: &Admission) -> &Admitted {
        match admission {
            Admission::Full(_) => &self.full,
            Admission::ProbeOnly(_) => &self.probe,
        }
    }
}

/// An accepted TCP connection and the pool slot it holds while it lives.
struct Connection {
    tcp: TcpStream,
    addr: SocketAddr,
    admission: Admission,
    gate: Arc<Gate>,
    /// Turns `true` when the server stops; dropped when the connection ends.
    stop: watch::Receiver<bool>,
}

impl Connection {
    /// The TLS handshake, then HTTP until the connection ends: by the client, by one of
    /// the [`lifetime`] rules, at the end of a probe-only connection's lifetime, or
    /// gracefully when the server stops.
    async fn serve(self, acceptor: TlsAcceptor, app: Arc<App>) {
        // `admission` holds the pool slot until the connection ends.
        let Self {
            tcp,
            addr,
            admission,
            gate,
            mut stop,
        } = self;
        let probe_only = matches!(admission, Admission::ProbeOnly(_));
        let pool = gate.pool(&admission);
        let metrics = app.metrics.clone();
        let _open = metrics.connection_opened();
        let accepted = Instant::now();
        let mut tls = match tokio::time::timeout(pool.handshake_timeout, acceptor.accept(tcp)).await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                debug!(%addr, error = %error_chain(&error), "TLS handshake failed");
                return;
            }
            Err(_) => {
                debug!(%addr, "TLS handshake timed out");
                return;
            }
        };
        let peer = Peer {
            addr: Some(addr),
            chain: peer_chain(&tls),
            probe_only,
        };
        tls.get_mut()
            .1
            .set_buffer_limit(Some(TLS_SEND_BUFFER_BYTES));
        let activity = Activity::new(Instant::now(), gate.heads.clone());
        let requests = activity.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let app = app.clone();
            let peer = peer.clone();
            let in_flight = requests.request();
            async move {
                // A watch keeps `in_flight` until its stream ends: its connection is busy.
                let response = app.handle(req, &peer, Box::new(in_flight)).await;
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let io = Guarded::new(tls, activity.clone(), pool.write_timeout);
        let mut conn = pin!(pool.builder.serve_connection(TokioIo::new(io), service));
        let end_of_life = pool.lifetime.map(|lifetime| accepted + lifetime);
        // Set once the connection was shut down for being idle: past it, it is dropped.
        let mut closing: Option<Instant> = None;
        // Set once the server stops: the server's grace period bounds what follows.
        let mut stopping = false;
        let served = loop {
            let wake = if stopping {
                None
            } else if let Some(deadline) = closing {
                Some(deadline)
            } else {
                match pool
                    .timeouts
                    .next(&activity, Instant::now(), gate.pressured())
                {
                    Next::At(at) => Some(at),
                    Next::Close(reason) if reason.graceful() => {
                        debug!(%addr, ?reason, "closing the connection gracefully");
                        conn.as_mut().graceful_shutdown();
                        let deadline = Instant::now() + pool.write_timeout;
                        closing = Some(deadline);
                        Some(deadline)
                    }
                    Next::Close(reason) => {
                        debug!(%addr, ?reason, "closing the connection");
                        return;
                    }
                }
            };
            let wake = match (wake, end_of_life) {
                (Some(at), Some(end)) => Some(at.min(end)),
                (at, end) => at.or(end),
            };
            let woken = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                served = conn.as_mut() => break served,
                () = woken => {
                    let now = Instant::now();
                    if end_of_life.is_some_and(|end| now >= end) {
                        debug!(%addr, "probe-only connection closed at the end of its lifetime");
                        return;
                    }
                    if closing.is_some_and(|deadline| now >= deadline) {
                        // A request that began just before the GOAWAY runs to its end
                        // (bounded by the request timeout); an answer that cannot be
                        // written does not.
                        if activity.in_flight() == 0 {
                            debug!(%addr, "connection still busy after its graceful shutdown; dropped");
                            return;
                        }
                        closing = Some(now + pool.write_timeout);
                    }
                }
                () = gate.pressure.notified(), if closing.is_none() && !stopping => {}
                changed = stop.changed(), if !stopping => {
                    if changed.is_err() || *stop.borrow() {
                        stopping = true;
                        if closing.is_none() {
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        };
        if let Err(error) = served {
            debug!(%addr, error = %error_chain(&*error), "connection ended with an error");
        }
    }
}

/// The certificate chain the client presented, if any.
fn peer_chain(tls: &TlsStream<TcpStream>) -> Option<Arc<[CertificateDer<'static>]>> {
    tls.get_ref()
        .1
        .peer_certificates()
        .filter(|chain| !chain.is_empty())
        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
}

/// The HTTP/1.1 and HTTP/2 settings. hyper applies its header read timeout only when
/// it has a timer, so one is always given.
fn builder(header_read_timeout: Duration, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(keep_alive);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(u32::try_from(MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(Some(20))
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// Reloads the serving certificate when its files change and counts the
/// reloads; never completes.
pub async fn reload_certificates(resolver: Arc<ReloadingResolver>, metrics: Arc<CertMetrics>) {
    let mut status = resolver.status();
    let count = async move {
        let (mut reloads, mut failures) = (0, 0);
        while status.changed().await.is_ok() {
            let now = status.borrow_and_update().clone();
            for _ in reloads..now.reloads {
                metrics.cert_reload(CertReload::Loaded);
            }
            for _ in failures..now.failures {
                metrics.cert_reload(CertReload::Rejected);
            }
            (reloads, failures) = (now.reloads, now.failures);
        }
        std::future::pending::<()>().await;
    };
    tokio::join!(resolver.watch(serving::DEFAULT_POLL_INTERVAL), count);
}

family! {
    /// What the serving certificate's reloads count.
    pub struct CertMetrics {
        reloads: IntCounterVec = metric(
            "serving_cert_reloads_total",
            "Serving certificate reloads, by result (loaded, rejected).",
            &["result"],
        ),
    }
}

impl CertMetrics {
    /// Counts a serving certificate reload.
    pub fn cert_reload(&self, result: CertReload) {
        self.reloads.with_label_values(&[result.as_str()]).inc();
    }
}

/// How a reload of the serving certificate ended: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertReload {
    /// The new pair was loaded and is served.
    Loaded,
    /// The new pair was refused; the old one is kept.
    Rejected,
}

impl CertReload {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Rejected => "rejected",
        }
    }
}

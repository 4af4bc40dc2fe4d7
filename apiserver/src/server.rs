//! The HTTPS listener: TLS handshakes (rustls), HTTP/1.1 and HTTP/2 on the same
//! port, bounded connections, graceful shutdown. Every request goes to
//! [`crate::routes::App`] with the client certificate chain the peer presented, if any.
//!
//! What a client can make the server hold is bounded here (see [`ServingLimits`]):
//! the TLS handshake time, the time to send a request head (which also ends idle
//! keep-alive connections), the head's size (431 above it), HTTP/2 streams per connection
//! and header list size, and the number of connections. Past the connection cap a few
//! more are admitted for health probes only; past that, new connections are closed at
//! once. In-flight requests and the per-request deadline are enforced by the app.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{
        conn::auto,
        graceful::{GracefulShutdown, Watcher},
    },
};
use rustls::pki_types::CertificateDer;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::{debug, info, warn};

use crate::{request::Peer, routes::App};

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
/// Largest request head (request line and headers), as kube-apiserver's 1 MiB.
pub const MAX_HEADER_BYTES: usize = 1024 * 1024;
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
    /// Deadline of one request; past it, 504.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_REQUEST_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Time a client has to send a request head; also ends idle keep-alive connections.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
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
    #[arg(long, env = "ELEMENTAL_CHANGELOG_ANSWER_CACHE_SIZE", default_value = "32MiB", value_parser = crate::oci::config::parse_byte_size)]
    pub answer_cache_size: u64,
    /// On SIGTERM, how long to keep serving with `/readyz` failing, so that endpoints
    /// drop this replica before it stops accepting (kube-apiserver's flag).
    #[arg(long, env = "ELEMENTAL_CHANGELOG_SHUTDOWN_DELAY_DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    pub shutdown_delay_duration: Duration,
    /// Then, time given to in-flight requests to finish.
    #[arg(long, env = "ELEMENTAL_CHANGELOG_SHUTDOWN_GRACE_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace_period: Duration,
}

impl Default for ServingLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_requests_inflight: 400,
            request_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(30),
            max_compute_concurrency: 0,
            answer_cache_size: 32 << 20,
            shutdown_delay_duration: Duration::ZERO,
            shutdown_grace_period: Duration::from_secs(10),
        }
    }
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
    let gate = Gate::new(limits);
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE: back off briefly rather than spin.
                    warn!(%error, "accepting a connection failed");
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
            builder: gate.builder(&admission),
            admission,
        };
        tokio::spawn(connection.serve(acceptor.clone(), app.clone(), graceful.watcher()));
    }
    drop(listener);
    let grace = limits.shutdown_grace_period;
    info!(grace = ?grace, "stopped accepting; waiting for in-flight requests");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("in-flight requests did not finish within the grace period");
    }
}

/// The connection cap with its probe-only overflow, and the HTTP settings of each.
struct Gate {
    connections: Arc<Semaphore>,
    probe_connections: Arc<Semaphore>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    probe_builder: Arc<auto::Builder<TokioExecutor>>,
}

impl Gate {
    fn new(limits: &ServingLimits) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            probe_connections: Arc::new(Semaphore::new(PROBE_CONNECTIONS)),
            builder: Arc::new(builder(limits.header_read_timeout, true)),
            probe_builder: Arc::new(builder_for_probes()),
        }
    }

    /// A slot for one more connection; `None` when both pools are full.
    fn admit(&self) -> Option<Admission> {
        if let Ok(permit) = self.connections.clone().try_acquire_owned() {
            return Some(Admission::Full(permit));
        }
        let permit = self.probe_connections.clone().try_acquire_owned().ok()?;
        Some(Admission::ProbeOnly(permit))
    }

    fn builder(&self, admission: &Admission) -> Arc<auto::Builder<TokioExecutor>> {
        match admission {
            Admission::Full(_) => self.builder.clone(),
            Admission::ProbeOnly(_) => self.probe_builder.clone(),
        }
    }
}

/// An accepted TCP connection and the pool slot it holds while it lives.
struct Connection {
    tcp: TcpStream,
    addr: SocketAddr,
    admission: Admission,
    builder: Arc<auto::Builder<TokioExecutor>>,
}

impl Connection {
    /// The TLS handshake, then HTTP until the connection ends (a probe-only one
    /// at the end of its lifetime at the latest).
    async fn serve(self, acceptor: TlsAcceptor, app: Arc<App>, watcher: Watcher) {
        // `admission` holds the pool slot until the connection ends.
        let Self {
            tcp,
            addr,
            admission,
            builder,
        } = self;
        let probe_only = matches!(admission, Admission::ProbeOnly(_));
        let metrics = app.metrics.clone();
        let _open = metrics.connection_opened();
        let handshake_timeout = if probe_only {
            PROBE_HANDSHAKE_TIMEOUT
        } else {
            HANDSHAKE_TIMEOUT
        };
        let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                debug!(%addr, %error, "TLS handshake failed");
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
        let service = service_fn(move |req: Request<Incoming>| {
            let app = app.clone();
            let peer = peer.clone();
            async move {
                Ok::<Response<Full<Bytes>>, std::convert::Infallible>(app.handle(req, &peer).await)
            }
        });
        let conn = watcher.watch(builder.serve_connection(TokioIo::new(tls), service));
        let served = if probe_only {
            match tokio::time::timeout(PROBE_CONNECTION_LIFETIME, conn).await {
                Ok(served) => served,
                Err(_) => {
                    debug!(%addr, "probe-only connection closed at the end of its lifetime");
                    return;
                }
            }
        } else {
            conn.await
        };
        if let Err(error) = served {
            debug!(%addr, %error, "connection ended with an error");
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

fn builder_for_probes() -> auto::Builder<TokioExecutor> {
    builder(PROBE_HEADER_TIMEOUT, false)
}

//! The HTTPS listener: TLS handshakes (rustls), HTTP/1.1 and HTTP/2 on the same
//! port, graceful shutdown. Every request goes to [`crate::routes::App`] with
//! the client certificate chain the peer presented, if any.

use std::{future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::{request::Peer, routes::App};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then lets in-flight
/// requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
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
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
            let chain = tls
                .get_ref()
                .1
                .peer_certificates()
                .filter(|chain| !chain.is_empty())
                .map(|chain| {
                    chain
                        .iter()
                        .map(|c| c.clone().into_owned())
                        .collect::<Arc<[_]>>()
                });
            let peer = Peer {
                addr: Some(addr),
                chain,
            };
            let service = service_fn(move |req: Request<Incoming>| {
                let app = app.clone();
                let peer = peer.clone();
                async move {
                    Ok::<Response<Full<Bytes>>, std::convert::Infallible>(
                        app.handle(req, &peer).await,
                    )
                }
            });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(conn).await {
                debug!(%addr, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    info!(grace = ?grace, "shutting down: waiting for in-flight requests");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("in-flight requests did not finish within the grace period");
    }
}

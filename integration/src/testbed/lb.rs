//! A TCP round-robin proxy on loopback standing in for kube-proxy in front
//! of several replicas of our server: each new connection goes to the next
//! backend in its endpoint list, skipping backends that are out of it (not
//! ready) or refuse the connection. TLS passes through untouched, so every
//! replica presents its own (here: the same) serving certificate.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Bound on waiting for proxied connections to close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A proxied connection: its backend, the task copying it, and what asks
/// that task to close it.
#[derive(Debug)]
struct Connection {
    backend: usize,
    task: JoinHandle<()>,
    close: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Backend ports; `None` for a backend out of the endpoint list.
    backends: Mutex<Vec<Option<u16>>>,
    next: AtomicUsize,
    /// Live proxied connections.
    live: Mutex<Vec<Connection>>,
    /// Connections made to each backend so far.
    accepted: Mutex<Vec<usize>>,
}

impl Shared {
    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backends in round-robin order from the next one.
    fn order(&self) -> Vec<(usize, u16)> {
        let backends = Self::lock(&self.backends).clone();
        if backends.is_empty() {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..backends.len())
            .map(|i| (start + i) % backends.len())
            .filter_map(|i| backends[i].map(|port| (i, port)))
            .collect()
    }
}

/// The proxy; stops when dropped. Its endpoint list is changed through
/// [`Handle`], which it dereferences to.
#[derive(Debug)]
pub struct RoundRobin {
    port: u16,
    handle: Handle,
    accept: JoinHandle<()>,
}

/// What changes a [`RoundRobin`]'s endpoints and connections; cheap to
/// clone into other tasks.
#[derive(Clone, Debug)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl RoundRobin {
    /// Listens on a free loopback port and proxies to `backends` (ports on 127.0.0.1).
    pub async fn start(backends: &[u16]) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the round-robin proxy")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        *Shared::lock(&shared.backends) = backends.iter().copied().map(Some).collect();
        *Shared::lock(&shared.accepted) = vec![0; backends.len()];
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Self {
            port,
            handle: Handle { shared },
            accept,
        })
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle for other tasks.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl std::ops::Deref for RoundRobin {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Handle {
    /// Puts backend `index` in the endpoint list (at `port`) or takes it out
    /// (`None`); connections already made are left alone.
    pub fn set_backend(&self, index: usize, port: Option<u16>) {
        let mut backends = Shared::lock(&self.shared.backends);
        if backends.len() <= index {
            backends.resize(index + 1, None);
            Shared::lock(&self.shared.accepted).resize(index + 1, 0);
        }
        backends[index] = port;
    }

    /// Closes every proxied connection (to backend `only`, or to all) and
    /// waits until the client has closed its end too, so that its next
    /// request is sure to go over a new connection, through the current
    /// endpoint list. (A client that sent a request down the connection
    /// meanwhile gets no answer: the race any server closing an idle
    /// connection has.)
    pub async fn close_connections(&self, only: Option<usize>) -> Result<()> {
        let closing: Vec<Connection> = {
            let mut live = Shared::lock(&self.shared.live);
            let (close, keep): (Vec<_>, Vec<_>) = live
                .drain(..)
                .partition(|c| only.is_none_or(|o| o == c.backend));
            *live = keep;
            close
        };
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        for connection in closing {
            let _ = connection.close.send(());
            if tokio::time::timeout_at(deadline.into(), connection.task)
                .await
                .is_err()
            {
                bail!("a proxied connection did not close within {CLOSE_TIMEOUT:?}");
            }
        }
        Ok(())
    }

    /// Connections made to each backend so far.
    pub fn accepted(&self) -> Vec<usize> {
        Shared::lock(&self.shared.accepted).clone()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in Shared::lock(&self.handle.shared.live).drain(..) {
            connection.task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let mut chosen = None;
        for (index, port) in shared.order() {
            if let Ok(backend) =
                TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await
            {
                chosen = Some((index, backend));
                break;
            }
        }
        // No backend at all: the client sees the connection closed, as with
        // a Service without ready endpoints.
        let Some((index, backend)) = chosen else {
            continue;
        };
        if let Some(count) = Shared::lock(&shared.accepted).get_mut(index) {
            *count += 1;
        }
        let (close, closed) = oneshot::channel();
        let task = tokio::spawn(proxy(client, backend, closed));
        let mut live = Shared::lock(&shared.live);
        live.retain(|c| !c.task.is_finished());
        live.push(Connection {
            backend: index,
            task,
            close,
        });
    }
}

/// Copies bytes both ways until either side closes, or until `close`: then
/// the backend connection is dropped, the client gets end-of-stream, and the
/// proxy waits (bounded) for the client to close its end.
async fn proxy(mut client: TcpStream, mut backend: TcpStream, close: oneshot::Receiver<()>) {
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut backend) => return,
        _ = close => {}
    }
    drop(backend);
    let _ = client.shutdown().await;
    let mut sink = [0u8; 4096];
    let drained = async { while client.read(&mut sink).await.is_ok_and(|n| n > 0) {} };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT / 2, drained).await;
}

//! A fault-injecting TCP proxy the end-to-end tests own: it listens on
//! 127.0.0.1, forwards every connection to one target, and is switched at
//! run time between [`Fault`]s (refused connections, resets and truncation
//! mid-stream, stalls, slow transfers, canned HTTP errors).
//!
//! It works at the TCP level, so TLS passes through untouched (kube-apiserver
//! behind it still presents its own certificate); only [`Fault::HttpStatus`]
//! speaks a protocol, and only makes sense in front of a plain HTTP/1 target
//! such as the test registry.
//!
//! A fault applies to new connections and to the ones already open: a stall
//! holds their next chunk, a byte limit counts from the moment the fault is
//! set, [`Fault::Refuse`] resets them. [`FaultProxy::cut`] resets every open
//! connection once, whatever the fault.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Size of one read from either side.
const CHUNK: usize = 16 * 1024;
/// Bound on connecting to the target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on waiting for a request (and for the client to close) when
/// answering [`Fault::HttpStatus`].
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between attempts to listen again after [`Fault::Refuse`].
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// What the proxy does to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways, untouched.
    Pass,
    /// The target is down: the listening socket is closed (connecting is
    /// refused, `ECONNREFUSED`) and open connections are reset. The proxy
    /// listens on the same port again when the fault changes.
    Refuse,
    /// Reset (RST) each connection once it has sent this many bytes to the
    /// client since the fault was set.
    ResetAfter(u64),
    /// Close (FIN) each connection towards the client once it has sent this
    /// many bytes since the fault was set: a truncated response.
    TruncateAfter(u64),
    /// Forward nothing either way: new connections are accepted and held,
    /// open ones keep their next chunk. Everything resumes when it ends.
    Stall,
    /// Forward to the client at most `bytes`, then pause for `every`, and so on.
    Slow {
        /// Bytes per step.
        bytes: usize,
        /// Pause after each step.
        every: Duration,
    },
    /// Answer each request with this HTTP status (a short `text/plain` body,
    /// `Connection: close`) without contacting the target. For HTTP/1
    /// targets only: the answer is written when the client sends a request
    /// on a new connection, or on an open one that was idle.
    HttpStatus(u16),
}

#[derive(Clone, Copy, Debug)]
struct State {
    fault: Fault,
    /// Bumped on every [`FaultProxy::set`]: byte limits count from there.
    generation: u64,
    /// Bumped on every [`FaultProxy::cut`].
    cuts: u64,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    open: AtomicUsize,
    stalled: AtomicUsize,
    to_client: AtomicU64,
}

/// The proxy; dropping it closes the listener and every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free 127.0.0.1 port and forwards to `target`, passing
    /// everything until told otherwise.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the fault proxy")?;
        let addr = listener.local_addr().context("reading the proxy's port")?;
        let (state, receiver) = watch::channel(State {
            fault: Fault::Pass,
            generation: 0,
            cuts: 0,
        });
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(serve(listener, target, receiver, Arc::clone(&stats)));
        Ok(Self {
            addr,
            target,
            state,
            stats,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:<port>`, as written in image references and URLs.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Where it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Switches to `fault`, for new and open connections.
    pub fn set(&self, fault: Fault) {
        self.state.send_modify(|state| {
            state.fault = fault;
            state.generation += 1;
        });
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        self.state.borrow().fault
    }

    /// Resets every open connection now (the fault stays as it is).
    pub fn cut(&self) {
        self.state.send_modify(|state| state.cuts += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.stats.open.load(Ordering::Relaxed)
    }

    /// Transfers waiting for a [`Fault::Stall`] to end: new connections not
    /// yet connected to the target, and chunks read but not forwarded.
    pub fn stalled(&self) -> usize {
        self.stats.stalled.load(Ordering::Relaxed)
    }

    /// Bytes forwarded to clients so far.
    pub fn bytes_to_clients(&self) -> u64 {
        self.stats.to_client.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept loop owns the connection tasks: aborting it drops them all.
        self.task.abort();
    }
}

/// Accepts connections while the fault allows, until the proxy is dropped.
async fn serve(
    listener: TcpListener,
    target: SocketAddr,
    mut state: watch::Receiver<State>,
    stats: Arc<Stats>,
) {
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(_) => return,
    };
    let mut listener = Some(listener);
    let mut connections = JoinSet::new();
    loop {
        let refusing = state.borrow_and_update().fault == Fault::Refuse;
        if refusing {
            listener = None;
        } else if listener.is_none() {
            listener = Some(listen_again(addr).await);
        }
        match &listener {
            None => tokio::select! {
                changed = state.changed() => if changed.is_err() { return },
                Some(_) = connections.join_next() => {}
            },
            Some(open) => tokio::select! {
                accepted = open.accept() => if let Ok((client, _)) = accepted {
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(connection(client, target, state.clone(), Arc::clone(&stats)));
                },
                changed = state.changed() => if changed.is_err() { return },
                Some(_) = connections.join_next() => {}
            },
        }
    }
}

/// Listens on `addr` again after a refusal; retries until it can (the port
/// is ours unless another process grabbed it meanwhile, which a test then
/// sees as a refused connection that never ends).
async fn listen_again(addr: SocketAddr) -> TcpListener {
    let mut said = false;
    loop {
        let bound = TcpSocket::new_v4().and_then(|socket| {
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        });
        match bound {
            Ok(listener) => return listener,
            Err(error) => {
                if !said {
                    eprintln!("fault proxy: cannot listen on {addr} again, retrying: {error}");
                    said = true;
                }
                tokio::time::sleep(REBIND_PAUSE).await;
            }
        }
    }
}

/// How one direction (or the whole connection) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// The sender closed its side; passed on.
    Eof,
    /// Reset the client.
    Reset,
    /// Close towards the client without resetting.
    Truncate,
    /// Answer the client with this HTTP status.
    Answer(u16),
}

/// Counts an open connection while it lives.
struct Open<'a>(&'a Stats);

impl<'a> Open<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    state: watch::Receiver<State>,
    stats: Arc<Stats>,
) {
    let _open = Open::new(&stats);
    let cuts = state.borrow().cuts;
    let start = tokio::select! {
        start = unstalled(state.clone(), &stats) => start,
        () = killed(state.clone(), cuts) => None,
    };
    let Some(start) = start else {
        reset(&client);
        return;
    };
    if let Fault::HttpStatus(code) = start.fault {
        let mut request = [0u8; CHUNK];
        let read = tokio::time::timeout(ANSWER_TIMEOUT, client.read(&mut request)).await;
        if matches!(read, Ok(Ok(n)) if n > 0) {
            answer(&mut client, code).await;
        }
        return;
    }
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(upstream)) => upstream,
        _ => {
            reset(&client);
            return;
        }
    };
    let mut upstream = upstream;
    let end = {
        let (mut client_read, mut client_write) = client.split();
        let (mut upstream_read, mut upstream_write) = upstream.split();
        let mut up = std::pin::pin!(to_target(
            &mut client_read,
            &mut upstream_write,
            state.clone(),
            &stats
        ));
        let mut down = std::pin::pin!(to_client(
            &mut upstream_read,
            &mut client_write,
            state.clone(),
            &stats
        ));
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                flow = &mut up, if !up_done => match flow {
                    Flow::Eof => up_done = true,
                    other => break other,
                },
                flow = &mut down, if !down_done => match flow {
                    Flow::Eof => down_done = true,
                    other => break other,
                },
                () = killed(state.clone(), cuts) => break Flow::Reset,
            }
            if up_done && down_done {
                break Flow::Eof;
            }
        }
    };
    match end {
        Flow::Eof => {}
        Flow::Reset => {
            reset(&client);
            reset(&upstream);
        }
        Flow::Truncate => {
            let _ = client.shutdown().await;
        }
        Flow::Answer(code) => {
            drop(upstream);
            answer(&mut client, code).await;
        }
    }
}

/// Waits until the fault is not [`Fault::Stall`] and returns the state then;
/// `None` when the proxy is gone.
async fn unstalled(mut state: watch::Receiver<State>, stats: &Stats) -> Option<State> {
    let now = *state.borrow_and_update();
    if now.fault != Fault::Stall {
        return Some(now);
    }
    stats.stalled.fetch_add(1, Ordering::Relaxed);
    let state = state
        .wait_for(|s| s.fault != Fault::Stall)
        .await
        .map(|s| *s)
        .ok();
    stats.stalled.fetch_sub(1, Ordering::Relaxed);
    state
}

/// Resolves when open connections must be reset: [`FaultProxy::cut`] since
/// `cuts`, [`Fault::Refuse`], or the proxy gone.
async fn killed(mut state: watch::Receiver<State>, cuts: u64) {
    let _ = state
        .wait_for(|s| s.cuts != cuts || s.fault == Fault::Refuse)
        .await;
}

/// Reads the next chunk of one direction into `buf`; at the end of the
/// stream, passes the end on to `to` and says how the direction ended.
async fn next_chunk<R, W>(from: &mut R, to: &mut W, buf: &mut [u8]) -> Result<usize, Flow>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match from.read(buf).await {
        Ok(0) => {
            let _ = to.shutdown().await;
            Err(Flow::Eof)
        }
        Ok(n) => Ok(n),
        Err(_) => Err(Flow::Reset),
    }
}

/// Client to target: forwarded as is, held during a stall; a request while
/// [`Fault::HttpStatus`] is answered by the proxy.
async fn to_target<R, W>(
    from: &mut R,
    to: &mut W,
    state: watch::Receiver<State>,
    stats: &Stats,
) -> Flow
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match next_chunk(from, to, &mut buf).await {
            Ok(n) => n,
            Err(end) => return end,
        };
        let Some(now) = unstalled(state.clone(), stats).await else {
            return Flow::Reset;
        };
        if let Fault::HttpStatus(code) = now.fault {
            return Flow::Answer(code);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return Flow::Reset;
        }
    }
}

/// Target to client, where byte limits and slowness apply.
async fn to_client<R, W>(
    from: &mut R,
    to: &mut W,
    state: watch::Receiver<State>,
    stats: &Stats,
) -> Flow
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    // Bytes sent since the fault of this generation was set.
    let mut generation = state.borrow().generation;
    let mut sent: u64 = 0;
    loop {
        let n = match next_chunk(from, to, &mut buf).await {
            Ok(n) => n,
            Err(end) => return end,
        };
        let Some(now) = unstalled(state.clone(), stats).await else {
            return Flow::Reset;
        };
        if now.generation != generation {
            generation = now.generation;
            sent = 0;
        }
        let chunk = &buf[..n];
        match now.fault {
            Fault::ResetAfter(limit) | Fault::TruncateAfter(limit) => {
                let allowed = usize::try_from(limit.saturating_sub(sent))
                    .unwrap_or(usize::MAX)
                    .min(n);
                if to.write_all(&chunk[..allowed]).await.is_err() {
                    return Flow::Reset;
                }
                stats.to_client.fetch_add(allowed as u64, Ordering::Relaxed);
                sent += allowed as u64;
                if allowed < n {
                    let _ = to.flush().await;
                    return if matches!(now.fault, Fault::ResetAfter(_)) {
                        Flow::Reset
                    } else {
                        Flow::Truncate
                    };
                }
            }
            Fault::Slow { bytes, every } => {
                let mut rest = chunk;
                while !rest.is_empty() {
                    let step = if state.borrow().fault == now.fault {
                        bytes.max(1).min(rest.len())
                    } else {
                        rest.len()
                    };
                    if to.write_all(&rest[..step]).await.is_err() {
                        return Flow::Reset;
                    }
                    stats.to_client.fetch_add(step as u64, Ordering::Relaxed);
                    rest = &rest[step..];
                    tokio::time::sleep(every).await;
                }
            }
            Fault::Pass | Fault::Stall | Fault::Refuse | Fault::HttpStatus(_) => {
                if to.write_all(chunk).await.is_err() {
                    return Flow::Reset;
                }
                stats.to_client.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}

/// Closes with RST instead of FIN once the socket is dropped.
fn reset(stream: &TcpStream) {
    // A zero linger never blocks: close sends the RST at once.
    #[expect(
        deprecated,
        reason = "SO_LINGER is deprecated because a non-zero linger blocks on drop; zero does not"
    )]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// The canned response of [`Fault::HttpStatus`].
fn http_response(code: u16) -> String {
    let reason = match code {
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Injected Fault",
    };
    let body = format!("fault proxy: injected {code}\n");
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes the canned response, then reads what the client still sends until
/// it closes: closing with unread data would reset the connection instead.
async fn answer(client: &mut TcpStream, code: u16) {
    if client
        .write_all(http_response(code).as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let _ = client.shutdown().await;
    let mut sink = [0u8; CHUNK];
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, async {
        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests;

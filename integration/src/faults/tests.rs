use std::io::ErrorKind;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::*;

/// Bound on waiting for the proxy to apply a change.
const DEADLINE: Duration = Duration::from_secs(10);

/// A target that answers each line `<n>` with `n` bytes of a known pattern,
/// counting connections and requests.
struct Target {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

async fn target() -> Result<Target> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let (a, r) = (Arc::clone(&accepted), Arc::clone(&requests));
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::Relaxed);
            let r = Arc::clone(&r);
            connections.spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(n) = line.trim().parse::<usize>() else {
                        return;
                    };
                    r.fetch_add(1, Ordering::Relaxed);
                    if write.write_all(&pattern(n)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(Target {
        addr,
        accepted,
        requests,
        task,
    })
}

/// Sends `<n>\n` and reads the `n` bytes of the answer.
async fn request(stream: &mut TcpStream, n: usize) -> Result<Vec<u8>> {
    stream.write_all(format!("{n}\n").as_bytes()).await?;
    let mut answer = vec![0u8; n];
    stream.read_exact(&mut answer).await?;
    Ok(answer)
}

/// Reads until EOF or an error: the bytes, and the error kind if any.
async fn read_all(stream: &mut TcpStream) -> (Vec<u8>, Option<ErrorKind>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(error) => return (out, Some(error.kind())),
        }
    }
}

/// Polls `condition` until it holds, failing after [`DEADLINE`].
async fn until(what: &str, mut condition: impl AsyncFnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while !condition().await {
        anyhow::ensure!(
            started.elapsed() < DEADLINE,
            "{what}: not after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test]
async fn passes_bytes_both_ways() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    assert_eq!(proxy.target(), target.addr);
    assert_eq!(proxy.host(), format!("127.0.0.1:{}", proxy.addr().port()));
    let mut stream = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(request(&mut stream, 5).await?, pattern(5));
    assert_eq!(request(&mut stream, 200_000).await?, pattern(200_000));
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open(), 1);
    assert_eq!(proxy.bytes_to_clients(), 200_005);
    assert_eq!(target.accepted.load(Ordering::Relaxed), 1);
    // The client's close is passed on, and the connection ends.
    drop(stream);
    until("the connection closed", async || proxy.open() == 0).await
}

#[tokio::test]
async fn refuse_closes_the_port_and_resets_open_connections() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    request(&mut open, 3).await?;
    proxy.set(Fault::Refuse);
    assert_eq!(proxy.fault(), Fault::Refuse);
    let (_, error) = read_all(&mut open).await;
    assert_eq!(error, Some(ErrorKind::ConnectionReset));
    until("connecting is refused", async || {
        matches!(TcpStream::connect(proxy.addr()).await, Err(e) if e.kind() == ErrorKind::ConnectionRefused)
    })
    .await?;
    let accepted = target.accepted.load(Ordering::Relaxed);

    proxy.set(Fault::Pass);
    let mut again = None;
    until("listening again on the same port", async || {
        again = TcpStream::connect(proxy.addr()).await.ok();
        again.is_some()
    })
    .await?;
    let mut again = again.context("connected")?;
    assert_eq!(request(&mut again, 7).await?, pattern(7));
    assert_eq!(target.accepted.load(Ordering::Relaxed), accepted + 1);
    Ok(())
}

#[tokio::test]
async fn reset_after_a_byte_count() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let mut stream = TcpStream::connect(proxy.addr()).await?;
    // The count starts when the fault is set, on an open connection too.
    request(&mut stream, 500).await?;
    proxy.set(Fault::ResetAfter(1000));
    stream.write_all(b"100000\n").await?;
    let (received, error) = read_all(&mut stream).await;
    assert_eq!(error, Some(ErrorKind::ConnectionReset));
    // A reset may discard what the client had not read yet.
    assert!(received.len() <= 1000, "{}", received.len());
    assert_eq!(received, pattern(100_000)[..received.len()]);
    assert_eq!(proxy.bytes_to_clients(), 1500);
    Ok(())
}

#[tokio::test]
async fn truncate_after_a_byte_count() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    proxy.set(Fault::TruncateAfter(1000));
    let mut stream = TcpStream::connect(proxy.addr()).await?;
    stream.write_all(b"100000\n").await?;
    let (received, error) = read_all(&mut stream).await;
    assert_eq!(error, None, "a clean end of stream");
    assert_eq!(received, pattern(1000));
    Ok(())
}

#[tokio::test]
async fn stall_holds_open_and_new_connections_until_it_ends() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    request(&mut open, 3).await?;
    proxy.set(Fault::Stall);
    open.write_all(b"4\n").await?;
    until("the request held", async || proxy.stalled() == 1).await?;
    let mut new = TcpStream::connect(proxy.addr()).await?;
    new.write_all(b"5\n").await?;
    until("the new connection held", async || proxy.stalled() == 2).await?;
    // Held, so not forwarded: the target saw neither.
    assert_eq!(target.requests.load(Ordering::Relaxed), 1);
    assert_eq!(target.accepted.load(Ordering::Relaxed), 1);
    assert_eq!(proxy.accepted(), 2);

    proxy.set(Fault::Pass);
    let mut answer = vec![0u8; 4];
    open.read_exact(&mut answer).await?;
    assert_eq!(answer, pattern(4));
    let mut answer = vec![0u8; 5];
    new.read_exact(&mut answer).await?;
    assert_eq!(answer, pattern(5));
    assert_eq!(proxy.stalled(), 0);
    Ok(())
}

#[tokio::test]
async fn slow_trickles_the_answer() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    proxy.set(Fault::Slow {
        bytes: 1000,
        every: Duration::from_millis(20),
    });
    let mut stream = TcpStream::connect(proxy.addr()).await?;
    let started = Instant::now();
    assert_eq!(request(&mut stream, 10_000).await?, pattern(10_000));
    // Ten steps of 1000 bytes, each followed by a pause: the last step comes
    // after at least nine.
    assert!(
        started.elapsed() >= Duration::from_millis(180),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn http_status_answers_without_the_target() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let mut idle = TcpStream::connect(proxy.addr()).await?;
    request(&mut idle, 3).await?;
    proxy.set(Fault::HttpStatus(503));
    let get = b"GET /v2/ HTTP/1.1\r\nHost: registry\r\n\r\n";
    let mut new = TcpStream::connect(proxy.addr()).await?;
    for stream in [&mut new, &mut idle] {
        stream.write_all(get).await?;
        let (received, error) = read_all(stream).await;
        assert_eq!(error, None);
        let text = String::from_utf8(received)?;
        assert!(
            text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{text}"
        );
        let body = "fault proxy: injected 503\n";
        assert!(
            text.ends_with(&format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )),
            "{text}"
        );
    }
    assert_eq!(target.accepted.load(Ordering::Relaxed), 1);
    assert_eq!(target.requests.load(Ordering::Relaxed), 1);
    Ok(())
}

#[tokio::test]
async fn cut_resets_open_connections_only() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    request(&mut open, 3).await?;
    proxy.cut();
    let (_, error) = read_all(&mut open).await;
    assert_eq!(error, Some(ErrorKind::ConnectionReset));
    let mut new = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(request(&mut new, 3).await?, pattern(3));
    assert_eq!(proxy.fault(), Fault::Pass);
    Ok(())
}

#[tokio::test]
async fn a_dead_target_resets_the_client() -> Result<()> {
    let target = target().await?;
    let addr = target.addr;
    drop(target);
    let proxy = FaultProxy::start(addr).await?;
    until("the target's port closed", async || {
        TcpStream::connect(addr).await.is_err()
    })
    .await?;
    let mut stream = TcpStream::connect(proxy.addr()).await?;
    let (received, error) = read_all(&mut stream).await;
    assert!(received.is_empty());
    assert_eq!(error, Some(ErrorKind::ConnectionReset));
    Ok(())
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() -> Result<()> {
    let target = target().await?;
    let proxy = FaultProxy::start(target.addr).await?;
    let addr = proxy.addr();
    let mut open = TcpStream::connect(addr).await?;
    request(&mut open, 3).await?;
    drop(proxy);
    let (received, _) = read_all(&mut open).await;
    assert!(received.is_empty());
    until("connecting is refused", async || {
        TcpStream::connect(addr).await.is_err()
    })
    .await
}

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use super::Guarded;
use crate::server::{heads::Pool, lifetime::Activity};

const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_write_nobody_reads_fails_after_the_write_timeout() {
    let (server, _client) = tokio::io::duplex(1024);
    let mut guarded = Guarded::new(
        server,
        Activity::new(Instant::now(), Pool::new(0)),
        WRITE_TIMEOUT,
    );
    let started = Instant::now();
    let error = guarded
        .write_all(&[0; 4096])
        .await
        .expect_err("nobody reads");
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(started.elapsed(), WRITE_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_is_not_cut() {
    let (server, mut client) = tokio::io::duplex(1024);
    let mut guarded = Guarded::new(
        server,
        Activity::new(Instant::now(), Pool::new(0)),
        WRITE_TIMEOUT,
    );
    let reader = tokio::spawn(async move {
        let mut buf = [0; 512];
        let mut read = 0;
        while read < 8192 {
            // Less than the write timeout between reads, far more in all.
            tokio::time::sleep(WRITE_TIMEOUT / 2).await;
            read += client.read(&mut buf).await.expect("read");
        }
    });
    let started = Instant::now();
    guarded.write_all(&[0; 8192]).await.expect("progress");
    assert!(started.elapsed() > WRITE_TIMEOUT * 4);
    reader.await.expect("reader");
}

#[tokio::test(start_paused = true)]
async fn reads_are_recorded() {
    let (server, mut client) = tokio::io::duplex(1024);
    let activity = Activity::new(Instant::now(), Pool::new(0));
    let mut guarded = Guarded::new(server, activity.clone(), WRITE_TIMEOUT);
    assert!(!activity.was_heard());
    client.write_all(b"x").await.expect("write");
    let mut buf = [0; 1];
    guarded.read_exact(&mut buf).await.expect("read");
    assert!(activity.was_heard());
}

#[tokio::test(start_paused = true)]
async fn a_read_the_head_pool_cannot_hold_fails() {
    let (server, mut client) = tokio::io::duplex(64 * 1024);
    let activity = Activity::new(Instant::now(), Pool::new(0));
    let mut guarded = Guarded::new(server, activity, WRITE_TIMEOUT);
    client.write_all(&[b'a'; 9 * 1024]).await.expect("write");
    let mut buf = vec![0; 16 * 1024];
    let mut read = 0;
    let error = loop {
        match guarded.read(&mut buf).await {
            Ok(n) => read += n,
            Err(error) => break error,
        }
    };
    assert!(read <= 8 * 1024, "{read}");
    assert_eq!(error.kind(), std::io::ErrorKind::OutOfMemory);
}

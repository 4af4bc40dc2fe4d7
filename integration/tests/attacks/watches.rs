//! Watches held by a few users (issue 35): ten identities asking 100 watches each under the
//! default limits (`--max-watches` 1,000, `--max-watches-per-user` 100) took every watch
//! slot, and any other user's watch was a 429. With the reserve (the last tenth of
//! `--max-watches` for users holding fewer than 4), they hold 904 and another user's watch
//! is served. Identities are front-proxy headers on the front-proxy certificate, in
//! `system:masters` (no review per watch), straight to the server.

use anyhow::{Result, bail, ensure};
use elemental_changelog_integration::{paths::GROUP_VERSION, registry::Registry, testbed::TestBed};
use reqwest::StatusCode;

/// Identities that hog watches.
const HOGS: usize = 10;
/// Watches each asks for (`--max-watches-per-user`'s default).
const EACH: usize = 100;

async fn watch(client: &reqwest::Client, url: &str, user: &str) -> Result<reqwest::Response> {
    Ok(client
        .get(url)
        .header("X-Remote-User", user)
        .header("X-Remote-Group", "system:masters")
        .send()
        .await?)
}

/// The hogs' watches, then another user's.
pub async fn few_users_cannot_take_every_watch(
    bed: &mut TestBed,
    registry: &Registry,
) -> Result<()> {
    bed.start_server_reading(registry, &[]).await?;
    let url = format!(
        "{}{GROUP_VERSION}/managedosversions?watch=true&timeoutSeconds=600",
        bed.server_url()?
    );
    let mut held = Vec::new();
    let mut refused = 0;
    for hog in 0..HOGS {
        // One client (one HTTP/2 connection, 100 streams at most) per identity.
        let client = bed.server_streaming_http(Some(&bed.pki().front_proxy_client))?;
        let user = format!("hog-{hog}");
        let answers =
            futures::future::join_all((0..EACH).map(|_| watch(&client, &url, &user))).await;
        for answer in answers {
            let answer = answer?;
            match answer.status() {
                StatusCode::OK => held.push(answer),
                StatusCode::TOO_MANY_REQUESTS => {
                    ensure!(
                        answer.headers().get("retry-after").is_some(),
                        "a 429 without Retry-After"
                    );
                    refused += 1;
                }
                other => bail!("{user}'s watch: {other} {}", answer.text().await?),
            }
        }
    }
    ensure!(
        held.len() < HOGS * EACH,
        "{HOGS} users held all their {} watches",
        held.len()
    );
    let client = bed.server_streaming_http(Some(&bed.pki().front_proxy_client))?;
    let other = watch(&client, &url, "newcomer").await?;
    let status = other.status();
    eprintln!(
        "{HOGS} users asking {EACH} watches each under the default --max-watches (1,000): {} held, {refused} refused (429); another user's watch then: {status}",
        held.len()
    );
    ensure!(
        status == StatusCode::OK,
        "another user's watch after {HOGS} users x {EACH}: {status} {}",
        other.text().await?
    );
    drop(held);
    Ok(())
}

//! `make bench`: measures this server side by side with kube-apiserver and
//! nginx on the real test bed and writes `docs/performance.md` (see
//! `elemental_changelog_integration::bench`). `BENCH_QUICK=1` for a short run.

use anyhow::{Context as _, Result};
use elemental_changelog_integration::bench::{self, Settings, report};
use elemental_changelog_integration::registry;

#[tokio::main]
async fn main() -> Result<()> {
    registry::install_crypto_provider();
    let settings = Settings::from_env()?;
    let output = settings.output.clone();
    eprintln!("bench: {settings:?}");
    let results = bench::run(settings).await?;
    let existing = std::fs::read_to_string(&output).unwrap_or_default();
    let document = report::render(&results, report::kept_notes(&existing));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&output, document).with_context(|| format!("writing {}", output.display()))?;
    println!("bench: wrote {}", output.display());
    Ok(())
}

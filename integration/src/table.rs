//! Tables as `kubectl get` prints them, cut at the header's column starts, so
//! empty cells (kubectl prints null as nothing) stay in their column.

use anyhow::{Context as _, Result};

/// The header's column titles and the rows' cells.
pub fn parse(out: &str) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let mut lines = out.lines();
    let header = lines.next().context("no table printed")?;
    let mut starts = Vec::new();
    let mut previous = ' ';
    for (i, c) in header.char_indices() {
        if c != ' ' && previous == ' ' {
            starts.push(i);
        }
        previous = c;
    }
    let cut = |line: &str| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(k, &start)| {
                let end = starts
                    .get(k + 1)
                    .copied()
                    .unwrap_or(line.len())
                    .min(line.len());
                line.get(start.min(end)..end)
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            })
            .collect()
    };
    Ok((cut(header), lines.map(cut).collect()))
}

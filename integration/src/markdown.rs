//! The project's documents as the docs tests read them: a Markdown file with its path, its
//! tables row by row with line numbers (so that a mismatch names the line to fix), its
//! sections by heading and code spans; and the flags a clap `--help` lists.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};

use crate::testbed::workspace_root;

/// A document of the repository, read whole.
#[derive(Clone, Debug)]
pub struct Document {
    /// Its path from the workspace root, as errors name it (`docs/install.md`).
    pub path: String,
    /// Its text.
    pub text: String,
}

/// One row of a Markdown table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Its line, counted from 1.
    pub line: usize,
    /// Its cells, trimmed; `\|` inside a cell is a `|` of the cell.
    pub cells: Vec<String>,
}

/// A Markdown table: its header cells and its rows (the separator line left out).
#[derive(Clone, Debug)]
pub struct Table {
    /// The header's cells.
    pub header: Vec<String>,
    /// The line of the header.
    pub line: usize,
    /// The rows below the separator.
    pub rows: Vec<Row>,
}

impl Document {
    /// Reads `path` (relative to the workspace root).
    pub fn read(path: &str) -> Result<Self> {
        let full = workspace_root().join(path);
        let text = std::fs::read_to_string(&full).with_context(|| format!("{}", full.display()))?;
        Ok(Self {
            path: path.to_owned(),
            text,
        })
    }

    /// `path:line`, where a reader fixes something.
    pub fn at(&self, line: usize) -> String {
        format!("{}:{line}", self.path)
    }

    /// Every table, in order.
    pub fn tables(&self) -> Vec<Table> {
        self.tables_in(1..=usize::MAX)
    }

    /// The tables whose header is `header` (cells as written, e.g. `["flag", "environment"]`
    /// matches a table whose header starts with those cells).
    pub fn tables_with_header(&self, header: &[&str]) -> Vec<Table> {
        self.tables()
            .into_iter()
            .filter(|t| {
                t.header.len() >= header.len() && header.iter().zip(&t.header).all(|(a, b)| a == b)
            })
            .collect()
    }

    /// The lines of the section under the heading line `heading` (as written, e.g.
    /// `#### \`inspect\``) up to the next heading of the same or a higher level.
    pub fn section(&self, heading: &str) -> Result<std::ops::RangeInclusive<usize>> {
        let level = heading.chars().take_while(|c| *c == '#').count();
        let mut lines = self.text.lines().enumerate();
        let (start, _) = lines
            .find(|(_, line)| line.trim_end() == heading)
            .with_context(|| format!("{} has no heading {heading:?}", self.path))?;
        let mut in_code = false;
        for (at, line) in lines {
            if line.starts_with("```") {
                in_code = !in_code;
            }
            let hashes = line.chars().take_while(|c| *c == '#').count();
            if !in_code && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
                return Ok(start + 1..=at);
            }
        }
        Ok(start + 1..=self.text.lines().count())
    }

    /// The tables whose header lies within `lines` (1-based).
    pub fn tables_in(&self, lines: std::ops::RangeInclusive<usize>) -> Vec<Table> {
        let mut tables: Vec<Table> = Vec::new();
        let mut current: Option<Table> = None;
        for (index, line) in self.text.lines().enumerate() {
            let number = index + 1;
            if !line.starts_with('|') {
                if let Some(table) = current.take() {
                    tables.push(table);
                }
                continue;
            }
            if line.starts_with("|---") || line.starts_with("| ---") {
                continue;
            }
            let cells = cells(line);
            match &mut current {
                Some(table) => table.rows.push(Row {
                    line: number,
                    cells,
                }),
                None if lines.contains(&number) => {
                    current = Some(Table {
                        header: cells,
                        line: number,
                        rows: Vec::new(),
                    })
                }
                None => {}
            }
        }
        tables.extend(current);
        tables
    }

    /// The code blocks fenced with ```` ```lang ````, each with the line of its first line.
    pub fn code_blocks(&self, lang: &str) -> Vec<(usize, Vec<String>)> {
        let mut blocks = Vec::new();
        let mut current: Option<(usize, Vec<String>)> = None;
        let fence = format!("```{lang}");
        for (index, line) in self.text.lines().enumerate() {
            match &mut current {
                Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
                Some((_, lines)) => lines.push(line.to_owned()),
                None if line.trim_end() == fence => current = Some((index + 2, Vec::new())),
                None => {}
            }
        }
        blocks
    }
}

/// The cells of one table line.
fn cells(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = line.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells
}

/// The text of the first code span of a cell, if the cell starts with one.
pub fn leading_code(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?.split('`').next()
}

/// The code spans of a cell.
pub fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// One flag as a clap `--help` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flag {
    /// Its short form (`-n`), if any.
    pub short: Option<String>,
    /// Its environment variable.
    pub env: Option<String>,
    /// Its default, as shown.
    pub default: Option<String>,
    /// The values `Possible values:` lists.
    pub values: Vec<String>,
}

/// The flags of a clap `--help`, short or long form (`[env: NAME=]` and `[default: VALUE]`
/// on the flag's line or the lines below it), `--help` and clap's `-V, --version` left out.
pub fn help_flags(help: &str) -> BTreeMap<String, Flag> {
    let mut flags: BTreeMap<String, Flag> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_values = false;
    for line in help.lines() {
        let trimmed = line.trim();
        let is_flag_line = (line.starts_with("      --") || line.starts_with("  -"))
            && !line.starts_with("          ");
        if is_flag_line {
            let mut words = trimmed.split_whitespace();
            let first = words.next().unwrap_or_default().trim_end_matches(',');
            let (short, long) = if first.starts_with("--") {
                (None, first.to_owned())
            } else {
                (
                    Some(first.to_owned()),
                    words.next().unwrap_or(first).to_owned(),
                )
            };
            flags.insert(
                long.clone(),
                Flag {
                    short,
                    ..Flag::default()
                },
            );
            current = Some(long);
            in_values = false;
        } else if !line.is_empty() && !line.starts_with(' ') {
            current = None;
        }
        let Some(name) = &current else { continue };
        let Some(flag) = flags.get_mut(name) else {
            continue;
        };
        if let Some(at) = trimmed.find("[env: ") {
            flag.env = trimmed[at + 6..].split('=').next().map(str::to_owned);
        }
        if let Some(at) = trimmed.find("[default: ") {
            flag.default = trimmed[at + 10..].split(']').next().map(str::to_owned);
        }
        if trimmed.starts_with("Possible values:") {
            in_values = true;
        } else if in_values {
            match trimmed.strip_prefix("- ") {
                Some(value) => flag.values.push(
                    value
                        .split(':')
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                ),
                None if trimmed.is_empty() || trimmed.starts_with('[') => {}
                None => in_values = false,
            }
        }
    }
    flags.remove("--help");
    // clap's own `-V, --version`; a program's `--version` flag of its own stays.
    if flags
        .get("--version")
        .is_some_and(|f| f.short.as_deref() == Some("-V"))
    {
        flags.remove("--version");
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_sections_and_flags_are_read_with_their_lines() {
        let document = Document {
            path: "docs/x.md".into(),
            text: "# X\n\n## A\n\n| a | b |\n|---|---|\n| `x` | y \\| z |\n\n## B\n\n| c |\n|---|\n| 1 |\n"
                .into(),
        };
        let tables = document.tables();
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[0].rows[0].line, 7);
        assert_eq!(tables[0].rows[0].cells, vec!["`x`", "y | z"]);
        let b = document.section("## B").unwrap();
        let in_b = document.tables_in(b);
        assert_eq!(in_b.len(), 1);
        assert_eq!(in_b[0].header, vec!["c"]);
        assert_eq!(document.at(13), "docs/x.md:13");

        let help = "Usage: x\n\nOptions:\n      --dir <DIR>\n          The folder [env: X_DIR=]\n      --port <PORT>  HTTP port [env: X_PORT=] [default: 8080]\n  -o, --output <OUTPUT>\n          Output\n\n          Possible values:\n          - text: Text\n          - json: JSON\n\n          [default: text]\n  -h, --help\n          Print help\n";
        let flags = help_flags(help);
        assert_eq!(flags.len(), 3, "{flags:?}");
        assert_eq!(flags["--dir"].env.as_deref(), Some("X_DIR"));
        assert_eq!(flags["--port"].default.as_deref(), Some("8080"));
        assert_eq!(flags["--output"].short.as_deref(), Some("-o"));
        assert_eq!(flags["--output"].values, vec!["text", "json"]);
        assert_eq!(flags["--output"].default.as_deref(), Some("text"));
    }
}

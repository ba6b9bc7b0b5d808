//! Where a config value came from (a line of the file, or a `--set`), so that every config
//! error names the key and the place to fix it.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// A table of the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Section {
    Run,
    Axes,
    Report,
    /// The i-th `[[zip]]` group, counted from 0 in file order.
    Zip(usize),
    Model,
    Plugins,
    Python,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Run => f.write_str("run"),
            Section::Axes => f.write_str("axes"),
            Section::Report => f.write_str("report"),
            Section::Zip(i) => write!(f, "zip[{i}]"),
            Section::Model => f.write_str("model"),
            Section::Plugins => f.write_str("plugins"),
            Section::Python => f.write_str("python"),
        }
    }
}

/// The file text plus the key paths (`axes.seq_len`, `run.seed`, `zip[0].batch`) that
/// `--set` replaced, whose file lines would be misleading.
pub(super) struct Source<'a> {
    pub path: &'a Path,
    pub text: &'a str,
    pub overridden: BTreeSet<String>,
}

impl Source<'_> {
    /// `Error::Config` for `section.key`, e.g. "axes.seq_len (line 7): expected ...".
    pub fn err(&self, section: Section, key: &str, msg: impl fmt::Display) -> Error {
        let name = format!("{section}.{key}");
        let place = if self.overridden.contains(&name) {
            " (from --set)".to_string()
        } else {
            find_line(self.text, section, Some(key))
                .map_or_else(String::new, |l| format!(" (line {l})"))
        };
        self.config_err(format!("{name}{place}: {msg}"))
    }

    /// `Error::Config` about a whole table, e.g. "zip[1] (line 20): lists of different lengths".
    pub fn section_err(&self, section: Section, msg: impl fmt::Display) -> Error {
        let place = find_line(self.text, section, None)
            .map_or_else(String::new, |l| format!(" (line {l})"));
        self.config_err(format!("{section}{place}: {msg}"))
    }

    /// A file a config names (a paper table, a plugin library): `path` as given from the
    /// current directory (configs name repository paths, run from its root), else beside
    /// the config file.
    pub fn locate(&self, path: &Path) -> Option<PathBuf> {
        if path.is_absolute() || path.exists() {
            return path.exists().then(|| path.to_path_buf());
        }
        let beside = self.path.parent()?.join(path);
        beside.exists().then_some(beside)
    }

    pub fn config_err(&self, msg: String) -> Error {
        Error::Config {
            path: self.path.to_path_buf(),
            msg,
        }
    }

    /// A toml parse/schema error keeps toml's own text (line, column, the offending line and,
    /// for unknown keys, the known ones); the enclosing table is named in front.
    pub fn toml_err(&self, e: &toml::de::Error) -> Error {
        let text = e.to_string();
        let table = e
            .span()
            .and_then(|span| table_at(self.text, span.start))
            .map_or_else(String::new, |t| format!("in [{t}]: "));
        self.config_err(format!("{table}{}", text.trim_end()))
    }
}

/// The table header (`run`, `axes`, `zip`) in force at byte `offset`, if any; None when
/// `offset` is on a header line itself (an unknown table is a top-level key).
fn table_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    if header(line).is_some() {
        return None;
    }
    before
        .lines()
        .rev()
        .find_map(|l| header(l).map(|(name, _)| name.to_string()))
}

/// `[name]` or `[[name]]` on this line: the name and whether it is an array of tables.
fn header(line: &str) -> Option<(&str, bool)> {
    let t = line.trim();
    let t = t.split_once('#').map_or(t, |(h, _)| h).trim_end();
    if let Some(inner) = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
        return Some((inner.trim(), true));
    }
    t.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .map(|inner| (inner.trim(), false))
}

/// 1-based line of `key = ...` inside `section` (or of the section header when `key` is
/// None). A heuristic over the text: keys written as dotted keys or inside inline tables
/// are not found, and then the message simply has no line.
pub(super) fn find_line(text: &str, section: Section, key: Option<&str>) -> Option<usize> {
    let mut current: Option<Section> = None;
    let mut zips = 0;
    for (i, line) in text.lines().enumerate() {
        if let Some((name, array)) = header(line) {
            current = match (name, array) {
                ("run", false) => Some(Section::Run),
                ("axes", false) => Some(Section::Axes),
                ("report", false) => Some(Section::Report),
                ("model", false) => Some(Section::Model),
                ("plugins", false) => Some(Section::Plugins),
                ("python", false) => Some(Section::Python),
                ("zip", true) => {
                    zips += 1;
                    Some(Section::Zip(zips - 1))
                }
                _ => None,
            };
            if key.is_none() && current == Some(section) {
                return Some(i + 1);
            }
            continue;
        }
        let (Some(key), true) = (key, current == Some(section)) else {
            continue;
        };
        let t = line.trim_start();
        let quoted = format!("\"{key}\"");
        let rest = t
            .strip_prefix(quoted.as_str())
            .or_else(|| t.strip_prefix(key));
        if rest.is_some_and(|r| r.trim_start().starts_with('=')) {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[run]\nname = \"x\"\n\n[axes]\nseq_len_x = 1\nseq_len = 0\n\n[[zip]]\nbatch = [1]\n[[zip]] # second\n batch = [2]\n";

    #[test]
    fn finds_key_lines_per_table() {
        assert_eq!(find_line(TEXT, Section::Run, Some("name")), Some(2));
        assert_eq!(find_line(TEXT, Section::Axes, Some("seq_len")), Some(6));
        assert_eq!(find_line(TEXT, Section::Zip(0), Some("batch")), Some(9));
        assert_eq!(find_line(TEXT, Section::Zip(1), Some("batch")), Some(11));
        assert_eq!(find_line(TEXT, Section::Zip(1), None), Some(10));
        assert_eq!(find_line(TEXT, Section::Axes, Some("batch")), None);
        assert_eq!(
            table_at(TEXT, TEXT.find("seq_len").unwrap()),
            Some("axes".into())
        );
    }
}

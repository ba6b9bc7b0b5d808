//! A paper's published table as data: a CSV file in the repository (`configs/papers/`),
//! `#` comment lines citing the source, then a header whose first cell is the table's id and
//! whose other cells are sequence lengths, then one row per quantity with the cells exactly
//! as printed (`160KB`, `OOM`, `0.15ms`, `+2%`, `-`). The sweep embeds the parsed table in
//! `meta.json`, so a report needs nothing but the results directory.

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::error::{Error, Result};

/// One published table: `cells[row][column]` is the text printed for `rows[row]` at
/// sequence length `columns[column]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaperTable {
    /// The layout this table has (e.g. `rabe_staats_table2`): the report joins it with our
    /// rows by the layout's rules, or shows it as printed when it does not know the id.
    pub id: String,
    /// The comment lines, without `#`: the citation.
    pub source: Vec<String>,
    /// Sequence lengths, one per column.
    pub columns: Vec<usize>,
    pub rows: Vec<PaperRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaperRow {
    pub key: String,
    pub cells: Vec<String>,
}

/// Bytes of a MiB: what `Cell::parse` reads "MB" as.
pub const MIB: f64 = (1u64 << 20) as f64;

/// Bytes of one printed size unit, the one table of them: binary ("KB" is KiB, "GB" GiB),
/// except that "MB" is `mb` bytes, since a paper's "MB" may not be a MiB (Rabe & Staats
/// Table 3 prints a thousandth of a GiB as "MB"). `None`: not a size unit.
pub fn unit_bytes(unit: &str, mb: f64) -> Option<f64> {
    let binary = |shift: u32| Some((1u64 << shift) as f64);
    match unit {
        "B" => binary(0),
        "KB" | "KiB" => binary(10),
        "MB" => Some(mb),
        "MiB" => binary(20),
        "GB" | "GiB" => binary(30),
        "TB" | "TiB" => binary(40),
        _ => None,
    }
}

/// A printed cell, read. Sizes are read by `unit_bytes` with "MB" a MiB (Rabe & Staats
/// Table 2's inputs+outputs, 640·n bytes, fits every cell that way; Table 3 prints a
/// thousandth of a GiB as "MB", which `report::checks` reads where it matters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell {
    Bytes(f64),
    Seconds(f64),
    /// A relative figure: "+2%" is 0.02.
    Fraction(f64),
    Oom,
    /// "-" or empty: not given.
    Missing,
    /// Anything else.
    Text,
}

impl Cell {
    pub fn parse(text: &str) -> Cell {
        let t = text.trim();
        if t.is_empty() || t == "-" || t == "–" {
            return Cell::Missing;
        }
        if t.eq_ignore_ascii_case("oom") {
            return Cell::Oom;
        }
        if let Some(p) = t.strip_suffix('%') {
            let p = p.replace('−', "-");
            return p
                .trim()
                .parse::<f64>()
                .map_or(Cell::Text, |x| Cell::Fraction(x / 100.0));
        }
        let Some(Printed { value: x, unit, .. }) = Printed::read(t) else {
            return Cell::Text;
        };
        if let Some(b) = unit_bytes(unit, MIB) {
            return Cell::Bytes(x * b);
        }
        match unit {
            "us" | "µs" => Cell::Seconds(x * 1e-6),
            "ms" => Cell::Seconds(x * 1e-3),
            "s" => Cell::Seconds(x),
            _ => Cell::Text,
        }
    }
}

/// A printed number and its unit, as the paper wrote them: "2.9MB" is 2.9, 1 decimal, "MB".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Printed<'a> {
    pub value: f64,
    /// Digits after the decimal point: the precision the paper printed.
    pub decimals: usize,
    pub unit: &'a str,
}

impl<'a> Printed<'a> {
    pub fn read(text: &'a str) -> Option<Printed<'a>> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value = num.parse::<f64>().ok()?;
        let decimals = num.split_once('.').map_or(0, |(_, f)| f.len());
        Some(Printed {
            value,
            decimals,
            unit: unit.trim(),
        })
    }

    /// Whether `x` (in this cell's unit) rounds to the printed value at its precision.
    pub fn rounds_from(&self, x: f64) -> bool {
        let scale = 10f64.powi(self.decimals as i32);
        ((x * scale).round() - self.value * scale).abs() < 1e-6
    }
}

impl PaperTable {
    /// Reads and checks a paper table file (errors name the file and the line).
    pub fn read(path: &Path) -> Result<PaperTable> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Input {
            path: path.to_path_buf(),
            msg: format!("cannot read the paper table: {e}"),
        })?;
        PaperTable::parse(&text).map_err(|msg| Error::Input {
            path: path.to_path_buf(),
            msg,
        })
    }

    pub fn parse(text: &str) -> Result<PaperTable, String> {
        let source: Vec<String> = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix('#'))
            .map(|l| l.trim().to_string())
            .collect();
        let mut r = ::csv::ReaderBuilder::new()
            .comment(Some(b'#'))
            .flexible(false)
            .from_reader(text.as_bytes());
        let header = r
            .headers()
            .map_err(|e| format!("reading the header: {e}"))?
            .clone();
        let mut cells = header.iter();
        let id = cells
            .next()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .ok_or("the header must start with the table id, e.g. `rabe_staats_table2,256,1024`")?;
        let columns = cells
            .map(|c| {
                c.trim().parse::<usize>().map_err(|_| {
                    format!("header cell `{c}`: expected a sequence length (an integer)")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if columns.is_empty() {
            return Err("the header has no sequence-length columns".into());
        }
        let mut rows = Vec::new();
        for rec in r.records() {
            let rec = rec.map_err(|e| e.to_string())?;
            let line = rec.position().map_or(0, |p| p.line());
            let mut it = rec.iter();
            let key = it.next().unwrap_or("").trim().to_string();
            if key.is_empty() {
                return Err(format!("line {line}: the first cell must name the row"));
            }
            rows.push(PaperRow {
                key,
                cells: it.map(|c| c.trim().to_string()).collect(),
            });
        }
        if rows.is_empty() {
            return Err("no rows after the header".into());
        }
        Ok(PaperTable {
            id,
            source,
            columns,
            rows,
        })
    }

    /// The printed cells of row `key`, if the table has it.
    pub fn row(&self, key: &str) -> Option<&[String]> {
        self.rows
            .iter()
            .find(|r| r.key == key)
            .map(|r| r.cells.as_slice())
    }

    /// The printed cell of row `key` at sequence length `n`.
    pub fn cell(&self, key: &str, n: usize) -> Option<&str> {
        let col = self.columns.iter().position(|&c| c == n)?;
        self.row(key)?.get(col).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_numbers_keep_their_precision() {
        let p = Printed::read("2.9MB").unwrap();
        assert_eq!((p.value, p.decimals, p.unit), (2.9, 1, "MB"));
        assert!(p.rounds_from(2.9296875) && p.rounds_from(2.85) && !p.rounds_from(3.0));
        let p = Printed::read(" 188MB").unwrap();
        assert_eq!((p.decimals, p.unit), (0, "MB"));
        assert!(p.rounds_from(187.5) && !p.rounds_from(187.4));
        assert_eq!(Printed::read("OOM"), None);
    }

    #[test]
    fn cells_parse_in_the_papers_units() {
        assert_eq!(Cell::parse("160KB"), Cell::Bytes(160.0 * 1024.0));
        assert_eq!(Cell::parse("2.5MB"), Cell::Bytes(2.5 * 1048576.0));
        assert_eq!(Cell::parse("1GB"), Cell::Bytes(1073741824.0));
        assert_eq!(Cell::parse("3MiB"), Cell::Bytes(3.0 * 1048576.0));
        assert_eq!(Cell::parse("2TB"), Cell::Bytes(2.0 * (1u64 << 40) as f64));
        assert_eq!(Cell::parse("OOM"), Cell::Oom);
        assert_eq!(Cell::parse("0.15ms"), Cell::Seconds(0.15e-3));
        assert_eq!(Cell::parse("95.2s"), Cell::Seconds(95.2));
        assert_eq!(Cell::parse("+2%"), Cell::Fraction(0.02));
        assert_eq!(Cell::parse("−8%"), Cell::Fraction(-0.08));
        assert_eq!(Cell::parse("-"), Cell::Missing);
        assert_eq!(Cell::parse("soon"), Cell::Text);
    }

    #[test]
    fn only_mb_reads_as_given() {
        let thousandth = (1u64 << 30) as f64 / 1000.0;
        assert_eq!(unit_bytes("MB", thousandth), Some(thousandth));
        assert_eq!(unit_bytes("MB", MIB), Some(MIB));
        assert_eq!(unit_bytes("MiB", thousandth), Some(MIB));
        assert_eq!(unit_bytes("KB", thousandth), Some(1024.0));
        assert_eq!(unit_bytes("GB", thousandth), Some(1073741824.0));
        assert_eq!(unit_bytes("ms", MIB), None);
    }

    #[test]
    fn table_parses_with_comments_and_rejects_bad_headers() {
        let t = PaperTable::parse("# cite\n# more\nt2,256,1024\nio,160KB,640KB\nstd,270KB,OOM\n")
            .unwrap();
        assert_eq!(t.id, "t2");
        assert_eq!(t.source, ["cite", "more"]);
        assert_eq!(t.columns, [256, 1024]);
        assert_eq!(t.cell("std", 1024), Some("OOM"));
        assert_eq!(t.cell("std", 2048), None);
        assert!(PaperTable::parse("t2,256,big\nio,1,2\n")
            .unwrap_err()
            .contains("big"));
        assert!(PaperTable::parse("t2,256\n")
            .unwrap_err()
            .contains("no rows"));
        assert!(PaperTable::parse("t2,256,1024\nio,1\n").is_err());
    }
}

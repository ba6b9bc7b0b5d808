//! The docs stay in step with the binary: docs/reference/variants.md has every variant that
//! `attnbench list` prints and no other, and its first table is what `list` prints (name,
//! description, modes, default chunks, source), in the same order.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// One variant as `attnbench list` prints it (and as the doc's first table holds it).
#[derive(Debug, PartialEq, Eq)]
struct Listed {
    name: String,
    description: String,
    modes: String,
    q_chunk: String,
    kv_chunk: String,
    source: String,
}

/// The variants section of `attnbench list`: two lines per variant,
/// `  NAME  DESCRIPTION` and `  ...  modes: M; default q_chunk Q, kv_chunk K; source: S`.
fn listed() -> Vec<Listed> {
    let out = Command::new(env!("CARGO_BIN_EXE_attnbench"))
        .arg("list")
        .output()
        .expect("attnbench list runs");
    assert!(out.status.success(), "attnbench list failed: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text
        .lines()
        .skip_while(|l| *l != "variants:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty());
    let mut variants = Vec::new();
    while let Some(first) = lines.next() {
        let second = lines.next().expect("each variant has a second line");
        let (name, description) = first
            .trim()
            .split_once(char::is_whitespace)
            .expect("name and description");
        let rest = second
            .trim()
            .strip_prefix("modes: ")
            .unwrap_or_else(|| panic!("no modes in `{second}`"));
        let (modes, rest) = rest.split_once("; default q_chunk ").expect("q_chunk");
        let (q_chunk, rest) = rest.split_once(", kv_chunk ").expect("kv_chunk");
        let (kv_chunk, source) = rest.split_once("; source: ").expect("source");
        variants.push(Listed {
            name: name.to_string(),
            description: description.trim().to_string(),
            modes: modes.to_string(),
            q_chunk: q_chunk.to_string(),
            kv_chunk: kv_chunk.to_string(),
            source: source.to_string(),
        });
    }
    assert!(!variants.is_empty(), "no variants in:\n{text}");
    variants
}

/// The cells of one Markdown table row, with `\|` and `\*` unescaped.
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    inner
        .replace("\\|", "\u{0}")
        .split('|')
        .map(|c| c.trim().replace('\u{0}', "|").replace("\\*", "*"))
        .collect()
}

/// Every Markdown table of `text` whose header's first cell is `variant`: its header and its
/// data rows (the separator row dropped).
fn variant_tables(text: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let mut tables = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with('|') {
            continue;
        }
        let header = cells(line);
        let mut rows = Vec::new();
        while let Some(next) = lines.next_if(|l| l.starts_with('|')) {
            rows.push(cells(next));
        }
        if header.first().map(String::as_str) == Some("variant") {
            rows.retain(|r| !r.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')));
            tables.push((header, rows));
        }
    }
    tables
}

fn unquote(cell: &str) -> String {
    cell.trim_matches('`').to_string()
}

#[test]
fn variants_doc_matches_attnbench_list() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/variants.md");
    let doc = std::fs::read_to_string(&path).expect("docs/reference/variants.md");
    let listed = listed();
    let names: BTreeSet<&str> = listed.iter().map(|v| v.name.as_str()).collect();

    let tables = variant_tables(&doc);
    assert!(
        tables.len() >= 2,
        "{}: expected the table as `attnbench list` prints it and the algorithms table",
        path.display()
    );
    for (header, rows) in &tables {
        let in_doc: Vec<String> = rows.iter().map(|r| unquote(&r[0])).collect();
        let doc_names: BTreeSet<&str> = in_doc.iter().map(String::as_str).collect();
        assert_eq!(
            doc_names.len(),
            in_doc.len(),
            "{}: a variant appears twice in the table headed {header:?}",
            path.display()
        );
        for name in &names {
            assert!(
                doc_names.contains(name),
                "{}: `{name}` (printed by `attnbench list`) is missing from the table headed {header:?}",
                path.display()
            );
        }
        for name in &doc_names {
            assert!(
                names.contains(name),
                "{}: `{name}` is in the table headed {header:?} but `attnbench list` does not print it",
                path.display()
            );
        }
    }

    // The first table is `attnbench list` itself, row for row.
    let (header, rows) = &tables[0];
    assert_eq!(
        header,
        &[
            "variant",
            "description",
            "modes",
            "default q_chunk",
            "default kv_chunk",
            "source"
        ],
        "{}: the first variants table's columns",
        path.display()
    );
    let documented: Vec<Listed> = rows
        .iter()
        .map(|r| {
            assert_eq!(r.len(), 6, "{}: row {r:?}", path.display());
            Listed {
                name: unquote(&r[0]),
                description: r[1].clone(),
                modes: r[2].clone(),
                q_chunk: r[3].clone(),
                kv_chunk: r[4].clone(),
                source: r[5].clone(),
            }
        })
        .collect();
    for (doc_row, bin_row) in documented.iter().zip(&listed) {
        assert_eq!(
            doc_row,
            bin_row,
            "{} disagrees with `attnbench list` (regenerate the row from its output)",
            path.display()
        );
    }
    assert_eq!(documented.len(), listed.len());
}

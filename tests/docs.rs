//! The docs stay in step with the binary: docs/reference/variants.md has every variant that
//! `attnbench list` prints and no other, and its first table is what `list` prints (name,
//! description, modes, default chunks, source), in the same order; every segment of the case
//! ids of every config in configs/ is documented in docs/reference/results-format.md.

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

/// A part of a documented `case_id` segment: text as written, or a `{column}` value (one or
/// more characters).
#[derive(Debug)]
enum Part {
    Text(String),
    Value,
}

/// One row of the `case_id` table: its position (`None` for an optional `+` segment), its
/// form as written, the form's parts, and the example.
#[derive(Debug)]
struct Segment {
    position: Option<usize>,
    form: String,
    parts: Vec<Part>,
    example: String,
}

fn parts(form: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut rest = form;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('{') {
            let end = after
                .find('}')
                .unwrap_or_else(|| panic!("unclosed `{{` in `{form}`"));
            parts.push(Part::Value);
            rest = &after[end + 1..];
        } else {
            let end = rest.find('{').unwrap_or(rest.len());
            parts.push(Part::Text(rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    parts
}

/// Whether `s` is `parts` with each value one or more characters.
fn fits(parts: &[Part], s: &str) -> bool {
    match parts.split_first() {
        None => s.is_empty(),
        Some((Part::Text(t), rest)) => s.strip_prefix(t.as_str()).is_some_and(|s| fits(rest, s)),
        Some((Part::Value, rest)) => s
            .char_indices()
            .skip(1)
            .map(|(i, _)| i)
            .chain([s.len()])
            .filter(|&i| i > 0)
            .any(|i| fits(rest, &s[i..])),
    }
}

/// The `case_id` section of results-format.md: the rows of its segment table.
fn documented_segments() -> Vec<Segment> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/results-format.md");
    let doc = std::fs::read_to_string(&path).expect("docs/reference/results-format.md");
    let section: Vec<&str> = doc
        .lines()
        .skip_while(|l| *l != "### `case_id`")
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .collect();
    assert!(
        !section.is_empty(),
        "{}: no section ### `case_id`",
        path.display()
    );
    let rows: Vec<Vec<String>> = section
        .iter()
        .filter(|l| l.starts_with('|'))
        .map(|l| cells(l))
        .collect();
    assert_eq!(
        rows.first().map(|h| &h[..2]),
        Some(&["#".to_string(), "segment".to_string()][..])
    );
    let segments: Vec<Segment> = rows[2..]
        .iter()
        .map(|r| {
            let form = unquote(&r[1]);
            Segment {
                position: (r[0] != "+").then(|| r[0].parse().expect("a position or +")),
                parts: parts(&form),
                form,
                example: unquote(&r[3]),
            }
        })
        .collect();
    let fixed = segments.iter().take_while(|s| s.position.is_some()).count();
    for (i, s) in segments.iter().enumerate() {
        if i < fixed {
            assert_eq!(
                s.position,
                Some(i + 1),
                "`{}`: positions run 1, 2, ...",
                s.form
            );
        } else {
            assert!(
                s.position.is_none(),
                "`{}`: numbered after a `+` segment",
                s.form
            );
            // An optional segment is told apart by its leading text.
            assert!(
                matches!(s.parts.first(), Some(Part::Text(_))),
                "`{}`",
                s.form
            );
        }
        assert!(
            fits(&s.parts, &s.example),
            "example `{}` is not `{}`",
            s.example,
            s.form
        );
    }
    segments
}

/// The case ids of every config in configs/, from `sweep --dry-run --json` (a config whose
/// plugin library is not built here is left out: it cannot be expanded).
fn config_case_ids() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut configs: Vec<_> = std::fs::read_dir(root.join("configs"))
        .expect("configs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    configs.sort();
    let mut ids = Vec::new();
    for config in &configs {
        let out = Command::new(env!("CARGO_BIN_EXE_attnbench"))
            .args(["sweep", "--dry-run", "--json", "--config"])
            .arg(config)
            .current_dir(root)
            .output()
            .expect("attnbench sweep --dry-run runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            assert!(
                stderr.contains("plugins.") && stderr.contains("not found"),
                "{}: {stderr}",
                config.display()
            );
            eprintln!("left out (plugin not built): {}", config.display());
            continue;
        }
        let text = String::from_utf8(out.stdout).expect("utf-8");
        for line in text.lines().skip(1) {
            let case: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            ids.push(case["case_id"].as_str().expect("case_id").to_string());
        }
    }
    ids
}

/// Every segment of every case id the configs make is a documented one: the numbered ones in
/// their places, then only `+` segments, in the table's order. So an id that gains a segment
/// fails here until results-format.md documents it; and each documented segment occurs.
#[test]
fn case_id_segments_are_documented() {
    let segments = documented_segments();
    let fixed: Vec<&Segment> = segments.iter().filter(|s| s.position.is_some()).collect();
    let optional: Vec<&Segment> = segments.iter().filter(|s| s.position.is_none()).collect();
    let ids = config_case_ids();
    assert!(ids.len() > 1000, "only {} ids", ids.len());
    let mut seen = vec![false; segments.len()];
    for id in &ids {
        let parts: Vec<&str> = id.split('|').collect();
        assert!(
            parts.len() >= fixed.len(),
            "`{id}` has fewer than {} segments",
            fixed.len()
        );
        for (i, (part, seg)) in parts.iter().zip(&fixed).enumerate() {
            assert!(
                fits(&seg.parts, part),
                "segment {} `{part}` of `{id}` is not the documented `{}`",
                i + 1,
                seg.form
            );
            seen[i] = true;
        }
        let mut next = 0;
        for part in &parts[fixed.len()..] {
            let k = (next..optional.len())
                .find(|&k| fits(&optional[k].parts, part))
                .unwrap_or_else(|| {
                    panic!(
                        "segment `{part}` of `{id}` is not documented (in this order) in \
                         docs/reference/results-format.md#case_id"
                    )
                });
            seen[fixed.len() + k] = true;
            next = k + 1;
        }
    }
    for (s, seen) in segments.iter().zip(seen) {
        assert!(
            seen,
            "`{}` is documented but no config's case id has it",
            s.form
        );
    }
}

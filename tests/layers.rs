//! The layer rule: the imports between top-level modules of `src/` stay within the table of
//! docs/internals/architecture.md ("Layers"), and that table has no cycle. Reads each file's
//! `crate::` paths as text (comments and test code left out: tests may import anything), so a
//! back-edge or a new module fails here, not in review. The checker is tested on a fixture
//! with a known back-edge (tests/fixtures/layers/).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The allowed imports: the rows `| `module` | `a`, `b` |` of the first Markdown table in
/// `text` whose header is "module | may import".
fn parse_table(text: &str) -> Graph {
    let mut graph = Graph::new();
    let mut in_table = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("| module | may import") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 2 || cells[0].starts_with("---") {
            continue;
        }
        let names = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let module = names(cells[0]).pop().expect("a module name in backticks");
        graph.insert(module, names(cells[1]).into_iter().collect());
    }
    graph
}

/// The top-level module a file belongs to: `src/x.rs` and `src/x/...` are `x`.
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under the root");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_string()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("readable")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file that ships: without its test module (a `tests.rs` file, or what
/// follows `#[cfg(test)]` before `mod tests`) and without comment lines.
fn shipped_code(file: &Path) -> String {
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    let text = fs::read_to_string(file).expect("readable");
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::name` and `crate::{a::.., b}` in `code`.
fn imported_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The names at depth 1 of the brace group.
            let mut depth = 1;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if depth == 1 && start && (c.is_ascii_alphabetic() || c == '_') => {
                        found.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// The imports between top-level modules of the crate rooted at `root` (lib.rs and main.rs,
/// the crate's roots, left out): module -> (imported module -> first file that does it).
fn code_graph(root: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for f in files {
        let module = module_of(root, &f);
        if module == "lib" || module == "main" {
            continue;
        }
        let entry = graph.entry(module.clone()).or_default();
        for m in imported_modules(&shipped_code(&f)) {
            if m != module {
                entry.entry(m).or_insert_with(|| f.clone());
            }
        }
    }
    graph
}

/// Everything wrong with `root` against `table`: imports the table does not allow, modules
/// it does not list, and cycles in the table itself.
fn violations(root: &Path, table: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (module, imports) in code_graph(root) {
        let Some(allowed) = table.get(&module) else {
            out.push(format!(
                "module `{module}` is not in the layer table (docs/internals/architecture.md)"
            ));
            continue;
        };
        for (m, file) in imports {
            if !allowed.contains(&m) {
                out.push(format!(
                    "`{module}` imports `{m}` ({}), which the layer table does not allow",
                    file.display()
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(table) {
        out.push(format!(
            "the layer table has a cycle: {}",
            cycle.join(" -> ")
        ));
    }
    out
}

/// A cycle of `graph` as the modules along it, if there is one (depth-first search).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_code_keeps_to_the_layer_table() {
    let doc = fs::read_to_string(manifest().join("docs/internals/architecture.md"))
        .expect("docs/internals/architecture.md");
    let table = parse_table(&doc);
    assert!(
        table.len() > 10,
        "the layer table was not found or is short: {table:?}"
    );
    let problems = violations(&manifest().join("src"), &table);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_finds_a_back_edge_and_a_cycle() {
    let fixture = manifest().join("tests/fixtures/layers");
    let table = parse_table(&fs::read_to_string(fixture.join("table.md")).unwrap());
    assert_eq!(table.len(), 3, "{table:?}");
    let problems = violations(&fixture.join("src"), &table);
    // `low` reaches `high` inside a brace group; the doc comment and the test module of
    // `high` name modules too, and must not count.
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("`low` imports `high`"),
        "{problems:?}"
    );
    // Allowing the back-edge in the table makes a cycle, which is itself a violation.
    let mut cyclic = table.clone();
    cyclic.get_mut("low").unwrap().insert("high".into());
    let problems = violations(&fixture.join("src"), &cyclic);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("cycle"), "{problems:?}");
    assert!(
        problems[0].contains("low") && problems[0].contains("high"),
        "{problems:?}"
    );
    // A module the table does not list.
    let mut partial = table;
    partial.remove("base");
    let problems = violations(&fixture.join("src"), &partial);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`base` is not in the layer table")),
        "{problems:?}"
    );
}

#[test]
fn brace_groups_and_paths_are_read() {
    let code = "use crate::a::b;\nuse crate::{c::d, e, f::{g, h}};\nlet x = crate::i::j();";
    let found: Vec<String> = imported_modules(code).into_iter().collect();
    assert_eq!(found, ["a", "c", "e", "f", "i"]);
}

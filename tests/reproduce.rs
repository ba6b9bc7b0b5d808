//! `attnbench reproduce`: the tables it runs, the claims it judges from rows alone
//! (`--report-only` on the committed results/papers/), and exit 3 when a claim breaks.
//! CI runs the measured path itself (`reproduce --quick` in .ci/run).

mod common;

use std::fs;
use std::path::Path;

use common::{attnbench, copy_run, repo};

/// The paper directories and table directories of results/papers/ measured by a sweep.
const TABLES: [(&str, &str); 6] = [
    ("rabe-staats", "table2"),
    ("rabe-staats", "table3"),
    ("bpt", "max_context"),
    ("bpt", "memory"),
    ("bpt", "throughput"),
    ("tree-attention", "tree_vs_ring"),
];

/// The blog's softmax table: no sweep, its rows in softmax.csv and io.csv.
const SOFTMAX: (&str, &str) = ("blog", "softmax");

/// Tree Attention's Tables 1-2, simulated and on MPI ranks: no sweep, rows in generate.csv.
const GENERATE: (&str, &str) = ("tree-attention", "generate");
const GENERATE_RANKS: (&str, &str) = ("tree-attention", "generate_ranks");

/// Copies the committed results/papers/ runs (rows, meta and the Tree-vs-Ring
/// measurements, which its report reads; the softmax rows) into `to`.
fn copy_papers(to: &Path) {
    let (paper, table) = SOFTMAX;
    let from = repo().join("results/papers").join(paper).join(table);
    let dir = to.join(paper).join(table);
    fs::create_dir_all(&dir).unwrap();
    for f in ["softmax.csv", "io.csv", "meta.json"] {
        fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    for (paper, table) in [GENERATE, GENERATE_RANKS] {
        let from = repo().join("results/papers").join(paper).join(table);
        let dir = to.join(paper).join(table);
        fs::create_dir_all(&dir).unwrap();
        for f in ["generate.csv", "meta.json"] {
            fs::copy(from.join(f), dir.join(f)).unwrap();
        }
    }
    for (paper, table) in TABLES {
        let from = repo().join("results/papers").join(paper).join(table);
        let dir = to.join(paper).join(table);
        copy_run(&from, &dir);
        for f in fs::read_dir(&from).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.starts_with("tree_vs_ring_") && name.ends_with(".csv") {
                fs::copy(f.path(), dir.join(&name)).unwrap();
            }
        }
    }
}

#[test]
fn dry_run_names_every_table_with_a_sweep_a_user_can_run() {
    let out = attnbench()
        .args(["reproduce", "--dry-run", "--quick"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for (paper, table) in TABLES {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{paper} {table}:")))
            .unwrap_or_else(|| panic!("no {paper} {table} in {text}"));
        assert!(
            line.contains(&format!("--out results/papers-quick/{paper}/{table} ")),
            "{line}"
        );
        assert!(line.contains("--set run.interleave=true"), "{line}");
        assert!(line.contains("--set run.max_reps=1"), "{line}");
        let config = line
            .split("--config ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        assert!(repo().join(config).is_file(), "{config}");
    }
    let (paper, table) = SOFTMAX;
    assert!(
        text.contains(&format!("{paper} {table}: naive, safe and online softmax counted and timed (1M and 4M elements), FlashAttention loop orders' HBM traffic counted, into results/papers-quick/{paper}/{table}")),
        "{text}"
    );
    let (paper, table) = GENERATE;
    assert!(
        text.contains(&format!("{paper} {table}: a tiny GQA model's prefill and 10 decode steps, ring against tree on [8, 4, 2] simulated devices, N = [1024, 2048], into results/papers-quick/{paper}/{table}")),
        "{text}"
    );
    // The tables that need more than this CPU: the GPU Table 2's sweep, and one mpirun
    // per p of the generations on ranks; each says when this build cannot run it.
    let line = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start} in {text}"))
    };
    assert!(line("rabe-staats table2_gpu:").contains("configs/rabe_staats_table2_gpu.toml"));
    for p in [2, 4] {
        assert!(
            line(&format!("tree-attention generate_ranks: mpirun -np {p} "))
                .ends_with(" reproduce tree-attention --out results/papers-quick --quick"),
            "{text}"
        );
    }
    let notes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  (skipped here: "))
        .collect();
    let expected = usize::from(!cfg!(feature = "cuda")) + usize::from(!cfg!(feature = "mpi"));
    assert!(notes.len() >= expected, "{text}");
    assert_eq!(
        text.lines().count() - notes.len(),
        TABLES.len() + 2 + 1 + 2,
        "{text}"
    );
    // One paper: only its tables.
    let out = attnbench()
        .args(["reproduce", "bpt", "--dry-run"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(!text.contains("--set run.max_reps=1"), "{text}");
}

#[test]
fn bad_input_is_exit_2_naming_it() {
    attnbench()
        .args(["reproduce", "flash-attention-9"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("flash-attention-9"));
    // Away from the checkout the configs are not there.
    let away = tempfile::tempdir().unwrap();
    attnbench()
        .current_dir(away.path())
        .args(["reproduce", "--report-only"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("configs/rabe_staats_table2.toml"));
    // A table no chosen paper has.
    attnbench()
        .args(["reproduce", "bpt", "--table", "table2", "--dry-run"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "--table table2: not a table of the papers named",
        ));
    // No results to judge.
    let empty = tempfile::tempdir().unwrap();
    attnbench()
        .args(["reproduce", "tree-attention", "--report-only", "--out"])
        .arg(empty.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("tree_vs_ring"));
}

/// The committed claims files are what the committed rows give, and every claim holds.
#[test]
fn the_committed_claims_follow_from_the_committed_rows() {
    let tmp = tempfile::tempdir().unwrap();
    copy_papers(tmp.path());
    let out = attnbench()
        .args(["reproduce", "--report-only", "--out"])
        .arg(tmp.path())
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains(" 0 FAIL, "), "{text}");
    assert!(text.contains(" 0 n/a"), "{text}");
    for paper in ["rabe-staats", "bpt", "tree-attention", "blog"] {
        let ours = fs::read_to_string(tmp.path().join(paper).join("claims.md")).unwrap();
        let committed =
            fs::read_to_string(repo().join("results/papers").join(paper).join("claims.md"))
                .unwrap();
        assert_eq!(ours, committed, "{paper}/claims.md differs from its rows");
    }
    let (paper, table) = SOFTMAX;
    for md in ["softmax.md", "io.md"] {
        let rendered =
            |root: &Path| fs::read_to_string(root.join(paper).join(table).join(md)).unwrap();
        assert_eq!(
            rendered(tmp.path()),
            rendered(&repo().join("results/papers")),
            "{md} differs from its rows"
        );
    }
    for (paper, table) in [GENERATE, GENERATE_RANKS] {
        let rendered = |root: &Path| {
            fs::read_to_string(root.join(paper).join(table).join("generate.md")).unwrap()
        };
        assert_eq!(
            rendered(tmp.path()),
            rendered(&repo().join("results/papers")),
            "{table}/generate.md differs from its rows"
        );
    }
}

/// `--table` measures only the tables named; the paper's others are judged from their
/// rows, so its claims file is the committed one. Here the one named is the GPU table,
/// which a build without `cuda` skips: nothing is measured.
#[test]
fn one_table_runs_and_the_others_are_judged_from_their_rows() {
    let tmp = tempfile::tempdir().unwrap();
    copy_papers(tmp.path());
    let out = attnbench()
        .args(["reproduce", "rabe-staats", "--table", "table2_gpu", "--out"])
        .arg(tmp.path())
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    if cfg!(feature = "cuda") {
        return;
    }
    assert!(text.contains("1 table(s) skipped"), "{text}");
    let ours = fs::read_to_string(tmp.path().join("rabe-staats/claims.md")).unwrap();
    let committed =
        fs::read_to_string(repo().join("results/papers/rabe-staats/claims.md")).unwrap();
    assert_eq!(ours, committed);
    // The dry run names only the table it would measure.
    let out = attnbench()
        .args(["reproduce", "rabe-staats", "--table", "table3", "--dry-run"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("rabe-staats table3: "), "{text}");
}

/// A rabe-staats error at n = 2^14 above the paper's bound is a FAIL and exit 3, and rows
/// that lack a claim's case are n/a and exit 3 too.
#[test]
fn a_broken_claim_is_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    copy_papers(tmp.path());
    let dir = tmp.path().join("rabe-staats/table2");
    let mut reader = csv::Reader::from_path(dir.join("runs.csv")).unwrap();
    let head = reader.headers().unwrap().clone();
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let (variant, seq, dist, diff) = (
        col("variant"),
        col("seq_q"),
        col("input_dist"),
        col("max_abs_diff"),
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let write = |keep: &dyn Fn(&csv::StringRecord) -> bool,
                 edit: &dyn Fn(&csv::StringRecord) -> csv::StringRecord| {
        let mut w = csv::Writer::from_path(dir.join("runs.csv")).unwrap();
        w.write_record(&head).unwrap();
        for r in rows.iter().filter(|r| keep(r)) {
            w.write_record(&edit(r)).unwrap();
        }
        w.flush().unwrap();
    };
    let at_check = |r: &csv::StringRecord| {
        &r[variant] == "rabe-staats" && &r[seq] == "16384" && &r[dist] == "uniform"
    };
    // 1e-6 is above the uniform bound (6.5e-7).
    write(&|_| true, &|r| {
        if at_check(r) {
            r.iter()
                .enumerate()
                .map(|(i, v)| if i == diff { "1e-6" } else { v })
                .collect()
        } else {
            r.clone()
        }
    });
    let run = || {
        attnbench()
            .args(["reproduce", "rabe-staats", "--report-only", "--out"])
            .arg(tmp.path())
            .assert()
            .code(3)
    };
    let text = String::from_utf8_lossy(&run().get_output().stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("uniform inputs"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.trim_start().starts_with("FAIL"), "{line}");
    // Without the row: n/a, still exit 3.
    write(&|r| !at_check(r), &|r| r.clone());
    let text = String::from_utf8_lossy(&run().get_output().stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("uniform inputs"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.trim_start().starts_with("n/a"), "{line}");
}

/// The cells of a Markdown table row (`| a | b \| c |` -> ["a", "b \| c"]).
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push_str("\\|");
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// docs/papers.md lists every claim of the committed claims files with its verdict, and
/// no other: (paper, table, claim, verdict).
#[test]
fn the_papers_page_lists_every_committed_claim_with_its_verdict() {
    let mut committed = Vec::new();
    for paper in ["rabe-staats", "bpt", "tree-attention", "blog"] {
        let md = fs::read_to_string(repo().join("results/papers").join(paper).join("claims.md"))
            .unwrap();
        let mut table = String::new();
        for line in md.lines() {
            if let Some(h) = line.strip_prefix("## ") {
                table = h
                    .split("(`")
                    .nth(1)
                    .unwrap()
                    .trim_end_matches("/`)")
                    .to_string();
            } else if line.starts_with("| ") && !line.starts_with("| claim |") {
                let c = cells(line);
                committed.push((
                    paper.to_string(),
                    table.clone(),
                    c[0].clone(),
                    c[3].trim_matches('*').to_string(),
                ));
            }
        }
    }
    let page = fs::read_to_string(repo().join("docs/papers.md")).unwrap();
    let section = page
        .split("## Every claim, judged")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let listed: Vec<(String, String, String, String)> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| paper |"))
        .map(|l| {
            let c = cells(l);
            (
                c[0].clone(),
                c[1].clone(),
                c[2].clone(),
                c[3].trim_matches('*').to_string(),
            )
        })
        .collect();
    assert!(!committed.is_empty());
    assert_eq!(listed, committed, "docs/papers.md's claims table");
}

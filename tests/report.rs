//! `attnbench report` end to end on a fixture results directory (tests/fixtures/report:
//! a hand-made runs.csv with Rabe–Staats Table 2 shaped rows and a meta.json; the numbers
//! are plausible, not measured): tables.md against a golden copy, plots that are valid PNG
//! and SVG, clear errors (exit code 2) for missing columns and empty CSVs, no config needed.
//!
//! After an intended change to tables.md, regenerate the golden copy with
//! `UPDATE_GOLDEN=1 cargo test --release --test report` and review the diff.

use predicates::prelude::*;
use std::fs;
use std::path::{Path, PathBuf};

mod common;
use common::attnbench;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report")
}

/// `within/run` holding a copy of the committed quick run's runs.csv (no meta.json).
fn quick_run(within: &Path) -> PathBuf {
    let dir = within.join("run");
    fs::create_dir_all(&dir).unwrap();
    let quick = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/quick/runs.csv");
    fs::copy(quick, dir.join("runs.csv")).unwrap();
    dir
}

/// Runs the report from an unrelated working directory (no configs/ there), into `out`.
fn report(dir: &Path, out: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    let cwd = tempfile::tempdir().unwrap();
    attnbench()
        .current_dir(cwd.path())
        .arg("report")
        .arg(dir)
        .arg("--out")
        .arg(out)
        .args(extra)
        .assert()
}

#[test]
fn fixture_report_matches_the_golden_tables_md() {
    let out = tempfile::tempdir().unwrap();
    report(&fixture(), out.path(), &[]).success().stdout(
        predicate::str::contains("PASS  memory overhead ratio")
            .and(predicate::str::contains("0.495 (5 points)"))
            .and(predicate::str::contains("standard oom at 2^16, 2^18, 2^20")),
    );
    let got = fs::read_to_string(out.path().join("tables.md")).unwrap();
    let golden = fixture().join("expected/tables.md");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::create_dir_all(golden.parent().unwrap()).unwrap();
        fs::write(&golden, &got).unwrap();
    }
    let want = fs::read_to_string(&golden).expect("golden tables.md (UPDATE_GOLDEN=1 writes it)");
    assert!(
        got == want,
        "tables.md differs from {}; rerun with UPDATE_GOLDEN=1 if intended\n--- got ---\n{got}",
        golden.display()
    );
    // The table shows the paper's cells verbatim, ours beside them, OOM and extrapolation marked.
    for needle in [
        "| Memory overhead of standard attention (paper) | 270KB | 4.0MB | 64MB | 1GB | OOM | OOM | OOM |",
        "| OOM | OOM | OOM |",
        "†",
        "**PASS**",
    ] {
        assert!(got.contains(needle), "tables.md lacks {needle}");
    }
}

#[test]
fn plots_are_valid_png_and_svg() {
    let out = tempfile::tempdir().unwrap();
    report(&fixture(), out.path(), &[]).success();
    let stems = [
        "runtime",
        "memory",
        "error",
        "gflops",
        "chunks_rabe-staats_f32_n1024",
    ];
    for stem in stems {
        let png = out.path().join(format!("{stem}.png"));
        let bytes = fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{stem}.png signature"
        );
        let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
            .unwrap_or_else(|e| panic!("{stem}.png does not decode: {e}"))
            .to_rgb8();
        if stem.starts_with("chunks") {
            assert_eq!(img.dimensions(), (1400, 820));
        } else {
            // Its 10 series make each chart a grid of panels (one per dtype).
            let (w, h) = img.dimensions();
            assert!(
                (1000..=2480).contains(&w) && h >= 600,
                "{stem}.png is {w}x{h}"
            );
        }
        // Not blank: text and lines leave plenty of non-white pixels.
        let inked = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
        assert!(
            inked > 10_000,
            "{stem}.png has only {inked} non-white pixels"
        );
        let svg = fs::read_to_string(out.path().join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{stem}.svg"
        );
        assert!(
            svg.contains("<text") && svg.contains("sequence length") || stem.starts_with("chunks")
        );
    }
}

#[test]
fn format_flag_selects_the_plot_files() {
    let out = tempfile::tempdir().unwrap();
    report(&fixture(), out.path(), &["--format", "svg"]).success();
    assert!(out.path().join("memory.svg").exists());
    assert!(!out.path().join("memory.png").exists());
    assert!(out.path().join("tables.md").exists());
    attnbench()
        .args(["report", "--format", "gif"])
        .arg(fixture())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gif"));
}

#[test]
fn missing_columns_and_empty_csvs_are_clear_errors_exiting_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("res");
    fs::create_dir_all(&dir).unwrap();
    let out = tmp.path().join("out");
    let text = fs::read_to_string(fixture().join("runs.csv")).unwrap();
    // Drop the time_median_s column.
    let col = text
        .lines()
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "time_median_s")
        .unwrap();
    let cut: String = text
        .lines()
        .map(|l| {
            let mut cells: Vec<&str> = l.split(',').collect();
            cells.remove(col);
            cells.join(",") + "\n"
        })
        .collect();
    fs::write(dir.join("runs.csv"), cut).unwrap();
    report(&dir, &out, &[]).code(2).stderr(
        predicate::str::contains("runs.csv")
            .and(predicate::str::contains("missing column time_median_s")),
    );
    fs::write(dir.join("runs.csv"), "").unwrap();
    report(&dir, &out, &[])
        .code(2)
        .stderr(predicate::str::contains("runs.csv").and(predicate::str::contains("empty")));
    let header = text.lines().next().unwrap().to_string() + "\n";
    fs::write(dir.join("runs.csv"), header).unwrap();
    report(&dir, &out, &[])
        .code(2)
        .stderr(predicate::str::contains("no rows"));
    report(&tmp.path().join("nothing"), &out, &[])
        .code(2)
        .stderr(predicate::str::contains("nothing"));
    fs::remove_file(dir.join("runs.csv")).unwrap();
    report(&dir, &out, &[])
        .code(2)
        .stderr(predicate::str::contains("runs.csv"));
}

#[test]
fn rows_with_an_empty_or_repeated_case_id_are_refused_exiting_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("res");
    fs::create_dir_all(&dir).unwrap();
    let out = tmp.path().join("out");
    let text = fs::read_to_string(fixture().join("runs.csv")).unwrap();
    let mut lines = text.lines();
    let (head, first, second) = (
        lines.next().unwrap(),
        lines.next().unwrap(),
        lines.next().unwrap(),
    );
    assert_eq!(head.split(',').nth(1), Some("case_id"));
    // The second row with its case_id cleared.
    let mut cells: Vec<&str> = second.split(',').collect();
    cells[1] = "";
    fs::write(
        dir.join("runs.csv"),
        format!("{head}\n{first}\n{}\n", cells.join(",")),
    )
    .unwrap();
    report(&dir, &out, &[]).code(2).stderr(
        predicate::str::contains("runs.csv").and(predicate::str::contains("row 3: empty case_id")),
    );
    assert!(!out.join("tables.md").exists(), "nothing written");
    fs::write(dir.join("runs.csv"), format!("{head}\n{first}\n{first}\n")).unwrap();
    report(&dir, &out, &[]).code(2).stderr(
        predicate::str::contains("row 3: case_id").and(predicate::str::contains("appears again")),
    );
}

/// A negative, NaN or infinite time is refused naming the row and column, exit 2 (it was
/// drawn as "-1 s" or "NaN s", and left out of the plots without a word).
#[test]
fn times_that_are_not_times_are_refused_naming_row_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = quick_run(tmp.path());
    let text = fs::read_to_string(dir.join("runs.csv")).unwrap();
    let mut lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let col = lines[0].iter().position(|h| h == "time_max_s").unwrap();
    for bad in ["-1", "NaN", "inf"] {
        lines[3][col] = bad.to_string();
        let csv: Vec<String> = lines.iter().map(|l| l.join(",")).collect();
        fs::write(dir.join("runs.csv"), csv.join("\n") + "\n").unwrap();
        report(&dir, &tmp.path().join("out"), &[])
            .code(2)
            .stderr(predicate::str::contains(format!(
                "row 4, column time_max_s: {bad} is not a time"
            )));
    }
}

/// A report of a directory a sweep is still writing says so (and still reports the rows).
#[test]
fn a_report_of_a_directory_being_written_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = quick_run(tmp.path());
    let note = "a sweep is writing";
    report(&dir, &tmp.path().join("out"), &["--format", "svg"])
        .success()
        .stderr(predicate::str::contains(note).not());
    // The lock a sweep holds while it writes (`.attnbench.lock`).
    let lock = fs::File::create(dir.join(".attnbench.lock")).unwrap();
    lock.lock().unwrap();
    report(&dir, &tmp.path().join("out"), &["--format", "svg"])
        .success()
        .stderr(predicate::str::contains(note));
}

/// A meta.json that is not JSON, or not even UTF-8, is malformed input: exit 2 naming it.
#[test]
fn a_malformed_meta_json_is_refused_exiting_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = quick_run(tmp.path());
    for bytes in [&b"{\"config\": "[..], &[0xff, 0xfe, 0x00][..]] {
        fs::write(dir.join("meta.json"), bytes).unwrap();
        report(&dir, &tmp.path().join("out"), &[])
            .code(2)
            .stderr(predicate::str::contains(
                "meta.json: not a meta.json written by attnbench",
            ));
    }
}

#[test]
fn report_needs_no_meta_json_and_reads_csvs_from_before_the_new_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("old");
    fs::create_dir_all(&dir).unwrap();
    // The committed quick results predate the extrapolated/diff columns.
    let quick = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/quick/runs.csv");
    fs::copy(quick, dir.join("runs.csv")).unwrap();
    let out = tmp.path().join("out");
    report(&dir, &out, &["--format", "png"]).success();
    let md = fs::read_to_string(out.join("tables.md")).unwrap();
    assert!(md.contains("no meta.json") && md.contains("## All cases"));
    assert!(
        !md.contains("## Derived checks"),
        "no paper table, no checks"
    );
    assert!(out.join("runtime.png").exists());
}

#[test]
fn sweep_writes_the_report_unless_told_not_to() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    let paper = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/papers/rabe_staats_table2.csv");
    fs::write(
        &cfg,
        format!(
            r#"
[run]
name = "tiny"
warmup = 0
min_reps = 1
max_reps = 2
max_time_s = 0.05
calibrate = false
memory_budget = "8GiB"
threads = 1
extrapolate_above_s = 0.000001
extrapolate_q_chunks = 1
diff_against = "naive"

[axes]
variant = ["naive", "rabe-staats"]
seq_len = [256, 1024]
q_chunk = [128]
head_dim = [16]
dtype = ["bf16"]

[report]
paper_table = "{}"
"#,
            paper.display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("res");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(
            predicate::str::contains("report written to")
                .and(predicate::str::contains("derived checks")),
        );
    let md = fs::read_to_string(out.join("report/tables.md")).unwrap();
    assert!(md.contains("Rabe–Staats Table 2"));
    // rabe-staats at n = 1024 with 128-row chunks on 1 thread is extrapolated from 128 rows,
    // and naive (workspace grows with the rows) never is.
    let mut r = csv::Reader::from_path(out.join("runs.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    let get = |variant: &str, n: &str| {
        rows.iter()
            .find(|x| &x[col("variant")] == variant && &x[col("seq_q")] == n)
            .unwrap()
            .clone()
    };
    let rs = get("rabe-staats", "1024");
    assert_eq!(&rs[col("extrapolated")], "true");
    assert_eq!(&rs[col("timed_rows")], "128");
    assert_eq!(&rs[col("diff_variant")], "naive");
    // Both round P to bf16 for their `vdpbf16ps` PV (rabe-staats the per-chunk exp values,
    // naive the normalized probabilities), each within 2^-9 relative per entry: with
    // |v| < 5 the two outputs agree to about 2 * 2^-9 * 5 = 0.02 at worst, and rows from the
    // wrong place would differ by O(1).
    let diff: f64 = rs[col("max_abs_diff")].parse().unwrap();
    assert!(diff < 2e-2, "rabe-staats vs naive differ by {diff}");
    assert_eq!(&get("naive", "1024")[col("extrapolated")], "false");
    assert_eq!(&get("naive", "1024")[col("max_abs_diff")], "");
    assert!(md.contains("†"));

    let out2 = tmp.path().join("res2");
    attnbench()
        .args(["sweep", "--no-report", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out2)
        .assert()
        .success();
    assert!(out2.join("runs.csv").exists() && !out2.join("report").exists());
}

#[test]
fn a_runs_csv_path_reports_its_directory_and_a_file_as_out_is_refused() {
    let out = tempfile::tempdir().unwrap();
    report(
        &fixture().join("runs.csv"),
        out.path(),
        &["--format", "svg"],
    )
    .success();
    assert!(out.path().join("tables.md").is_file());
    let file = out.path().join("afile");
    fs::write(&file, "x").unwrap();
    report(&fixture(), &file, &[])
        .code(2)
        .stderr(predicate::str::contains("not a directory"));
}

/// A results directory with 3 variants x threads (1, 2) x dtype x causal x heads x head_dim
/// = 96 series at two n (the fixture's first row with those columns changed) and the
/// fixture's meta.json with an SGEMM peak for each thread count.
fn many_series(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let text = fs::read_to_string(fixture().join("runs.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let template: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let mut csv = header.join(",") + "\n";
    for (k, variant) in ["naive", "rabe-staats", "flash"].iter().enumerate() {
        for threads in [1, 2] {
            for dtype in ["f32", "bf16"] {
                for causal in ["false", "true"] {
                    for heads in [1, 8] {
                        for d in [64, 128] {
                            for n in [256, 1024] {
                                let mut row: Vec<String> =
                                    template.iter().map(|c| c.to_string()).collect();
                                let scale = threads * threads;
                                for (name, value) in [
                                    (
                                        "case_id",
                                        format!(
                                            "{variant}|{threads}|{dtype}|{causal}|{heads}|{d}|{n}"
                                        ),
                                    ),
                                    ("variant", variant.to_string()),
                                    ("dtype", dtype.into()),
                                    ("heads", heads.to_string()),
                                    ("kv_heads", heads.to_string()),
                                    ("head_dim", d.to_string()),
                                    ("causal", causal.into()),
                                    ("threads", threads.to_string()),
                                    ("seq_q", n.to_string()),
                                    ("seq_kv", n.to_string()),
                                    ("timed_rows", n.to_string()),
                                    (
                                        "time_median_s",
                                        format!("{}", 1e-6 * (n * (k + 1) * scale) as f64),
                                    ),
                                    ("gflops", format!("{}", 10 * (k + 1) * scale)),
                                    ("mem_overhead_bytes", (n * n * (k + 1)).to_string()),
                                ] {
                                    row[col(name)] = value;
                                }
                                csv += &(row.join(",") + "\n");
                            }
                        }
                    }
                }
            }
        }
    }
    fs::write(dir.join("runs.csv"), csv).unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(fixture().join("meta.json")).unwrap()).unwrap();
    let mut two = meta["calibration"][0].clone();
    two["threads"] = 2.into();
    two["sgemm_gflops"] = 180.0.into();
    meta["calibration"].as_array_mut().unwrap().push(two);
    meta["config"].as_object_mut().unwrap().remove("report");
    fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
}

#[test]
fn charts_with_too_many_series_are_one_grid_image_each_all_embedded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("many");
    many_series(&dir);
    let out = tmp.path().join("out");
    report(&dir, &out, &[]).success();
    let md = fs::read_to_string(out.join("tables.md")).unwrap();
    let plots = &md[md.find("## Plots").expect("a plots section")..];
    // 96 series: threads, dtype, causal and heads (2 values each, in the fixed order) split
    // them into 16 panels of 3 variants x 2 head_dims, all in one image per chart.
    let panels = [
        "1 thread · f32 · non-causal · h=1",
        "1 thread · bf16 · causal · h=8",
        "2 threads · f32 · non-causal · h=1",
        "2 threads · bf16 · causal · h=8",
    ];
    for (stem, title) in [
        ("runtime", "Runtime vs sequence length"),
        ("memory", "Memory overhead vs sequence length"),
        ("error", "Max abs error vs sequence length"),
        ("gflops", "Throughput vs sequence length"),
    ] {
        let section = &plots[plots.find(&format!("### {title}\n")).unwrap()..];
        let section = &section[..section[4..].find("\n### ").map_or(section.len(), |i| i + 4)];
        let images: Vec<&str> = section.lines().filter(|l| l.starts_with("![")).collect();
        assert_eq!(images, [format!("![{title}]({stem}.png)")], "{stem}");
        assert!(section.contains("small multiples"), "{stem}");
        let png = out.join(format!("{stem}.png"));
        let bytes = fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
            .unwrap()
            .to_rgb8();
        assert!(img.width() <= 2480, "{stem}.png is {} wide", img.width());
        let svg = fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        for p in panels {
            assert!(svg.contains(p), "{stem}.svg shows the panel {p}");
        }
        assert!(svg.contains("16 panels"), "{stem}.svg");
        if stem == "gflops" {
            // Each thread count's SGEMM reference, each in its own panels.
            for t in ["1 thread:", "2 threads:"] {
                assert!(
                    svg.contains(&format!("SGEMM (matrixmultiply), reference, {t}")),
                    "{t}"
                );
            }
        }
        if stem == "memory" {
            assert!(svg.contains("memory budget 8.00 GiB"));
        }
    }
    // No other image is embedded, and every embedded one exists.
    let embedded: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("!["))
        .map(|l| &l[l.rfind('(').unwrap() + 1..l.len() - 1])
        .collect();
    assert_eq!(embedded.len(), 4);
    for f in embedded {
        assert!(out.join(f).is_file(), "{f}");
    }
}

#[test]
fn a_new_report_leaves_no_stale_plot_of_an_old_one_and_keeps_other_files() {
    let out = tempfile::tempdir().unwrap();
    let stale = out.path().join("runtime__threads-9.png");
    fs::write(&stale, "old").unwrap();
    fs::write(out.path().join("notes.md"), "mine").unwrap();
    report(&fixture(), out.path(), &["--format", "svg"]).success();
    assert!(
        !stale.exists(),
        "a stale facet of an earlier report was left"
    );
    assert_eq!(
        fs::read_to_string(out.path().join("notes.md")).unwrap(),
        "mine"
    );
    assert!(out.path().join("runtime.svg").is_file());
}

/// `attnbench report` regenerates the derived renderings a sweep writes beside runs.csv
/// (`decode.md`, `bpt.md`) from the rows and meta.json's config alone: a committed results
/// directory, copied without them, gets them back byte for byte, beside runs.csv.
#[test]
fn report_regenerates_decode_md_and_bpt_md_beside_runs_csv() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, name) in [
        ("results/tree_vs_ring_mpi/p2", "decode.md"),
        ("results/papers/bpt/memory", "bpt.md"),
    ] {
        let src = root.join(dir);
        let copy = tempfile::tempdir().unwrap();
        for f in ["runs.csv", "meta.json"] {
            fs::copy(src.join(f), copy.path().join(f)).unwrap();
        }
        let cwd = tempfile::tempdir().unwrap();
        attnbench()
            .current_dir(cwd.path())
            .args(["report", "--format", "svg"])
            .arg(copy.path())
            .assert()
            .success()
            .stdout(predicate::str::contains(format!(
                "wrote {}",
                copy.path().join(name).display()
            )));
        let got = fs::read_to_string(copy.path().join(name)).unwrap();
        let want = fs::read_to_string(src.join(name)).unwrap();
        assert!(got == want, "{dir}/{name} does not regenerate:\n{got}");
    }
}

/// The summary heads tables.md and the terminal output: on the committed Rabe–Staats
/// Table 2 run, rabe-staats against naive at the largest n both ran, with naive's first
/// oom and how far rabe-staats went; `--reference` names another, and one without timed
/// rows is exit 2 naming the flag.
#[test]
fn the_summary_compares_each_variant_with_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t2");
    fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/papers/rabe-staats/table2");
    for f in ["runs.csv", "meta.json"] {
        fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let out = tmp.path().join("out");
    let printed = report(&dir, &out, &["--format", "svg"]).success();
    let stdout = String::from_utf8_lossy(&printed.get_output().stdout).into_owned();
    assert!(
        stdout.contains("summary against naive (the default"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("rabe-staats:"))
        .unwrap_or_else(|| panic!("no rabe-staats line in {stdout}"));
    assert!(line.contains("the speed of naive at n = 16384"), "{line}");
    assert!(line.contains("of its memory overhead"), "{line}");
    assert!(line.contains("naive oom from n = 65536"), "{line}");
    let md = fs::read_to_string(out.join("tables.md")).unwrap();
    let summary = md.find("## Summary").expect("a summary section");
    assert!(summary < md.find("## Provenance").unwrap());
    assert!(md.contains("| rabe-staats | n = 16384 |"), "{md}");
    // Against rabe-staats instead.
    let other = tmp.path().join("other");
    let printed = report(
        &dir,
        &other,
        &["--format", "svg", "--reference", "rabe-staats"],
    )
    .success();
    let stdout = String::from_utf8_lossy(&printed.get_output().stdout).into_owned();
    assert!(
        stdout.contains("summary against rabe-staats (named by --reference)")
            && stdout.contains("naive: "),
        "{stdout}"
    );
    report(&dir, &other, &["--reference", "flash"])
        .code(2)
        .stderr(predicate::str::contains(
            "--reference: `flash` has no timed rows",
        ));
}

/// `sweep --json` prints its closing summary as one JSON object on stdout (rows per status,
/// the report's files and summary), the human lines on stderr.
#[test]
fn sweep_json_prints_one_closing_object() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    fs::write(
        &cfg,
        "[run]\nname = \"j\"\nwarmup = 0\nmin_reps = 1\nmax_reps = 1\nmax_time_s = 0.05\ncalibrate = false\nthreads = 1\n[axes]\nvariant = [\"naive\", \"flash\"]\nmode = [\"fwd\", \"decode\"]\nseq_len = [64]\nheads = 2\nhead_dim = 16\n[report]\nreference = \"flash\"\n",
    )
    .unwrap();
    let out = tmp.path().join("res");
    let o = attnbench()
        .args(["sweep", "--json", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["run"], "j");
    assert_eq!(v["rows"], 2);
    assert_eq!(v["statuses"]["ok"], 2);
    assert_eq!(v["statuses"]["oom"], 0);
    assert_eq!(v["left_out"].as_array().unwrap().len(), 2, "{v}");
    let summary = &v["report"]["summary"];
    assert_eq!(summary["reference"], "flash");
    assert_eq!(summary["chosen"], "config");
    assert_eq!(summary["lines"][0]["variant"], "naive");
    assert_eq!(summary["lines"][0]["at"], 64);
    assert!(summary["lines"][0]["speed"]["geomean"].as_f64().unwrap() > 0.0);
    let files = v["report"]["files"].as_array().unwrap();
    assert!(files.iter().any(|f| f == "tables.md"));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("rows written to"), "{stderr}");
    // A reference the grid does not run is refused when the config loads.
    let bad = tmp.path().join("bad.toml");
    fs::write(
        &bad,
        "[run]\nname = \"j\"\n[axes]\nvariant = \"naive\"\nseq_len = 64\n[report]\nreference = \"flash\"\n",
    )
    .unwrap();
    attnbench()
        .args(["sweep", "--dry-run", "--config"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("report.reference").and(predicate::str::contains(
                "`flash` is not a variant of the grid (it has: naive)",
            )),
        );
}

/// The markdown tables of `md`: (tables, rows including each header row). A table is a
/// header line, then its `|---|` separator, then its rows, every line starting with `|`.
fn md_tables(md: &str) -> (usize, usize) {
    let lines: Vec<&str> = md.lines().map(str::trim).collect();
    let separator =
        |l: &str| l.starts_with('|') && l.contains('-') && l.chars().all(|c| "|-: ".contains(c));
    let tables = lines.iter().filter(|l| separator(l)).count();
    let rows = lines
        .iter()
        .filter(|l| l.starts_with('|') && !separator(l))
        .count();
    (tables, rows)
}

/// The names of the files in `dir` ending in `.ext`.
fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// The page loads nothing from elsewhere: no script, no stylesheet link, no remote URL
/// in a `src` or `href`, and every `src` a data URI.
fn assert_self_contained(page: &str) {
    for bad in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "<script",
        "<link",
    ] {
        assert!(!page.contains(bad), "index.html has {bad}");
    }
    for (at, _) in page.match_indices("src=\"") {
        assert!(
            page[at..].starts_with("src=\"data:"),
            "a src that is not a data URI: {}",
            &page[at..(at + 80).min(page.len())]
        );
    }
}

/// A Chromium on PATH (`chromium`, else `chromium-browser`).
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs headless Chromium on `page` with `args`, its own fresh profile and no network
/// chatter, killed after 60 s; returns its stdout.
fn headless(browser: &Path, page: &Path, args: &[String]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let (out, err) = (tmp.path().join("stdout"), tmp.path().join("stderr"));
    let mut child = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!(
            "--user-data-dir={}",
            tmp.path().join("profile").display()
        ))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(std::process::Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .expect("chromium starts");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium {args:?} ran past 60 s; stderr:\n{}",
                fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "chromium {args:?}: {status}; stderr:\n{}",
        fs::read_to_string(&err).unwrap_or_default()
    );
    fs::read_to_string(&out).unwrap()
}

/// index.html (issue 37): the whole report on one page that loads nothing from elsewhere,
/// every table of tables.md a <table>, every plot an inline <svg>; then, where Chromium is
/// installed (required with ATTNBENCH_REQUIRE_BROWSER=1, as in .ci/run), the page as a
/// browser parses it (title, tables, SVG elements in the DOM) and draws it (a screenshot
/// that decodes and is not blank).
#[test]
fn html_report_is_self_contained_and_renders_in_a_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let run = quick_run(tmp.path());
    let out = tmp.path().join("report");
    report(&run, &out, &[])
        .success()
        .stdout(predicate::str::contains("index.html"));
    let html_path = out.join("index.html");
    let page = fs::read_to_string(&html_path).unwrap();
    let md = fs::read_to_string(out.join("tables.md")).unwrap();
    assert_self_contained(&page);
    assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    assert!(page.contains("<style>"), "no inline style");
    // The title: tables.md's first heading (plain text, so it appears verbatim).
    let title = md.lines().next().unwrap().strip_prefix("# ").unwrap();
    assert!(!title.contains(['&', '<', '>', '"']), "{title}");
    assert!(page.contains(&format!("<title>{title}</title>")));
    // Every plot inline, as the SVG written beside it, once; no PNG needed with an SVG.
    let svgs = files_with_ext(&out, "svg");
    assert!(svgs.len() >= 4, "{svgs:?}");
    assert_eq!(page.matches("<svg").count(), svgs.len());
    for svg in &svgs {
        let markup = fs::read_to_string(svg).unwrap();
        assert_eq!(page.matches(markup.trim()).count(), 1, "{}", svg.display());
    }
    assert!(!page.contains(".png") && !page.contains("<img"));
    // Every table of tables.md, row for row.
    let (tables, rows) = md_tables(&md);
    assert!(tables >= 1 && rows > tables, "{tables} tables, {rows} rows");
    assert_eq!(page.matches("<table>").count(), tables);
    assert_eq!(page.matches("<tr>").count(), rows);

    let Some(browser) = chromium() else {
        let why = "no chromium or chromium-browser on PATH";
        assert!(
            std::env::var_os("ATTNBENCH_REQUIRE_BROWSER").is_none_or(|v| v != "1"),
            "ATTNBENCH_REQUIRE_BROWSER=1 but {why}"
        );
        eprintln!("skipping the browser half: {why}");
        return;
    };
    let dom = headless(&browser, &html_path, &["--dump-dom".into()]);
    assert!(
        dom.contains(&format!("<title>{title}</title>")),
        "{dom:.2000}"
    );
    assert_eq!(dom.matches("<table>").count(), tables);
    assert_eq!(dom.matches("<tr>").count(), rows);
    // Parsed as SVG elements, with their drawing, not as text.
    assert_eq!(dom.matches("<svg").count(), svgs.len());
    assert!(dom.matches("<polyline").count() + dom.matches("<path").count() >= svgs.len());
    let shots = tempfile::tempdir().unwrap();
    let shot = shots.path().join("shot.png");
    headless(
        &browser,
        &html_path,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,4000".into(),
        ],
    );
    let img = image::open(&shot)
        .unwrap_or_else(|e| panic!("{}: {e}", shot.display()))
        .to_rgb8();
    assert_eq!(img.dimensions(), (1280, 4000));
    let colours: std::collections::HashSet<[u8; 3]> = img.pixels().map(|p| p.0).collect();
    assert!(
        colours.len() >= 64,
        "the screenshot is blank: {} colours",
        colours.len()
    );
    if let Some(dir) = std::env::var_os("ATTNBENCH_KEEP_SCREENSHOT") {
        fs::copy(&shot, Path::new(&dir).join("index.png")).unwrap();
    }
}

/// index.html of a report with PNG plots only and a derived file: each PNG as a data URI
/// holding its bytes, then decode.md rendered with its paging figure inline.
#[test]
fn html_report_inlines_pngs_and_the_derived_files() {
    use base64::Engine as _;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    common::copy_run(&root.join("results/serving/ragged"), &run);
    let out = tmp.path().join("out");
    report(&run, &out, &["--format", "png"]).success();
    let page = fs::read_to_string(out.join("index.html")).unwrap();
    assert_self_contained(&page);
    let pngs = files_with_ext(&out, "png");
    assert!(!pngs.is_empty());
    assert_eq!(
        page.matches("src=\"data:image/png;base64,").count(),
        pngs.len()
    );
    for png in &pngs {
        let data = base64::engine::general_purpose::STANDARD.encode(fs::read(png).unwrap());
        assert!(page.contains(&data), "{} not inline", png.display());
    }
    // decode.md after tables.md, then its figure: the one SVG on the page.
    let decode = fs::read_to_string(out.join("decode.md")).unwrap();
    let heading = decode.lines().next().unwrap().strip_prefix("# ").unwrap();
    let paging = fs::read_to_string(out.join("paging.svg")).unwrap();
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:.80}"))
    };
    assert!(at("<h1>attnbench report") < at(&format!("<h1>{heading}</h1>")));
    assert!(at(&format!("<h1>{heading}</h1>")) < at(paging.trim()));
    assert_eq!(page.matches("<svg").count(), 1);
    let (tables, _) = md_tables(&fs::read_to_string(out.join("tables.md")).unwrap());
    assert_eq!(
        page.matches("<table>").count(),
        tables + md_tables(&decode).0
    );
}

/// Decode rows are drawn over the KV cache length: results/decode's charts are lines over
/// n_kv (one image each, its x axis so named), not panels of single points at n = 1.
#[test]
fn decode_reports_draw_lines_over_the_kv_cache_length() {
    let copy = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/decode");
    for f in ["runs.csv", "meta.json"] {
        fs::copy(src.join(f), copy.path().join(f)).unwrap();
    }
    let out = copy.path().join("out");
    report(copy.path(), &out, &["--format", "svg"]).success();
    for stem in ["runtime", "memory", "gflops"] {
        let svg = fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.contains("KV cache length (tokens, log scale)"),
            "{stem}"
        );
        assert!(!svg.contains("sequence length n"), "{stem}");
        assert!(
            svg.contains("n_q=1"),
            "{stem}: the query rows in the caption"
        );
    }
    let md = fs::read_to_string(out.join("tables.md")).unwrap();
    assert!(md.contains("### Runtime vs KV cache length"));
    assert!(!md.contains("runtime__"), "one image per chart");
}

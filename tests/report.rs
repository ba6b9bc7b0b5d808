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
        ("results/bpt_memory", "bpt.md"),
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

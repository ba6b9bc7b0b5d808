//! An FP8 KV cache (`kv_dtype`) through the CLI: the rows it writes (its own case id, the
//! half-size cache read, both error columns) beside the same cache in bf16, and the bad
//! inputs it refuses with exit 2 naming the key.

mod common;

use common::attnbench;

fn write_config(dir: &std::path::Path, axes: &str) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nname = \"fp8\"\ncalibrate = false\nmin_reps = 1\nmax_reps = 1\n\
             [axes]\nmode = \"decode\"\nseq_len = 1\nseq_kv = 300\nheads = 4\nkv_heads = 2\n\
             head_dim = 64\ndtype = \"bf16\"\n{axes}\n"
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn an_fp8_cache_is_its_own_row_reading_half_the_bytes_with_both_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "variant = \"flash-decoding\"\nkv_dtype = [\"same\", \"fp8e4m3\", \"fp8e5m2\"]",
    );
    let out = dir.path().join("out");
    common::sweep(&cfg, &out, &["--no-report"]);
    let (rows, col) = common::runs(&out);
    assert_eq!(rows.len(), 3);
    let get = |r: &csv::StringRecord, name: &str| r[col(name)].to_string();
    let num = |r: &csv::StringRecord, name: &str| get(r, name).parse::<f64>().unwrap();
    let bf16 = rows.iter().find(|r| get(r, "kv_dtype").is_empty()).unwrap();
    assert!(get(bf16, "max_abs_err_unquantized").is_empty());
    for f in ["fp8e4m3", "fp8e5m2"] {
        let r = rows.iter().find(|r| get(r, "kv_dtype") == f).unwrap();
        assert_eq!(get(r, "status"), "ok", "{f}");
        assert!(get(r, "case_id").ends_with(&format!("|kv{f}")), "{f}");
        // 1 byte a value against bf16's 2, plus one f32 scale per KV head of K and of V.
        assert_eq!(
            num(r, "kv_read_bytes"),
            num(bf16, "kv_read_bytes") / 2.0 + (2 * 4 * 2) as f64,
            "{f}"
        );
        // The kernel's own error (against the cache as stored) is f32 rounding; the
        // quantization's (against the bf16 cache) is the format's.
        let (stored, raw) = (num(r, "max_abs_err"), num(r, "max_abs_err_unquantized"));
        assert!(stored < 1e-5, "{f}: {stored}");
        assert!(raw > 100.0 * stored, "{f}: {raw} vs {stored}");
    }
    // decode.md sets each FP8 row against the bf16 one: half the bytes read.
    attnbench().arg("report").arg(&out).assert().success();
    let md = std::fs::read_to_string(out.join("decode.md")).unwrap();
    let section = md
        .split("## FP8 cache")
        .nth(1)
        .expect("an FP8 section")
        .split("\n## ")
        .next()
        .unwrap();
    for f in ["fp8e4m3", "fp8e5m2"] {
        let row = section
            .lines()
            .find(|l| l.contains(&format!("| {f} |")))
            .unwrap_or_else(|| panic!("{f} in {section}"));
        assert!(row.contains("| 0.50 |"), "{row}");
    }
}

#[test]
fn fp8_where_it_does_not_apply_is_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // FP8 is a storage of K and V, not of Q.
    let out = attnbench()
        .args(["run", "-v", "flash-decoding", "--mode", "decode", "-n", "1"])
        .args(["--seq-kv", "64", "--dtype", "fp8e4m3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--dtype") && err.contains("kv_dtype"), "{err}");
    // A dtype name as kv_dtype, and an unknown format.
    for bad in ["\"bf16\"", "\"fp8\""] {
        let cfg = write_config(
            dir.path(),
            &format!("variant = \"flash-decoding\"\nkv_dtype = {bad}"),
        );
        let out = attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("axes.kv_dtype") && err.contains("same"),
            "{bad}: {err}"
        );
    }
    // A variant that reads its cache as dtype only: `run` refuses the case.
    let out = attnbench()
        .args(["run", "-v", "paged-decode", "--mode", "decode", "-n", "1"])
        .args(["--seq-kv", "64", "--kv-dtype", "fp8e4m3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kv_dtype") && err.contains("flash-decoding"),
        "{err}"
    );
}

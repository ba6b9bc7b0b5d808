//! The contract the peer scripts (scripts/peers/) rely on: their CSV header is attnbench's,
//! and `sweep --dry-run --json` lists every case with its case_id, flops and io_bytes.

use assert_cmd::Command;
use std::fs;

/// The `HEADER = [...]` list of scripts/peers/common.py, in order.
fn python_header() -> Vec<String> {
    let text = fs::read_to_string("scripts/peers/common.py").expect("common.py exists");
    let start = text.find("HEADER = [").expect("HEADER list") + "HEADER = [".len();
    let end = start + text[start..].find(']').expect("end of HEADER");
    text[start..end]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn peer_scripts_write_attnbench_columns_in_order() {
    assert_eq!(python_header(), attnbench::report::record::header());
}

#[test]
fn dry_run_json_lists_the_config_then_every_case() {
    let out = Command::cargo_bin("attnbench")
        .expect("binary built")
        .args([
            "sweep",
            "--config",
            "configs/quick.toml",
            "--dry-run",
            "--json",
        ])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines[0]["config"]["run"]["name"], "quick");
    // configs/quick.toml: 5 variants x 2 dtypes x 2 kv_heads x 3 lengths x 2 causal.
    assert_eq!(lines.len(), 1 + 120);
    let first = &lines[1];
    let id = first["case_id"].as_str().expect("case_id");
    assert!(id.starts_with("naive|fwd|cpu|f32|"), "{id}");
    assert!(first["flops"].as_f64().expect("flops") > 0.0);
    assert!(first["io_bytes"].as_u64().expect("io_bytes") > 0);
    assert_eq!(first["case"]["shape"]["head_dim"], 64);
}

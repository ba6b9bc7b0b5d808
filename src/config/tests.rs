//! End-to-end tests of loading, validation and expansion through the public `Config` API.

use super::*;
use crate::problem::VariantId;
use crate::problem::{DType, InputDist, Mode};
use crate::variant::Registry;

fn load(text: &str, sets: &[&str]) -> Result<Config> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::from_str(text, Path::new("test.toml"), &sets)
}

fn cfg(text: &str) -> Config {
    load(text, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// The config error message, asserting the error is `Error::Config`.
fn config_err(text: &str, sets: &[&str]) -> String {
    match load(text, sets) {
        Err(Error::Config { msg, .. }) => msg,
        other => panic!("expected a config error, got {other:?}"),
    }
}

const MIN: &str = "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nseq_len = 128\n";

fn with_axes(extra: &str) -> String {
    format!("{MIN}{extra}\n")
}

#[test]
fn run_names_and_timing_keys_that_escape_or_never_end_are_refused() {
    for name in ["..", ".", "a/b", "a\\\\b", "a\\nb", " "] {
        let e = config_err(&MIN.replace("\"t\"", &format!("\"{name}\"")), &[]);
        assert!(e.contains("run.name"), "{name}: {e}");
    }
    for key in ["warmup_s", "min_time_s", "max_time_s"] {
        let e = config_err(MIN, &[&format!("run.{key}=1e300"), "run.max_time_s=1e300"]);
        assert!(e.contains(key) && e.contains("a day"), "{key}: {e}");
    }
    assert!(load(MIN, &["run.warmup_s=86400"]).is_ok());
}

#[test]
fn model_shapes_too_large_to_simulate_are_refused() {
    for (model, key) in [
        ("check = [[1, 1, 1, 1000000000000000000, 1]]", "model.check"),
        ("check = [[1, 1, 1, 1048576, 1048576]]", "model.check"),
        (
            "check = [[1000000000000000000, 1000000000000000000, 1, 8, 1]]",
            "model.check",
        ),
        ("devices = [1000000000000000000]", "model.devices"),
        ("tokens = [1000000000000000000]", "model.tokens"),
        ("probe_tokens = 1099511627776", "model.probe_tokens"),
    ] {
        let e = config_err(&format!("{MIN}[model]\n{model}\n"), &[]);
        assert!(e.contains(key), "{model}: {e}");
    }
    // The default shapes (the largest 1 x 16 x 128 x 10000 elements) stay inside.
    assert!(load(&format!("{MIN}[model]\n"), &[]).is_ok());
}

#[test]
fn defaults_are_filled() {
    let c = cfg(MIN);
    let r = &c.run;
    assert_eq!((r.seed, r.warmup, r.min_reps, r.max_reps), (0, 1, 3, 50));
    assert_eq!((r.min_time_s, r.max_time_s, r.rel_spread), (0.0, 5.0, 0.02));
    assert_eq!(
        (r.memory_budget, r.error_rows, r.calibrate),
        (None, 256, true)
    );
    assert_eq!(r.threads, default_threads());
    assert_eq!(
        c.axes.get(Axis::Mode),
        Some(&[AxisValue::Mode(Mode::Fwd)][..])
    );
    assert_eq!(c.axes.get(Axis::HeadDim), Some(&[AxisValue::Size(64)][..]));
    assert_eq!(
        c.axes.get(Axis::Threads),
        Some(&[AxisValue::Size(r.threads)][..])
    );
    assert_eq!(c.axes.get(Axis::KvHeads), None);
    let cases = c.expand();
    assert_eq!(cases.len(), 1);
    let k = &cases[0];
    assert_eq!(
        (k.mode, k.device, k.dtype, k.input_dist),
        (
            Mode::Fwd,
            crate::problem::Device::Cpu,
            DType::F32,
            InputDist::Normal
        )
    );
    assert_eq!(
        (
            k.shape.batch,
            k.shape.heads,
            k.shape.kv_heads,
            k.shape.head_dim
        ),
        (1, 1, 1, 64)
    );
    assert_eq!((k.shape.seq_q, k.shape.seq_kv), (128, 128));
    assert_eq!(
        (k.causal, k.window, k.devices, k.input_scale, k.seed),
        (false, None, 1, 1.0, 0)
    );
}

#[test]
fn run_fields_are_read() {
    let c = cfg("[run]\nname = \"q\"\nseed = 7\nmax_time_s = 1\nmemory_budget = \"1.5GiB\"\nthreads = 3\ncalibrate = false\n[axes]\nvariant = \"flash\"\nseq_len = 64\n");
    assert_eq!(
        (c.run.seed, c.run.max_time_s, c.run.threads, c.run.calibrate),
        (7, 1.0, 3, false)
    );
    assert_eq!(c.run.memory_budget, Some(ByteSize(3 << 29)));
    assert!(c.expand().iter().all(|k| k.threads == 3 && k.seed == 7));
}

#[test]
fn the_bpt_budget_rule_resolves_to_bytes_from_the_layer_cases() {
    let layers = |run: &str, heads: &str| {
        format!("[run]\nname = \"t\"\n{run}\n[axes]\nvariant = \"layer-bpt\"\nmode = \"layer-train\"\nheads = {heads}\nhead_dim = 64\nseq_len = 256\n")
    };
    // Hidden 256, 2 layers: 16 x 2 x (12 x 256^2 + 13 x 256) = 25,272,320 / 0.54.
    let c = cfg(&layers(
        "memory_budget = \"bpt-rule\"\nmodel_layers = 2",
        "4",
    ));
    assert_eq!(c.run.memory_budget, Some(ByteSize(46_800_593)));
    assert!(c.run.memory_budget_rule);
    // Without the model's depth, or with two hidden sizes, the rule has no single budget.
    let msg = config_err(&layers("memory_budget = \"bpt-rule\"", "4"), &[]);
    assert!(
        msg.starts_with("run.memory_budget") && msg.contains("model_layers"),
        "{msg}"
    );
    let msg = config_err(
        &layers("memory_budget = \"bpt-rule\"\nmodel_layers = 2", "[4, 8]"),
        &[],
    );
    assert!(
        msg.starts_with("run.memory_budget") && msg.contains("[256, 512]"),
        "{msg}"
    );
    // A byte size stays a byte size.
    let c = cfg(&layers("memory_budget = \"1MiB\"\nmodel_layers = 2", "4"));
    assert_eq!(
        (c.run.memory_budget, c.run.memory_budget_rule),
        (Some(ByteSize(1 << 20)), false)
    );
}

#[test]
fn pow2_axis_expands_in_order() {
    let c = cfg("[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nseq_len = { pow2 = [8, 11] }\n");
    let n: Vec<usize> = c.expand().iter().map(|k| k.shape.seq_q).collect();
    assert_eq!(n, [256, 512, 1024, 2048]);
}

/// `"none"` in the list of an optional setting (window, sinks, prefix_len): cases without
/// it beside cases with it, so one config times both in the same rounds; any other name
/// is an error naming the key.
#[test]
fn none_in_a_list_is_a_case_without_the_setting() {
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"flash\"\nseq_len = 128\n\
         causal = true\nwindow = [\"none\", 16]\nsinks = [\"none\", 4]\n",
    );
    let got: Vec<(Option<usize>, Option<usize>)> =
        c.expand().iter().map(|k| (k.window, k.sinks)).collect();
    assert_eq!(
        got,
        [
            (None, None),
            (None, Some(4)),
            (Some(16), None),
            (Some(16), Some(4))
        ]
    );
    let c = cfg(&with_axes("window = \"none\""));
    assert!(c.expand().iter().all(|k| k.window.is_none()));
    let e = config_err(&with_axes("window = [\"all\", 16]"), &[]);
    assert!(
        e.contains("axes.window") && e.contains("\"none\" or a positive integer"),
        "{e}"
    );
    let e = config_err(&with_axes("prefix_len = [\"none\", 0]"), &[]);
    assert!(e.contains("axes.prefix_len"), "{e}");
}

#[test]
fn unknown_key_names_key_line_and_known_keys() {
    let msg = config_err(&with_axes("sequence = 4"), &[]);
    assert!(
        msg.contains("in [axes]") && msg.contains("sequence"),
        "{msg}"
    );
    assert!(msg.contains("line 6"), "{msg}");
    assert!(msg.contains("seq_len") && msg.contains("head_dim"), "{msg}");
    let msg = config_err("[run]\nname = \"t\"\nspeed = 1\n", &[]);
    assert!(
        msg.contains("in [run]") && msg.contains("line 3") && msg.contains("max_time_s"),
        "{msg}"
    );
    let msg = config_err("[sweep]\n", &[]);
    assert!(msg.contains("sweep") && msg.contains("line 1"), "{msg}");
    // An unknown table after another is not blamed on the one before it.
    let msg = config_err(&format!("{MIN}[reprot]\nx = 1\n"), &[]);
    assert!(msg.contains("reprot") && msg.contains("line 6"), "{msg}");
    assert!(!msg.contains("in [axes]"), "{msg}");
}

#[test]
fn empty_and_zero_axis_values_name_the_key() {
    let msg = config_err(&with_axes("heads = []"), &[]);
    assert!(
        msg.starts_with("axes.heads (line 6):") && msg.contains("empty list"),
        "{msg}"
    );
    for key in [
        "batch", "heads", "kv_heads", "seq_kv", "head_dim", "q_chunk", "kv_chunk", "window",
        "threads",
    ] {
        let msg = config_err(&with_axes(&format!("{key} = [4, 0]")), &[]);
        assert!(
            msg.starts_with(&format!("axes.{key} (line 6):")) && msg.contains("positive"),
            "{msg}"
        );
    }
    let msg = config_err(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nseq_len = 0\n",
        &[],
    );
    assert!(msg.starts_with("axes.seq_len (line 5)"), "{msg}");
    let msg = config_err(&with_axes("input_scale = -2.0"), &[]);
    assert!(msg.starts_with("axes.input_scale"), "{msg}");
    let msg = config_err(&with_axes("dtype = [\"f32\", \"fp8\"]"), &[]);
    assert!(
        msg.starts_with("axes.dtype") && msg.contains("bf16"),
        "{msg}"
    );
    let msg = config_err(
        "[run]\nname = \"t\"\n[axes]\nvariant = [\"naive\", \"nave\"]\nseq_len = 8\n",
        &[],
    );
    assert!(
        msg.starts_with("axes.variant (line 4)") && msg.contains("rabe-staats"),
        "{msg}"
    );
}

#[test]
fn required_keys_and_run_checks() {
    let msg = config_err("[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\n", &[]);
    assert!(
        msg.starts_with("axes.seq_len") && msg.contains("required"),
        "{msg}"
    );
    let msg = config_err("[axes]\nvariant = \"naive\"\nseq_len = 8\n", &[]);
    assert!(
        msg.starts_with("run.name") && msg.contains("required"),
        "{msg}"
    );
    for (run, key) in [
        ("min_reps = 0", "run.min_reps"),
        ("min_reps = 9\nmax_reps = 4", "run.min_reps"),
        ("max_time_s = 0", "run.max_time_s"),
        ("max_time_s = -1.0", "run.max_time_s"),
        ("memory_budget = \"8 gigs\"", "run.memory_budget"),
        ("memory_budget = 0", "run.memory_budget"),
        ("threads = 0", "run.threads"),
        ("seed = -1", "run.seed"),
        ("calibrate = 1", "run.calibrate"),
    ] {
        let text =
            format!("[run]\nname = \"t\"\n{run}\n[axes]\nvariant = \"naive\"\nseq_len = 8\n");
        let msg = config_err(&text, &[]);
        assert!(
            msg.starts_with(key) && msg.contains("(line "),
            "{run}: {msg}"
        );
    }
}

#[test]
fn zip_pairs_values_and_checks_lengths() {
    let c = cfg(
        &format!("{MIN}[[zip]]\nbatch = [16, 8, 4]\nhead_dim = [32, 64, 128]\n")
            .replace("seq_len = 128", "seq_len = [128, 256]"),
    );
    let got: Vec<(usize, usize, usize)> = c
        .expand()
        .iter()
        .map(|k| (k.shape.batch, k.shape.head_dim, k.shape.seq_q))
        .collect();
    assert_eq!(
        got,
        [
            (16, 32, 128),
            (16, 32, 256),
            (8, 64, 128),
            (8, 64, 256),
            (4, 128, 128),
            (4, 128, 256)
        ]
    );

    let msg = config_err(
        &format!("{MIN}[[zip]]\nbatch = [16, 8, 4]\nheads = [1, 2]\n"),
        &[],
    );
    assert!(
        msg.starts_with("zip[0] (line 6)") && msg.contains("batch: 3, heads: 2"),
        "{msg}"
    );
}

#[test]
fn zip_may_hold_seq_len_and_sits_at_its_innermost_member() {
    let text = "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nhead_dim = [32, 64]\n[[zip]]\nbatch = [4, 2]\nseq_len = [8, 16]\n";
    let got: Vec<(usize, usize, usize)> = cfg(text)
        .expand()
        .iter()
        .map(|k| (k.shape.head_dim, k.shape.batch, k.shape.seq_q))
        .collect();
    assert_eq!(got, [(32, 4, 8), (32, 2, 16), (64, 4, 8), (64, 2, 16)]);
}

#[test]
fn axis_in_axes_and_zip_or_two_zips_is_an_error() {
    let msg = config_err(&format!("{MIN}[[zip]]\nseq_len = [1, 2]\n"), &[]);
    assert!(
        msg.starts_with("zip[0].seq_len (line 7)") && msg.contains("[axes]"),
        "{msg}"
    );
    let msg = config_err(
        &format!("{MIN}[[zip]]\nbatch = [1, 2]\n[[zip]]\nbatch = [3]\n"),
        &[],
    );
    assert!(
        msg.starts_with("zip[1].batch (line 9)") && msg.contains("zip[0]"),
        "{msg}"
    );
}

#[test]
fn chunks_are_clamped_and_none_for_variants_that_do_not_chunk() {
    let c = cfg("[run]\nname = \"t\"\n[axes]\nvariant = [\"naive\", \"rabe-staats\", \"flash\"]\nseq_len = [100, 8192]\nseq_kv = 200\n");
    for k in c.expand() {
        let info = k.variant.info();
        assert_eq!(
            k.q_chunk,
            info.default_q_chunk.map(|d| d.min(k.shape.seq_q)),
            "{}",
            k.id()
        );
        assert_eq!(
            k.kv_chunk,
            info.default_kv_chunk.map(|d| d.min(200)),
            "{}",
            k.id()
        );
    }
    let rs = VariantId::RabeStaats.info();
    let k = &c.expand()[2];
    assert_eq!(
        (k.variant, k.q_chunk, k.kv_chunk),
        (
            VariantId::RabeStaats,
            rs.default_q_chunk.map(|d| d.min(100)),
            Some(200)
        )
    );

    let c = cfg("[run]\nname = \"t\"\n[axes]\nvariant = [\"naive\", \"flash\"]\nseq_len = 1000\nq_chunk = [16, 4096]\n");
    let got: Vec<(VariantId, Option<usize>)> =
        c.expand().iter().map(|k| (k.variant, k.q_chunk)).collect();
    // naive ignores the axis, so its two chunk values collapse into one case.
    assert_eq!(
        got,
        [
            (VariantId::Naive, None),
            (VariantId::Flash, Some(16)),
            (VariantId::Flash, Some(1000))
        ]
    );
}

#[test]
fn identical_cases_are_deduplicated_keeping_the_first() {
    let c = cfg("[run]\nname = \"t\"\n[axes]\nvariant = \"flash\"\nseq_len = [64, 128, 64]\nkv_chunk = [256, 512]\n");
    let got: Vec<(usize, Option<usize>)> = c
        .expand()
        .iter()
        .map(|k| (k.shape.seq_q, k.kv_chunk))
        .collect();
    assert_eq!(got, [(64, Some(64)), (128, Some(128))]);
}

#[test]
fn expansion_order_and_kv_heads_default() {
    let c = cfg("[run]\nname = \"t\"\n[axes]\nvariant = [\"naive\", \"flash\"]\ndtype = [\"f32\", \"bf16\"]\nheads = [4, 8]\nseq_len = [16, 32]\n");
    let cases = c.expand();
    assert_eq!(cases.len(), 16);
    assert!(cases[..8].iter().all(|k| k.variant == VariantId::Naive));
    assert_eq!(cases[0].shape.seq_q, 16);
    assert_eq!(cases[1].shape.seq_q, 32);
    assert_eq!((cases[1].shape.heads, cases[2].shape.heads), (4, 8));
    assert_eq!((cases[3].dtype, cases[4].dtype), (DType::F32, DType::Bf16));
    assert!(cases.iter().all(|k| k.shape.kv_heads == k.shape.heads));
    // Invalid GQA combinations stay as cases: the runner skips them with a reason.
    let c = cfg(&with_axes("heads = 4\nkv_heads = [3, 8]"));
    assert_eq!(
        c.expand()
            .iter()
            .map(|k| k.shape.kv_heads)
            .collect::<Vec<_>>(),
        [3, 8]
    );
}

#[test]
fn set_overrides_axes_and_run_and_are_validated_alike() {
    let c = load(
        MIN,
        &[
            "seq_len=pow2:4:5",
            "dtype=bf16,f16",
            "causal=true,false",
            "run.max_time_s=0.5",
            "run.memory_budget=8GiB",
        ],
    )
    .unwrap();
    let cases = c.expand();
    assert_eq!(cases.len(), 8);
    assert_eq!(cases[0].shape.seq_q, 16);
    assert_eq!(cases[0].dtype, DType::Bf16);
    assert!(cases[0].causal && !cases[2].causal);
    assert_eq!(
        (c.run.max_time_s, c.run.memory_budget),
        (0.5, Some(ByteSize(8 << 30)))
    );

    let msg = config_err(MIN, &["heads=0"]);
    assert!(msg.starts_with("axes.heads (from --set)"), "{msg}");
    let msg = config_err(MIN, &["run.max_reps=1"]);
    assert!(
        msg.starts_with("run.min_reps") && msg.contains("max_reps"),
        "{msg}"
    );
    assert!(matches!(load(MIN, &["seq_len"]), Err(Error::Usage(m)) if m.contains("`seq_len`")));
    assert!(matches!(load(MIN, &["speed=3"]), Err(Error::Usage(m)) if m.contains("speed")));
    // A required axis may come from --set alone.
    let c = load("[run]\nname = \"t\"\n", &["variant=flash", "seq_len=8"]).unwrap();
    assert_eq!(c.expand().len(), 1);
}

#[test]
fn set_on_zipped_axis_keeps_or_breaks_the_pairing() {
    let text = "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\n[[zip]]\nbatch = [4, 2]\nseq_len = [8, 16]\n";
    let pairs = |sets: &[&str]| -> Vec<(usize, usize)> {
        load(text, sets)
            .unwrap()
            .expand()
            .iter()
            .map(|k| (k.shape.batch, k.shape.seq_q))
            .collect()
    };
    assert_eq!(pairs(&["seq_len=32,64"]), [(4, 32), (2, 64)]);
    assert_eq!(pairs(&["seq_len=32"]), [(4, 32), (2, 32)]);
    assert_eq!(pairs(&["batch=1", "seq_len=32"]), [(1, 32)]);
}

#[test]
fn serialized_config_shows_resolved_axes() {
    let c = cfg(
        &format!("{MIN}[[zip]]\nbatch = [2, 1]\nhead_dim = [32, 64]\n")
            .replace("seq_len = 128", "seq_len = { pow2 = [3, 4] }\nwindow = 4"),
    );
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(j["axes"]["seq_len"], serde_json::json!([8, 16]));
    assert_eq!(j["axes"]["variant"], serde_json::json!(["naive"]));
    assert_eq!(j["axes"]["dtype"], serde_json::json!(["f32"]));
    assert_eq!(j["axes"]["input_scale"], serde_json::json!([1.0]));
    assert_eq!(j["axes"]["window"], serde_json::json!([4]));
    assert_eq!(j["zip"][0]["batch"], serde_json::json!([2, 1]));
    assert_eq!(j["run"]["name"], "t");
    assert!(j["run"]["memory_budget"].is_null() && j.get("path").is_none());
}

#[test]
fn grid_summary_shows_values_rules_and_zips() {
    let c = cfg(&format!(
        "{MIN}[[zip]]\nbatch = [2, 1]\nhead_dim = [32, 64]\n"
    ));
    let rows = c.grid_summary();
    let get = |k: &str| rows.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("variant"), Some("naive"));
    assert_eq!(get("kv_heads"), Some("= heads"));
    assert_eq!(get("seq_kv"), Some("= seq_len"));
    assert_eq!(get("window"), Some("none"));
    assert_eq!(get("zip(batch, head_dim)"), Some("(2, 32), (1, 64)"));
    assert_eq!(get("batch"), None);
    assert_eq!(rows.last().map(|(n, _)| n.as_str()), Some("seq_len"));
}

#[test]
fn load_reads_a_file_and_reports_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, MIN).unwrap();
    let c = Config::load(&p, &[]).unwrap();
    assert_eq!(c.path, p);
    let e = Config::load(&dir.path().join("nope.toml"), &[]).unwrap_err();
    assert!(
        matches!(e, Error::Config { .. }) && e.exit_code() == 2,
        "{e}"
    );
}

#[test]
fn extrapolation_and_diff_keys_are_read_and_checked() {
    let c = cfg("[run]\nname = \"t\"\nextrapolate_above_s = 30\nextrapolate_q_chunks = 2\ndiff_against = \"naive\"\n[axes]\nvariant = \"rabe-staats\"\nseq_len = 64\n");
    assert_eq!(c.run.extrapolate_above_s, Some(30.0));
    assert_eq!(c.run.extrapolate_q_chunks, 2);
    assert_eq!(c.run.diff_against, Some(VariantId::Naive));
    let d = cfg(MIN);
    assert_eq!(
        (
            d.run.extrapolate_above_s,
            d.run.extrapolate_q_chunks,
            d.run.diff_against
        ),
        (None, DEFAULT_EXTRAPOLATE_Q_CHUNKS, None)
    );
    for (run, key, needle) in [
        (
            "extrapolate_above_s = 0",
            "run.extrapolate_above_s",
            "greater than 0",
        ),
        (
            "extrapolate_above_s = \"slow\"",
            "run.extrapolate_above_s",
            "number",
        ),
        (
            "extrapolate_q_chunks = 0",
            "run.extrapolate_q_chunks",
            "at least 1",
        ),
        ("diff_against = \"nave\"", "run.diff_against", "rabe-staats"),
        ("diff_against = 3", "run.diff_against", "variant name"),
    ] {
        let text =
            format!("[run]\nname = \"t\"\n{run}\n[axes]\nvariant = \"naive\"\nseq_len = 8\n");
        let msg = config_err(&text, &[]);
        assert!(
            msg.starts_with(&format!("{key} (line 3)")) && msg.contains(needle),
            "{run}: {msg}"
        );
    }
    let c = load(
        MIN,
        &["run.diff_against=naive", "run.extrapolate_above_s=5"],
    )
    .unwrap();
    assert_eq!(
        (c.run.diff_against, c.run.extrapolate_above_s),
        (Some(VariantId::Naive), Some(5.0))
    );
}

#[test]
fn report_paper_table_is_read_into_the_resolved_config() {
    let text = format!("{MIN}[report]\npaper_table = \"configs/papers/rabe_staats_table2.csv\"\n");
    let c = cfg(&text);
    let paper = c.report.paper.as_ref().expect("paper table read");
    assert_eq!(paper.id, "rabe_staats_table2");
    assert_eq!(paper.cell("overhead_standard", 65536), Some("OOM"));
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(
        j["report"]["paper_table"],
        "configs/papers/rabe_staats_table2.csv"
    );
    assert_eq!(j["report"]["paper"]["columns"][6], 1048576);
    // Without [report], meta.json carries an empty table.
    assert_eq!(
        serde_json::to_value(cfg(MIN)).unwrap()["report"],
        serde_json::json!({})
    );

    let msg = config_err(&format!("{MIN}[report]\npaper_table = \"nope.csv\"\n"), &[]);
    assert!(
        msg.starts_with("report.paper_table (line 7)") && msg.contains("nope.csv"),
        "{msg}"
    );
    let msg = config_err(&format!("{MIN}[report]\npaper_table = 5\n"), &[]);
    assert!(msg.starts_with("report.paper_table"), "{msg}");
    let msg = config_err(&format!("{MIN}[report]\ntable = \"x\"\n"), &[]);
    assert!(
        msg.contains("in [report]") && msg.contains("paper_table"),
        "{msg}"
    );
    let msg = config_err(MIN, &["report.paper_table=missing.csv"]);
    assert!(msg.contains("report.paper_table (from --set)"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "t2,256,big\nio,1,2\n").unwrap();
    let msg = config_err(MIN, &[&format!("report.paper_table={}", bad.display())]);
    assert!(msg.contains("bad.csv") && msg.contains("big"), "{msg}");
}

#[test]
fn rabe_staats_table2_config_expands_to_the_table_the_error_rows_and_the_sqrt_rows() {
    let c = Config::load(Path::new("configs/rabe_staats_table2.toml"), &[]).unwrap();
    let cases = c.expand();
    assert_eq!(cases.len(), 21);
    let has = |v: VariantId, n: usize, kv: Option<usize>, dist: InputDist| {
        cases.iter().any(|k| {
            k.variant == v && k.shape.seq_q == n && k.kv_chunk == kv && k.input_dist == dist
        })
    };
    for k in (8..=20).step_by(2) {
        let n = 1usize << k;
        assert!(
            has(VariantId::Naive, n, None, InputDist::Normal),
            "naive {n}"
        );
        assert!(has(
            VariantId::RabeStaats,
            n,
            Some(n.min(4096)),
            InputDist::Normal
        ));
    }
    for k in (12..=20).step_by(2) {
        let n = 1usize << k;
        assert!(has(
            VariantId::RabeStaats,
            n,
            Some(1 << (k / 2)),
            InputDist::Normal
        ));
    }
    assert!(has(VariantId::Naive, 16384, None, InputDist::Uniform));
    assert!(has(
        VariantId::RabeStaats,
        16384,
        Some(4096),
        InputDist::Uniform
    ));
    assert!(cases
        .iter()
        .all(|k| k.dtype == DType::Bf16 && k.threads == 1));
    // The paper's precision=HIGHEST: P kept in f32, under which its error bounds hold.
    assert!(cases.iter().all(|k| k.highest()));
    assert_eq!(c.run.diff_against, Some(VariantId::Naive));
    assert!(c.run.extrapolate_above_s.is_some());
    assert_eq!(
        c.report.paper.as_ref().map(|p| p.id.as_str()),
        Some("rabe_staats_table2")
    );
}

#[test]
fn decode_defaults_one_new_token_and_reads_the_device_axes() {
    let c = cfg(
        "[run]\nname = \"t\"\nthreads = 2\n[axes]\nvariant = [\"flash-decoding\", \"tree-decode\", \"naive\"]\nmode = \"decode\"\nseq_kv = 100\nkv_heads = 1\nheads = 4\ndevices = [1, 4]\nallreduce = [\"ring\", \"two-level:2\"]\nsplits = [3]\n",
    );
    let expansion = c.expansion();
    let cases = &expansion.cases;
    assert!(cases
        .iter()
        .all(|k| k.shape.seq_q == 1 && k.mode == Mode::Decode));
    let flash: Vec<_> = cases
        .iter()
        .filter(|k| k.variant == VariantId::FlashDecoding)
        .collect();
    // allreduce is dropped for flash-decoding, and it runs on one device: 1 case, not 4;
    // naive has no decode mode: none of its (2) combinations is a case.
    assert_eq!(flash.len(), 1);
    let left: Vec<(&str, usize)> = expansion
        .left_out
        .iter()
        .map(|l| (l.variant.as_str(), l.count))
        .collect();
    assert_eq!(left, [("flash-decoding", 1), ("naive", 2)]);
    assert_eq!(expansion.left_out_count(), 3);
    assert!(flash
        .iter()
        .all(|k| k.splits == Some(3) && k.allreduce.is_none()));
    let tree: Vec<_> = cases
        .iter()
        .filter(|k| k.variant == VariantId::TreeDecode)
        .collect();
    assert_eq!(tree.len(), 4);
    assert!(tree
        .iter()
        .all(|k| k.splits.is_none() && k.allreduce.is_some()));
    assert!(cases
        .iter()
        .filter(|k| k.variant == VariantId::Naive)
        .all(|k| k.splits.is_none() && k.allreduce.is_none()));
    // Without decode, seq_len stays required.
    let e = config_err(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nmode = [\"decode\", \"fwd\"]\n",
        &[],
    );
    assert!(e.contains("seq_len") && e.contains("decode"), "{e}");
}

#[test]
fn page_axes_apply_to_paged_decode_only_and_name_their_key() {
    let c = cfg(
        "[run]\nname = \"t\"\nthreads = 2\n[axes]\nvariant = [\"flash-decoding\", \"paged-decode\"]\nmode = \"decode\"\nseq_kv = 100\npage_size = [1, 16, 128]\npage_order = [\"shuffled\", \"contiguous\"]\n",
    );
    let cases = c.expand();
    // flash-decoding reads no pages: one case, not six.
    let (fd, pd): (Vec<_>, Vec<_>) = cases
        .iter()
        .partition(|k| k.variant == VariantId::FlashDecoding);
    assert_eq!(fd.len(), 1);
    assert!(fd[0].paging.is_none() && !fd[0].id().contains("|pg"));
    assert_eq!(pd.len(), 6);
    assert!(pd.iter().all(|k| k.splits.is_some()));
    let ids: std::collections::HashSet<String> = pd.iter().map(|k| k.id()).collect();
    assert_eq!(ids.len(), 6);
    assert!(
        ids.contains(&pd[0].id()) && pd[0].id().ends_with("|pg1shuffled"),
        "{}",
        pd[0].id()
    );
    // A page longer than the cache is a skipped row that says so, not a crash.
    let long = pd
        .iter()
        .find(|k| k.paging.unwrap().page_size == 128)
        .unwrap();
    let why = crate::run::skip_reason(long).unwrap();
    assert!(
        why.contains("page_size 128") && why.contains("seq_kv"),
        "{why}"
    );
    // Without the axes, paged-decode pages by 16 tokens in shuffled order.
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"paged-decode\"\nmode = \"decode\"\nseq_kv = 64\n",
    );
    let k = &c.expand()[0];
    assert_eq!(
        k.paging,
        Some(crate::problem::Paging {
            page_size: 16,
            order: crate::problem::PageOrder::Shuffled
        })
    );
    for (extra, key) in [
        ("page_size = 0", "axes.page_size"),
        ("page_size = [16, -1]", "axes.page_size"),
        ("page_order = \"random\"", "axes.page_order"),
        ("page_order = 3", "axes.page_order"),
    ] {
        let e = config_err(&with_axes(extra), &[]);
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn prefill_chunk_applies_to_chunked_prefill_only() {
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = [\"flash\", \"chunked-prefill\"]\ncausal = true\nseq_len = [100, 2000]\nprefill_chunk = [64, 1000]\n",
    );
    let cases = c.expand();
    let (flash, chunked): (Vec<_>, Vec<_>) =
        cases.iter().partition(|k| k.variant == VariantId::Flash);
    assert_eq!(flash.len(), 2);
    assert!(flash.iter().all(|k| k.prefill_chunk.is_none()));
    assert_eq!(chunked.len(), 4);
    assert!(chunked.iter().any(|k| k.id().ends_with("|pc1000")));
    // A named chunk is kept, and one longer than the prompt is a skipped row saying so.
    let long = chunked
        .iter()
        .find(|k| k.shape.seq_q == 100 && k.prefill_chunk == Some(1000))
        .unwrap();
    let why = crate::run::skip_reason(long).unwrap();
    assert!(why.contains("prefill_chunk 1000"), "{why}");
    // The default, 512 tokens, is clamped to a shorter prompt.
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"chunked-prefill\"\ncausal = true\nseq_len = [100, 2000]\n",
    );
    let chunks: Vec<_> = c.expand().iter().map(|k| k.prefill_chunk).collect();
    assert_eq!(chunks, [Some(100), Some(512)]);
    for (extra, key) in [
        ("prefill_chunk = 0", "axes.prefill_chunk"),
        ("prefill_chunk = \"big\"", "axes.prefill_chunk"),
    ] {
        let e = config_err(&with_axes(extra), &[]);
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn batch_spec_packs_a_ragged_batch_for_flash_varlen() {
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = [\"flash-varlen\", \"flash\"]\nheads = 4\nbatch_spec = [\"2xq1k+3xq1kv500\", \"q7\"]\n",
    );
    let cases = c.expand();
    let varlen: Vec<_> = cases
        .iter()
        .filter(|k| k.variant == VariantId::FlashVarlen)
        .collect();
    assert_eq!(varlen.len(), 2);
    let k = varlen[0];
    assert_eq!(
        (k.shape.batch, k.shape.seq_q, k.shape.seq_kv),
        (1, 2051, 3548)
    );
    assert!(k.id().ends_with("|bs2xq1024+3xq1kv500"), "{}", k.id());
    // The others run one length per batch: not cases, and `run` says why.
    assert!(cases.iter().all(|k| k.variant == VariantId::FlashVarlen));
    let left = c.expansion().left_out;
    assert_eq!(left.len(), 1);
    assert_eq!((left[0].variant.as_str(), left[0].count), ("flash", 2));
    assert_eq!(left[0].reasons[0].0, "batch_spec");
    let flash = Case {
        variant: VariantId::Flash,
        ..k.clone()
    };
    let why = crate::run::skip_reason(&flash).unwrap();
    assert!(
        why.contains("batch_spec") && why.contains("flash-varlen"),
        "{why}"
    );
    // Without a spec, flash-varlen takes the batch of equal lengths as one.
    let c =
        cfg("[run]\nname = \"t\"\n[axes]\nvariant = \"flash-varlen\"\nbatch = 3\nseq_len = 100\n");
    let k = &c.expand()[0];
    assert_eq!(k.batch_spec.as_ref().unwrap().to_string(), "3xq100");
    assert_eq!((k.shape.batch, k.shape.seq_q), (1, 300));
    for (extra, key, says) in [
        ("batch_spec = \"2xq0\"", "axes.batch_spec", "length 0"),
        ("batch_spec = \"q4kv2+zz\"", "axes.batch_spec", "`q4kv2`"),
        ("batch_spec = \"q4+zz\"", "axes.batch_spec", "`zz`"),
        ("batch_spec = 3", "axes.batch_spec", "batch spec"),
    ] {
        let e = config_err(&with_axes(extra), &[]);
        assert!(e.contains(key) && e.contains(says), "{extra}: {e}");
    }
    // Lengths come from the spec or from seq_len, not both.
    let e = config_err(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"flash-varlen\"\nseq_len = 64\nbatch_spec = \"q8\"\n",
        &[],
    );
    assert!(
        e.contains("axes.batch_spec") && e.contains("seq_len"),
        "{e}"
    );
}

/// The split-KV variants run a batch_spec in decode mode, split over the whole ragged
/// cache by default (4 parts per thread, none under a key block); a given `splits` stays;
/// decode-online still declines it, naming the variants that run one.
#[test]
fn split_kv_variants_take_a_batch_spec_in_decode() {
    let c = cfg(
        "[run]\nname = \"t\"\nthreads = 2\n[axes]\nmode = \"decode\"\nvariant = [\"flash-decoding\", \"paged-decode\", \"decode-online\"]\nheads = 4\nkv_heads = 2\nbatch_spec = [\"q1kv8k+3xq1kv1k\", \"q1kv2k\"]\n",
    );
    let cases = c.expand();
    let splits = |v: VariantId, spec: &str| {
        cases
            .iter()
            .find(|k| k.variant == v && k.batch_spec.as_ref().unwrap().to_string() == spec)
            .unwrap()
            .splits
    };
    for v in [VariantId::FlashDecoding, VariantId::PagedDecode] {
        assert_eq!(splits(v, "q1kv8192+3xq1kv1024"), Some(8));
        assert_eq!(splits(v, "q1kv2048"), Some(2));
    }
    assert!(cases.iter().all(|k| k.variant != VariantId::DecodeOnline));
    let online = Case {
        variant: VariantId::DecodeOnline,
        ..cases[0].clone()
    };
    let why = crate::run::skip_reason(&online).unwrap();
    assert!(
        why.contains("flash-decoding") && why.contains("paged-decode"),
        "{why}"
    );
    let c = cfg(
        "[run]\nname = \"t\"\n[axes]\nmode = \"decode\"\nvariant = \"flash-decoding\"\nsplits = 3\nbatch_spec = \"q1kv8k+3xq1kv1k\"\n",
    );
    assert_eq!(c.expand()[0].splits, Some(3));
}

#[test]
fn new_axes_and_model_keys_are_checked_and_named() {
    for (extra, key) in [
        ("allreduce = \"star\"", "axes.allreduce"),
        ("allreduce = \"two-level:0\"", "axes.allreduce"),
        ("devices = 0", "axes.devices"),
        ("splits = []", "axes.splits"),
    ] {
        let e = config_err(&with_axes(extra), &[]);
        assert!(e.contains(key), "{extra}: {e}");
    }
    for (model, key) in [
        ("topology = 3", "model.topology"),
        ("compute = \"tpu\"", "model.compute"),
        (
            "devices = [8, 12]\nallreduce = \"two-level\"",
            "model.allreduce",
        ),
        ("check = [[1, 2, 3]]", "model.check"),
        ("overlap = \"yes\"", "model.overlap"),
        ("alpha_inter_us = -1", "model.alpha_inter_us"),
    ] {
        let e = config_err(&format!("{MIN}[model]\n{model}\n"), &[]);
        assert!(e.contains(key), "{model}: {e}");
    }
    let c = cfg(&format!(
        "{MIN}[model]\ntopology = \"pcie-pair\"\ncompute = \"measured\"\n"
    ));
    let m = c.model.unwrap();
    assert_eq!(m.topology.per_node, 2);
    assert_eq!(
        m.allreduce,
        crate::sim::plan::Allreduce::TwoLevel { per_node: 2 }
    );
    assert!(matches!(m.compute, ComputeSpec::Measured { .. }));
    let c = load(
        &format!("{MIN}[model]\n"),
        &["model.devices=8,64", "model.beta_inter_gbs=25"],
    )
    .unwrap();
    let m = c.model.unwrap();
    assert_eq!(m.devices, vec![8, 64]);
    assert_eq!(m.topology.inter.beta_bytes_per_s, 25e9);
    assert!(load(MIN, &["model.check=1"]).is_err());
}

#[test]
fn innermost_axes_turn_fastest_in_their_order() {
    let text = "[run]\nname = \"t\"\ninnermost = [\"threads\", \"variant\"]\n[axes]\n\
                variant = [\"naive\", \"flash\"]\nthreads = [1, 2]\nseq_len = [64, 128]\n";
    let key = |k: &crate::problem::Case| (k.shape.seq_q, k.threads, k.variant.name());
    let got: Vec<_> = cfg(text).expand().iter().map(key).collect();
    assert_eq!(
        got,
        [
            (64, 1, "naive"),
            (64, 1, "flash"),
            (64, 2, "naive"),
            (64, 2, "flash"),
            (128, 1, "naive"),
            (128, 1, "flash"),
            (128, 2, "naive"),
            (128, 2, "flash"),
        ]
    );
    // Without it, the fixed order: variant outermost, seq_len fastest.
    let plain = text.replace("innermost = [\"threads\", \"variant\"]\n", "");
    let first: Vec<_> = cfg(&plain).expand().iter().take(2).map(key).collect();
    assert_eq!(first, [(64, 1, "naive"), (128, 1, "naive")]);
    // The same from the command line; the dry-run grid lists the axes in this order.
    let c = load(&plain, &["run.innermost=threads,variant"]).unwrap();
    assert_eq!(c.expand().iter().map(key).collect::<Vec<_>>(), got);
    let rows = c.grid_summary();
    let names: Vec<&str> = rows.iter().rev().take(2).map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["variant", "threads"]);
}

#[test]
fn a_zip_group_with_an_innermost_member_turns_with_it() {
    let text = "[run]\nname = \"t\"\ninnermost = [\"batch\"]\n[axes]\nvariant = \"naive\"\n\
                seq_len = [64, 128]\n[[zip]]\nbatch = [1, 2]\nheads = [4, 2]\n";
    let got: Vec<_> = cfg(text)
        .expand()
        .iter()
        .map(|k| (k.shape.seq_q, k.shape.batch, k.shape.heads))
        .collect();
    assert_eq!(got, [(64, 1, 4), (64, 2, 2), (128, 1, 4), (128, 2, 2)]);
}

#[test]
fn innermost_must_name_each_axis_once() {
    let base = "[run]\nname = \"t\"\ninnermost = X\n[axes]\nvariant = \"naive\"\nseq_len = 64\n";
    for (value, want) in [
        ("[\"threads\", \"speed\"]", "expected axis names"),
        ("[\"threads\", \"threads\"]", "`threads` is named twice"),
        ("\"threads\"", "expected a list of axis names"),
        ("[3]", "expected axis names"),
    ] {
        let msg = config_err(&base.replace('X', value), &[]);
        assert!(msg.contains(want), "{value}: {msg}");
    }
}

#[test]
fn decode_gemm_rows_is_measured_by_default_or_pinned_at_16_or_more() {
    assert_eq!(cfg(MIN).run.decode_gemm_rows, None);
    let measured =
        "[run]\nname = \"t\"\ndecode_gemm_rows = \"measured\"\n[axes]\nvariant = \"naive\"\nseq_len = 8\n";
    assert_eq!(cfg(measured).run.decode_gemm_rows, None);
    let c = load(MIN, &["run.decode_gemm_rows=64"]).unwrap();
    assert_eq!(c.run.decode_gemm_rows, Some(64));
    for bad in ["8", "-1", "\"fast\"", "true"] {
        let text = format!(
            "[run]\nname = \"t\"\ndecode_gemm_rows = {bad}\n[axes]\nvariant = \"naive\"\nseq_len = 8\n"
        );
        let msg = config_err(&text, &[]);
        assert!(
            msg.starts_with("run.decode_gemm_rows (line 3)") && msg.contains("at least 16"),
            "{bad}: {msg}"
        );
    }
}

#[test]
fn threads_beyond_eight_per_cpu_are_refused_naming_the_key() {
    let max = super::run::max_threads();
    assert!(max >= 64);
    assert_eq!(
        load(MIN, &[&format!("axes.threads={max}")])
            .unwrap()
            .run
            .threads,
        { super::run::default_threads() }
    );
    for (set, key) in [
        (format!("axes.threads=1,{}", max + 1), "axes.threads"),
        (format!("run.threads={}", max + 1), "run.threads"),
    ] {
        let e = load(MIN, &[&set]).unwrap_err().to_string();
        assert!(
            e.contains(key) && e.contains(&format!("{} is more than {max}", max + 1)),
            "{set}: {e}"
        );
    }
}

#[test]
fn kernel_path_is_an_axis_with_a_run_default_and_only_paths_this_cpu_runs() {
    use crate::backend::cpu::isa::Isa;
    // Unset: no case forces a path, and ids are as before.
    let plain = cfg(MIN).expand();
    assert!(plain.iter().all(|c| c.kernel_path.is_none()));
    assert!(plain.iter().all(|c| !c.id().contains("|kp")));
    // The axis: one case per path, the path in the id.
    let both = cfg(&with_axes("kernel_path = [\"portable\", \"avx2\"]"));
    let paths: Vec<Option<Isa>> = both.expand().iter().map(|c| c.kernel_path).collect();
    if Isa::Avx2.available() {
        assert_eq!(paths, [Some(Isa::Portable), Some(Isa::Avx2)]);
        assert!(both.expand()[1].id().ends_with("|kpavx2"));
    }
    // "all": every path this CPU runs, widest first.
    let all = cfg(&with_axes("kernel_path = \"all\""));
    let got: Vec<Option<Isa>> = all.expand().iter().map(|c| c.kernel_path).collect();
    let want: Vec<Option<Isa>> = Isa::available_paths().into_iter().map(Some).collect();
    assert_eq!(got, want);
    // run.kernel_path is the axis's default; the axis wins where both are given.
    let by_run = load(MIN, &["run.kernel_path=portable"]).unwrap();
    assert_eq!(by_run.run.kernel_path, Some(Isa::Portable));
    assert!(by_run
        .expand()
        .iter()
        .all(|c| c.kernel_path == Some(Isa::Portable)));
    let axis_wins = load(
        &with_axes("kernel_path = \"portable\""),
        &["run.kernel_path=portable"],
    )
    .unwrap();
    assert_eq!(axis_wins.expand().len(), 1);
    // Unknown names and paths this CPU lacks are refused, naming the key and the list.
    let e = config_err(&with_axes("kernel_path = \"sse2\""), &[]);
    assert!(
        e.contains("kernel_path") && e.contains("avx512-bf16, avx512"),
        "{e}"
    );
    let e = config_err(MIN, &["run.kernel_path=sse2"]);
    assert!(e.starts_with("run.kernel_path"), "{e}");
    for isa in Isa::ALL.into_iter().filter(|i| !i.available()) {
        let e = config_err(&with_axes(&format!("kernel_path = \"{isa}\"")), &[]);
        assert!(e.contains("not available on this CPU"), "{e}");
    }
    // The GPU and multi-device variants take no path: a GPU case keeps its plain id, and a
    // ring case forced onto a path is left out, saying why.
    let gpu = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"flash\"\ndevice = \"cuda\"\nseq_len = 64\nkernel_path = \"portable\"\n",
    );
    assert!(gpu.expand().iter().all(|c| c.kernel_path.is_none()));
    let ring = cfg(
        "[run]\nname = \"t\"\n[axes]\nvariant = \"ring-prefill\"\ndevices = 2\nseq_len = 64\nkernel_path = \"portable\"\n",
    );
    let x = ring.expansion();
    assert!(x.cases.is_empty());
    assert!(
        x.left_out[0].line().contains("default kernel path only"),
        "{:?}",
        x.left_out
    );
}

#[test]
fn precision_is_an_axis_in_the_id_only_when_set() {
    use crate::problem::Precision;
    // Unset: every case is `fast` and its id is as before the axis existed.
    let plain = cfg(MIN).expand();
    assert!(plain.iter().all(|c| c.precision.is_none() && !c.highest()));
    assert!(plain.iter().all(|c| !c.id().contains("|pr")));
    // The axis: one case per value, the value at the end of the id.
    let both = cfg(&with_axes("precision = [\"fast\", \"highest\"]"));
    let cases = both.expand();
    let got: Vec<Option<Precision>> = cases.iter().map(|c| c.precision).collect();
    assert_eq!(got, [Some(Precision::Fast), Some(Precision::Highest)]);
    assert!(cases[0].id().ends_with("|prfast"), "{}", cases[0].id());
    assert!(cases[1].id().ends_with("|prhighest"), "{}", cases[1].id());
    assert!(cases[1].highest());
    // --set reaches it too.
    let set = load(MIN, &["axes.precision=highest"]).unwrap();
    assert!(set.expand().iter().all(|c| c.highest()));
    // A bad value names the key and the choices, in a file and in a --set.
    let e = config_err(&with_axes("precision = \"exact\""), &[]);
    assert!(
        e.contains("precision") && e.contains("fast, highest"),
        "{e}"
    );
    let e = config_err(MIN, &["axes.precision=f32"]);
    assert!(
        e.contains("precision") && e.contains("fast, highest"),
        "{e}"
    );
}

//! `--set KEY=VALUES` overrides, applied to the raw TOML table before it is checked, so a
//! value from the command line passes exactly the validation a value from the file does.
//!
//! `KEY` is an axis (`seq_len=1024,2048`, `dtype=bf16`, `seq_len=pow2:8:12`; `axes.KEY` is
//! accepted too), `run.KEY` (`run.max_time_s=0.5`, `run.memory_budget=8GiB`) or
//! `report.KEY` (`report.paper_table=FILE`). Axis items are comma-separated; each is read as
//! a TOML value (integer, float, bool), else kept as a string; name axes, `run.name`,
//! `run.diff_against` and `report.*` always take strings. Setting an axis that a `[[zip]]`
//! group holds replaces it inside the group when the new list has the group's length (the
//! pairing is kept); otherwise the axis leaves the group and becomes an independent axis in
//! `[axes]`.

use toml::{Table, Value};

use super::axis::{value_len, Axis};
use super::model::MODEL_KEYS;
use super::schema::{REPORT_KEYS, RUN_KEYS};
use crate::error::{Error, Result};

/// Apply one `--set` to the config table; returns the key path it set (`axes.seq_len`,
/// `zip[0].batch`, `run.seed`). A malformed argument or unknown key is `Error::Usage`.
pub fn apply_set(table: &mut Table, arg: &str) -> Result<String> {
    let usage = |msg: String| Error::Usage(format!("--set `{arg}`: {msg}"));
    let (key, value) = arg.split_once('=').ok_or_else(|| {
        usage(
            "expected KEY=VALUE, e.g. seq_len=1024,2048, seq_len=pow2:8:12 or run.max_time_s=0.5"
                .into(),
        )
    })?;
    let (key, value) = (key.trim(), value.trim());
    let axis_key = match key.split_once('.') {
        None => key,
        Some(("axes", k)) => k,
        Some(("run", k)) => {
            if !RUN_KEYS.contains(&k) {
                return Err(usage(format!(
                    "unknown key `run.{k}` (known run keys: {})",
                    RUN_KEYS.join(", ")
                )));
            }
            let v = match k {
                "name" | "diff_against" => Value::String(value.to_string()),
                "innermost" => Value::Array(
                    value
                        .split(',')
                        .map(|a| Value::String(a.trim().to_string()))
                        .collect(),
                ),
                _ => item(value),
            };
            section(table, "run")
                .map_err(usage)?
                .insert(k.to_string(), v);
            return Ok(format!("run.{k}"));
        }
        Some(("report", k)) => {
            if !REPORT_KEYS.contains(&k) {
                return Err(usage(format!(
                    "unknown key `report.{k}` (known report keys: {})",
                    REPORT_KEYS.join(", ")
                )));
            }
            section(table, "report")
                .map_err(usage)?
                .insert(k.to_string(), Value::String(value.to_string()));
            return Ok(format!("report.{k}"));
        }
        Some(("model", k)) => {
            if !MODEL_KEYS.contains(&k) || k == "check" {
                return Err(usage(format!(
                    "unknown or unsettable key `model.{k}` (settable: {})",
                    MODEL_KEYS[..MODEL_KEYS.len() - 1].join(", ")
                )));
            }
            let v = match k {
                "topology" | "compute" | "dtype" | "allreduce" => Value::String(value.to_string()),
                "devices" | "tokens" => Value::Array(value.split(',').map(item).collect()),
                _ => item(value),
            };
            section(table, "model")
                .map_err(usage)?
                .insert(k.to_string(), v);
            return Ok(format!("model.{k}"));
        }
        Some(("plugins", name)) => {
            // A library path, as `[plugins] NAME = "path"` (keeping a table's other keys).
            let plugins = section(table, "plugins").map_err(usage)?;
            let lib = Value::String(value.to_string());
            match plugins.get_mut(name).and_then(Value::as_table_mut) {
                Some(t) => {
                    t.insert("library".into(), lib);
                }
                None => {
                    plugins.insert(name.to_string(), lib);
                }
            }
            return Ok(format!("plugins.{name}"));
        }
        Some(("python", rest)) => {
            let (name, k) = rest.split_once('.').ok_or_else(|| {
                usage(format!(
                    "expected python.NAME.KEY (KEY: {}), e.g. python.sdpa-math.python=/venv/bin/python",
                    PYTHON_KEYS.join(", ")
                ))
            })?;
            if !PYTHON_KEYS.contains(&k) {
                return Err(usage(format!(
                    "unknown key `python.{name}.{k}` (known: {})",
                    PYTHON_KEYS.join(", ")
                )));
            }
            let v = match k {
                "path" => Value::Array(
                    value
                        .split(',')
                        .map(|p| Value::String(p.trim().to_string()))
                        .collect(),
                ),
                "timeout_s" => item(value),
                _ => Value::String(value.to_string()),
            };
            let python = section(table, "python").map_err(usage)?;
            section(python, name).map_err(usage)?.insert(k.to_string(), v);
            return Ok(format!("python.{name}.{k}"));
        }
        Some(_) => {
            return Err(usage(format!(
                "unknown key `{key}`: expected an axis ({}), run.KEY, report.KEY, model.KEY, plugins.NAME or python.NAME.KEY",
                Axis::names().join(", ")
            )))
        }
    };
    let axis = Axis::from_name(axis_key).ok_or_else(|| {
        usage(format!(
            "unknown key `{axis_key}`: expected an axis ({}) or run.KEY ({})",
            Axis::names().join(", "),
            RUN_KEYS.join(", ")
        ))
    })?;
    let value = axis_value(axis, value).map_err(usage)?;

    if let Some(Value::Array(groups)) = table.get_mut("zip") {
        for (i, group) in groups.iter_mut().enumerate() {
            let Some(group) = group.as_table_mut() else {
                continue;
            };
            let Some(old) = group.get(axis.name()) else {
                continue;
            };
            let group_len = value_len(old);
            if group.len() > 1 && group_len.is_some() && value_len(&value) == group_len {
                group.insert(axis.name().to_string(), value);
                return Ok(format!("zip[{i}].{}", axis.name()));
            }
            group.remove(axis.name());
        }
    }
    section(table, "axes")
        .map_err(usage)?
        .insert(axis.name().to_string(), value);
    Ok(format!("axes.{}", axis.name()))
}

/// The `[name]` table, created if absent.
/// The keys of a `[python]` entry, for `--set python.NAME.KEY=...`.
const PYTHON_KEYS: [&str; 5] = ["call", "arrays", "python", "path", "timeout_s"];

fn section<'t>(table: &'t mut Table, name: &str) -> Result<&'t mut Table, String> {
    table
        .entry(name)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .ok_or_else(|| format!("`{name}` in the config file is not a table"))
}

/// `pow2:lo:hi`, or comma-separated items (one item is a scalar).
fn axis_value(axis: Axis, text: &str) -> Result<Value, String> {
    if let Some(range) = text.strip_prefix("pow2:") {
        let bounds: Vec<i64> = range
            .split(':')
            .map(|b| b.trim().parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("expected pow2:LO:HI with integer exponents, got `{text}`"))?;
        let [lo, hi] = bounds[..] else {
            return Err(format!("expected pow2:LO:HI, got `{text}`"));
        };
        let mut t = Table::new();
        t.insert(
            "pow2".into(),
            Value::Array(vec![Value::Integer(lo), Value::Integer(hi)]),
        );
        return Ok(Value::Table(t));
    }
    if text.is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    let mut items: Vec<Value> = text
        .split(',')
        .map(|s| {
            if axis.takes_names() {
                Value::String(s.trim().to_string())
            } else {
                item(s)
            }
        })
        .collect();
    Ok(if items.len() == 1 {
        items.remove(0)
    } else {
        Value::Array(items)
    })
}

/// One item as a TOML value (`8` integer, `0.5` float, `true` bool), else a string.
fn item(text: &str) -> Value {
    let text = text.trim();
    match toml::from_str::<Table>(&format!("v = {text}")) {
        Ok(mut t) if t.len() == 1 => t
            .remove("v")
            .unwrap_or_else(|| Value::String(text.to_string())),
        _ => Value::String(text.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(toml_text: &str, arg: &str) -> Result<(Table, String)> {
        let mut t: Table = toml::from_str(toml_text).unwrap();
        let key = apply_set(&mut t, arg)?;
        Ok((t, key))
    }

    #[test]
    fn axis_items_are_typed() {
        let (t, key) = set("", "seq_len=1024, 2048").unwrap();
        assert_eq!(key, "axes.seq_len");
        assert_eq!(
            t["axes"]["seq_len"],
            Value::Array(vec![Value::Integer(1024), Value::Integer(2048)])
        );
        let (t, _) = set("", "causal=true,false").unwrap();
        assert_eq!(
            t["axes"]["causal"],
            Value::Array(vec![Value::Boolean(true), Value::Boolean(false)])
        );
        let (t, _) = set("[axes]\ndtype = \"f32\"", "dtype=bf16").unwrap();
        assert_eq!(t["axes"]["dtype"], Value::String("bf16".into()));
        let (t, _) = set("", "input_scale=0.5").unwrap();
        assert_eq!(t["axes"]["input_scale"], Value::Float(0.5));
        let (t, _) = set("", "axes.batch=4").unwrap();
        assert_eq!(t["axes"]["batch"], Value::Integer(4));
    }

    #[test]
    fn plugin_and_python_entries_are_settable() {
        let (t, key) = set("", "plugins.mine=build/libmine.so").unwrap();
        assert_eq!(key, "plugins.mine");
        assert_eq!(
            t["plugins"]["mine"],
            Value::String("build/libmine.so".into())
        );
        // A table entry keeps its timeout and gets the new library.
        let (t, _) = set(
            "[plugins]\nmine = { library = \"a.so\", timeout_s = 5 }",
            "plugins.mine=b.so",
        )
        .unwrap();
        assert_eq!(
            t["plugins"]["mine"]["library"],
            Value::String("b.so".into())
        );
        assert_eq!(t["plugins"]["mine"]["timeout_s"], Value::Integer(5));
        let (t, key) = set("", "python.sdpa.python=/venv/bin/python").unwrap();
        assert_eq!(key, "python.sdpa.python");
        assert_eq!(
            t["python"]["sdpa"]["python"],
            Value::String("/venv/bin/python".into())
        );
        let (t, _) = set("", "python.sdpa.path=a, b").unwrap();
        assert_eq!(
            t["python"]["sdpa"]["path"],
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())])
        );
        let e = set("", "python.sdpa.interpreter=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key `python.sdpa.interpreter`"), "{e}");
        let e = set("", "python.sdpa=x").unwrap_err().to_string();
        assert!(e.contains("expected python.NAME.KEY"), "{e}");
    }

    #[test]
    fn pow2_form() {
        let (t, _) = set("", "seq_len=pow2:8:12").unwrap();
        assert_eq!(
            t["axes"]["seq_len"]["pow2"],
            Value::Array(vec![Value::Integer(8), Value::Integer(12)])
        );
        assert!(
            matches!(set("", "seq_len=pow2:8"), Err(Error::Usage(m)) if m.contains("pow2:LO:HI"))
        );
    }

    #[test]
    fn run_keys() {
        let (t, key) = set("[run]\nname = \"x\"", "run.max_time_s=0.5").unwrap();
        assert_eq!(key, "run.max_time_s");
        assert_eq!(t["run"]["max_time_s"], Value::Float(0.5));
        let (t, _) = set("", "run.memory_budget=8GiB").unwrap();
        assert_eq!(t["run"]["memory_budget"], Value::String("8GiB".into()));
        let (t, _) = set("", "run.name=2024").unwrap();
        assert_eq!(t["run"]["name"], Value::String("2024".into()));
    }

    #[test]
    fn malformed_and_unknown_are_usage_errors_naming_the_argument() {
        for (arg, needle) in [
            ("seq_len", "expected KEY=VALUE"),
            ("sequence=4", "unknown key `sequence`"),
            ("run.speed=4", "unknown key `run.speed`"),
            ("zip.batch=4", "unknown key `zip.batch`"),
        ] {
            match set("", arg) {
                Err(Error::Usage(m)) => assert!(m.contains(arg) && m.contains(needle), "{m}"),
                other => panic!("{arg}: {other:?}"),
            }
        }
    }

    #[test]
    fn zip_member_is_replaced_when_lengths_match_else_moved_out() {
        let zip = "[[zip]]\nbatch = [4, 2]\nseq_len = [8, 16]\n";
        let (t, key) = set(zip, "seq_len=32,64").unwrap();
        assert_eq!(key, "zip[0].seq_len");
        assert_eq!(
            t["zip"][0]["seq_len"],
            Value::Array(vec![Value::Integer(32), Value::Integer(64)])
        );
        let (t, key) = set(zip, "seq_len=pow2:5:7").unwrap();
        assert_eq!(key, "axes.seq_len");
        assert!(t["zip"][0].get("seq_len").is_none());
        assert!(t["axes"]["seq_len"].is_table());
    }
}

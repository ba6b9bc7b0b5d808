//! `[plugins]` and `[python]`: the external implementations a config may name in its
//! `variant` axis as `plugin:NAME` and `python:NAME` (docs/guide/your-kernel.md). Each
//! becomes a `problem::ExternalSpec`: what starts its worker. A library path must exist
//! when the config loads (looked up from the current directory, then beside the config).

use std::path::{Path, PathBuf};
use toml::{Table, Value};

use super::source::{Section, Source};
use crate::error::Result;
use crate::problem::{ExternalKind, ExternalSpec, Externals};

/// Seconds one worker request (a prepare, one timed call, the checked call) may take before
/// the implementation counts as hung: its row is `timeout` and its worker is killed.
pub const DEFAULT_TIMEOUT_S: f64 = 300.0;

/// The array kinds `attnbench-peer` serves.
pub const ARRAYS: [&str; 3] = ["numpy", "torch", "lists"];

pub(super) fn resolve_externals(
    plugins: Option<Table>,
    python: Option<Table>,
    src: &Source,
) -> Result<Externals> {
    let mut out = Externals::new();
    for (name, value) in plugins.unwrap_or_default() {
        let spec = plugin(&name, &value, src)?;
        out.insert(
            variant_name(ExternalKind::Plugin, &name, Section::Plugins, src)?,
            spec,
        );
    }
    for (name, value) in python.unwrap_or_default() {
        let spec = python_callable(&name, &value, src)?;
        out.insert(
            variant_name(ExternalKind::Python, &name, Section::Python, src)?,
            spec,
        );
    }
    Ok(out)
}

fn variant_name(kind: ExternalKind, name: &str, section: Section, src: &Source) -> Result<String> {
    let fine = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !fine {
        return Err(src.err(
            section,
            name,
            "a name is letters, digits, '-', '_' and '.' (it becomes the variant name in rows)",
        ));
    }
    Ok(format!("{}:{name}", kind.prefix()))
}

fn plugin(name: &str, value: &Value, src: &Source) -> Result<ExternalSpec> {
    let err = |msg: String| src.err(Section::Plugins, name, msg);
    let (written, timeout) = match value {
        Value::String(s) => (s.clone(), None),
        Value::Table(t) => {
            known_keys(t, &["library", "timeout_s"]).map_err(err)?;
            let lib = match t.get("library") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(err("expected `library = \"path/to/libNAME.so\"`".into())),
            };
            (lib, t.get("timeout_s"))
        }
        v => {
            return Err(err(format!(
                "expected a library path, e.g. \"build/libmykernel.so\", or {{ library = ..., timeout_s = ... }}, got {} {v}",
                v.type_str()
            )))
        }
    };
    // Absolute, so a worker started elsewhere finds it.
    let library = src
        .locate(Path::new(&written))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .ok_or_else(|| {
            err(format!(
            "library `{written}` not found (looked in the current directory and beside the config)"
        ))
        })?;
    Ok(ExternalSpec::Plugin {
        library,
        timeout_s: timeout_s(timeout).map_err(err)?,
    })
}

fn python_callable(name: &str, value: &Value, src: &Source) -> Result<ExternalSpec> {
    let err = |msg: String| src.err(Section::Python, name, msg);
    let Value::Table(t) = value else {
        return Err(err(format!(
            "expected {{ call = \"module:function\", arrays = \"numpy\" }}, got {} {value}",
            value.type_str()
        )));
    };
    known_keys(t, &["call", "arrays", "python", "path", "timeout_s"]).map_err(err)?;
    let string = |key: &str, default: Option<&str>| match (t.get(key), default) {
        (Some(Value::String(s)), _) if !s.is_empty() => Ok(s.clone()),
        (None, Some(d)) => Ok(d.to_string()),
        (v, _) => Err(err(format!(
            "`{key}`: expected a string{}",
            v.map_or_else(String::new, |v| format!(", got {v}"))
        ))),
    };
    let call = string("call", None)?;
    if !call.contains(':') {
        return Err(err(format!(
            "`call`: expected module:function, e.g. \"mypkg.attention:forward\", got \"{call}\""
        )));
    }
    let arrays = string("arrays", Some("numpy"))?;
    if !ARRAYS.contains(&arrays.as_str()) {
        return Err(err(format!(
            "`arrays`: expected one of {}, got \"{arrays}\"",
            ARRAYS.join(", ")
        )));
    }
    let path = match t.get("path") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(PathBuf::from(s)),
                v => Err(err(format!("`path`: expected directory names, got {v}"))),
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(err(format!(
                "`path`: expected a list of directories, got {v}"
            )))
        }
    };
    Ok(ExternalSpec::Python {
        call,
        arrays,
        python: string("python", Some("python3"))?,
        path,
        timeout_s: timeout_s(t.get("timeout_s")).map_err(err)?,
    })
}

fn known_keys(t: &Table, known: &[&str]) -> std::result::Result<(), String> {
    match t.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown key `{k}` (known: {})", known.join(", "))),
        None => Ok(()),
    }
}

fn timeout_s(v: Option<&Value>) -> std::result::Result<f64, String> {
    let x = match v {
        None => return Ok(DEFAULT_TIMEOUT_S),
        Some(Value::Integer(i)) => *i as f64,
        Some(Value::Float(x)) => *x,
        Some(v) => return Err(format!("`timeout_s`: expected seconds, got {v}")),
    };
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(format!("`timeout_s`: must be more than 0 seconds, got {x}"))
    }
}

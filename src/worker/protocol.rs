//! Messages of the worker protocol, version 1: one JSON object a line on the worker's
//! stdin (requests, tagged by `op`) and one JSON object a line on its stdout (one reply per
//! request, in order). Nothing else may be written to the worker's stdout; its stderr is
//! free. A worker exits when its stdin closes or on `quit`.
//!
//! - `{"op":"hello","protocol":1}` -> `{"ok":true,"protocol":1,"implementation":...,...}`
//! - `{"op":"run","case":CASE,"stop":RULE,"error_rows":N,"memory_budget":BYTES|null}`
//!   (and `"decode_gemm_rows":N` where the config pins decode's loop choice) ->
//!   `{"ok":true,"status":"ok","reason":"","samples":[s, ...],"mem_overhead_bytes":B,
//!   "max_abs_err":E}`: the case measured by the worker's run sequence under that
//!   stopping rule (its warm-up, timed calls, checked call and oracle check).
//!   `CASE` is [`Case`]'s JSON form (the fields of a `runs.csv` row's identity).
//! - `{"op":"quit"}` -> `{"ok":true}`, then the worker exits.
//!
//! Workers of external implementations (`attnbench worker --plugin LIB`,
//! `python -m attnbench_peer`) are driven call by call instead, so the driver owns the
//! schedule and can interleave them with its own cases:
//! - `{"op":"prepare","case":CASE,"inputs":{"q":PATH,"k":PATH,"v":PATH},"output":PATH,
//!   "memory_budget":BYTES|null}` ->
//!   `{"ok":true,"supported":true|false,"reason":"...","workspace_bytes":B|null}`: load the
//!   inputs (raw little-endian f32, C order, `[batch, heads, seq_q, head_dim]` for q and
//!   `[batch, kv_heads, seq_kv, head_dim]` for k and v; every value exact in the case's
//!   dtype) and allocate the output; `supported: false` says why the case cannot run.
//! - `{"op":"call","n":N}` -> `{"ok":true,"seconds":[s, ...]}`: N calls, each timed by the
//!   worker (the driver's pipe round trip is not in a sample).
//! - `{"op":"check"}` -> `{"ok":true,"mem_overhead_bytes":B|null,"memory_source":"..."}`:
//!   the output filled with NaN, one call under the worker's memory figure, the output
//!   written to the prepare's `output` path (raw little-endian f32, C order).
//! - `{"op":"release"}` -> `{"ok":true}`: the prepared case's buffers freed.
//!
//! A request the worker cannot parse or serve gets `{"ok":false,"error":"..."}` and the
//! worker goes on: an older build that does not know a new variant answers that case with
//! an error instead of ending the session.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::measure::timer::StopRule;
use crate::problem::Case;

/// The protocol version this build speaks.
pub const PROTOCOL: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Hello {
        protocol: u32,
    },
    Run {
        case: Box<Case>,
        stop: StopRule,
        error_rows: usize,
        #[serde(default)]
        memory_budget: Option<u64>,
        /// The config's `run.decode_gemm_rows` where it pins decode's loop choice; absent:
        /// the worker's own measured choice.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decode_gemm_rows: Option<usize>,
    },
    Prepare {
        case: Box<Case>,
        inputs: InputFiles,
        output: PathBuf,
        /// The run's memory budget: live bytes (inputs and output included) past which
        /// the allocator table refuses a large request.
        #[serde(default)]
        memory_budget: Option<u64>,
    },
    Call {
        n: usize,
    },
    Check,
    Release,
    Quit,
}

/// Where `prepare` finds the inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputFiles {
    pub q: PathBuf,
    pub k: PathBuf,
    pub v: PathBuf,
}

/// The reply to `prepare`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub supported: bool,
    #[serde(default)]
    pub reason: String,
    /// The implementation's own prediction of its scratch bytes, where it makes one.
    #[serde(default)]
    pub workspace_bytes: Option<u64>,
}

/// The reply to `call`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Called {
    pub seconds: Vec<f64>,
}

/// The reply to `check`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checked {
    #[serde(default)]
    pub mem_overhead_bytes: Option<u64>,
    /// What the figure counts (the allocator table, RSS, a framework's allocator peak).
    #[serde(default)]
    pub memory_source: String,
}

/// The reply to `release`: nothing besides `ok`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Released {}

/// The reply to `hello`: who answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    /// What the worker is, e.g. `attnbench 0.1.0`.
    pub implementation: String,
    /// The revision of the worker's source tree, where it knows one.
    #[serde(default)]
    pub git_revision: Option<String>,
    #[serde(default)]
    pub git_dirty: Option<bool>,
    /// The CPU kernel path it runs (attnbench workers).
    #[serde(default)]
    pub cpu_kernel_path: Option<String>,
    /// Its measured decode loop choice (`DecodePath::summary`), attnbench workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_decode_loop: Option<String>,
}

/// The reply to `run`: the case's status (a `runs.csv` status: ok, oom, skipped, error,
/// timeout) and what was measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReply {
    pub status: String,
    #[serde(default)]
    pub reason: String,
    /// Seconds of each timed call, in call order.
    #[serde(default)]
    pub samples: Vec<f64>,
    #[serde(default)]
    pub mem_overhead_bytes: Option<u64>,
    #[serde(default)]
    pub max_abs_err: Option<f64>,
}

/// One reply line: `ok` and, when false, `error`; the rest is the request's reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply<T> {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub body: Option<T>,
}

impl<T> Reply<T> {
    pub fn ok(body: T) -> Reply<T> {
        Reply {
            ok: true,
            error: None,
            body: Some(body),
        }
    }

    pub fn failed(error: impl Into<String>) -> Reply<T> {
        Reply {
            ok: false,
            error: Some(error.into()),
            body: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::VariantId;
    use crate::problem::{DType, Shape};
    use crate::variant::DefaultCase;

    #[test]
    fn a_run_request_round_trips_through_one_json_line() {
        let case = crate::problem::Case {
            causal: true,
            splits: Some(3),
            allreduce: Some(crate::sim::plan::Allreduce::TwoLevel { per_node: 4 }),
            ..Case::cpu_fwd(
                VariantId::Flash,
                Shape::self_attention(2, 80, 64),
                DType::Bf16,
                1,
            )
        };
        let req = Request::Run {
            case: Box::new(case),
            stop: StopRule::default(),
            error_rows: 16,
            memory_budget: Some(1 << 30),
            decode_gemm_rows: None,
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with(r#"{"op":"run","case":{"variant":"flash""#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
    }

    #[test]
    fn unknown_ops_and_variants_are_errors_not_panics() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"dance"}"#).is_err());
        let mut v = serde_json::to_value(Request::Run {
            case: Box::new(Case::cpu_fwd(
                VariantId::Naive,
                Shape::self_attention(1, 8, 8),
                DType::F32,
                1,
            )),
            stop: StopRule::default(),
            error_rows: 1,
            memory_budget: None,
            decode_gemm_rows: None,
        })
        .unwrap();
        v["case"]["variant"] = "not-a-variant".into();
        let e = serde_json::from_value::<Request>(v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `not-a-variant`"), "{e}");
    }

    #[test]
    fn replies_carry_either_a_body_or_an_error() {
        let ok = serde_json::to_string(&Reply::ok(RunReply {
            status: "ok".into(),
            samples: vec![0.5],
            ..Default::default()
        }))
        .unwrap();
        assert!(ok.starts_with(r#"{"ok":true,"status":"ok""#), "{ok}");
        let back: Reply<RunReply> = serde_json::from_str(&ok).unwrap();
        assert_eq!(back.body.unwrap().samples, vec![0.5]);
        let err = serde_json::to_string(&Reply::<RunReply>::failed("no")).unwrap();
        assert_eq!(err, r#"{"ok":false,"error":"no"}"#);
        let back: Reply<RunReply> = serde_json::from_str(&err).unwrap();
        assert!(!back.ok && back.error.as_deref() == Some("no"));
    }
}

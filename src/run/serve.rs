//! `attnbench worker`: answers the worker protocol (`worker::protocol`) on stdin/stdout
//! until stdin closes or `quit`. Each `run` goes through the one run sequence (`run_case`:
//! predict memory, inputs, warm-up, timed calls under the requested stopping rule, memory
//! checked call, oracle), so a worker measures a case exactly as a sweep of its build does.
//! With `--plugin LIB` it also serves `prepare`, `call`, `check` and `release` for that
//! C-ABI plugin (`plugin::host`), which a sweep's `plugin:NAME` cases drive
//! (`run::external`); a plugin that does not load answers `hello` with the reason.
//! Cost per request: that of the case's run or calls; one prepared case between requests.

use std::io::{BufRead, Write};

use std::path::Path;

use crate::backend::cpu::decode_path::{self, DecodePath};
use crate::error::{Error, Result};
use crate::plugin::abi::Plugin;
use crate::plugin::host::Host;
use crate::run::{run_case, Settings};
use crate::worker::protocol::{Hello, Released, Reply, Request, RunReply, PROTOCOL};

/// What `attnbench worker` does before serving: an attnbench worker (no plugin) measures
/// this machine's decode loop choice, so that no timed call pays for the probe.
pub fn prepare(plugin: Option<&Path>) {
    if plugin.is_none() {
        decode_path::measure_once();
    }
}

/// Serves requests from `input` to `output`, one reply line per request line; `plugin`:
/// the library whose calls `prepare`, `call` and `check` make.
pub fn serve(input: impl BufRead, mut output: impl Write, plugin: Option<&Path>) -> Result<()> {
    let mut host: Option<std::result::Result<Host, String>> =
        plugin.map(|p| Plugin::open(p).map(Host::new).map_err(|e| e.to_string()));
    let io = |e: std::io::Error| Error::Io {
        context: "worker: writing a reply to stdout".into(),
        source: e,
    };
    for line in input.lines() {
        let line = line.map_err(|e| Error::Io {
            context: "worker: reading a request from stdin".into(),
            source: e,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let (reply, quit) = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Quit) => (r#"{"ok":true}"#.to_string(), true),
            Ok(request) => (answer(request, &mut host), false),
            Err(e) => (
                to_line(&Reply::<()>::failed(format!("bad request: {e}"))),
                false,
            ),
        };
        writeln!(output, "{reply}").map_err(io)?;
        output.flush().map_err(io)?;
        if quit {
            break;
        }
    }
    Ok(())
}

fn answer(request: Request, host: &mut Option<std::result::Result<Host, String>>) -> String {
    let failed = |e: String| to_line(&Reply::<()>::failed(e));
    match request {
        Request::Hello { protocol } if protocol != PROTOCOL => failed(format!(
            "this worker speaks protocol {PROTOCOL}, not {protocol}"
        )),
        Request::Hello { .. } => match host {
            Some(Err(e)) => failed(e.clone()),
            Some(Ok(h)) => {
                let mut me = hello();
                me.implementation = format!("{} (plugin {})", me.implementation, h.plugin.name);
                ok_line(me)
            }
            None => ok_line(hello()),
        },
        Request::Prepare {
            case,
            inputs,
            output,
            memory_budget,
        } => {
            reply(plugin_host(host).and_then(|h| h.prepare(&case, &inputs, &output, memory_budget)))
        }
        Request::Call { n } => reply(plugin_host(host).and_then(|h| h.call(n))),
        Request::Check => reply(plugin_host(host).and_then(Host::check)),
        Request::Release => reply(plugin_host(host).map(|h| {
            h.release();
            Released {}
        })),
        Request::Run {
            case,
            stop,
            error_rows,
            memory_budget,
            decode_gemm_rows,
        } => {
            match decode_gemm_rows {
                Some(rows) => DecodePath::pinned(rows).install(),
                // The choice this worker measured at its start (`attnbench worker`).
                None => {
                    if let Some(p) = decode_path::measured() {
                        p.install();
                    }
                }
            }
            let settings = Settings {
                run_name: "worker".into(),
                stop,
                memory_budget,
                error_rows,
                extrapolate: None,
                diff_against: None,
                model_layers: None,
                gpu: Default::default(),
                externals: Default::default(),
            };
            match run_case(&case, &settings, None) {
                Ok(outcome) => {
                    let r = outcome.record;
                    to_line(&Reply::ok(RunReply {
                        status: r.status.name().to_string(),
                        reason: r.reason,
                        samples: outcome.samples,
                        mem_overhead_bytes: r.mem_overhead_bytes,
                        max_abs_err: r.max_abs_err,
                    }))
                }
                Err(e) => to_line(&Reply::<()>::failed(e.to_string())),
            }
        }
        Request::Quit => unreachable!("handled by serve"),
    }
}

/// The plugin the `prepare`, `call`, `check` and `release` requests need: the one this
/// worker serves, or why there is none.
fn plugin_host(host: &mut Option<std::result::Result<Host, String>>) -> Result<&mut Host> {
    match host {
        Some(Ok(h)) => Ok(h),
        Some(Err(e)) => Err(Error::Runtime(e.clone())),
        None => Err(Error::Runtime(
            "this worker serves no plugin (start it with --plugin LIBRARY)".into(),
        )),
    }
}

fn ok_line<T: serde::Serialize>(body: T) -> String {
    to_line(&Reply::ok(body))
}

/// The reply line of a request's result: its body, or its error.
fn reply<T: serde::Serialize>(r: Result<T>) -> String {
    r.map_or_else(|e| to_line(&Reply::<()>::failed(e.to_string())), ok_line)
}

/// Who this worker is: the build's version, source revision and kernel path.
pub fn hello() -> Hello {
    let (git_revision, git_dirty) = crate::results::meta::git_state();
    Hello {
        protocol: PROTOCOL,
        implementation: format!("attnbench {}", env!("CARGO_PKG_VERSION")),
        git_revision,
        git_dirty,
        cpu_kernel_path: Some(crate::backend::cpu::isa::Isa::detect().name().to_string()),
        cpu_decode_loop: decode_path::measured().map(DecodePath::summary),
    }
}

fn to_line<T: serde::Serialize>(reply: &Reply<T>) -> String {
    serde_json::to_string(reply)
        .unwrap_or_else(|e| format!(r#"{{"ok":false,"error":"reply not serializable: {e}"}}"#))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::timer::StopRule;
    use crate::problem::VariantId;
    use crate::problem::{Case, DType, Shape};
    use crate::variant::DefaultCase;

    fn served(requests: &[String]) -> Vec<serde_json::Value> {
        let input = requests.join("\n");
        let mut out = Vec::new();
        serve(input.as_bytes(), &mut out, None).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_session_answers_every_line_in_order_and_stops_at_quit() {
        let _g = crate::measure::alloc::test_lock();
        let case = Case::cpu_fwd(
            VariantId::Flash,
            Shape::self_attention(2, 24, 16),
            DType::F32,
            1,
        );
        let run = serde_json::to_string(&Request::Run {
            case: Box::new(case),
            stop: StopRule {
                warmup: 1,
                min_reps: 4,
                max_reps: 4,
                ..StopRule::default()
            },
            error_rows: 8,
            memory_budget: None,
            decode_gemm_rows: None,
        })
        .unwrap();
        let replies = served(&[
            r#"{"op":"hello","protocol":1}"#.into(),
            "not json".into(),
            run,
            r#"{"op":"hello","protocol":99}"#.into(),
            r#"{"op":"quit"}"#.into(),
            r#"{"op":"hello","protocol":1}"#.into(),
        ]);
        assert_eq!(replies.len(), 5, "{replies:?}");
        assert_eq!(replies[0]["ok"], true);
        assert_eq!(replies[0]["protocol"], 1);
        assert!(replies[0]["implementation"]
            .as_str()
            .unwrap()
            .starts_with("attnbench "));
        assert_eq!(replies[1]["ok"], false);
        assert!(replies[1]["error"]
            .as_str()
            .unwrap()
            .contains("bad request"));
        let r: Reply<RunReply> = serde_json::from_value(replies[2].clone()).unwrap();
        let body = r.body.unwrap();
        assert_eq!(body.status, "ok", "{}", body.reason);
        assert_eq!(body.samples.len(), 4);
        assert!(body.samples.iter().all(|&s| s > 0.0));
        assert!(body.max_abs_err.is_some_and(|e| e < 1e-5));
        assert!(body.mem_overhead_bytes.is_some());
        assert_eq!(replies[3]["ok"], false);
        assert_eq!(replies[4], serde_json::json!({"ok": true}));
    }
}

//! The driver's side of the worker protocol: starts a worker process, says hello, sends one
//! request at a time and reads its reply line, with a time limit (a hung worker is killed
//! and reported, never waited on forever). Cost: one pipe round trip per request.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::protocol::{Hello, Reply, Request, RunReply, PROTOCOL};
use crate::error::{Error, Result};

/// A running worker process.
pub struct Worker {
    /// How the user named it (`--baseline PATH`), for messages.
    pub label: String,
    pub hello: Hello,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    timeout: Duration,
}

/// Why a request got no measurement.
#[derive(Debug)]
pub enum Failure {
    /// The worker answered with an error (it goes on serving).
    Refused(String),
    /// The worker died or broke the protocol (it is stopped).
    Lost(String),
    /// The worker gave no reply within the time limit (it is killed).
    TimedOut(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::Refused(m) | Failure::Lost(m) | Failure::TimedOut(m) => m,
        }
    }
}

impl Worker {
    /// Starts `program args...` and checks that it speaks this protocol version.
    pub fn start(label: &str, program: &Path, args: &[&str], timeout: Duration) -> Result<Worker> {
        let mut command = Command::new(program);
        command.args(args);
        Worker::spawn(label, command, timeout)
    }

    /// Starts `command` (its stdin and stdout become the protocol's pipes) and says hello.
    pub fn spawn(label: &str, mut command: Command, timeout: Duration) -> Result<Worker> {
        let program = PathBuf::from(command.get_program());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::Io {
                context: format!("starting the {label} worker {}", program.display()),
                source: e,
            })?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Runtime(format!("the {label} worker has no stdout pipe")))?;
        // Lines are read on a thread of their own so a request can time out.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let end = line.is_err();
                if tx.send(line).is_err() || end {
                    break;
                }
            }
        });
        let mut worker = Worker {
            label: label.to_string(),
            hello: Hello::default(),
            child,
            stdin,
            lines,
            timeout,
        };
        let hello = worker
            .request::<Hello>(&Request::Hello { protocol: PROTOCOL })
            .map_err(|f| {
                Error::Runtime(match f {
                    // It speaks the protocol and says why it cannot serve.
                    Failure::Refused(why) => format!("the {label} worker refused to start: {why}"),
                    f => format!(
                        "the {label} worker ({}) does not speak the worker protocol {PROTOCOL}: {}",
                        program.display(),
                        f.message()
                    ),
                })
            })?;
        worker.hello = hello;
        Ok(worker)
    }

    /// Measures `case` under `stop` (see `protocol`).
    pub fn run(
        &mut self,
        case: &crate::problem::Case,
        stop: &crate::measure::timer::StopRule,
        error_rows: usize,
        memory_budget: Option<u64>,
        decode_gemm_rows: Option<usize>,
    ) -> std::result::Result<RunReply, Failure> {
        self.request(&Request::Run {
            case: Box::new(case.clone()),
            stop: stop.clone(),
            error_rows,
            memory_budget,
            decode_gemm_rows,
        })
    }

    /// Sends `req` and reads its reply as a `T`.
    pub fn request<T: DeserializeOwned>(
        &mut self,
        req: &Request,
    ) -> std::result::Result<T, Failure> {
        let line = serde_json::to_string(req)
            .map_err(|e| Failure::Refused(format!("request not serializable: {e}")))?;
        let sent = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("the worker was stopped")),
        };
        if let Err(e) = sent {
            return Err(self.lost(format!("cannot send a request: {e}")));
        }
        let reply = match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(self.lost(format!("cannot read its reply: {e}"))),
            Err(RecvTimeoutError::Timeout) => {
                let s = self.timeout.as_secs_f64();
                self.kill();
                return Err(Failure::TimedOut(format!(
                    "the {} worker gave no reply within {s} s (killed)",
                    self.label
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(self.lost("it exited".to_string()));
            }
        };
        match serde_json::from_str::<Reply<T>>(&reply) {
            Ok(Reply {
                ok: true,
                body: Some(b),
                ..
            }) => Ok(b),
            Ok(r) => Err(Failure::Refused(
                r.error
                    .unwrap_or_else(|| "an error without a message".into()),
            )),
            Err(e) => Err(self.lost(format!("a reply that is not protocol JSON ({e}): {reply}"))),
        }
    }

    /// Stops the worker after a protocol failure and says why (with the signal that
    /// ended it, if one did).
    fn lost(&mut self, why: String) -> Failure {
        let status = self.stop();
        Failure::Lost(format!(
            "the {} worker: {why}{}",
            self.label,
            status.map_or_else(String::new, |s| format!(" ({})", describe_exit(s)))
        ))
    }

    /// Ends the session (closing stdin asks the worker to exit) and reaps the process;
    /// one that has not exited a few seconds later is killed. Returns how it ended.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        drop(self.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill()
    }

    /// Kills the process at once and reaps it.
    fn kill(&mut self) -> Option<ExitStatus> {
        drop(self.stdin.take());
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Whether the process is still running (not stopped after a failure).
    pub fn alive(&mut self) -> bool {
        self.stdin.is_some() && matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How a worker process ended, in words: its exit code, or the signal that killed it.
pub fn describe_exit(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => " (SIGILL)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            return format!("killed by signal {sig}{name}");
        }
    }
    match status.code() {
        Some(c) => format!("exit code {c}"),
        None => "ended".into(),
    }
}

/// The attnbench binary running this process (the current build's worker).
pub fn this_executable() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::Io {
        context: "finding this executable".into(),
        source: e,
    })
}

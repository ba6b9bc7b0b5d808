//! The driver's side of the worker protocol: starts a worker process, says hello, sends one
//! request at a time and reads its reply line, with a time limit (a hung worker is killed
//! and reported, never waited on forever). Cost: one pipe round trip per request.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
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
    /// The worker died, hung past the limit or broke the protocol (it is stopped).
    Lost(String),
}

impl Worker {
    /// Starts `program args...` and checks that it speaks this protocol version.
    pub fn start(label: &str, program: &Path, args: &[&str], timeout: Duration) -> Result<Worker> {
        let mut child = Command::new(program)
            .args(args)
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
                let why = match f {
                    Failure::Refused(e) | Failure::Lost(e) => e,
                };
                Error::Runtime(format!(
                    "the {label} worker ({}) does not speak the worker protocol {PROTOCOL}: {why}",
                    program.display()
                ))
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
    ) -> std::result::Result<RunReply, Failure> {
        self.request(&Request::Run {
            case: Box::new(case.clone()),
            stop: stop.clone(),
            error_rows,
            memory_budget,
        })
    }

    fn request<T: DeserializeOwned>(&mut self, req: &Request) -> std::result::Result<T, Failure> {
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
                return Err(self.lost(format!("no reply within {s} s")));
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

    /// Stops the worker after a protocol failure and says why.
    fn lost(&mut self, why: String) -> Failure {
        self.stop();
        Failure::Lost(format!("the {} worker: {why}", self.label))
    }

    /// Ends the session (closing stdin asks the worker to exit) and reaps the process;
    /// one that has not exited a few seconds later is killed.
    pub fn stop(&mut self) {
        drop(self.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The attnbench binary running this process (the current build's worker).
pub fn this_executable() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::Io {
        context: "finding this executable".into(),
        source: e,
    })
}

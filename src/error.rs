//! The crate's one error type. Each variant maps to an exit code: usage/config errors are 2,
//! runtime failures are 1 (see `Error::exit_code`).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command-line input that clap could not catch (conflicting flags, bad values).
    #[error("{0}")]
    Usage(String),
    /// A config file that does not parse or does not validate. `key` names the offending key.
    #[error("config {}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    /// An input file (e.g. a `.npy`) that is malformed or disagrees with the requested shape.
    #[error("input {}: {msg}", path.display())]
    Input { path: PathBuf, msg: String },
    /// A workspace allocation that does not fit in the memory budget (or in the machine).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Runtime(String),
    /// The case cannot run here (an external implementation said why): a `skipped` row.
    #[error("{0}")]
    Unsupported(String),
    /// A call ran past its time limit (a hung worker): a `timeout` row.
    #[error("{0}")]
    Timeout(String),
    /// The user pressed Ctrl-C; the message says what was kept and how to continue.
    #[error("{0}")]
    Interrupted(String),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Config { .. } | Error::Input { .. } => 2,
            Error::OutOfMemory(_)
            | Error::Io { .. }
            | Error::Runtime(_)
            | Error::Unsupported(_)
            | Error::Timeout(_) => 1,
            Error::Interrupted(_) => 130,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

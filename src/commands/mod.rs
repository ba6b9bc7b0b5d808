//! The commands: each module owns its clap arguments and turns them into calls of the
//! library (`sweep`, `run`, `report`, `reproduce`, `list`, `compare`, `ab`, `model`). The only place
//! besides `crate::cli` that knows clap.

pub mod ab;
pub mod compare;
pub mod generate;
pub mod list;
pub mod model;
pub mod report;
pub mod reproduce;
pub mod run;
pub mod softmax;
pub mod sweep;

/// How to run this program again from the current directory, for the commands a message
/// suggests: its path (relative when under the current directory, `./target/release/attnbench`
/// in the README's `cargo run` workflow, where `attnbench` is not on PATH), shell-quoted;
/// `attnbench` when the path cannot be read.
pub fn this_program() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "attnbench".into();
    };
    let shown = match std::env::current_dir()
        .ok()
        .and_then(|d| exe.strip_prefix(d).ok())
    {
        Some(rel) => std::path::Path::new(".").join(rel),
        None => exe.clone(),
    };
    shell_quote(&shown.to_string_lossy())
}

/// `s` quoted for a POSIX shell where it needs it (single quotes where shlex refuses it).
pub fn shell_quote(s: &str) -> String {
    shlex::try_quote(s).map_or_else(|_| format!("'{s}'"), |q| q.into_owned())
}

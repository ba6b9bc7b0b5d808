//! The worker protocol (docs/reference/worker-protocol.md): a process that runs cases on
//! request, so a driver can time it interleaved with another implementation. `protocol`
//! holds the messages (JSON lines, versioned), `files` the raw f32 tensor files they name,
//! `client` starts a worker process and talks to it, with a time limit. Servers:
//! `run::serve` (`attnbench worker`, this build answering through the one run sequence, and
//! hosting a C-ABI plugin with `--plugin`) and the Python package `attnbench-peer`. Users: the A/B time gate (`commands::ab`: the baseline build
//! against the current one) and external implementations (`run::external`).

pub mod client;
pub mod files;
pub mod protocol;

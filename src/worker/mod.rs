//! The worker protocol (docs/methodology.md, "Other implementations"): a process that runs cases on
//! request, so a driver can time it interleaved with another implementation. `protocol`
//! holds the messages (JSON lines, versioned), `serve` is `attnbench worker` (this build
//! answering them through the one run sequence), `client` starts a worker process and
//! talks to it. Users: the A/B time gate (`crate::ab`: the baseline build against the
//! current one, in the same run).

pub mod client;
pub mod protocol;
pub mod serve;

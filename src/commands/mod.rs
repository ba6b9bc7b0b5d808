//! The commands: each module owns its clap arguments and turns them into calls of the
//! library (`sweep`, `run`, `report`, `list`, `compare`, `ab`, `model`). The only place
//! besides `crate::cli` that knows clap.

pub mod ab;
pub mod compare;
pub mod list;
pub mod model;
pub mod report;
pub mod run;
pub mod sweep;

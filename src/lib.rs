//! attnbench: benchmarks exact attention algorithms (naive, Rabe–Staats chunked, flash,
//! decode, Ring and Tree Attention across simulated devices, ...) for runtime, memory
//! overhead beyond inputs and outputs, and error against an f64 oracle.
//!
//! Data flow: config --expand--> cases --runner--> records --CSV--> report / compare.

pub mod algorithm;
pub mod backend;
pub mod cli;
pub mod commands;
pub mod compare;
pub mod config;
pub mod dist;
pub mod error;
pub mod layer;
pub mod measure;
pub mod model;
pub mod npy;
pub mod plugin;
pub mod problem;
pub mod reference;
pub mod report;
pub mod results;
pub mod run;
pub mod sim;
pub mod units;
pub mod variant;
pub mod worker;

/// Every heap allocation of the process is counted, so the memory counter can read the peak
/// bytes live during a call, and large requests over the memory budget fail (as `oom`).
#[global_allocator]
static ALLOCATOR: measure::alloc::CountingAllocator = measure::alloc::CountingAllocator;

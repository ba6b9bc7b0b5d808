//! Analytic models, no measurement: BPT's Sec. 3.1 memory calculator (`bpt_memory`,
//! `bpt_calculator`), the α–β link fitted to measured MPI runs (`fit`), and of attention across
//! devices: the Tree Attention paper's closed forms (`formulas`, eqs. (8)-(14)), the α–β
//! two-level link model with its presets (`topology`), and predicted Ring vs Tree decode
//! latency priced on the simulator's own schedules (`cost`); KV-cache bytes per token of MHA, GQA and MLA (`kv_cache`). The files a sweep derives from
//! them are `crate::report::derived`.

pub mod bpt_calculator;
pub mod bpt_memory;
pub mod cost;
pub mod fit;
pub mod formulas;
pub mod kv_cache;
pub mod markdown;
pub mod topology;

//! Analytic models of attention across devices: the Tree Attention paper's closed forms
//! (`formulas`, eqs. (8)-(14)), the α–β two-level link model with its presets
//! (`topology`), predicted Ring vs Tree decode latency priced on the simulator's own
//! schedules (`cost`), the `[model]` config section (`config`), and the Markdown/CSV/SVG
//! tables a sweep writes beside its CSV (`tables`, `svg`) until the report layer takes
//! them over.

pub mod cost;
pub mod formulas;
pub mod topology;

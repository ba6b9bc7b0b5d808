//! Analytic models: closed-form memory and cost formulas from the papers, checked exactly
//! by unit tests and printed beside measurements.

pub mod bpt_memory;
pub mod bpt_table;

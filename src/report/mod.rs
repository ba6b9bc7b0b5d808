//! Reporting: terminal tables and `attnbench report` (tables.md, plots, derived checks),
//! rendered from a results directory (`crate::results`) alone, so runs made elsewhere can be
//! shown the same way.
pub mod checks;
pub mod claims;
pub mod derived;
pub mod figures;
pub mod generate;
pub mod html;
pub mod plot;
pub mod run_config;
pub mod select;
pub mod series;
pub mod summary;
pub mod tables_md;
pub mod terminal;

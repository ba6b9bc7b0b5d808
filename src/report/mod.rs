//! Reporting: the record (one CSV row per case), the CSV file, `meta.json`, terminal tables,
//! and `attnbench report` (tables.md, plots, derived checks). Reports read CSV files (and
//! meta.json) only, so runs made elsewhere can be shown the same way.
pub mod checks;
pub mod csv;
pub mod durable;
pub mod figures;
pub mod generate;
pub mod load;
pub mod meta;
pub mod paper;
pub mod plot;
pub mod record;
pub mod samples;
pub mod select;
pub mod series;
pub mod table;
pub mod tables;

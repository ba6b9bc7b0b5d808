//! Reporting: the record (one CSV row per case), the CSV file, `meta.json`, and terminal
//! tables. Reports read CSV files only, so runs made elsewhere can be shown the same way.
pub mod csv;
pub mod meta;
pub mod record;
pub mod table;
pub mod paper;

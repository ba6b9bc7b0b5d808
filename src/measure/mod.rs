//! Measurement: counting allocator (exact memory overhead, emulated budget), timing with a
//! noise-based stopping rule, statistics, peak RSS, machine calibration, and the per-case
//! machine-speed probe.

pub mod alloc;
pub mod calibrate;
pub mod pool;
pub mod probe;
pub mod rss;
pub mod softmax_timing;
pub mod stats;
pub mod timer;

pub use alloc::{
    current_bytes, limit, peak_bytes, reset_peak, set_limit, OverheadMeter, LARGE_ALLOCATION_BYTES,
};
pub use calibrate::{calibrate, calibrate_with, Calibration};
pub use rss::{current_rss_bytes, peak_rss_bytes, reset_peak_rss};
pub use stats::Summary;
pub use timer::{time_measured_repetitions, time_repetitions, StopReason, StopRule, Timing};

//! Measurement: counting allocator (memory overhead, budget), timing and stopping rule,
//! statistics, peak RSS, machine calibration.
pub mod alloc;

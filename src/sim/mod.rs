//! Simulated devices for attention across devices (Ring, Striped and Tree Attention): each
//! device is a worker with its own shard and its own memory accounting (`device`), and
//! every message between devices goes through one communication layer (`comm`) that counts
//! elements, bytes and rounds per device and per collective. The collectives are real
//! algorithms given as schedules (`plan`: ring, binary-tree and two-level allreduce,
//! binomial broadcast, ring rotation), executed by `exec`; `local` is each device's own
//! attention step; `ring` and `tree` are the two distributed algorithms.

pub mod comm;
pub mod device;
pub mod exec;
pub mod local;
pub mod plan;
pub mod ring;
pub mod shard;
pub mod stats;
pub mod tree;

#[cfg(test)]
mod tests;

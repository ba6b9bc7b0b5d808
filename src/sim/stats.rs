//! What one simulated multi-device call reports: the communication counters of every
//! collective (from the comm layer), each device's peak memory (from its accountant), and
//! the attention work (query-key pairs) each device did per step. O(p * collectives).

use super::comm::CollectiveStats;
use super::device::DeviceMemory;
use super::plan::Plan;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimStats {
    pub collectives: Vec<CollectiveStats>,
    pub memory: Vec<DeviceMemory>,
    /// Query-key pairs each device attended, per compute step: `work[step][device]`.
    pub work: Vec<Vec<u64>>,
    /// Real devices (`dist`): the library's collectives moved the data, so `collectives`
    /// is empty and the communication columns stay empty rather than read 0.
    pub uncounted: bool,
    /// Real devices: median seconds per call spent communicating, on the slowest and the
    /// fastest rank.
    pub comm_time_s: Option<f64>,
    pub comm_time_min_s: Option<f64>,
    /// Real devices: what the simulation counts for the same case (bytes sent by all
    /// devices, by the busiest one), to set beside the measured counts.
    pub sim_bytes: Option<u64>,
    pub sim_max_device_bytes: Option<u64>,
}

impl SimStats {
    pub fn devices(&self) -> usize {
        self.memory.len()
    }

    /// Elements sent by all devices in all collectives.
    pub fn elements(&self) -> u64 {
        self.collectives.iter().map(CollectiveStats::elements).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.collectives.iter().map(CollectiveStats::bytes).sum()
    }

    /// Communication rounds of all collectives, one after the other.
    pub fn steps(&self) -> u64 {
        self.collectives.iter().map(|c| c.steps).sum()
    }

    /// The collective named `name`, if the call ran one.
    pub fn collective(&self, name: &str) -> Option<&CollectiveStats> {
        self.collectives.iter().find(|c| c.name == name)
    }

    /// Bytes sent by the device that sent the most.
    pub fn max_device_bytes(&self) -> u64 {
        (0..self.devices())
            .map(|d| {
                self.collectives
                    .iter()
                    .map(|c| c.sent.get(d).map_or(0, |t| t.bytes))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    pub fn peak_elements(&self) -> u64 {
        self.memory
            .iter()
            .map(|m| m.peak_elements)
            .max()
            .unwrap_or(0)
    }

    pub fn peak_bytes(&self) -> u64 {
        self.memory.iter().map(|m| m.peak_bytes).max().unwrap_or(0)
    }

    /// Pairs of the busiest device over the whole call.
    pub fn pairs_max(&self) -> u64 {
        (0..self.devices())
            .map(|d| {
                self.work
                    .iter()
                    .map(|s| s.get(d).copied().unwrap_or(0))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Pairs on the critical path of lockstep steps: each step lasts as long as its busiest
    /// device (the load-balance measure of Striped vs Ring Attention).
    pub fn pairs_critical(&self) -> u64 {
        self.work
            .iter()
            .map(|s| s.iter().copied().max().unwrap_or(0))
            .sum()
    }

    pub fn pairs_total(&self) -> u64 {
        self.work.iter().flatten().sum()
    }
}

/// What a call's schedules send, from the plans alone (no data): the simulation's counts for
/// a case too large to simulate on one machine, set beside the real devices' counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// Bytes sent by all devices.
    pub bytes: u64,
    /// Bytes sent by the device that sends the most.
    pub max_device_bytes: u64,
    /// Rounds of all collectives, one after the other.
    pub steps: u64,
}

impl Planned {
    /// The traffic of `plans` run one after the other on `p` devices, each with its
    /// element size in bytes.
    pub fn of(p: usize, plans: &[(&Plan, usize)]) -> Planned {
        let mut per_device = vec![0u64; p];
        let mut steps = 0;
        for (plan, es) in plans {
            for (d, e) in plan.sent_per_device(p).into_iter().enumerate() {
                per_device[d] += e * *es as u64;
            }
            steps += plan.steps() as u64;
        }
        Planned {
            bytes: per_device.iter().sum(),
            max_device_bytes: per_device.iter().copied().max().unwrap_or(0),
            steps,
        }
    }
}

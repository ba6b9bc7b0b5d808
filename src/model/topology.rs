//! The α–β link model of a two-level cluster (docs/papers.md, Shyam et al.): devices grouped in
//! nodes; a message of m bytes costs α + m/β on the link between its two devices, the
//! intra-node link (NVLink, PCIe) inside a node and the inter-node one (InfiniBand) across.
//! Presets for the paper's DGX H100 cluster (Shyam et al. Sec. 6.1) and a PCIe pair (its App.
//! C.3), and rooflines of named GPUs for the compute term. O(1) per query.

use serde::{Deserialize, Serialize};

/// One link: latency α (seconds) and bandwidth β (bytes per second, per direction).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub alpha_s: f64,
    pub beta_bytes_per_s: f64,
}

impl Link {
    pub fn seconds(&self, bytes: f64) -> f64 {
        self.alpha_s + bytes / self.beta_bytes_per_s
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub name: String,
    pub per_node: usize,
    pub intra: Link,
    pub inter: Link,
}

impl Topology {
    /// The link between devices `a` and `b`.
    pub fn link(&self, a: usize, b: usize) -> Link {
        if a / self.per_node.max(1) == b / self.per_node.max(1) {
            self.intra
        } else {
            self.inter
        }
    }

    /// A named preset: `dgx-h100` (8 GPUs per node, NVLink 450 GB/s per direction,
    /// InfiniBand 400 Gb/s = 50 GB/s per GPU; α 5 µs intra, 10 µs inter, assumed) or
    /// `pcie-pair` (2 GPUs on PCIe 4.0 x16, 32 GB/s per direction, α 10 µs, assumed).
    pub fn preset(name: &str) -> Option<Topology> {
        match name {
            "dgx-h100" => Some(Topology {
                name: name.into(),
                per_node: 8,
                intra: Link {
                    alpha_s: 5e-6,
                    beta_bytes_per_s: 450e9,
                },
                inter: Link {
                    alpha_s: 10e-6,
                    beta_bytes_per_s: 50e9,
                },
            }),
            "pcie-pair" => {
                let pcie = Link {
                    alpha_s: 10e-6,
                    beta_bytes_per_s: 32e9,
                };
                Some(Topology {
                    name: name.into(),
                    per_node: 2,
                    intra: pcie,
                    inter: pcie,
                })
            }
            _ => None,
        }
    }

    pub const PRESETS: [&'static str; 2] = ["dgx-h100", "pcie-pair"];
}

/// A GPU's roofline: dense 16-bit tensor FLOP/s and HBM bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub name: &'static str,
    pub flops: f64,
    pub hbm_bytes_per_s: f64,
}

impl Gpu {
    pub const ALL: [Gpu; 3] = [
        // H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3.
        Gpu {
            name: "h100",
            flops: 989e12,
            hbm_bytes_per_s: 3.35e12,
        },
        // A100 80 GB SXM: 312 TFLOP/s, 2.039 TB/s.
        Gpu {
            name: "a100",
            flops: 312e12,
            hbm_bytes_per_s: 2.039e12,
        },
        // RTX 4090: 165 TFLOP/s fp16 with fp32 accumulate, 1.008 TB/s.
        Gpu {
            name: "rtx4090",
            flops: 165e12,
            hbm_bytes_per_s: 1.008e12,
        },
    ];

    pub fn named(name: &str) -> Option<Gpu> {
        Gpu::ALL.into_iter().find(|g| g.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_follow_the_nodes() {
        let t = Topology::preset("dgx-h100").unwrap();
        assert_eq!(t.link(0, 7), t.intra);
        assert_eq!(t.link(7, 8), t.inter);
        // docs/papers.md, Shyam et al.: 655 MB over NVLink at 450 GB/s is about 1.5 ms.
        assert!((t.intra.seconds(655e6) - 1.46e-3).abs() < 0.01e-3);
        assert!(Topology::preset("nvl72").is_none());
        assert_eq!(Gpu::named("h100").map(|g| g.hbm_bytes_per_s), Some(3.35e12));
    }
}

//! `ring-decode-mpi`, `ring-prefill-mpi`, `tree-decode-mpi`, `tree-decode-mpi-explicit`:
//! Ring Attention (docs/papers.md, Other sources (Ring Attention)) and Tree Attention decoding (Shyam et al. Algorithm 3)
//! with one MPI rank per device (`dist`; issue 10), the same algorithms and kernels as the
//! simulated `ring-decode`, `ring-prefill`, `tree-decode`. `tree-decode-mpi` leaves the
//! broadcast and the allreduces to the MPI library (MPI_Ibcast, MPI_Iallreduce: its own
//! algorithm choice); `tree-decode-mpi-explicit` runs the simulation's schedules (the
//! `allreduce` axis: ring, binary tree, two-level) over point-to-point messages. Host
//! memory per rank: `predict_workspace_bytes`; per-rank memory and communication are counted
//! and gathered on rank 0. Needs the `mpi` feature and `mpirun -np devices`.

use super::decode::kv_read_bytes;
use super::{Engine, Variant, VariantInfo};
use crate::backend::cpu::decode::KV_BLOCK;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::Workspace;
use crate::error::Result;
use crate::problem::{Case, Inputs, Mode};
use crate::sim::plan::{even_chunks, Allreduce};
use crate::sim::shard::Placement;
use crate::sim::stats::SimStats;
use crate::sim::{ring, tree};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    RingDecode,
    RingPrefill,
    /// The library's collectives.
    Tree,
    /// The simulation's schedules over point-to-point.
    TreeExplicit,
}

pub struct Mpi {
    kind: Kind,
    info: &'static VariantInfo,
}

pub static RING_DECODE_MPI: Mpi = Mpi {
    kind: Kind::RingDecode,
    info: &VariantInfo {
        name: "ring-decode-mpi",
        description: "ring-decode with one MPI rank per device: q broadcast, KV shards passed to the next rank with MPI_Isend/Irecv while the current one is computed",
        source: "Shyam et al. 2024 (Tree Attention), Sec. 6: its Ring Attention decode baseline; over MPI",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

pub static RING_PREFILL_MPI: Mpi = Mpi {
    kind: Kind::RingPrefill,
    info: &VariantInfo {
        name: "ring-prefill-mpi",
        description: "ring-prefill with one MPI rank per device: queries and KV sharded contiguously, KV passed on with MPI_Isend/Irecv while the current block is computed",
        source: "Ring Attention (Liu et al. 2023); over MPI",
        modes: &[Mode::Fwd],
        default_q_chunk: Some(super::ring::PREFILL_Q_CHUNK),
        default_kv_chunk: Some(super::ring::PREFILL_KV_CHUNK),
        numerically_safe: true,
    },
};

pub static TREE_DECODE_MPI: Mpi = Mpi {
    kind: Kind::Tree,
    info: &VariantInfo {
        name: "tree-decode-mpi",
        description: "tree-decode with one MPI rank per device: local flash attention, then MPI_Iallreduce (the library's algorithm) of max, numerator, denominator",
        source: "Shyam et al. 2024 (Tree Attention), Algorithm 3; over MPI",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

pub static TREE_DECODE_MPI_EXPLICIT: Mpi = Mpi {
    kind: Kind::TreeExplicit,
    info: &VariantInfo {
        name: "tree-decode-mpi-explicit",
        description: "tree-decode-mpi with the simulation's allreduce schedules (ring, binary tree, two-level) over MPI point-to-point, counted",
        source: "Shyam et al. 2024 (Tree Attention), Algorithm 3 and Sec. 5.3 (two-level allreduce); over MPI",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

impl Mpi {
    fn ring_spec(&self, case: &Case) -> ring::Spec {
        let decode = self.kind == Kind::RingDecode;
        ring::Spec {
            placement: Placement::Contiguous,
            decode,
            causal: case.causal,
            window: case.window,
            devices: case.devices,
            bq: case.q_chunk.unwrap_or(super::ring::PREFILL_Q_CHUNK),
            bk: case.kv_chunk.unwrap_or(if decode {
                KV_BLOCK
            } else {
                super::ring::PREFILL_KV_CHUNK
            }),
            threads: case.threads,
        }
    }

    fn tree_spec(&self, case: &Case) -> tree::Spec {
        tree::Spec {
            placement: Placement::Contiguous,
            causal: case.causal,
            window: case.window,
            devices: case.devices,
            allreduce: case.allreduce.unwrap_or(super::tree::DEFAULT_ALLREDUCE),
            bk: case.kv_chunk.unwrap_or(KV_BLOCK),
            threads: case.threads,
        }
    }

    #[cfg(feature = "mpi")]
    fn run(
        &self,
        case: &Case,
        inputs: &Inputs,
        out: &mut [f32],
        counted: bool,
    ) -> Result<Option<SimStats>> {
        match self.kind {
            Kind::RingDecode | Kind::RingPrefill => {
                crate::dist::ring::run(&self.ring_spec(case), inputs, out, counted)
            }
            Kind::Tree => crate::dist::tree::run(&self.tree_spec(case), true, inputs, out, counted),
            Kind::TreeExplicit => {
                crate::dist::tree::run(&self.tree_spec(case), false, inputs, out, counted)
            }
        }
    }

    #[cfg(not(feature = "mpi"))]
    fn run(&self, case: &Case, _: &Inputs, _: &mut [f32], _: bool) -> Result<Option<SimStats>> {
        Err(crate::dist::not_here(case.devices))
    }
}

impl Variant for Mpi {
    fn multi_device(&self) -> bool {
        true
    }

    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn engine(&self) -> Engine {
        Engine::Mpi
    }

    /// Bytes the busiest rank allocates besides the inputs and the output: its q, its
    /// output state, the travelling and the incoming shard (ring), the allreduce scratch
    /// (tree), the kernel scratch, and on rank 0 of a prefill the gathered output rows.
    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        let s = &case.shape;
        let (es, p) = (case.dtype.size_bytes() as u64, case.devices.max(1));
        let d = s.head_dim as u64;
        let max_t = even_chunks(0..s.seq_kv, p)
            .iter()
            .map(|r| r.len())
            .max()
            .unwrap_or(0) as u64;
        match self.kind {
            Kind::RingDecode | Kind::RingPrefill => {
                let spec = self.ring_spec(case);
                let decode = spec.decode;
                let tq = if decode { s.seq_q as u64 } else { max_t };
                let heads = (s.batch * s.heads) as u64;
                let q = heads * tq * d * es;
                let state = heads * tq * (d + 2) * 4;
                let shard = 2 * (s.batch * s.kv_heads) as u64 * max_t * d * es;
                let shards = if p > 1 { 2 * shard } else { shard };
                let gathered = if decode { 0 } else { s.out_len() as u64 * 4 };
                let (workers, floats) = spec.workspace(s, case.dtype);
                q + state + shards + gathered + Workspace::bytes(workers, floats)
            }
            Kind::Tree | Kind::TreeExplicit => {
                let spec = self.tree_spec(case);
                let rows = (s.batch * s.heads * s.seq_q) as u64;
                let q = s.q_len() as u64 * es;
                let state = (rows * d + 3 * rows) * 4;
                // One buffer's worth of receive scratch (explicit) or send copy (library).
                let scratch = rows * d * 4;
                let (workers, floats) = spec.workspace(s, case.dtype);
                q + state + scratch + Workspace::bytes(workers, floats)
            }
        }
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        let s = &case.shape;
        if self.kind == Kind::RingPrefill && s.seq_q != s.seq_kv {
            return Some(format!(
                "{} shards queries and keys alike: seq_q ({}) must equal seq_kv ({})",
                self.info.name, s.seq_q, s.seq_kv
            ));
        }
        if self.kind == Kind::TreeExplicit {
            let alg: Allreduce = case.allreduce.unwrap_or(super::tree::DEFAULT_ALLREDUCE);
            if let Some(r) = alg.unsupported(case.devices.max(1)) {
                return Some(r);
            }
        }
        crate::dist::unavailable(case.devices)
    }

    fn default_allreduce(&self) -> Option<Allreduce> {
        (self.kind == Kind::TreeExplicit).then_some(super::tree::DEFAULT_ALLREDUCE)
    }

    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        (self.kind != Kind::RingPrefill).then(|| kv_read_bytes(case))
    }

    fn forward_cpu(&self, case: &Case, _isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        self.run(case, inputs, out, false).map(|_| ())
    }

    fn forward_counted(
        &self,
        case: &Case,
        _isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Option<SimStats>> {
        self.run(case, inputs, out, true)
    }
}

//! Which loop `decode::attend` runs for a block of query rows sharing one KV head: the
//! key-major dot products of `vecops` (each key read once, nothing packed) or the blocked
//! SGEMM over packed key blocks. The crossover is measured, per storage dtype: both loops
//! time the same rows against the same keys (interleaved, best of `PROBE_RUNS`), and the
//! SGEMM takes over at the fewest probed rows where it is clearly faster (`SGEMM_MARGIN`).
//! About 0.3 s on one core; `attnbench sweep` measures it once and records it in
//! `meta.json`.
//!
//! Why measured: the crossover is a property of the core, not of its instructions. The
//! rule "16 rows and up take the SGEMM" was set on AMD Zen; on a Skylake-class Xeon the dot
//! products stayed faster well beyond it (docs/internals/decode-path.md).
//!
//! Memory never depends on the choice: scratch is sized by `GEMM_MIN_ROWS`, the fewest rows
//! that may take the SGEMM, so a noisy probe cannot change a gated memory figure.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::decode::{attend_with, scratch_len, Keys, RowState, GEMM_MIN_ROWS, KV_BLOCK};
use super::isa::Isa;
use crate::problem::{DType, Tensor};

/// Query rows per KV head the probe times (powers of two from `GEMM_MIN_ROWS`).
pub const PROBE_ROWS: [usize; 4] = [16, 32, 64, 128];
/// Head dimension of the probe (the common LLM head).
pub const PROBE_HEAD_DIM: usize = 128;
/// Keys of the probe: 2 MiB of f32 K and V at d = 128, beyond a 1 MiB L2.
pub const PROBE_KEYS: usize = 2048;
/// Timed runs of each loop and row count (best kept), after one warm-up each.
const PROBE_RUNS: usize = 5;
/// The SGEMM must take at most this fraction of the dot products' time to be chosen: near
/// a tie the dot products keep the rows, since over a paged cache the SGEMM also pays for
/// gathering the pages, which the contiguous probe does not see.
pub const SGEMM_MARGIN: f64 = 0.95;

/// Rows from which `attend` takes the SGEMM, per storage dtype (f32, bf16, f16); until a
/// probe is installed, `GEMM_MIN_ROWS` (the rule the kernels had before it was measured).
static GEMM_ROWS: [AtomicUsize; 3] = [
    AtomicUsize::new(GEMM_MIN_ROWS),
    AtomicUsize::new(GEMM_MIN_ROWS),
    AtomicUsize::new(GEMM_MIN_ROWS),
];

fn slot(dtype: DType) -> usize {
    DType::ALL.iter().position(|&t| t == dtype).unwrap_or(0)
}

/// The fewest query rows per KV head for which `attend` takes the SGEMM over keys stored
/// as `dtype` in this process.
#[inline]
pub fn gemm_rows(dtype: DType) -> usize {
    GEMM_ROWS[slot(dtype)].load(Ordering::Relaxed)
}

/// One probed row count: best seconds of each loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeRow {
    pub rows: usize,
    pub vecops_s: f64,
    pub sgemm_s: f64,
}

/// The choice for one storage dtype and the timings behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DtypeChoice {
    pub dtype: String,
    /// Query rows per KV head from which the SGEMM runs.
    pub gemm_min_rows: usize,
    pub probe: Vec<ProbeRow>,
}

/// The decode loop choice of this machine (`meta.json`'s `cpu_decode_path`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodePath {
    pub head_dim: usize,
    pub keys: usize,
    pub dtypes: Vec<DtypeChoice>,
    /// Set by the user (`run.decode_gemm_rows`), not measured: no probe behind it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

impl DecodePath {
    /// The SGEMM from `rows` query rows per KV head for every dtype, without a probe.
    pub fn pinned(rows: usize) -> DecodePath {
        DecodePath {
            head_dim: 0,
            keys: 0,
            dtypes: DType::ALL
                .iter()
                .map(|t| DtypeChoice {
                    dtype: t.name().to_string(),
                    gemm_min_rows: rows.max(GEMM_MIN_ROWS),
                    probe: Vec::new(),
                })
                .collect(),
            pinned: true,
        }
    }

    /// Makes this the choice of every later `attend` call in this process.
    pub fn install(&self) {
        for c in &self.dtypes {
            if let Ok(t) = c.dtype.parse::<DType>() {
                GEMM_ROWS[slot(t)].store(c.gemm_min_rows.max(GEMM_MIN_ROWS), Ordering::Relaxed);
            }
        }
    }

    /// One line for `attnbench list` and logs: `SGEMM from 64 query rows per KV head
    /// (f32), 32 (bf16), 64 (f16); dot products below`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .dtypes
            .iter()
            .map(|c| {
                let rows = if c.gemm_min_rows > PROBE_ROWS[PROBE_ROWS.len() - 1] {
                    format!("over {}", c.gemm_min_rows - 1)
                } else {
                    c.gemm_min_rows.to_string()
                };
                format!("{rows} ({})", c.dtype)
            })
            .collect();
        let how = if self.pinned {
            " (pinned by run.decode_gemm_rows)"
        } else {
            ""
        };
        format!(
            "SGEMM from {} query rows per KV head; dot products below{how}",
            parts.join(", ")
        )
    }
}

/// The fewest probed rows at which the SGEMM takes at most `SGEMM_MARGIN` of the dot
/// products' time; one past the largest probed count when it never does.
pub fn choose(probe: &[ProbeRow]) -> usize {
    probe
        .iter()
        .find(|p| p.sgemm_s <= SGEMM_MARGIN * p.vecops_s)
        .map(|p| p.rows)
        .unwrap_or_else(|| {
            probe
                .iter()
                .map(|p| p.rows + 1)
                .max()
                .unwrap_or(GEMM_MIN_ROWS)
        })
        .max(GEMM_MIN_ROWS)
}

/// This process's probe, once measured by `measure_once`.
static MEASURED: OnceLock<DecodePath> = OnceLock::new();

/// Measures this machine's choice and installs it, the first time only (a sweep, `run` and
/// a worker call it before their first case, so no timed call pays for the probe).
pub fn measure_once() -> &'static DecodePath {
    MEASURED.get_or_init(|| {
        let p = measure();
        p.install();
        p
    })
}

/// The choice `measure_once` measured, if it ran.
pub fn measured() -> Option<&'static DecodePath> {
    MEASURED.get()
}

/// Times both loops on this core for every dtype and probed row count.
pub fn measure() -> DecodePath {
    let dtypes = DType::ALL
        .iter()
        .map(|&t| {
            let probe = probe_dtype(t, PROBE_HEAD_DIM, PROBE_KEYS);
            DtypeChoice {
                dtype: t.name().to_string(),
                gemm_min_rows: choose(&probe),
                probe,
            }
        })
        .collect();
    DecodePath {
        head_dim: PROBE_HEAD_DIM,
        keys: PROBE_KEYS,
        dtypes,
        pinned: false,
    }
}

/// Best seconds of `attend_with` forced to each loop, for each of `PROBE_ROWS`, over `n`
/// contiguous keys of width `d` stored as `dtype`.
fn probe_dtype(dtype: DType, d: usize, n: usize) -> Vec<ProbeRow> {
    let values = |seed: usize| -> Vec<f32> {
        (0..n * d)
            .map(|i| ((i * 7 + seed) % 13) as f32 * 0.05 - 0.3)
            .collect()
    };
    let (k, v) = (
        Tensor::from_f32(values(1), dtype),
        Tensor::from_f32(values(2), dtype),
    );
    let keys = Keys {
        k: &k,
        v: &v,
        base: 0,
        len: n,
        pages: None,
        isa: Isa::detect(),
        fp8: None,
    };
    let widen = dtype != DType::F32;
    PROBE_ROWS
        .iter()
        .map(|&rows| {
            let q: Vec<f32> = (0..rows * d).map(|i| (i % 11) as f32 * 0.03).collect();
            let mut acc = vec![0.0f32; rows * d];
            let (mut m, mut l) = (vec![0.0f32; rows], vec![0.0f32; rows]);
            let mut scratch = vec![0.0f32; scratch_len(rows, KV_BLOCK, d, widen, false)];
            let scale = 1.0 / (d as f32).sqrt();
            let mut time = |gemm_from: usize| {
                let mut state = RowState {
                    acc: &mut acc,
                    m: &mut m,
                    l: &mut l,
                };
                state.reset();
                let t0 = Instant::now();
                attend_with(
                    &q,
                    rows,
                    &|_| 0..n,
                    keys,
                    d,
                    scale,
                    KV_BLOCK,
                    &mut state,
                    &mut scratch,
                    gemm_from,
                );
                let dt = t0.elapsed().as_secs_f64();
                std::hint::black_box(&state.acc);
                dt
            };
            let (mut vec_best, mut gemm_best) = (f64::INFINITY, f64::INFINITY);
            for run in 0..=PROBE_RUNS {
                // Interleaved, so a slower phase of the host touches both loops alike.
                let tv = time(usize::MAX);
                let tg = time(GEMM_MIN_ROWS);
                if run > 0 {
                    vec_best = vec_best.min(tv);
                    gemm_best = gemm_best.min(tg);
                }
            }
            ProbeRow {
                rows,
                vecops_s: vec_best,
                sgemm_s: gemm_best,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rows: usize, vecops_s: f64, sgemm_s: f64) -> ProbeRow {
        ProbeRow {
            rows,
            vecops_s,
            sgemm_s,
        }
    }

    #[test]
    fn the_sgemm_takes_over_where_it_is_first_clearly_faster() {
        // A Zen-like core: the SGEMM already wins at 16 rows.
        let zen = [row(16, 2.0, 1.5), row(32, 4.0, 2.5), row(64, 8.0, 4.0)];
        assert_eq!(choose(&zen), 16);
        // A core where the dot products win to 32 rows; a near tie keeps them.
        let xeon = [row(16, 1.0, 1.6), row(32, 2.0, 1.98), row(64, 4.0, 3.0)];
        assert_eq!(choose(&xeon), 64);
        // Dot products faster everywhere probed: SGEMM only beyond the largest count.
        let never = [row(16, 1.0, 2.0), row(128, 8.0, 9.0)];
        assert_eq!(choose(&never), 129);
        assert_eq!(choose(&[]), GEMM_MIN_ROWS);
    }

    #[test]
    fn a_probe_measures_both_loops_at_every_row_count() {
        let probe = probe_dtype(DType::Bf16, 32, 64);
        assert_eq!(
            probe.iter().map(|p| p.rows).collect::<Vec<_>>(),
            PROBE_ROWS.to_vec()
        );
        for p in &probe {
            assert!(p.vecops_s > 0.0 && p.vecops_s.is_finite(), "{p:?}");
            assert!(p.sgemm_s > 0.0 && p.sgemm_s.is_finite(), "{p:?}");
        }
        assert!(choose(&probe) >= GEMM_MIN_ROWS);
    }
}

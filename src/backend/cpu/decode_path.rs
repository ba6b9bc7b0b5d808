//! Which loop `decode::attend` runs for a block of query rows sharing one KV head: the
//! key-major dot products of `vecops` (each key read once, nothing packed) or the SGEMM on
//! the register tiles (`tiles::gemm`, K^T packed `decode::KT_KEYS` keys at a time). The
//! crossover is measured, per storage dtype: both loops time the same rows against the
//! same keys (interleaved, best of `PROBE_RUNS`), and the SGEMM takes over at the fewest
//! probed rows where it is clearly faster (`SGEMM_MARGIN`). About 0.3 s on one core; `attnbench sweep` measures it once and records it in
//! `meta.json`.
//!
//! Why measured: the crossover is a property of the core, not of its instructions. The
//! rule "16 rows and up take the SGEMM" was set on AMD Zen; on a Skylake-class Xeon the dot
//! products stayed faster well beyond it (docs/internals/decode-path.md).
//!
//! Memory never depends on the choice: scratch is sized by `GEMM_MIN_ROWS`, the fewest rows
//! that may take the SGEMM, so a noisy probe cannot change a gated memory figure.
//!
//! Where the CPU has both, it also measures how decode's dot products take bf16 keys: as
//! pairs (`vdpbf16ps`, the `avx512-bf16` path) or widened to f32 (`avx512`). The default
//! kernel path is chosen by the tiles' peak rates, where bf16 pairs may lose; decode waits
//! on loads instead, and on a Xeon whose pairs run at half the FMA rate they still won
//! there (docs/internals/decode-path.md). Where the CPU has AMX, the pairs on tiles
//! (`decode_amx`) are timed beside them. Cases that force a kernel path keep it.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
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

/// bf16 decode's dot products in this process: 0 as the kernel path says (no probe), else
/// `Bf16Loop`'s code (`DecodePath::install`).
static BF16_LOOP: AtomicU8 = AtomicU8::new(0);

/// How decode multiplies bf16 keys by the query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Loop {
    /// As pairs by `vdpbf16ps` (the `avx512-bf16` path).
    Pairs,
    /// Widened to f32 for FMAs (the `avx512` path).
    Widened,
    /// As pairs on AMX tiles, and P rounded to bf16 for the value sums on tiles too
    /// (`decode_amx`, the `amx-bf16` path).
    Tiles,
}

impl Bf16Loop {
    fn code(self) -> u8 {
        match self {
            Bf16Loop::Pairs => 1,
            Bf16Loop::Widened => 2,
            Bf16Loop::Tiles => 3,
        }
    }

    fn of_code(c: u8) -> Option<Bf16Loop> {
        [Bf16Loop::Pairs, Bf16Loop::Widened, Bf16Loop::Tiles]
            .into_iter()
            .find(|l| l.code() == c)
    }

    /// The kernel path that runs this loop.
    fn path(self) -> Isa {
        match self {
            Bf16Loop::Pairs => Isa::Avx512Bf16,
            Bf16Loop::Widened => Isa::Avx512,
            Bf16Loop::Tiles => Isa::AmxBf16,
        }
    }
}

/// The kernel path decode's loops run for a case on `isa` (`forced`: the case names its
/// path; `highest`: `precision = highest`): the measured bf16 choice where the path is the
/// default AVX-512 one. The tile loop rounds P to bf16 for the value sums, so a case that
/// keeps P in f32 runs the pairs instead, forced or not.
pub fn loops_path(isa: Isa, forced: bool, highest: bool) -> Isa {
    let choice = Bf16Loop::of_code(BF16_LOOP.load(Ordering::Relaxed));
    match loops_path_with(isa, forced, choice) {
        Isa::AmxBf16 if highest => Isa::Avx512Bf16,
        path => path,
    }
}

/// `loops_path` given the measured choice (`None`: not measured). The tiles are taken only
/// on the `amx-bf16` path itself (a narrower path has no tiles).
pub fn loops_path_with(isa: Isa, forced: bool, choice: Option<Bf16Loop>) -> Isa {
    match choice.map(Bf16Loop::path) {
        Some(Isa::AmxBf16) if !forced && isa.avx512() && isa != Isa::AmxBf16 => Isa::Avx512Bf16,
        Some(path) if !forced && isa.avx512() => path,
        _ => isa,
    }
}

/// Rows of the bf16 probe: a GQA group of 4 query heads on one KV head, one new token.
pub const BF16_PROBE_ROWS: usize = 4;

/// The bf16 probe: best seconds of decode's dot-product loop on bf16 keys as pairs,
/// widened and (where the CPU has AMX) on tiles, and the choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bf16Dots {
    pub rows: usize,
    pub pairs_s: f64,
    pub widened_s: f64,
    /// bf16 keys multiplied as pairs (else widened to f32), of those two.
    pub pairs: bool,
    /// The same loop with the scores on AMX tiles (absent where the CPU has none, and in
    /// runs before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiles_s: Option<f64>,
    /// The tiles chosen over both.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tiles: bool,
}

/// Widening must take at most this fraction of the pairs' time to be chosen: near a tie
/// the pairs keep bf16 decode, since they load and multiply with half the instructions and
/// on a cache larger than the probe's (memory-bound) they ran 1.03x to 1.25x faster on the
/// Xeon where the probe's L2-resident keys came out even in some runs.
pub const WIDEN_MARGIN: f64 = 0.95;

/// Timed runs of each bf16 loop (best kept): the two differ by about a tenth, so more
/// runs than the SGEMM probe's (a run is about 70 us at d = 128).
const BF16_PROBE_RUNS: usize = 15;

impl Bf16Dots {
    /// Pairs unless widening is clearly faster (`WIDEN_MARGIN`); the tiles where they are
    /// clearly faster than the one of those chosen (`TILES_MARGIN`).
    pub fn of(rows: usize, pairs_s: f64, widened_s: f64, tiles_s: Option<f64>) -> Bf16Dots {
        let pairs = widened_s > WIDEN_MARGIN * pairs_s;
        let vector_s = if pairs { pairs_s } else { widened_s };
        Bf16Dots {
            rows,
            pairs_s,
            widened_s,
            pairs,
            tiles_s,
            tiles: tiles_s.is_some_and(|t| t <= TILES_MARGIN * vector_s),
        }
    }

    /// The loop chosen.
    pub fn choice(&self) -> Bf16Loop {
        match (self.tiles, self.pairs) {
            (true, _) => Bf16Loop::Tiles,
            (false, true) => Bf16Loop::Pairs,
            (false, false) => Bf16Loop::Widened,
        }
    }
}

/// The tiles must take at most this fraction of the vector loop's time to be chosen: near
/// a tie the vector loop keeps bf16 decode (no tile state to switch per call).
pub const TILES_MARGIN: f64 = 0.95;

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
    /// bf16 keys as pairs, widened or as pairs on AMX tiles in decode, where the CPU runs
    /// more than one (absent in runs before it was measured, and where it does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_dots: Option<Bf16Dots>,
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
            bf16_dots: None,
        }
    }

    /// Makes this the choice of every later `attend` call in this process.
    pub fn install(&self) {
        for c in &self.dtypes {
            if let Ok(t) = c.dtype.parse::<DType>() {
                GEMM_ROWS[slot(t)].store(c.gemm_min_rows.max(GEMM_MIN_ROWS), Ordering::Relaxed);
            }
        }
        let code = self.bf16_dots.as_ref().map_or(0, |b| b.choice().code());
        BF16_LOOP.store(code, Ordering::Relaxed);
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
        let bf16 = match &self.bf16_dots {
            Some(b) => format!(
                "; bf16 keys {} ({} rows: pairs {:.0} us, widened {:.0} us{})",
                match b.choice() {
                    Bf16Loop::Tiles => "as pairs on AMX tiles",
                    Bf16Loop::Pairs => "as pairs (vdpbf16ps)",
                    Bf16Loop::Widened => "widened to f32",
                },
                b.rows,
                b.pairs_s * 1e6,
                b.widened_s * 1e6,
                b.tiles_s
                    .map_or(String::new(), |t| format!(", tiles {:.0} us", t * 1e6))
            ),
            None => String::new(),
        };
        format!(
            "SGEMM from {} query rows per KV head; dot products below{how}{bf16}",
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

/// Times both loops on this core for every dtype and probed row count, after the bf16
/// dot products as pairs and widened (whose choice the bf16 row counts then run with).
pub fn measure() -> DecodePath {
    // The `avx512-bf16` path runs wherever both do (it is `avx512` plus the pairs).
    let bf16_dots = Isa::Avx512Bf16
        .available()
        .then(|| probe_bf16_dots(PROBE_HEAD_DIM, PROBE_KEYS));
    let isa = loops_path_with(Isa::detect(), false, bf16_dots.as_ref().map(|b| b.choice()));
    let dtypes = DType::ALL
        .iter()
        .map(|&t| {
            let probe = probe_dtype(t, PROBE_HEAD_DIM, PROBE_KEYS, isa);
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
        bf16_dots,
    }
}

/// Probe keys and values of `n` keys of width `d` stored as `dtype`.
fn probe_kv(dtype: DType, d: usize, n: usize) -> (Tensor, Tensor) {
    let values = |seed: usize| -> Vec<f32> {
        (0..n * d)
            .map(|i| ((i * 7 + seed) % 13) as f32 * 0.05 - 0.3)
            .collect()
    };
    (
        Tensor::from_f32(values(1), dtype),
        Tensor::from_f32(values(2), dtype),
    )
}

/// Best seconds of `attend_with` for `rows` query rows over each of `runs` (its keys, and
/// the rows from which it takes the SGEMM), each timed in turn per round (interleaved, so a
/// slower phase of the host touches every one alike), `rounds` rounds after a warm-up.
fn time_interleaved<const N: usize>(
    rows: usize,
    d: usize,
    rounds: usize,
    runs: [(Keys, usize); N],
) -> [f64; N] {
    let n = runs.first().map_or(0, |(k, _)| k.len);
    let widen = runs.iter().any(|(k, _)| k.widens());
    // bf16-valued queries, so the pairs path takes them as they are.
    let q: Vec<f32> = (0..rows * d).map(|i| (i % 11) as f32 * 0.03125).collect();
    let mut acc = vec![0.0f32; rows * d];
    let (mut m, mut l) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let mut scratch = vec![0.0f32; scratch_len(rows, KV_BLOCK, d, widen, false)];
    let scale = 1.0 / (d as f32).sqrt();
    let mut best = [f64::INFINITY; N];
    for run in 0..=rounds {
        for (i, &(keys, gemm_from)) in runs.iter().enumerate() {
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
            if run > 0 {
                best[i] = best[i].min(dt);
            }
        }
    }
    best
}

/// Decode's dot products over `n` bf16 keys of width `d`, `BF16_PROBE_ROWS` rows, on the
/// `avx512-bf16` path (pairs), the `avx512` one (widened) and, where it runs, the
/// `amx-bf16` one (tiles), interleaved.
fn probe_bf16_dots(d: usize, n: usize) -> Bf16Dots {
    let (k, v) = probe_kv(DType::Bf16, d, n);
    let keys = |isa| (Keys::contiguous(&k, &v, n, isa), usize::MAX);
    let (rows, runs) = (BF16_PROBE_ROWS, BF16_PROBE_RUNS);
    let (pairs, widened) = (keys(Isa::Avx512Bf16), keys(Isa::Avx512));
    if Isa::AmxBf16.available() {
        let [p, w, t] = time_interleaved(rows, d, runs, [pairs, widened, keys(Isa::AmxBf16)]);
        Bf16Dots::of(rows, p, w, Some(t))
    } else {
        let [p, w] = time_interleaved(rows, d, runs, [pairs, widened]);
        Bf16Dots::of(rows, p, w, None)
    }
}

/// Best seconds of `attend_with` forced to each loop, for each of `PROBE_ROWS`, over `n`
/// contiguous keys of width `d` stored as `dtype`, on the kernel path `isa`.
fn probe_dtype(dtype: DType, d: usize, n: usize, isa: Isa) -> Vec<ProbeRow> {
    let (k, v) = probe_kv(dtype, d, n);
    let keys = Keys::contiguous(&k, &v, n, isa);
    PROBE_ROWS
        .iter()
        .map(|&rows| {
            let [vecops_s, sgemm_s] = time_interleaved(
                rows,
                d,
                PROBE_RUNS,
                [(keys, usize::MAX), (keys, GEMM_MIN_ROWS)],
            );
            ProbeRow {
                rows,
                vecops_s,
                sgemm_s,
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
        let probe = probe_dtype(DType::Bf16, 32, 64, Isa::detect());
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

    #[test]
    fn decode_takes_the_measured_bf16_loop_unless_the_case_forces_a_path() {
        // Measured pairs faster (this Xeon) or slower: the default AVX-512 path follows.
        use Bf16Loop::{Pairs, Tiles, Widened};
        for isa in [Isa::AmxBf16, Isa::Avx512, Isa::Avx512Bf16] {
            assert_eq!(loops_path_with(isa, false, Some(Pairs)), Isa::Avx512Bf16);
            assert_eq!(loops_path_with(isa, false, Some(Widened)), Isa::Avx512);
            // A forced path, or nothing measured: the path as given.
            for c in [Pairs, Widened, Tiles] {
                assert_eq!(loops_path_with(isa, true, Some(c)), isa);
            }
            assert_eq!(loops_path_with(isa, false, None), isa);
        }
        // The tiles run on the amx-bf16 path; on an AVX-512 path below it, the pairs.
        assert_eq!(
            loops_path_with(Isa::AmxBf16, false, Some(Tiles)),
            Isa::AmxBf16
        );
        for isa in [Isa::Avx512, Isa::Avx512Bf16] {
            assert_eq!(loops_path_with(isa, false, Some(Tiles)), Isa::Avx512Bf16);
        }
        // The tile loop rounds P: a case that keeps P in f32 runs the pairs, even forced;
        // the other paths keep P in f32 already.
        assert_eq!(loops_path(Isa::AmxBf16, true, true), Isa::Avx512Bf16);
        assert_eq!(loops_path(Isa::AmxBf16, true, false), Isa::AmxBf16);
        for isa in [Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2, Isa::Portable] {
            assert_eq!(loops_path(isa, true, true), isa);
        }
        // Narrower paths have no pairs to choose.
        for isa in [Isa::Avx2, Isa::Portable] {
            for c in [Pairs, Widened, Tiles] {
                assert_eq!(loops_path_with(isa, false, Some(c)), isa);
            }
        }
        // Pairs unless widening is clearly faster: a near tie keeps the pairs.
        let of = |p, w| Bf16Dots::of(4, p, w, None).choice();
        assert_eq!(of(1.0, 1.2), Pairs);
        assert_eq!(of(1.0, 0.96), Pairs);
        assert_eq!(of(1.0, 0.95), Widened);
        assert_eq!(of(1.0, 0.94), Widened);
        assert_eq!(of(1.2, 1.0), Widened);
        // The tiles where clearly faster than the vector loop chosen (this Xeon), not
        // against the one left out, and a near tie keeps the vector loop.
        let of = |p, w, t| Bf16Dots::of(4, p, w, Some(t)).choice();
        assert_eq!(of(1.0, 1.2, 0.5), Tiles);
        assert_eq!(of(1.0, 1.2, 0.95), Tiles);
        assert_eq!(of(1.0, 1.2, 0.96), Pairs);
        assert_eq!(of(1.0, 0.8, 0.9), Widened);
        assert_eq!(of(1.0, 0.8, 0.76), Tiles);
    }

    #[test]
    fn the_bf16_probe_times_both_loops_and_the_choice_reaches_meta_and_list() {
        if !Isa::Avx512Bf16.available() {
            return; // nothing to choose on this CPU
        }
        let b = probe_bf16_dots(32, 64);
        assert!(b.pairs_s > 0.0 && b.pairs_s.is_finite(), "{b:?}");
        assert!(b.widened_s > 0.0 && b.widened_s.is_finite(), "{b:?}");
        assert_eq!(b.pairs, b.widened_s > WIDEN_MARGIN * b.pairs_s);
        // The tiles timed exactly where the CPU has them.
        assert_eq!(b.tiles_s.is_some(), Isa::AmxBf16.available());
        assert!(b.tiles_s.is_none_or(|t| t > 0.0 && t.is_finite()), "{b:?}");
        let mut p = DecodePath::pinned(32);
        p.bf16_dots = Some(b.clone());
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<DecodePath>(&json).unwrap(), p);
        assert!(p.summary().contains("bf16 keys"), "{}", p.summary());
        // Runs recorded before the probe existed read back without it.
        p.bf16_dots = None;
        assert!(!serde_json::to_string(&p).unwrap().contains("bf16_dots"));
    }
}

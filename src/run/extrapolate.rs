//! Time extrapolation for cases too slow to time in full (`[run] extrapolate_above_s`): the
//! case is timed on its first `rows` query rows (a fixed number of query chunks) against all
//! keys, and every time figure is scaled by `seq_q / rows`.
//!
//! Why that is exact for non-causal attention: every query row sees every key, so each row
//! costs the same work, and the kernels split work by query chunks over the threads; with a
//! whole number of chunks per thread the timed part keeps every thread busy exactly as the
//! full call does. The same holds for forward + backward: each query chunk's backward also
//! costs the same (dK and dV accumulate over the chunks). Causal rows see different numbers
//! of keys, so causal cases are never extrapolated. Memory is never extrapolated: a case is
//! eligible only when its variant
//! predicts the same workspace for the part as for the whole (true of `rabe-staats`: its one
//! chunk buffer, shared by the workers, depends on the chunk sizes and n_kv, not on how
//! many query chunks there are), so the checked call of the part measures the full case's
//! overhead. The error is checked on the rows computed (`err_rows`).

use crate::problem::{Case, Inputs, Mode, Shape, Tensor};
use crate::results::record::Record;
use crate::run::Outcome;

/// Query rows per extrapolation chunk for variants that do not cut the query loop.
pub const ROWS_PER_CHUNK_UNCHUNKED: usize = 1024;

/// When and how much to extrapolate (from `[run]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Extrapolation {
    /// A case whose one call is estimated above this many seconds is extrapolated.
    pub above_s: f64,
    /// Query chunks timed, rounded up to a multiple of the case's threads.
    pub q_chunks: usize,
}

/// Query rows per (batch, head) the part computes, or `None` when the case cannot be
/// extrapolated (causal, not a forward pass, or the part would be the whole case).
pub fn part_rows(case: &Case, q_chunks: usize) -> Option<usize> {
    // A ragged batch's rows are its sequences': its first rows are no part to scale.
    if case.causal || case.batch_spec.is_some() || !matches!(case.mode, Mode::Fwd | Mode::FwdBwd) {
        return None;
    }
    let chunk = case.q_chunk.unwrap_or(ROWS_PER_CHUNK_UNCHUNKED).max(1);
    let threads = case.threads.max(1);
    let rows = q_chunks.max(1).div_ceil(threads) * threads * chunk;
    (rows < case.shape.seq_q).then_some(rows)
}

/// The case restricted to its first `rows` query rows (chunks clamped as the config does).
pub fn part_case(case: &Case, rows: usize) -> Case {
    let mut part = case.clone();
    part.shape.seq_q = rows;
    part.q_chunk = case.q_chunk.map(|c| c.min(rows));
    part
}

/// Splits the inputs into the part's (a copy of the first `rows` rows of every head of Q;
/// K and V moved, not copied) and the full Q, which `join_inputs` puts back. The only
/// allocation is the part's Q, small beside the inputs.
pub fn split_inputs(inputs: Inputs, rows: usize) -> (Inputs, Tensor) {
    let s = inputs.shape;
    fn first_rows<T: Copy>(v: &[T], s: &Shape, rows: usize) -> Vec<T> {
        let (d, heads) = (s.head_dim, s.batch * s.heads);
        let mut out = Vec::with_capacity(heads * rows * d);
        for h in 0..heads {
            let start = h * s.seq_q * d;
            out.extend_from_slice(&v[start..start + rows * d]);
        }
        out
    }
    let q = match &inputs.q {
        Tensor::F32(v) => Tensor::F32(first_rows(v, &s, rows)),
        Tensor::Bf16(v) => Tensor::Bf16(first_rows(v, &s, rows)),
        Tensor::F16(v) => Tensor::F16(first_rows(v, &s, rows)),
    };
    let mut shape = s;
    shape.seq_q = rows;
    let part = Inputs {
        shape,
        q,
        k: inputs.k,
        v: inputs.v,
        paged: inputs.paged,
        fp8: inputs.fp8,
        mla: inputs.mla,
    };
    (part, inputs.q)
}

/// Undoes `split_inputs`: the full inputs of `shape`, bit for bit.
pub fn join_inputs(part: Inputs, full_q: Tensor, shape: Shape) -> Inputs {
    Inputs {
        shape,
        q: full_q,
        k: part.k,
        v: part.v,
        paged: part.paged,
        fp8: part.fp8,
        mla: part.mla,
    }
}

/// Estimated seconds of one full call from one call of the part.
pub fn estimate_full_s(part_s: f64, case: &Case, rows: usize) -> f64 {
    part_s * case.shape.seq_q as f64 / rows as f64
}

/// The outcome of the full case from that of its part: the row by [`scale_record`], and the
/// timed samples by the same factor, so that `samples.csv` (which `compare` judges) and the
/// row's time columns agree.
pub fn scale_outcome(part: Outcome, full: &Case, run: &str, predicted_full: u64) -> Outcome {
    let ratio = time_ratio(full, &part.record);
    Outcome {
        record: scale_record(part.record, full, run, predicted_full),
        samples: part.samples.iter().map(|t| t * ratio).collect(),
        ..part
    }
}

/// The factor from the part's times to the full case's: `seq_q / rows`.
fn time_ratio(full: &Case, part: &Record) -> f64 {
    full.shape.seq_q as f64 / part.seq_q as f64
}

/// The full case's record from the part's: identity, inputs/outputs bytes and FLOPs of the
/// full case; times scaled by `seq_q / rows` (each sample scales, so median, min, max and
/// MAD do); GFLOP/s from the full FLOPs and the scaled median; memory, RSS and error as
/// measured on the part; flagged `extrapolated` with `timed_rows`.
pub fn scale_record(part: Record, full: &Case, run: &str, predicted_full: u64) -> Record {
    let ratio = time_ratio(full, &part);
    let scale = |t: Option<f64>| t.map(|t| t * ratio);
    let mut r = crate::run::record_for(run, full, part.status, part.reason);
    r.reps = part.reps;
    r.time_median_s = scale(part.time_median_s);
    r.time_min_s = scale(part.time_min_s);
    r.time_max_s = scale(part.time_max_s);
    r.time_mad_s = scale(part.time_mad_s);
    r.gflops = r
        .time_median_s
        .filter(|&t| t > 0.0)
        .map(|t| full.flops() / t / 1e9);
    r.mem_overhead_bytes = part.mem_overhead_bytes;
    r.mem_predicted_bytes = Some(predicted_full);
    r.peak_rss_bytes = part.peak_rss_bytes;
    r.max_abs_err = part.max_abs_err;
    r.max_rel_err = part.max_rel_err;
    r.err_rows = part.err_rows;
    r.stopped_by = part.stopped_by;
    r.probe_gflops = part.probe_gflops;
    r.time_bwd_median_s = scale(part.time_bwd_median_s);
    r.grad_max_abs_err = part.grad_max_abs_err;
    r.grad_max_rel_err = part.grad_max_rel_err;
    r.grad_err_rows = part.grad_err_rows;
    r.grad_err_scope = part.grad_err_scope;
    r.extrapolated = true;
    r.timed_rows = Some(part.seq_q);
    r.diff_variant = part.diff_variant;
    r.max_abs_diff = part.max_abs_diff;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::VariantId;
    use crate::problem::{DType, Device, InputDist};
    use crate::results::record::Status;

    fn case(seq: usize, q_chunk: Option<usize>, threads: usize) -> Case {
        Case {
            variant: VariantId::RabeStaats,
            mode: Mode::Fwd,
            device: Device::Cpu,
            dtype: DType::Bf16,
            shape: Shape {
                batch: 2,
                heads: 3,
                kv_heads: 3,
                seq_q: seq,
                seq_kv: seq,
                head_dim: 4,
            },
            q_chunk,
            kv_chunk: Some(16),
            causal: false,
            window: None,
            devices: 1,
            threads,
            input_dist: InputDist::Normal,
            input_scale: 1.0,
            seed: 3,
            d_out: crate::problem::UpstreamGrad::Random,
            splits: None,
            allreduce: None,
            external: None,
            paging: None,
            prefill_chunk: None,
            batch_spec: None,
            kernel_path: None,
            prefix_len: None,
            kv_dtype: None,
            mla: None,
            sinks: None,
            precision: None,
        }
    }

    #[test]
    fn part_is_whole_chunks_per_thread_and_only_when_smaller() {
        assert_eq!(part_rows(&case(1 << 20, Some(1024), 1), 4), Some(4096));
        // 3 chunks on 2 threads round up to 4.
        assert_eq!(part_rows(&case(1 << 20, Some(1024), 2), 3), Some(4096));
        assert_eq!(part_rows(&case(4096, Some(1024), 1), 4), None);
        assert_eq!(part_rows(&case(1 << 14, None, 1), 2), Some(2048));
        let mut c = case(1 << 20, Some(1024), 1);
        c.causal = true;
        assert_eq!(part_rows(&c, 4), None);
        let p = part_case(&case(64, Some(32), 1), 16);
        assert_eq!(
            (p.shape.seq_q, p.shape.seq_kv, p.q_chunk),
            (16, 64, Some(16))
        );
    }

    #[test]
    fn split_takes_the_first_rows_of_every_head_and_join_restores_the_inputs() {
        for dtype in DType::ALL {
            let c = case(24, Some(8), 1);
            let full = Inputs::generate(c.shape, dtype, InputDist::Normal, 1.0, 5);
            let (part, rest) = split_inputs(full.clone(), 8);
            assert_eq!(part.shape.seq_q, 8);
            assert_eq!(part.q.len(), 2 * 3 * 8 * 4);
            assert_eq!((&part.k, &part.v), (&full.k, &full.v));
            let (d, n) = (4, 24);
            for h in 0..6 {
                for i in 0..8 * d {
                    assert_eq!(part.q.get_f64(h * 8 * d + i), full.q.get_f64(h * n * d + i));
                }
            }
            assert_eq!(join_inputs(part, rest, c.shape), full, "{dtype}");
        }
    }

    #[test]
    fn part_output_equals_the_first_rows_of_the_full_output() {
        let c = case(48, Some(16), 2);
        let full = Inputs::generate(c.shape, c.dtype, InputDist::Uniform, 1.0, 1);
        let whole = crate::run::output(&c, &full).unwrap();
        let rows = part_rows(&c, 1).unwrap();
        let (part, _) = split_inputs(full, rows);
        let got = crate::run::output(&part_case(&c, rows), &part).unwrap();
        for h in 0..6 {
            assert_eq!(
                got[h * rows * 4..(h + 1) * rows * 4],
                whole[h * 48 * 4..h * 48 * 4 + rows * 4]
            );
        }
    }

    fn settings(above_s: f64) -> crate::run::Settings {
        crate::run::Settings {
            run_name: "t".into(),
            stop: crate::measure::timer::StopRule {
                warmup: 1,
                warmup_s: 0.0,
                min_reps: 1,
                max_reps: 2,
                min_time_s: 0.0,
                max_time_s: 1.0,
                rel_spread: 1.0,
            },
            memory_budget: None,
            error_rows: 8,
            extrapolate: Some(Extrapolation {
                above_s,
                q_chunks: 1,
            }),
            diff_against: Some(VariantId::Naive),
            model_layers: None,
            gpu: Default::default(),
            externals: Default::default(),
        }
    }

    #[test]
    fn runner_extrapolates_only_cases_estimated_over_the_cap() {
        // run_case sets (and clears) the process-wide memory limit.
        let _g = crate::measure::alloc::test_lock();
        let c = case(64, Some(16), 1);
        let slow = crate::run::run_case(&c, &settings(1e-12), None).unwrap();
        let r = &slow.record;
        assert_eq!(
            (r.status, r.extrapolated, r.timed_rows),
            (Status::Ok, true, Some(16))
        );
        assert_eq!((r.seq_q, r.case_id.as_str()), (64, c.id().as_str()));
        assert!(r.max_abs_diff.is_some_and(|d| d < 1e-5) && r.diff_variant == "naive");
        assert_eq!(slow.output.map(|o| o.len()), Some(2 * 3 * 16 * 4));
        // The samples (what compare judges) are scaled with the row: x4, exact in binary.
        assert_eq!(slow.samples.len(), r.reps);
        let median = crate::measure::stats::Summary::of(&slow.samples).map(|s| s.median);
        assert_eq!(median, r.time_median_s);
        let fast = crate::run::run_case(&c, &settings(1e9), None).unwrap();
        let r = &fast.record;
        assert_eq!((r.extrapolated, r.timed_rows), (false, Some(64)));
        // Same workspace either way: the part's checked call measures the full case's.
        assert_eq!(slow.record.mem_predicted_bytes, r.mem_predicted_bytes);
        let mut causal = c.clone();
        causal.causal = true;
        let r = crate::run::run_case(&causal, &settings(1e-12), None)
            .unwrap()
            .record;
        assert_eq!((r.extrapolated, r.timed_rows), (false, Some(64)));
        let mut naive = c.clone();
        naive.variant = VariantId::Naive;
        naive.q_chunk = None;
        naive.kv_chunk = None;
        naive.shape.seq_q = 4096;
        naive.shape.seq_kv = 8;
        // naive's score matrix grows with the rows: never extrapolated.
        let r = crate::run::run_case(&naive, &settings(1e-12), None)
            .unwrap()
            .record;
        assert_eq!(
            (r.extrapolated, r.timed_rows, r.max_abs_diff),
            (false, Some(4096), None)
        );
    }

    #[test]
    fn record_times_scale_by_the_row_ratio_and_identity_is_the_full_case() {
        let full = case(1 << 16, Some(1024), 1);
        let rows = part_rows(&full, 4).unwrap();
        let part = part_case(&full, rows);
        let mut pr = Record::for_case("t", &part, Status::Ok, "");
        pr.reps = 3;
        pr.time_median_s = Some(2.0);
        pr.time_min_s = Some(1.5);
        pr.time_max_s = Some(3.0);
        pr.time_mad_s = Some(0.25);
        pr.mem_overhead_bytes = Some(1234);
        pr.max_abs_err = Some(1e-7);
        pr.err_rows = Some(256);
        pr.stopped_by = "time_cap".into();
        let r = scale_record(pr, &full, "t", 999);
        assert_eq!(r.case_id, full.id());
        assert_eq!(
            (r.seq_q, r.io_bytes, r.flops),
            (1 << 16, full.io_bytes(), full.flops())
        );
        assert_eq!(r.time_median_s, Some(32.0));
        assert_eq!((r.time_min_s, r.time_max_s), (Some(24.0), Some(48.0)));
        assert_eq!(r.time_mad_s, Some(4.0));
        let g = r.gflops.unwrap();
        assert!((g - full.flops() / 32.0 / 1e9).abs() < 1e-9);
        // GFLOP/s is the part's rate: exact for non-causal cases.
        assert!((g - part.flops() / 2.0 / 1e9).abs() < 1e-9 * g);
        assert_eq!(
            (r.mem_overhead_bytes, r.mem_predicted_bytes),
            (Some(1234), Some(999))
        );
        assert_eq!(
            (r.extrapolated, r.timed_rows, r.reps),
            (true, Some(4096), 3)
        );
        assert_eq!((r.err_rows, r.stopped_by.as_str()), (Some(256), "time_cap"));
        assert!((estimate_full_s(2.0, &full, rows) - 32.0).abs() < 1e-12);
    }
}

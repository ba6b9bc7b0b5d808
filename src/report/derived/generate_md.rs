//! `generate.md` and the checks of Tree Attention's end-to-end Tables 1-2 (Shyam et al.
//! Sec. 6.4 and App. C.3; docs/papers.md, Shyam et al.), from the rows of `generate.csv`:
//! our simulated prefill + 10-token decode of a tiny GQA model beside the paper's Llama 3.1
//! 8B on 8 H100s and 4 MI300x (Table 1, set beside our p = 8 and p = 4) and Llama 3.2 1B on
//! 2 RTX 4090s (Table 2, beside p = 2), length by length in order; then (1) the
//! generations equal one device's (PASS/FAIL, 1e-6 relative in f32), (2) tree faster than
//! ring at every length and (3) the ratio's change with length against the paper's, both
//! TREND. A check without its rows says so (n/a). O(rows).

use crate::model::markdown::{count, seconds, table};
use crate::report::checks::Check;
use crate::report::claims::markdown;
use crate::report::series::distinct;
use crate::results::generate::{GenerateRow, MPI_LINKS};

pub const MARKDOWN: &str = "generate.md";

/// Generations must equal one device's to this relative difference (f32).
pub const SAME_OUTPUT: f64 = 1e-6;

/// One of the paper's columns: its hardware, the p we set beside it, and its rows
/// (length, tree s, ring s) in seconds over 10 trials.
pub struct PaperColumn {
    pub label: &'static str,
    pub devices: usize,
    pub rows: [(&'static str, f64, f64); 4],
}

/// Table 1 (Llama 3.1 8B, 10-token decode including prefill) and Table 2 (Llama 3.2 1B).
pub const PAPER: [PaperColumn; 3] = [
    PaperColumn {
        label: "Table 1, Llama 3.1 8B, 8×H100",
        devices: 8,
        rows: [
            ("32k", 0.60, 2.57),
            ("64k", 1.08, 4.42),
            ("128k", 2.68, 6.38),
            ("256k", 2.89, 8.19),
        ],
    },
    PaperColumn {
        label: "Table 1, Llama 3.1 8B, 4×MI300x",
        devices: 4,
        rows: [
            ("32k", 1.05, 3.57),
            ("64k", 2.36, 7.33),
            ("128k", 6.43, 16.40),
            ("256k", 15.30, 35.12),
        ],
    },
    PaperColumn {
        label: "Table 2, Llama 3.2 1B, 2×RTX 4090 (PCIe)",
        devices: 2,
        rows: [
            ("8000", 0.34, 1.38),
            ("16000", 0.58, 2.77),
            ("20000", 0.74, 3.47),
            ("32000", 1.01, 5.45),
        ],
    },
];

fn find<'a>(rows: &'a [GenerateRow], method: &str, p: usize, n: usize) -> Option<&'a GenerateRow> {
    rows.iter()
        .find(|r| r.method == method && r.devices == p && r.tokens == n)
}

/// The prompt lengths of `p`, ascending.
fn lengths(rows: &[GenerateRow], p: usize) -> Vec<usize> {
    distinct(rows.iter().filter(|r| r.devices == p).map(|r| r.tokens))
}

/// (N, ring s, tree s, ring / tree) of every length of `p` with both rows.
fn ratios(rows: &[GenerateRow], p: usize) -> Vec<(usize, f64, f64, f64)> {
    lengths(rows, p)
        .into_iter()
        .filter_map(|n| {
            let (r, t) = (find(rows, "ring", p, n)?, find(rows, "tree", p, n)?);
            Some((n, r.total_s, t.total_s, r.total_s / t.total_s))
        })
        .collect()
}

fn paper_ratio(c: &PaperColumn) -> (f64, f64) {
    let (first, last) = (c.rows[0], c.rows[3]);
    (first.2 / first.1, last.2 / last.1)
}

/// The checks of the table.
pub fn checks(rows: &[GenerateRow]) -> Vec<Check> {
    let mut v = Vec::new();
    let c = Check::new(
        "ring and tree generation equal one device's (every token; every step's logits)",
        format!("outputs equal to vanilla (Sec. 1); <= {SAME_OUTPUT:.0e} relative in f32"),
    );
    v.push(if rows.is_empty() {
        c.missing("no generations".into())
    } else {
        let worst = rows.iter().map(|r| r.max_rel_err).fold(0.0, f64::max);
        let tokens = rows.iter().filter(|r| r.tokens_match).count();
        let generations: usize = rows.iter().map(|r| r.reps).sum();
        c.judged(
            format!(
                "max {worst:.1e} over {generations} generations at {} points; tokens equal at {tokens} of {}",
                rows.len(),
                rows.len()
            ),
            worst <= SAME_OUTPUT && tokens == rows.len(),
        )
    });
    let all: Vec<(usize, (usize, f64, f64, f64))> = PAPER
        .iter()
        .flat_map(|c| ratios(rows, c.devices).into_iter().map(|x| (c.devices, x)))
        .collect();
    let c = Check::new(
        "tree generation (prefill + 10 tokens) faster than ring at every length",
        "2-5x faster at every length (Tables 1-2: 8×H100, 4×MI300x, 2×RTX 4090)",
    );
    v.push(if all.is_empty() {
        c.missing("no ring and tree pairs".into())
    } else {
        let faster = all.iter().filter(|(_, x)| x.3 > 1.0).count();
        let lo = all.iter().map(|(_, x)| x.3).fold(f64::INFINITY, f64::min);
        let hi = all.iter().map(|(_, x)| x.3).fold(0.0, f64::max);
        c.trend(format!(
            "tree faster at {faster} of {} (p, N): {lo:.2}x to {hi:.2}x ({})",
            all.len(),
            if on_ranks(rows) {
                "MPI ranks"
            } else {
                "simulated"
            }
        ))
    });
    let c = Check::new(
        "ring / tree ratio from the shortest to the longest length",
        format!(
            "{} (shortest to longest length)",
            PAPER
                .iter()
                .map(|c| {
                    let (a, b) = paper_ratio(c);
                    format!(
                        "{} {a:.1}x to {b:.1}x",
                        c.label.rsplit(", ").next().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        ),
    );
    let ours: Vec<String> = PAPER
        .iter()
        .filter_map(|c| {
            let r = ratios(rows, c.devices);
            let (a, b) = (r.first()?, r.last()?);
            Some(format!(
                "p = {}: {:.2}x to {:.2}x (N = {} to {})",
                c.devices, a.3, b.3, a.0, b.0
            ))
        })
        .collect();
    v.push(if ours.is_empty() {
        c.missing("no ring and tree pairs".into())
    } else {
        c.trend(ours.join("; "))
    });
    v
}

/// Whether the rows were measured on real MPI ranks (all of them).
fn on_ranks(rows: &[GenerateRow]) -> bool {
    !rows.is_empty() && rows.iter().all(|r| r.topology == MPI_LINKS)
}

/// What runs and what the time is, on MPI ranks.
const ON_RANKS: &str = "Written by `attnbench reproduce tree-attention` (modules \
    `src/run/generate_ranks.rs`, `src/report/derived/generate_md.rs`), one `mpirun` per p; \
    the rows are `generate.csv` (each p's also in `p<p>/`, with the rank's `meta.json`).\n\n\
    **What runs.** The tiny Llama-style decoder of the simulated table \
    (`layer::decoder::Config::TINY`: 2 layers, hidden 256, 8 query heads on 2 key/value heads \
    of d_h = 32, SwiGLU 512, RoPE, RMSNorm, vocabulary 512, seeded random weights, f32) \
    generates greedily from N seeded prompt tokens on p MPI ranks of this machine, one \
    process per device with one thread, messages over shared memory, as the paper's \
    protocol: the prefill is sequence-parallel, rank r running prompt block r (contiguous, \
    N/p tokens) through the whole model, each layer's attention ring attention over MPI \
    (causal); the rank holding the last token broadcasts its logits. Then 10 decode steps: \
    every rank runs the new token's projections and MLP, its key and value join the last \
    rank's shard, and each layer attends by ring decode or tree decode over MPI \
    (Algorithm 3, binomial allreduces over point-to-point messages), the query broadcast \
    from the last rank, K/V repeated to every query head before they are communicated \
    (`repeat_kv`).\n\n\
    **What the time is.** Rank 0's wall clock, summed over the prefill and the 10 steps: \
    every phase ends with the last rank's logits arriving, so it covers the critical path. \
    Attention is the time inside the MPI attention calls, messages the time inside their MPI \
    operations (waits for a peer included), the rest the model around them; assembling each \
    call's whole-length inputs (the MPI kernels address their shard inside the whole \
    tensors) is harness work, in no figure. Ring and tree of one (p, N) are timed \
    interleaved and run the same prefill, so both are charged the same prefill and decode \
    rest, from both methods' runs pooled (the run of median prefill, the median decode \
    rest); each method's decode attention is the median of its own runs. Bytes are what \
    the schedules that ran send (the MPI kernels' counted traffic equals them, \
    `tests/mpi.rs`). Ranks beyond this machine's cores share them (p = 4 on 2 cores waits \
    for a core), and the links are one machine's memory, not NVLink or PCIe: compare \
    directions, not seconds. Lengths are the paper's Table 1 lengths scaled down by 32 \
    (Table 2's lengths set beside the same N in order).\n\n";

/// What runs and what the time is, simulated.
const SIMULATED: &str =
    "Written by `attnbench reproduce tree-attention` (modules `src/run/generate.rs`, \
          `src/report/derived/generate_md.rs`); the rows are `generate.csv`.\n\n\
          **What runs.** A tiny Llama-style decoder (`layer::decoder::Config::TINY`: 2 \
          layers, hidden 256, 8 query heads on 2 key/value heads of d_h = 32, SwiGLU 512, \
          RoPE, RMSNorm, vocabulary 512, seeded random weights, f32) generates greedily from \
          N seeded prompt tokens on p simulated devices, as the paper's protocol: both \
          methods prefill with ring attention (causal, contiguous shards); then 10 decode \
          steps, each layer's attention over the sharded cache by ring decode or tree decode \
          (Algorithm 3, binomial allreduces), the query broadcast from the last device, the \
          new key and value appended to the last shard, K/V repeated to every query head \
          before they are communicated (`repeat_kv`). The projections and the MLP run on \
          one device (the prefill's sequence-parallel, each device its own tokens).\n\n\
          **What the time is.** Simulated, not a cluster's wall time, and the sum over the \
          prefill and the 10 steps: each attention call's wall time on this machine (one \
          thread) spread over the devices in proportion to their counted query-key pairs, \
          the busiest device per step on the critical path; every message of the schedules \
          the simulator ran priced with the α–β link presets (`dgx-h100`: NVLink for p = 8 \
          and 4; `pcie-pair` for p = 2), ring's transfers overlapped with its steps; the \
          rest of the model timed here (the prefill's divided by p). Ring and tree of one \
          (p, N) are timed interleaved. Both run the same prefill (bit-identical caches) \
          and the same projections and MLP in the decode steps, so both are charged the \
          same figures for those, from both methods' runs pooled (the run of median \
          prefill, the median decode rest); each method's decode attention is the median \
          of its own runs. The \
          compute is a CPU's and the links a GPU cluster's, so compare directions, not \
          seconds. Lengths are the paper's Table 1 lengths scaled down by 32 (Table 2's \
          lengths are set beside the same N in order).\n\n";

/// `generate.md`: our table beside the paper's, the parts of each time, and the checks.
pub fn render(rows: &[GenerateRow]) -> String {
    let ranks = on_ranks(rows);
    let mut s = String::from(if ranks {
        "# Tree vs Ring attention on MPI ranks: prefill plus a 10-token decode (Shyam et al., Tables 1-2)\n\n"
    } else {
        "# Tree vs Ring attention: prefill plus a 10-token decode (Shyam et al., Tables 1-2)\n\n"
    });
    s += if ranks { ON_RANKS } else { SIMULATED };
    s += "## Ours beside the paper's\n\n";
    for c in &PAPER {
        let ours = ratios(rows, c.devices);
        if ours.is_empty() {
            continue;
        }
        s += &format!("**p = {}** beside {}:\n\n", c.devices, c.label);
        let body: Vec<Vec<String>> = ours
            .iter()
            .zip(&c.rows)
            .map(|(o, pp)| {
                vec![
                    o.0.to_string(),
                    seconds(o.2),
                    seconds(o.1),
                    format!("{:.2}×", o.3),
                    pp.0.into(),
                    format!("{:.2} s", pp.1),
                    format!("{:.2} s", pp.2),
                    format!("{:.2}×", pp.2 / pp.1),
                ]
            })
            .collect();
        s += &table(
            &[
                "N",
                "tree",
                "ring",
                "ring / tree",
                "paper len",
                "paper tree",
                "paper ring",
                "paper ratio",
            ],
            &body,
        );
        s += "\n";
    }
    s += "The paper prints the ratio rounded (4, 4, 2, 3; 3, 3, 3, 2; 4, 5, 5, 5); it is \
          computed here from its seconds. Its ± (np.std over 10 trials) is left out.\n\n";
    s += "## Where the time goes\n\n";
    s += if ranks {
        "Prefill (attention over MPI on rank 0, of which its MPI operations, the rest of the \
         model on rank 0's prompt block) and the 10 decode steps (the same three); bytes \
         every rank sent; error of the logits against one device (flash attention and \
         flash-decoding on the GQA cache).\n\n"
    } else {
        "Prefill (attention on the busiest devices, of which messages alone, the rest of \
          the model) and the 10 decode steps (attention with its messages, of which \
          messages alone, the rest of the model on one device); bytes every device sent; \
          error of the logits against one device (flash attention and flash-decoding on the \
          GQA cache).\n\n"
    };
    let mut sorted: Vec<&GenerateRow> = rows.iter().collect();
    sorted.sort_by(|a, b| (b.devices, a.tokens, &a.method).cmp(&(a.devices, b.tokens, &b.method)));
    let body: Vec<Vec<String>> = sorted
        .iter()
        .map(|r| {
            vec![
                r.devices.to_string(),
                r.tokens.to_string(),
                r.method.clone(),
                r.topology.clone(),
                seconds(r.total_s),
                format!(
                    "{} ({} / {} / {})",
                    seconds(r.prefill_s),
                    seconds(r.prefill_attention_s),
                    seconds(r.prefill_comm_s),
                    seconds(r.prefill_other_s)
                ),
                format!(
                    "{} ({} / {} / {})",
                    seconds(r.decode_s),
                    seconds(r.decode_attention_s),
                    seconds(r.decode_comm_s),
                    seconds(r.decode_other_s)
                ),
                count(r.comm_bytes),
                format!("{:.1e}", r.max_rel_err),
                if r.tokens_match { "yes" } else { "NO" }.into(),
                r.reps.to_string(),
            ]
        })
        .collect();
    s += &table(
        &[
            "p",
            "N",
            "method",
            "links",
            "total",
            "prefill (attention / messages / rest)",
            "decode (attention / messages / rest)",
            "bytes sent",
            "logits vs one device",
            "tokens equal",
            "reps",
        ],
        &body,
    );
    s += "\nBoth methods run the same ring prefill and are charged the same time for it; \
          the decode steps differ: ring's critical path visits every shard (N keys \
          per step) and moves the cache p - 1 times, tree's attends to its own shard (N/p) \
          and allreduces a few rows. The prefill grows as N² and the decode as N, so in this \
          model the ratio falls toward 1 as N grows; the paper's timings of a JAX \
          implementation on GPUs keep 2-5x.\n\n## Checks\n\n";
    s += &markdown(&checks(rows));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    fn row(method: &str, p: usize, n: usize, total: f64, err: f64) -> GenerateRow {
        GenerateRow {
            method: method.into(),
            devices: p,
            tokens: n,
            steps: 10,
            topology: "dgx-h100".into(),
            reps: 1,
            total_s: total,
            prefill_s: total / 2.0,
            prefill_attention_s: total / 4.0,
            prefill_comm_s: 1e-5,
            prefill_other_s: total / 4.0,
            decode_s: total / 2.0,
            decode_attention_s: total / 4.0,
            decode_comm_s: 1e-5,
            decode_other_s: total / 4.0,
            comm_bytes: 1000,
            max_rel_err: err,
            tokens_match: true,
        }
    }

    #[test]
    fn the_checks_read_the_rows() {
        let rows = vec![
            row("ring", 8, 2048, 4.0, 1e-7),
            row("tree", 8, 2048, 1.0, 2e-7),
            row("ring", 8, 4096, 6.0, 1e-7),
            row("tree", 8, 4096, 3.0, 1e-7),
        ];
        let c = checks(&rows);
        assert_eq!(c[0].verdict, Verdict::Pass, "{:?}", c[0]);
        assert!(c[0].ours.contains("2.0e-7"), "{}", c[0].ours);
        assert_eq!(c[1].verdict, Verdict::Trend);
        assert!(
            c[1].ours.contains("2 of 2") && c[1].ours.contains("4.00x"),
            "{}",
            c[1].ours
        );
        assert!(c[2].ours.contains("p = 8: 4.00x to 2.00x"), "{}", c[2].ours);
        // The paper's 8×H100 column: 2.57/0.60 to 8.19/2.89.
        assert!(c[2].paper.contains("8×H100 4.3x to 2.8x"), "{}", c[2].paper);
        let mut bad = rows.clone();
        bad[1].max_rel_err = 2e-6;
        assert_eq!(checks(&bad)[0].verdict, Verdict::Fail);
        bad[1].max_rel_err = 0.0;
        bad[3].tokens_match = false;
        assert_eq!(checks(&bad)[0].verdict, Verdict::Fail);
        assert_eq!(checks(&[])[0].verdict, Verdict::NotApplicable);
        assert!(c[1].ours.ends_with("(simulated)"), "{}", c[1].ours);
        // On MPI ranks: the same checks, said so, and the protocol of the ranks.
        let ranks: Vec<GenerateRow> = rows
            .iter()
            .cloned()
            .map(|mut r| {
                r.topology = MPI_LINKS.into();
                r
            })
            .collect();
        assert!(checks(&ranks)[1].ours.ends_with("(MPI ranks)"));
        let md = render(&ranks);
        assert!(
            md.starts_with("# Tree vs Ring attention on MPI ranks"),
            "{md}"
        );
        assert!(md.contains("Rank 0's wall clock") && !md.contains("Simulated, not"));
        let md = render(&rows);
        assert!(md.contains("Simulated, not") && !md.contains("Rank 0's wall clock"));
        assert!(
            md.contains("| 2048 | 1.000 s | 4.000 s | 4.00× | 32k | 0.60 s | 2.57 s | 4.28× |"),
            "{md}"
        );
    }
}

//! Which of our rows stand for the paper's columns in Rabe–Staats Table 2 (seed 001
//! L247–255): "standard attention" is `naive`, "memory-efficient attention" is `rabe-staats`
//! with the paper's default chunks (query 1024, key 4096, each `min(chunk, n)`), normal
//! inputs, forward, non-causal, no window. The √n check uses `rabe-staats` with
//! kv_chunk = ⌈√n⌉ and the default query chunk (REPRODUCTION.md 1.1). When several rows
//! match one n (other dtypes or thread counts in the same CSV) the first in CSV order is
//! used, and the table says which dtypes and threads its rows have.

use std::collections::BTreeMap;

use super::record::Record;
use super::series::ceil_sqrt;

pub const STANDARD: &str = "naive";
pub const MEMORY_EFFICIENT: &str = "rabe-staats";
/// The paper's `query_chunk_size` and `key_chunk_size` defaults (Figure 1).
pub const PAPER_Q_CHUNK: usize = 1024;
pub const PAPER_KV_CHUNK: usize = 4096;

/// Our rows for the Table 2 layout, keyed by sequence length.
#[derive(Debug, Default)]
pub struct Table2Rows<'a> {
    pub standard: BTreeMap<usize, &'a Record>,
    pub memory_efficient: BTreeMap<usize, &'a Record>,
    /// `rabe-staats` with kv_chunk = ⌈√n⌉, q_chunk = min(1024, n), any input distribution.
    pub sqrt_chunks: BTreeMap<usize, &'a Record>,
    /// `rabe-staats` with the default chunks and a paired difference, by input distribution.
    pub paired: BTreeMap<(String, usize), &'a Record>,
}

fn plain(r: &Record) -> bool {
    r.mode == "fwd" && !r.causal && r.window.is_none()
}

fn default_chunks(r: &Record) -> bool {
    r.q_chunk == Some(PAPER_Q_CHUNK.min(r.seq_q))
        && r.kv_chunk == Some(PAPER_KV_CHUNK.min(r.seq_kv))
}

pub fn table2_rows(records: &[Record]) -> Table2Rows<'_> {
    let mut t = Table2Rows::default();
    for r in records.iter().filter(|r| plain(r)) {
        let normal = r.input_dist == "normal";
        if r.variant == STANDARD && normal {
            t.standard.entry(r.seq_q).or_insert(r);
        }
        if r.variant != MEMORY_EFFICIENT {
            continue;
        }
        if default_chunks(r) {
            if normal {
                t.memory_efficient.entry(r.seq_q).or_insert(r);
            }
            if r.max_abs_diff.is_some() && r.diff_variant == STANDARD {
                t.paired.entry((r.input_dist.clone(), r.seq_q)).or_insert(r);
            }
        }
        let sqrt = ceil_sqrt(r.seq_kv);
        if r.kv_chunk == Some(sqrt)
            && r.q_chunk == Some(PAPER_Q_CHUNK.min(r.seq_q))
            && sqrt != PAPER_KV_CHUNK.min(r.seq_kv)
        {
            t.sqrt_chunks.entry(r.seq_q).or_insert(r);
        }
    }
    t
}

impl Table2Rows<'_> {
    /// "bf16 inputs, 1 thread" (or the mix) of the rows the table shows.
    pub fn describe(&self) -> String {
        let rows: Vec<&Record> = self
            .standard
            .values()
            .chain(self.memory_efficient.values())
            .copied()
            .collect();
        let distinct = |f: &dyn Fn(&Record) -> String| {
            let mut v: Vec<String> = rows.iter().map(|r| f(r)).collect();
            v.sort();
            v.dedup();
            v.join("/")
        };
        format!(
            "{} inputs, f32 output, b={} h={} d={}, {} thread(s)",
            distinct(&|r| r.dtype.clone()),
            distinct(&|r| r.batch.to_string()),
            distinct(&|r| r.heads.to_string()),
            distinct(&|r| r.head_dim.to_string()),
            distinct(&|r| r.threads.to_string()),
        )
    }
}

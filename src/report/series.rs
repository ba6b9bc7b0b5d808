//! Grouping records into plot series: one series per combination of every identity column
//! except the sequence length, labelled by the columns that differ between series (the
//! ones that are the same everywhere go into the plot's caption instead). Chunk sizes are
//! grouped by their rule, not their value: the paper's `min(chunk, n)` clamping and
//! `kv_chunk = ⌈√n⌉` change the value with n but belong to one line.

use std::collections::BTreeMap;

use super::record::Record;
use crate::variant::VariantId;

/// Records that form one line, sorted by sequence length.
/// How the file stems of the chunk-sweep heatmaps begin.
pub const CHUNKS_PREFIX: &str = "chunks_";

/// A legend label from (column, value) parts: the values joined by " · ".
pub fn join_label<'p>(parts: impl IntoIterator<Item = &'p (&'static str, String)>) -> String {
    parts
        .into_iter()
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>()
        .join(" · ")
}

#[derive(Clone, Debug)]
pub struct Series<'a> {
    pub label: String,
    /// The (column, value as shown) pairs `label` is made of, the variant first.
    pub parts: Vec<(&'static str, String)>,
    /// Every identity column but the sequence length, (column, value as shown): what a chart
    /// with too many series is split by (`figures::facets`).
    pub key: Vec<(&'static str, String)>,
    pub variant: String,
    pub dtype: String,
    pub device: String,
    pub records: Vec<&'a Record>,
}

/// Series in first-seen order, and the caption of what all of them share.
#[derive(Clone, Debug)]
pub struct Grouping<'a> {
    pub series: Vec<Series<'a>>,
    pub caption: String,
}

/// The smallest c with c * c >= n.
pub fn ceil_sqrt(n: usize) -> usize {
    let mut c = (n as f64).sqrt() as usize;
    while c * c < n {
        c += 1;
    }
    while c > 1 && (c - 1) * (c - 1) >= n {
        c -= 1;
    }
    c
}

/// How a chunk size relates to n: the variant's default (`min(default, n)`, or no chunk
/// for variants that do not cut that loop), `⌈√n⌉`, or a fixed value.
pub fn chunk_rule(chunk: Option<usize>, default: Option<usize>, n: usize) -> String {
    match chunk {
        None => "default".into(),
        Some(c) if default.is_some_and(|d| c == d.min(n)) => "default".into(),
        Some(c) if c == ceil_sqrt(n) => "⌈√n⌉".into(),
        Some(c) => c.to_string(),
    }
}

/// (column, value as shown) of every identity column but the sequence length.
fn identity(r: &Record) -> Vec<(&'static str, String)> {
    let info = r.variant.parse::<VariantId>().ok().map(|v| v.info());
    let q_default = info.and_then(|i| i.default_q_chunk);
    let kv_default = info.and_then(|i| i.default_kv_chunk);
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    vec![
        ("variant", r.variant.clone()),
        ("device", r.device.clone()),
        ("dtype", r.dtype.clone()),
        ("mode", r.mode.clone()),
        ("batch", format!("b={}", r.batch)),
        ("heads", format!("h={}", r.heads)),
        ("kv_heads", format!("kv_heads={}", r.kv_heads)),
        ("head_dim", format!("d={}", r.head_dim)),
        (
            "q_chunk",
            format!("q_chunk {}", chunk_rule(r.q_chunk, q_default, r.seq_q)),
        ),
        (
            "kv_chunk",
            format!("kv_chunk {}", chunk_rule(r.kv_chunk, kv_default, r.seq_kv)),
        ),
        (
            "causal",
            if r.causal { "causal" } else { "non-causal" }.into(),
        ),
        (
            "window",
            r.window
                .map_or("no window".into(), |w| format!("window={w}")),
        ),
        ("devices", format!("p={}", r.devices)),
        (
            "threads",
            format!("{} thread{}", r.threads, plural(r.threads)),
        ),
        ("input_dist", r.input_dist.clone()),
        ("input_scale", format!("input_scale={}", r.input_scale)),
        (
            "seq_kv",
            if r.seq_kv == r.seq_q {
                "n_kv=n".into()
            } else {
                format!("n_kv={}", r.seq_kv)
            },
        ),
    ]
}

/// Values that say nothing when every series has them (left out of the caption).
fn unremarkable(col: &str, value: &str) -> bool {
    matches!(
        (col, value),
        ("mode", "fwd")
            | ("window", "no window")
            | ("devices", "p=1")
            | ("input_scale", "input_scale=1")
            | ("seq_kv", "n_kv=n")
            | ("q_chunk", "q_chunk default")
            | ("kv_chunk", "kv_chunk default")
    )
}

pub fn group<'a>(records: impl IntoIterator<Item = &'a Record>) -> Grouping<'a> {
    let mut order: Vec<Vec<(&'static str, String)>> = Vec::new();
    let mut members: BTreeMap<usize, Vec<&'a Record>> = BTreeMap::new();
    for r in records {
        let id = identity(r);
        let i = match order.iter().position(|k| *k == id) {
            Some(i) => i,
            None => {
                order.push(id);
                order.len() - 1
            }
        };
        members.entry(i).or_default().push(r);
    }
    let columns = order.first().map_or(0, Vec::len);
    let varies: Vec<bool> = (0..columns)
        .map(|c| order.iter().any(|k| k[c].1 != order[0][c].1))
        .collect();
    let caption = order.first().map_or(String::new(), |first| {
        first
            .iter()
            .zip(&varies)
            .filter(|((col, v), varies)| !**varies && *col != "variant" && !unremarkable(col, v))
            .map(|((_, v), _)| v.clone())
            .collect::<Vec<_>>()
            .join(" · ")
    });
    let series = order
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let mut parts = vec![key[0].clone()];
            parts.extend(
                key.iter()
                    .zip(&varies)
                    .skip(1)
                    .filter(|((col, value), v)| **v && !unremarkable(col, value))
                    .map(|(kv, _)| kv.clone()),
            );
            let mut recs = members.remove(&i).unwrap_or_default();
            recs.sort_by_key(|r| r.seq_q);
            Series {
                label: join_label(&parts),
                parts,
                key: key.clone(),
                variant: key[0].1.clone(),
                dtype: key[2].1.clone(),
                device: key[1].1.clone(),
                records: recs,
            }
        })
        .collect();
    Grouping { series, caption }
}

/// Chunk settings of one case needed for a heatmap: two are a comparison (e.g. the default
/// and ⌈√n⌉ key chunks of the Table 2 config), three or more a sweep.
pub const MIN_GRID_CELLS: usize = 3;

/// A chunk-size sweep: one case (everything but the chunks equal) measured at several
/// (q_chunk, kv_chunk) pairs, shown as a q_chunk x kv_chunk heatmap.
#[derive(Clone, Debug)]
pub struct ChunkGrid<'a> {
    /// The shared identity, e.g. "rabe-staats · bf16 · n=16384".
    pub title: String,
    /// A file-name stem: "chunks_rabe-staats_bf16_n16384" (made unique by the caller's order).
    pub stem: String,
    pub q_chunks: Vec<usize>,
    pub kv_chunks: Vec<usize>,
    pub cells: BTreeMap<(usize, usize), &'a Record>,
}

/// Every group of rows that differ only in their chunk sizes and cover at least
/// `MIN_GRID_CELLS` (q_chunk, kv_chunk) pairs, in first-seen order.
pub fn chunk_grids(records: &[Record]) -> Vec<ChunkGrid<'_>> {
    let mut keys: Vec<Vec<(&'static str, String)>> = Vec::new();
    let mut grids: Vec<ChunkGrid> = Vec::new();
    for r in records {
        let (Some(q), Some(kv)) = (r.q_chunk, r.kv_chunk) else {
            continue;
        };
        let mut key: Vec<(&'static str, String)> = identity(r)
            .into_iter()
            .filter(|(c, _)| *c != "q_chunk" && *c != "kv_chunk")
            .collect();
        key.push(("seq_q", r.seq_q.to_string()));
        let i = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                grids.push(ChunkGrid {
                    title: format!("{} · {} · n={}", r.variant, r.dtype, r.seq_q),
                    stem: format!("{CHUNKS_PREFIX}{}_{}_n{}", r.variant, r.dtype, r.seq_q),
                    q_chunks: Vec::new(),
                    kv_chunks: Vec::new(),
                    cells: BTreeMap::new(),
                });
                grids.len() - 1
            }
        };
        grids[i].cells.entry((q, kv)).or_insert(r);
    }
    let mut seen = std::collections::HashSet::new();
    grids
        .into_iter()
        .filter(|g| g.cells.len() >= MIN_GRID_CELLS)
        .map(|mut g| {
            g.q_chunks = g.cells.keys().map(|k| k.0).collect();
            g.q_chunks.sort_unstable();
            g.q_chunks.dedup();
            g.kv_chunks = g.cells.keys().map(|k| k.1).collect();
            g.kv_chunks.sort_unstable();
            g.kv_chunks.dedup();
            let mut stem = g.stem.clone();
            let mut k = 2;
            while !seen.insert(stem.clone()) {
                stem = format!("{}_{k}", g.stem);
                k += 1;
            }
            g.stem = stem;
            g
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_sqrt_and_rules() {
        assert_eq!(
            [1, 2, 4, 5, 4096, 4097, 1 << 20].map(ceil_sqrt),
            [1, 2, 2, 3, 64, 65, 1024]
        );
        assert_eq!(chunk_rule(Some(256), Some(4096), 256), "default");
        assert_eq!(chunk_rule(Some(4096), Some(4096), 1 << 20), "default");
        assert_eq!(chunk_rule(Some(1024), Some(4096), 1 << 20), "⌈√n⌉");
        assert_eq!(chunk_rule(Some(512), Some(4096), 1 << 20), "512");
        assert_eq!(chunk_rule(None, None, 64), "default");
    }
}

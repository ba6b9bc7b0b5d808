//! Grouping records into plot series: one series per combination of every identity column
//! (every part of `case_id`) except the sequence length, labelled by the columns that differ
//! between series (the ones that are the same everywhere go into the plot's caption
//! instead). Chunk sizes are grouped by their rule, not their value: the paper's
//! `min(chunk, n)` clamping and `kv_chunk = ⌈√n⌉` change the value with n but belong to one
//! line; so are split counts (a default one changes with the cache length). Decode rows
//! run over the KV cache length instead (`x_len`), their query rows an identity column.

use crate::variant::Registry;
use std::collections::BTreeMap;

use crate::problem::VariantId;
use crate::problem::{Device, Shape};
use crate::results::record::Record;

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

/// Records that form one line, sorted by the length they run over (`x_len`).
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

/// The distinct values of a column, ascending: what a table's rows or a sweep's axis run over.
pub fn distinct<T: Ord>(values: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = values.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    v
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
        other_length(r),
        ("splits", splits_rule(r)),
        (
            "allreduce",
            if r.allreduce.is_empty() {
                NO_ALLREDUCE.into()
            } else {
                format!("allreduce={}", r.allreduce)
            },
        ),
        (
            "d_out",
            if r.d_out.is_empty() {
                NO_D_OUT.into()
            } else {
                format!("d_out={}", r.d_out)
            },
        ),
        ("seed", format!("seed={}", r.seed)),
        (
            "page_size",
            r.page_size.map_or(NO_PAGES.into(), |p| format!("page={p}")),
        ),
        (
            "page_order",
            if r.page_order.is_empty() {
                NO_PAGES.into()
            } else {
                r.page_order.clone()
            },
        ),
        (
            "kernel_path",
            if r.kernel_path.is_empty() {
                NO_KERNEL_PATH.into()
            } else {
                format!("path={}", r.kernel_path)
            },
        ),
        (
            "prefix_len",
            r.prefix_len
                .map_or(NO_PREFIX.into(), |n| format!("prefix={n}")),
        ),
        (
            "kv_dtype",
            if r.kv_dtype.is_empty() {
                NO_KV_DTYPE.into()
            } else {
                format!("kv={}", r.kv_dtype)
            },
        ),
        (
            "sinks",
            r.sinks.map_or(NO_SINKS.into(), |n| format!("sinks={n}")),
        ),
    ]
}

/// Whether `r` is a decode row: its series run over the KV cache length, not n.
pub fn is_decode(r: &Record) -> bool {
    r.mode == "decode"
}

/// The length a series runs over (its plots' x): the KV cache length of a decode row, whose
/// query rows are a handful of new tokens (n = 1 for every row of a decode sweep), else the
/// sequence length n.
pub fn x_len(r: &Record) -> usize {
    if is_decode(r) {
        r.seq_kv
    } else {
        r.seq_q
    }
}

/// The identity column of the length a series does not run over: the query rows of a decode
/// row (`seq_q`, `n_q=4`), else the key length (`seq_kv`, `n_kv=n` when it is n). One slot
/// for both, so that decode and other rows line up column by column.
fn other_length(r: &Record) -> (&'static str, String) {
    if is_decode(r) {
        ("seq_q", format!("n_q={}", r.seq_q))
    } else if r.seq_kv == r.seq_q {
        ("seq_kv", "n_kv=n".into())
    } else {
        ("seq_kv", format!("n_kv={}", r.seq_kv))
    }
}

/// The values of the keys that only some cases have (flash-decoding's split count, the
/// allreduce of variants with collectives, the upstream gradient of fwd+bwd): the case has
/// no such setting.
const NO_SPLITS: &str = "no splits";
const NO_ALLREDUCE: &str = "no allreduce";
const NO_D_OUT: &str = "no d_out";
const NO_PAGES: &str = "no pages";
const NO_KERNEL_PATH: &str = "default path";
const NO_PREFIX: &str = "no shared prefix";
const NO_KV_DTYPE: &str = "kv as dtype";
const NO_SINKS: &str = "no sinks";

/// Identity columns shown only in the labels of series that differ in them, never in the
/// caption: they apply to some variants or modes only (a caption speaks for every series), or
/// say nothing while they are the same everywhere (the seed).
pub const LABEL_ONLY: [&str; 10] = [
    "splits",
    "allreduce",
    "d_out",
    "seed",
    "page_size",
    "page_order",
    "kernel_path",
    "prefix_len",
    "kv_dtype",
    "sinks",
];

/// Whether `value` of identity column `col` says that the key does not apply to the case. Such
/// values do not make a column vary (flash-decoding's one split count beside rows of other
/// variants without one is no difference) and are left out of labels.
pub fn not_applicable(col: &str, value: &str) -> bool {
    matches!(
        (col, value),
        ("splits", NO_SPLITS)
            | ("allreduce", NO_ALLREDUCE)
            | ("d_out", NO_D_OUT)
            | ("page_size" | "page_order", NO_PAGES)
            | ("kernel_path", NO_KERNEL_PATH)
            | ("prefix_len", NO_PREFIX)
            | ("kv_dtype", NO_KV_DTYPE)
            | ("sinks", NO_SINKS)
    )
}

const SPLITS_DEFAULT: &str = "splits default";

/// A split count by its rule: `default` where it is the one the config gives a case without
/// `splits` (it changes with the cache length, the heads and the threads), else its value.
/// `identities` names every count by its value after all where any row chose one.
fn splits_rule(r: &Record) -> String {
    let Some(splits) = r.splits else {
        return NO_SPLITS.into();
    };
    let default = match (r.variant.parse::<VariantId>(), r.device.parse::<Device>()) {
        (Ok(v), Ok(device)) => {
            let shape = Shape {
                batch: r.batch,
                heads: r.heads,
                kv_heads: r.kv_heads,
                seq_q: r.seq_q,
                seq_kv: r.seq_kv,
                head_dim: r.head_dim,
            };
            v.default_splits(device, &shape, r.threads)
        }
        _ => None,
    };
    if default == Some(splits) {
        SPLITS_DEFAULT.into()
    } else {
        format!("splits={splits}")
    }
}

/// `identity` of each record, with split counts by their rule only where no row chose one:
/// rows that differ in nothing but n and a default split count (which changes with the
/// lengths, the heads and the threads) are one line, `splits default`; but once any row chose
/// its split count (`splits = [1, 8]`), every count is named by its value, also one that
/// happens to be the default, so that the same count reads the same in every label.
fn identities(records: &[&Record]) -> Vec<Vec<(&'static str, String)>> {
    let mut ids: Vec<Vec<(&'static str, String)>> = records.iter().map(|r| identity(r)).collect();
    let Some(col) = ids
        .first()
        .and_then(|k| k.iter().position(|(c, _)| *c == "splits"))
    else {
        return ids;
    };
    let chosen = ids
        .iter()
        .any(|k| k[col].1 != SPLITS_DEFAULT && !not_applicable("splits", &k[col].1));
    if chosen {
        for (k, r) in ids.iter_mut().zip(records) {
            if let Some(splits) = r.splits {
                k[col].1 = format!("splits={splits}");
            }
        }
    }
    ids
}

/// Values that say nothing when every series has them (left out of the caption).
pub fn unremarkable(col: &str, value: &str) -> bool {
    matches!(
        (col, value),
        ("mode", "fwd")
            | ("window", "no window")
            | ("devices", "p=1")
            | ("input_scale", "input_scale=1")
            | ("seq_kv", "n_kv=n")
            | ("q_chunk", "q_chunk default")
            | ("kv_chunk", "kv_chunk default")
    ) || not_applicable(col, value)
}

pub fn group<'a>(records: impl IntoIterator<Item = &'a Record>) -> Grouping<'a> {
    let records: Vec<&'a Record> = records.into_iter().collect();
    let mut order: Vec<Vec<(&'static str, String)>> = Vec::new();
    let mut members: BTreeMap<usize, Vec<&'a Record>> = BTreeMap::new();
    for (r, id) in records.iter().copied().zip(identities(&records)) {
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
    // A column varies where the series have two values of it that apply to them.
    let varies: Vec<bool> = (0..columns)
        .map(|c| {
            let mut applicable = order
                .iter()
                .map(|k| &k[c])
                .filter(|(col, v)| !not_applicable(col, v));
            applicable
                .next()
                .is_some_and(|first| applicable.any(|kv| kv.1 != first.1))
        })
        .collect();
    let caption = order.first().map_or(String::new(), |first| {
        first
            .iter()
            .zip(&varies)
            .filter(|((col, v), varies)| {
                !**varies && *col != "variant" && !LABEL_ONLY.contains(col) && !unremarkable(col, v)
            })
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
            recs.sort_by_key(|r| x_len(r));
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
    let all: Vec<&Record> = records.iter().collect();
    for (r, id) in records.iter().zip(identities(&all)) {
        let (Some(q), Some(kv)) = (r.q_chunk, r.kv_chunk) else {
            continue;
        };
        let mut key: Vec<(&'static str, String)> = id
            .into_iter()
            .filter(|(c, _)| *c != "q_chunk" && *c != "kv_chunk")
            .collect();
        // Both lengths: a decode row's identity names its query rows, not its cache.
        key.push(("seq_q", r.seq_q.to_string()));
        key.push(("seq_kv", r.seq_kv.to_string()));
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
            g.q_chunks = distinct(g.cells.keys().map(|k| k.0));
            g.kv_chunks = distinct(g.cells.keys().map(|k| k.1));
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
    use crate::problem::{Case, DType, InputDist, Mode, UpstreamGrad};
    use crate::results::record::Status;
    use crate::sim::plan::Allreduce;
    use crate::variant::DefaultCase;

    /// A row of `variant` in `mode` (4 heads over 1 key head, d = 64, 2 threads, seed 0, the
    /// variant's default split count and allreduce), changed by `edit`.
    fn row(variant: VariantId, mode: Mode, n: usize, edit: impl FnOnce(&mut Case)) -> Record {
        let shape = Shape {
            batch: 1,
            heads: 4,
            kv_heads: 1,
            seq_q: if mode == Mode::Decode { 1 } else { n },
            seq_kv: n,
            head_dim: 64,
        };
        let mut case = Case {
            mode,
            q_chunk: None,
            kv_chunk: None,
            ..Case::cpu_fwd(variant, shape, DType::F32, 2)
        };
        edit(&mut case);
        Record::for_case("t", &case, Status::Ok, "")
    }

    fn labels(g: &Grouping) -> Vec<String> {
        g.series.iter().map(|s| s.label.clone()).collect()
    }

    #[test]
    fn rows_that_differ_only_in_splits_are_two_series_named_by_them() {
        let fd = VariantId::FlashDecoding;
        let rows: Vec<Record> = [2, 8]
            .iter()
            .flat_map(|&sp| {
                [4096, 16384].map(|n| row(fd, Mode::Decode, n, |c| c.splits = Some(sp)))
            })
            .collect();
        // Before the split count was part of a series, these were 2 (one per n_kv), each
        // with two points at n = 1. Decode rows run over the cache length: one line each.
        let g = group(&rows);
        assert_eq!(
            labels(&g),
            ["flash-decoding · splits=2", "flash-decoding · splits=8"]
        );
        assert!(g.series.iter().all(|s| s.records.len() == 2
            && s.records.iter().map(|r| r.seq_kv).collect::<Vec<_>>() == [4096, 16384]));
        assert!(!g.caption.contains("splits"), "{}", g.caption);
        // Default counts (1 at n_kv = 1024, 4 at 4096) are no difference: labels as before.
        let defaults = [1024, 4096].map(|n| row(fd, Mode::Decode, n, |_| {}));
        assert_eq!(
            defaults.iter().map(|r| r.splits).collect::<Vec<_>>(),
            [Some(1), Some(4)]
        );
        let g = group(&defaults);
        assert_eq!(labels(&g), ["flash-decoding"]);
        assert_eq!(g.series[0].records.len(), 2);
        // Beside a chosen count they are named by their values too.
        let mut chosen = defaults.to_vec();
        chosen.push(row(fd, Mode::Decode, 4096, |c| c.splits = Some(2)));
        assert_eq!(
            labels(&group(&chosen)),
            [
                "flash-decoding · splits=1",
                "flash-decoding · splits=4",
                "flash-decoding · splits=2"
            ]
        );
        // A prefill-shaped sweep over n: one line per split count.
        let sweep: Vec<Record> = [1, 8]
            .iter()
            .flat_map(|&sp| {
                [256, 1024, 4096].map(|n| row(fd, Mode::Fwd, n, |c| c.splits = Some(sp)))
            })
            .collect();
        let g = group(&sweep);
        assert_eq!(
            labels(&g),
            ["flash-decoding · splits=1", "flash-decoding · splits=8"]
        );
        assert!(g
            .series
            .iter()
            .all(|s| s.records.len() == 3
                && s.records.iter().all(|r| r.splits == s.records[0].splits)));
        // The default split count changes with n (more key blocks, up to 2 per thread) but
        // is one rule: one line, named `splits default` beside a chosen count.
        let defaults: Vec<Record> = [256, 1024, 4096]
            .map(|n| row(fd, Mode::Fwd, n, |_| {}))
            .into_iter()
            .collect();
        let counts: Vec<Option<usize>> = defaults.iter().map(|r| r.splits).collect();
        assert!(counts.windows(2).any(|w| w[0] != w[1]), "{counts:?}");
        let g = group(&defaults);
        assert_eq!(labels(&g), ["flash-decoding"]);
        assert_eq!(g.series[0].records.len(), 3);
        // A chosen count that is the default at some n (1 at n <= 1024 here) is still named
        // by its value there, and its rows stay one line (above).
        assert_eq!(row(fd, Mode::Fwd, 256, |_| {}).splits, Some(1));
    }

    #[test]
    fn rows_that_differ_only_in_seed_are_two_series_named_by_it() {
        let rows: Vec<Record> = [0, 1]
            .iter()
            .flat_map(|&seed| {
                [256, 1024].map(|n| row(VariantId::Naive, Mode::Fwd, n, |c| c.seed = seed))
            })
            .collect();
        let g = group(&rows);
        assert_eq!(labels(&g), ["naive · seed=0", "naive · seed=1"]);
        assert!(g.series.iter().all(|s| s.records.len() == 2));
        assert!(!g.caption.contains("seed"), "{}", g.caption);
    }

    #[test]
    fn allreduce_and_d_out_tell_series_apart_where_two_values_apply() {
        let tree = |a| {
            row(VariantId::TreeDecode, Mode::Decode, 4096, move |c| {
                c.devices = 4;
                c.allreduce = Some(a);
            })
        };
        let rows = [
            row(VariantId::RingDecode, Mode::Decode, 4096, |c| c.devices = 4),
            tree(Allreduce::Ring),
            tree(Allreduce::Tree),
        ];
        assert_eq!(
            labels(&group(&rows)),
            [
                "ring-decode",
                "tree-decode · allreduce=ring",
                "tree-decode · allreduce=tree"
            ]
        );
        let rows = [
            row(VariantId::Naive, Mode::Fwd, 256, |_| {}),
            row(VariantId::Naive, Mode::FwdBwd, 256, |_| {}),
            row(VariantId::Naive, Mode::FwdBwd, 256, |c| {
                c.d_out = UpstreamGrad::Ones
            }),
        ];
        assert_eq!(
            labels(&group(&rows)),
            [
                "naive",
                "naive · fwd+bwd · d_out=random",
                "naive · fwd+bwd · d_out=ones"
            ]
        );
    }

    #[test]
    fn keys_that_do_not_vary_leave_labels_and_caption_as_they_were() {
        // One split count (flash-decoding's alone), one allreduce, one upstream gradient
        // (fwd+bwd rows only) and one seed: none of them in a label or the caption.
        let rows = [
            row(VariantId::Naive, Mode::Fwd, 256, |_| {}),
            row(VariantId::Naive, Mode::FwdBwd, 256, |_| {}),
            row(VariantId::FlashDecoding, Mode::Decode, 256, |c| {
                c.splits = Some(8)
            }),
            row(VariantId::TreeDecode, Mode::Decode, 256, |c| c.devices = 4),
            row(VariantId::RingDecode, Mode::Decode, 256, |c| c.devices = 4),
        ];
        let g = group(&rows);
        assert_eq!(
            labels(&g),
            [
                "naive",
                "naive · fwd+bwd",
                "flash-decoding · decode · n_q=1",
                "tree-decode · decode · p=4 · n_q=1",
                "ring-decode · decode · p=4 · n_q=1"
            ]
        );
        assert_eq!(
            g.caption,
            "cpu · f32 · b=1 · h=4 · kv_heads=1 · d=64 · non-causal · 2 threads · normal"
        );
        // ... though every series still knows them (what a chart too big is split by).
        let key = |s: &Series, col: &str| s.key.iter().find(|(c, _)| *c == col).unwrap().1.clone();
        assert_eq!(key(&g.series[2], "splits"), "splits=8");
        assert_eq!(key(&g.series[0], "splits"), NO_SPLITS);
        assert_eq!(key(&g.series[3], "allreduce"), "allreduce=tree");
        assert_eq!(key(&g.series[1], "d_out"), "d_out=random");
        assert_eq!(key(&g.series[0], "seed"), "seed=0");
    }

    /// Every part of `case_id` but the sequence length is an identity column: two rows with
    /// different case_ids and the same n are never one series.
    #[test]
    fn every_case_id_key_but_n_separates_series() {
        let base = |edit: fn(&mut Case)| row(VariantId::FlashDecoding, Mode::FwdBwd, 1024, edit);
        let edits: [fn(&mut Case); 23] = [
            |_| {},
            |c| c.variant = VariantId::Naive,
            |c| c.mode = Mode::Fwd,
            |c| c.device = Device::Cuda,
            |c| c.dtype = DType::Bf16,
            |c| c.shape.batch = 2,
            |c| c.shape.heads = 8,
            |c| c.shape.kv_heads = 2,
            |c| c.shape.seq_kv = 2048,
            |c| c.shape.head_dim = 128,
            |c| c.q_chunk = Some(7),
            |c| c.kv_chunk = Some(7),
            |c| c.causal = true,
            |c| c.window = Some(16),
            |c| c.devices = 2,
            |c| c.threads = 1,
            |c| c.input_dist = InputDist::Uniform,
            |c| c.input_scale = 0.5,
            |c| c.seed = 1,
            |c| c.d_out = UpstreamGrad::Ones,
            |c| c.splits = Some(5),
            // Rows of one variant all have an allreduce or none; two values name it.
            |c| c.allreduce = Some(Allreduce::Ring),
            |c| c.allreduce = Some(Allreduce::Tree),
        ];
        let rows: Vec<Record> = edits.iter().map(|&e| base(e)).collect();
        let ids: std::collections::HashSet<&str> =
            rows.iter().map(|r| r.case_id.as_str()).collect();
        assert_eq!(ids.len(), rows.len(), "each edit changes case_id");
        let g = group(&rows);
        assert_eq!(g.series.len(), rows.len(), "{:?}", labels(&g));
        let distinct: std::collections::HashSet<&str> =
            g.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(distinct.len(), rows.len(), "{:?}", labels(&g));
    }

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

    #[test]
    fn distinct_values_ascend_once_each() {
        assert_eq!(distinct([4096, 256, 4096, 1024, 256]), [256, 1024, 4096]);
        assert_eq!(distinct(["f32", "bf16", "f32"]), ["bf16", "f32"]);
        assert!(distinct(Vec::<usize>::new()).is_empty());
    }
}

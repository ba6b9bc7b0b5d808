//! `decode.md` beside a sweep's CSV when it has single-device decode rows: achieved KV
//! bandwidth against the calibrated copy bandwidth per case and, where the calibration
//! measured it, the read bandwidth (decode only reads its cache: its roofline), and the
//! best flash-decoding fraction for caches of at least 256 MiB per dtype (the issue's
//! acceptance line); with paged-decode rows, each against flash-decoding on the same cache,
//! and `paging.svg` (GB/s against page size). O(rows^2) matching, over the few rows of a
//! sweep.

use std::path::{Path, PathBuf};

use super::same_problem;
use super::svg::{line_chart, Series};
use super::tree_vs_ring::write_file;
use crate::error::Result;
use crate::model::markdown::{seconds, table};
use crate::results::record::Record;

pub const MARKDOWN: &str = "decode.md";
/// KV bandwidth against page size, beside `decode.md` when there are paged-decode rows.
pub const PAGING_PLOT: &str = "paging.svg";

/// Caches this large are past every cache level: the acceptance threshold.
pub const LARGE_CACHE_BYTES: u64 = 256 << 20;

/// Writes `decode.md` if `records` hold decode rows of single-device variants (those with
/// no simulated communication), and `paging.svg` if some of them page their cache.
pub fn write(
    dir: &Path,
    records: &[Record],
    read_bandwidth: &[(usize, f64)],
) -> Result<Vec<PathBuf>> {
    let rows: Vec<&Record> = records
        .iter()
        .filter(|r| r.mode == "decode" && r.comm_elements.is_none() && r.kv_read_bytes.is_some())
        .collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut written = Vec::new();
    if rows.iter().any(|r| r.page_size.is_some()) {
        written.push(write_file(dir, PAGING_PLOT, &paging_plot(&rows))?);
    }
    let mut s = String::from("# Decode: KV-cache bandwidth\n\n");
    s += "Written by `attnbench sweep` and `attnbench report` (module \
          `src/report/derived/decode_md.rs`) from `runs.csv`. `KV read` is the bytes of the \
          cached keys and values the new queries attend, each read once; `GB/s` is that over \
          the median time; `% copy` compares it with the copy bandwidth calibrated at the \
          same thread count (`meta.json`, bytes read + written per second).\n\n";
    // The read roofline only where the calibration measured it (older reports stay as
    // they were).
    let read = |r: &Record| read_gbytes_per_s(read_bandwidth, r.threads);
    let reads = rows.iter().any(|r| read(r).is_some());
    if reads {
        s += "`% read` compares `GB/s` with the read bandwidth calibrated at the same thread \
              count (the copy's source summed: bytes read alone per second). Decode only \
              reads its cache, so that is its roofline; where it is below 70% of the copy \
              bandwidth (`read / copy`), no kernel reaches the acceptance line's 70% of copy \
              on this machine.\n\n";
    }
    s += "## Acceptance: flash-decoding on caches of at least 256 MiB\n\n";
    let mut best = Vec::new();
    for dtype in ["f32", "bf16", "f16"] {
        let top = rows
            .iter()
            .filter(|r| {
                r.variant == "flash-decoding"
                    && r.dtype == dtype
                    && r.kv_dtype.is_empty()
                    && r.kv_read_bytes.unwrap_or(0) >= LARGE_CACHE_BYTES
                    && r.status.name() == "ok"
            })
            .filter_map(|r| r.copy_bw_frac.map(|f| (f, *r)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((f, r)) = top {
            best.push(vec![
                dtype.to_string(),
                format!("{:.0}%", 100.0 * f),
                format!("{:.1}", r.kv_gbytes_per_s.unwrap_or(0.0)),
                format!("{:.1}", r.copy_gbytes_per_s.unwrap_or(0.0)),
                mib(r.kv_read_bytes.unwrap_or(0)),
                r.threads.to_string(),
                if f >= 0.7 { "yes" } else { "no" }.into(),
            ]);
            if reads {
                let row = best.last_mut().expect("just pushed");
                let fill = match (read(r), r.copy_gbytes_per_s, r.kv_gbytes_per_s) {
                    (Some(rd), Some(copy), Some(g)) if rd > 0.0 && copy > 0.0 => [
                        format!("{rd:.1}"),
                        format!("{:.0}%", 100.0 * rd / copy),
                        format!("{:.0}%", 100.0 * g / rd),
                    ],
                    _ => ["-".into(), "-".into(), "-".into()],
                };
                row.extend(fill);
            }
        }
    }
    if best.is_empty() {
        s += "No flash-decoding row with a cache of at least 256 MiB and a calibration.\n\n";
    } else {
        let mut head = vec![
            "dtype",
            "best % of copy",
            "GB/s",
            "copy GB/s",
            "cache",
            "threads",
            ">= 70%",
        ];
        if reads {
            head.extend(["read GB/s", "read / copy", "% of read"]);
        }
        s += &table(&head, &best);
        s += "\n";
    }
    s += &paging_section(&rows);
    s += &fp8_section(&rows);
    s += &mla_section(&rows);
    s += "## Every decode row\n\n";
    // A page column only where some row pages its cache (older reports stay as they were).
    let pages = rows.iter().any(|r| r.page_size.is_some());
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut variant = match (pages, r.page_size) {
                (true, Some(p)) => format!("{} (page {p}, {})", r.variant, r.page_order),
                _ => r.variant.clone(),
            };
            if let (Some(c), Some(k)) = (r.latent_dim, r.rope_dim) {
                variant += &format!(" (latent {c} + RoPE {k})");
            }
            // A forced kernel path (no column of its own, so reports without one stay as
            // they were).
            if !r.kernel_path.is_empty() {
                variant += &format!(" [{}]", r.kernel_path);
            }
            // A ragged batch: its lengths are the spec's; the row's are the totals.
            if !r.batch_spec.is_empty() {
                variant += &format!(" on {}", r.batch_spec);
            }
            // An FP8 cache: Q's dtype and K and V's format (no column of its own, so
            // reports without one stay as they were).
            let dtype = match r.kv_dtype.as_str() {
                "" => r.dtype.clone(),
                kv => format!("{}, KV {kv}", r.dtype),
            };
            let mut cells = vec![
                variant,
                dtype,
                format!("{}/{}", r.heads, r.kv_heads),
                r.seq_q.to_string(),
                r.seq_kv.to_string(),
                // A window with attention sinks: "1024 + 4 sinks".
                match (r.window, r.sinks) {
                    (Some(w), Some(n)) => format!("{w} + {n} sinks"),
                    (w, _) => w.map_or("-".into(), |w| w.to_string()),
                },
                r.splits.map_or("-".into(), |s| s.to_string()),
                r.threads.to_string(),
                r.kv_read_bytes.map_or("-".into(), mib),
                r.status.to_string(),
                r.time_median_s.map_or("-".into(), seconds),
                r.kv_gbytes_per_s.map_or("-".into(), |g| format!("{g:.2}")),
                r.copy_bw_frac
                    .map_or("-".into(), |f| format!("{:.0}%", 100.0 * f)),
                r.max_rel_err.map_or("-".into(), |e| format!("{e:.1e}")),
            ];
            if reads {
                let frac = match (r.kv_gbytes_per_s, read(r)) {
                    (Some(g), Some(rd)) if rd > 0.0 => format!("{:.0}%", 100.0 * g / rd),
                    _ => "-".into(),
                };
                cells.insert(cells.len() - 1, frac);
            }
            cells
        })
        .collect();
    let mut head = vec![
        "variant",
        "dtype",
        "h/kv",
        "new tokens",
        "cache length",
        "window",
        "splits",
        "threads",
        "KV read",
        "status",
        "median",
        "GB/s",
        "% copy",
        "max rel err",
    ];
    if reads {
        head.insert(head.len() - 1, "% read");
    }
    s += &table(&head, &body);
    written.insert(0, write_file(dir, MARKDOWN, &s)?);
    Ok(written)
}

/// The read bandwidth calibrated at `threads` threads, where it was measured.
fn read_gbytes_per_s(read_bandwidth: &[(usize, f64)], threads: usize) -> Option<f64> {
    read_bandwidth
        .iter()
        .find(|(t, _)| *t == threads)
        .map(|(_, g)| *g)
}

/// GB/s against page size: one line per (dtype, new tokens, page order) of paged-decode,
/// and flash-decoding's GB/s on the same cache as a dashed line across the page sizes.
fn paging_plot(rows: &[&Record]) -> String {
    let gbs = |r: &Record| r.kv_gbytes_per_s.filter(|_| r.status.name() == "ok");
    let mut series: Vec<Series> = Vec::new();
    let mut keys: Vec<(String, usize, usize, usize, String)> = Vec::new();
    for r in rows.iter().filter(|r| r.page_size.is_some()) {
        let key = (
            r.dtype.clone(),
            r.seq_q,
            r.kv_heads,
            r.seq_kv,
            r.page_order.clone(),
        );
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let pages: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.page_size)
        .map(|p| p as f64)
        .collect();
    let (lo, hi) = pages
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &p| (a.min(p), b.max(p)));
    let mut flash_seen: Vec<(String, usize, usize, usize)> = Vec::new();
    for (i, (dtype, seq_q, kv, seq_kv, order)) in keys.iter().enumerate() {
        let of = |r: &&&Record| {
            (&r.dtype, r.seq_q, r.kv_heads, r.seq_kv) == (dtype, *seq_q, *kv, *seq_kv)
        };
        let mut points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| of(r) && r.page_order == *order)
            .filter_map(|r| Some((r.page_size? as f64, gbs(r)?)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let name = format!("{dtype} q{seq_q} {order}");
        series.push(Series {
            name,
            points,
            dashed: false,
            color: i,
        });
        let cache = (dtype.clone(), *seq_q, *kv, *seq_kv);
        if flash_seen.contains(&cache) {
            continue;
        }
        flash_seen.push(cache);
        if let Some(g) = rows
            .iter()
            .find(|r| of(r) && r.variant == "flash-decoding")
            .and_then(|r| gbs(r))
        {
            series.push(Series {
                name: format!("{dtype} q{seq_q} flash-decoding"),
                points: vec![(lo, g), (hi, g)],
                dashed: true,
                color: i,
            });
        }
    }
    line_chart(
        "paged-decode: KV bandwidth against page size",
        "page size (tokens)",
        "GB/s",
        &series,
    )
}

/// Pages of at least this many tokens must keep paged-decode at `PAGED_TARGET` of
/// flash-decoding's bandwidth on the same cache (the serving issue's acceptance line).
pub const PAGED_TARGET_PAGE: usize = 16;
pub const PAGED_TARGET: f64 = 0.9;
/// The FP8 cache's target (issue 32): at most this fraction of the time of the same cache
/// stored as bf16, reading half its bytes.
pub const FP8_TARGET: f64 = 0.67;

/// `## Paging`: each paged-decode row against the flash-decoding row on the same logical
/// cache (same run, shape, dtype, mask, threads and inputs), as a bandwidth ratio; empty
/// text when there is no paged-decode row.
fn paging_section(rows: &[&Record]) -> String {
    let paged: Vec<&Record> = rows
        .iter()
        .copied()
        .filter(|r| r.page_size.is_some())
        .collect();
    if paged.is_empty() {
        return String::new();
    }
    let mut s =
        String::from("## Paging: paged-decode against flash-decoding on the same cache\n\n");
    s += &format!(
        "`ratio` is paged-decode's GB/s over flash-decoding's on the same logical cache (same \
         shape, dtype, inputs and threads; a sweep with `run.interleave` times them in the \
         same rounds). Pages of {PAGED_TARGET_PAGE} tokens or more should keep at least \
         {PAGED_TARGET}x; smaller pages are measured and shown, not judged.\n\n"
    );
    let body: Vec<Vec<String>> = paged
        .iter()
        .map(|r| {
            let base = rows.iter().find(|f| {
                f.variant == "flash-decoding" && f.kv_dtype.is_empty() && same_problem(f, r)
            });
            let gbs = |x: &Record| x.kv_gbytes_per_s.filter(|_| x.status.name() == "ok");
            let ratio = base.and_then(|f| Some(gbs(r)? / gbs(f)?));
            let verdict = match ratio {
                Some(x) if r.page_size.unwrap_or(0) >= PAGED_TARGET_PAGE => {
                    if x >= PAGED_TARGET { "yes" } else { "no" }.to_string()
                }
                _ => "-".into(),
            };
            vec![
                r.dtype.clone(),
                format!("{}/{}", r.heads, r.kv_heads),
                if r.batch_spec.is_empty() {
                    r.batch.to_string()
                } else {
                    r.batch_spec.clone()
                },
                r.seq_q.to_string(),
                r.seq_kv.to_string(),
                r.page_size.map_or("-".into(), |p| p.to_string()),
                r.page_order.clone(),
                r.status.to_string(),
                gbs(r).map_or("-".into(), |g| format!("{g:.2}")),
                base.and_then(|f| gbs(f))
                    .map_or("-".into(), |g| format!("{g:.2}")),
                ratio.map_or("-".into(), |x| format!("{x:.2}")),
                verdict,
            ]
        })
        .collect();
    s += &table(
        &[
            "dtype",
            "h/kv",
            "batch",
            "new tokens",
            "cache length",
            "page",
            "order",
            "status",
            "GB/s",
            "flash-decoding GB/s",
            "ratio",
            &format!(">= {PAGED_TARGET}x"),
        ],
        &body,
    );
    s + "\n"
}

/// `## MLA`: each mla-decode row's cache bytes per token (measured: KV read over the
/// tokens; and from the shapes, `model::kv_cache`) against MHA and GQA caches with the same
/// query heads, and its time against flash-decoding's on those caches in the same run
/// (same dtype, batch, query heads, lengths, head dim and threads); empty text when there is
/// no MLA row.
fn mla_section(rows: &[&Record]) -> String {
    use crate::model::kv_cache::{cache_bytes_per_token, CacheKind};
    let mla: Vec<&Record> = rows
        .iter()
        .copied()
        .filter(|r| r.latent_dim.is_some())
        .collect();
    if mla.is_empty() {
        return String::new();
    }
    let mut s = String::from("## MLA: mla-decode against MHA and GQA caches\n\n");
    s += "mla-decode reads one latent vector (d_c) and one RoPE key part (d_r) per cached \
          token for all query heads (W_UK and W_UV absorbed into the query and output \
          sides). `B/token` is its KV read over batch x cache length (measured, per layer); \
          MHA caches 2 h d_h values a token and GQA 2 g d_h (`model::kv_cache`, from the \
          shapes). `x MHA` and `x GQA-g` are flash-decoding's median time on that cache over \
          mla-decode's (same dtype, batch, query heads, lengths and threads; a sweep with \
          `run.interleave` times cases of the same shape in the same rounds). `GFLOP/s` \
          counts the absorbed form's FLOPs.\n\n";
    let ok = |x: &Record| x.status.name() == "ok";
    let body: Vec<Vec<String>> = mla
        .iter()
        .map(|r| {
            let (dc, dr) = (r.latent_dim.unwrap_or(0), r.rope_dim.unwrap_or(0));
            let dtype: crate::problem::DType =
                r.dtype.parse().unwrap_or(crate::problem::DType::F32);
            let tokens = (r.batch * r.seq_kv).max(1) as u64;
            let per_token = r.kv_read_bytes.map(|b| b / tokens);
            let mha = cache_bytes_per_token(CacheKind::Mha { heads: r.heads }, r.head_dim, dtype);
            let peers = |f: &&&Record| {
                f.variant == "flash-decoding"
                    && f.latent_dim.is_none()
                    && (
                        &f.dtype, f.batch, f.heads, f.seq_q, f.seq_kv, f.head_dim, f.threads,
                    ) == (
                        &r.dtype, r.batch, r.heads, r.seq_q, r.seq_kv, r.head_dim, r.threads,
                    )
            };
            let time_ratio = |f: &Record| {
                Some(f.time_median_s.filter(|_| ok(f))? / r.time_median_s.filter(|_| ok(r))?)
            };
            let mha_row = rows.iter().filter(peers).find(|f| f.kv_heads == f.heads);
            let gqa: Vec<String> = rows
                .iter()
                .filter(peers)
                .filter(|f| f.kv_heads != f.heads)
                .map(|f| {
                    let b = cache_bytes_per_token(
                        CacheKind::Gqa {
                            kv_heads: f.kv_heads,
                        },
                        f.head_dim,
                        dtype,
                    );
                    let bytes =
                        per_token.map_or("-".into(), |m| format!("{:.2}x", b as f64 / m as f64));
                    let time = time_ratio(f).map_or("-".into(), |x| format!("{x:.2}x"));
                    format!("GQA-{}: {bytes} bytes, {time} time", f.kv_heads)
                })
                .collect();
            vec![
                r.dtype.clone(),
                r.batch.to_string(),
                r.heads.to_string(),
                r.seq_kv.to_string(),
                format!("{dc} + {dr}"),
                r.kv_read_bytes.map_or("-".into(), mib),
                per_token.map_or("-".into(), |b| b.to_string()),
                per_token.map_or("-".into(), |m| format!("{:.1}x", mha as f64 / m as f64)),
                r.status.to_string(),
                r.time_median_s.map_or("-".into(), seconds),
                r.kv_gbytes_per_s.map_or("-".into(), |g| format!("{g:.2}")),
                r.copy_bw_frac
                    .map_or("-".into(), |f| format!("{:.0}%", 100.0 * f)),
                r.gflops.map_or("-".into(), |g| format!("{g:.1}")),
                mha_row
                    .and_then(|f| time_ratio(f))
                    .map_or("-".into(), |x| format!("{x:.2}x")),
                if gqa.is_empty() {
                    "-".into()
                } else {
                    gqa.join("; ")
                },
            ]
        })
        .collect();
    s += &table(
        &[
            "dtype",
            "batch",
            "h",
            "cache length",
            "d_c + d_r",
            "KV read",
            "B/token",
            "MHA bytes / MLA",
            "status",
            "median",
            "GB/s",
            "% copy",
            "GFLOP/s",
            "x MHA (time)",
            "GQA (bytes / MLA, time / MLA)",
        ],
        &body,
    );
    s + "\n"
}

/// FP8 caches against the same logical cache in the storage dtype: each FP8 row's time
/// over the row of the same variant and problem without `kv_dtype` (same inputs; a sweep
/// with `run.interleave` times them in the same rounds), beside the bytes ratio, and the
/// error the quantization costs.
fn fp8_section(rows: &[&Record]) -> String {
    let fp8: Vec<&Record> = rows
        .iter()
        .copied()
        .filter(|r| !r.kv_dtype.is_empty())
        .collect();
    if fp8.is_empty() {
        return String::new();
    }
    let mut s = String::from("## FP8 cache: against the same cache in the storage dtype\n\n");
    s += &format!(
        "`time ratio` is the FP8 row's median over the median of the same variant on the same \
         logical cache stored as `dtype`; `bytes ratio` the same for the KV bytes read (the \
         codes and the scales). The target is a time ratio of at most {FP8_TARGET}. `error` \
         is against the f64 oracle on the cache as stored, `vs unquantized` against the \
         unquantized cache.\n\n"
    );
    let ok = |x: &Record| x.time_median_s.filter(|_| x.status.name() == "ok");
    let body: Vec<Vec<String>> = fp8
        .iter()
        .map(|r| {
            let base = rows
                .iter()
                .find(|b| b.variant == r.variant && b.kv_dtype.is_empty() && same_problem(b, r));
            let time = base.and_then(|b| Some(ok(r)? / ok(b)?));
            let bytes = base.and_then(|b| Some(r.kv_read_bytes? as f64 / b.kv_read_bytes? as f64));
            vec![
                r.variant.clone(),
                r.dtype.clone(),
                r.kv_dtype.clone(),
                format!("{}/{}", r.heads, r.kv_heads),
                r.seq_q.to_string(),
                r.seq_kv.to_string(),
                r.kv_read_bytes.map_or("-".into(), mib),
                r.status.to_string(),
                ok(r).map_or("-".into(), seconds),
                base.and_then(|b| ok(b)).map_or("-".into(), seconds),
                time.map_or("-".into(), |x| format!("{x:.2}")),
                bytes.map_or("-".into(), |x| format!("{x:.2}")),
                match time {
                    Some(x) => if x <= FP8_TARGET { "yes" } else { "no" }.into(),
                    None => "-".into(),
                },
                r.max_abs_err.map_or("-".into(), |e| format!("{e:.1e}")),
                r.max_abs_err_unquantized
                    .map_or("-".into(), |e| format!("{e:.1e}")),
            ]
        })
        .collect();
    s += &table(
        &[
            "variant",
            "dtype",
            "KV",
            "h/kv",
            "new tokens",
            "cache length",
            "KV read",
            "status",
            "median",
            "as dtype",
            "time ratio",
            "bytes ratio",
            &format!("<= {FP8_TARGET}"),
            "error",
            "vs unquantized",
        ],
        &body,
    );
    s + "\n"
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::record::Status;

    /// A flash-decoding row over 512 MiB of cache at `gbs` GB/s, copy 15 GB/s.
    fn row(dtype: &str, path: &str, gbs: f64) -> Record {
        Record {
            variant: "flash-decoding".into(),
            mode: "decode".into(),
            dtype: dtype.into(),
            heads: 32,
            kv_heads: 8,
            seq_q: 1,
            seq_kv: 65536,
            head_dim: 128,
            threads: 1,
            kernel_path: path.into(),
            status: Status::Ok,
            time_median_s: Some(0.07),
            kv_read_bytes: Some(512 << 20),
            kv_gbytes_per_s: Some(gbs),
            copy_gbytes_per_s: Some(15.0),
            copy_bw_frac: Some(gbs / 15.0),
            ..Record::default()
        }
    }

    fn render(records: &[Record], read_bandwidth: &[(usize, f64)]) -> String {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), records, read_bandwidth).unwrap();
        std::fs::read_to_string(dir.path().join(MARKDOWN)).unwrap()
    }

    #[test]
    fn the_read_roofline_shows_only_where_the_calibration_measured_it() {
        let rows = [row("f32", "avx512", 7.5), row("f32", "", 6.0)];
        // 7.5 GB/s of a 10 GB/s read bandwidth at 1 thread; read / copy = 10 / 15.
        let md = render(&rows, &[(1, 10.0)]);
        assert!(
            md.contains("| 7.5 | 15.0 | 512.0 MiB | 1 | no | 10.0 | 67% | 75% |"),
            "{md}"
        );
        assert!(md.contains("| % copy | % read | max rel err |"), "{md}");
        assert!(md.contains("| 7.50 | 50% | 75% |"), "{md}");
        assert!(md.contains("| 6.00 | 40% | 60% |"), "{md}");
        // The forced path names its row; the default path's row is the variant alone.
        assert!(md.contains("| flash-decoding [avx512] | f32 |"), "{md}");
        assert!(md.contains("| flash-decoding | f32 |"), "{md}");
        // No read figure at the rows' thread count, or none at all (`read_bandwidths` leaves
        // out calibrations without one): the report as before.
        for cal in [vec![(2, 10.0)], vec![]] {
            let md = render(&rows, &cal);
            assert!(!md.contains("% read") && !md.contains("read GB/s"), "{md}");
            assert!(md.contains("| 7.50 | 50% | - |"), "{md}");
        }
    }
}

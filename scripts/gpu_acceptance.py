#!/usr/bin/env python3
"""Issue 8's acceptance lines from a GPU batch's CSVs (scripts/gpu_batch.sh), as Markdown.

    python3 scripts/gpu_acceptance.py OUT > OUT/acceptance.md

- gpu_smoke: every CUDA row `ok` and within its dtype's error tolerance.
- gpu_perf: flash's throughput over PyTorch SDPA's best backend on the same shape, for every
  shape (acceptance: bf16, b 4, h 16, d 128, n 8192, non-causal at >= 50%).
- gpu_decode: flash-decoding bf16 with a cache >= 1 GiB at >= 70% of the device copy
  bandwidth (`copy_bw_frac`), and the fraction of every decode row.
(gpu_accept, the acceptance shapes alone, stands in for gpu_perf/gpu_decode where they are
missing.)
- rabe_staats_table2_gpu: rabe-staats `ok` to n = 2^20 with its memory overhead; naive
  `oom` from n = 2^16 under the 8 GiB budget.
Reads only the CSVs (standard library only). Missing files are reported, not fatal.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
SHAPE = ("dtype", "batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal")


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def num(r: dict, k: str) -> float | None:
    v = r.get(k, "")
    return float(v) if v not in ("", None) else None


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def smoke(out: Path) -> list[str]:
    rs = [r for r in rows(out / "gpu_smoke" / "runs.csv") if r["device"] == "cuda" and not r["variant"].startswith("torch")]
    if not rs:
        return ["## gpu_smoke", "", "no rows", ""]
    bad = []
    for r in rs:
        err = num(r, "max_abs_err")
        if r["status"] != "ok" or err is None or err > TOL[r["dtype"]]:
            bad.append(f"- {r['case_id']}: {r['status']} {r['reason']} err {err}")
    lines = ["## gpu_smoke", "", f"{verdict(not bad)}: {len(rs) - len(bad)} of {len(rs)} CUDA rows ok within tolerance", ""]
    return lines + bad + [""]


def perf(out: Path) -> list[str]:
    rs = rows(out / "gpu_perf" / "runs.csv") or rows(out / "gpu_accept" / "runs.csv")
    lines = ["## gpu_perf: flash vs PyTorch SDPA (GFLOP/s, same shape, same call)", ""]
    if not rs:
        return lines + ["no rows", ""]
    torch: dict[tuple, list[tuple[float, str]]] = {}
    for r in rs:
        if r["variant"].startswith("torch-sdpa") and r["status"] == "ok" and num(r, "gflops"):
            torch.setdefault(tuple(r[k] for k in SHAPE), []).append((num(r, "gflops"), r["variant"]))
    lines += ["| dtype | b | h | d | n | causal | flash GFLOP/s | best SDPA | SDPA GFLOP/s | ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    target = None
    for r in rs:
        if r["variant"] != "flash" or r["mode"] != "fwd":
            continue
        key = tuple(r[k] for k in SHAPE)
        ours = num(r, "gflops") if r["status"] == "ok" else None
        best = max(torch.get(key, []), default=None)
        ratio = ours / best[0] if ours and best else None
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['heads']} | {r['head_dim']} | {r['seq_q']} | {r['causal']} | "
            f"{ours if ours is not None else r['status']} | {best[1] if best else '-'} | {best[0] if best else '-'} | "
            f"{f'{ratio:.2f}' if ratio else '-'} |"
        )
        if (r["dtype"], r["batch"], r["heads"], r["head_dim"], r["seq_q"], r["causal"]) == ("bf16", "4", "16", "128", "8192", "false"):
            target = ratio
    lines += ["", f"{verdict(target is not None and target >= 0.5)}: flash bf16 b4 h16 d128 n8192 non-causal at {target if target is None else f'{target:.2f}'} of SDPA's best (need >= 0.50)", ""]
    return lines


def decode(out: Path) -> list[str]:
    rs = rows(out / "gpu_decode" / "runs.csv") or rows(out / "gpu_accept" / "runs.csv")
    rs = [r for r in rs if r["variant"] == "flash-decoding"]
    lines = ["## gpu_decode: flash-decoding bandwidth (K and V bytes read per second)", ""]
    if not rs:
        return lines + ["no rows", ""]
    lines += ["| dtype | b | h/kv | d | cache | K+V bytes | splits | time | GB/s | copy GB/s | fraction |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ok = False
    for r in rs:
        frac = num(r, "copy_bw_frac")
        t = num(r, "time_median_s")
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['heads']}/{r['kv_heads']} | {r['head_dim']} | {r['seq_kv']} | {r['kv_read_bytes']} | {r['splits']} | "
            f"{f'{t * 1e3:.3f} ms' if t else r['status']} | {num(r, 'kv_gbytes_per_s') or '-'} | {num(r, 'copy_gbytes_per_s') or '-'} | {f'{frac:.2f}' if frac else '-'} |"
        )
    big = [r for r in rs if r["dtype"] == "bf16" and (num(r, "kv_read_bytes") or 0) >= 2**30]
    ok = bool(big) and all(r["status"] == "ok" and (num(r, "copy_bw_frac") or 0) >= 0.7 for r in big)
    lines += ["", f"{verdict(ok)}: every bf16 row with a cache >= 1 GiB at >= 70% of the device copy bandwidth", ""]
    return lines


def table2(out: Path) -> list[str]:
    rs = rows(out / "rabe_staats_table2_gpu" / "runs.csv")
    lines = ["## Rabe-Staats Table 2 on the GPU (bf16, d 64, 8 GiB budget)", ""]
    if not rs:
        return lines + ["no rows", ""]
    lines += ["| variant | n | kv_chunk | status | overhead bytes | predicted | time s | max abs err |", "|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['variant']} | {r['seq_q']} | {r['kv_chunk']} | {r['status']} | {r['mem_overhead_bytes']} | {r['mem_predicted_bytes']} | {r['time_median_s']} | {r['max_abs_err']} |")
    rs_ok = any(r["variant"] == "rabe-staats" and r["seq_q"] == str(2**20) and r["status"] == "ok" for r in rs)
    naive = [r for r in rs if r["variant"] == "naive"]
    oom_ok = all((r["status"] == "oom") == (int(r["seq_q"]) >= 2**16) for r in naive) and bool(naive)
    lines += ["", f"{verdict(rs_ok)}: rabe-staats ok at n = 2^20", f"{verdict(oom_ok)}: naive oom exactly from n = 2^16", ""]
    return lines


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: gpu_acceptance.py OUT")
    out = Path(sys.argv[1])
    print("# Issue 8 acceptance (from the CSVs of this batch)\n")
    for part in (smoke, perf, decode, table2):
        print("\n".join(part(out)))


if __name__ == "__main__":
    main()

"""Shared pieces of the peer benchmarks: the cases of an attnbench config (from
`attnbench sweep --dry-run --json`, so a peer runs exactly the shapes attnbench expands), the
same stopping rule and statistics as attnbench's timer, and an f64 oracle on the same rows
attnbench checks. The rows and samples in attnbench's CSV formats are results.py's
(standard library only), re-exported here.

Only the Python standard library and NumPy are needed here; the peers import their
framework themselves.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import ResultsOut, base_record, fill_timing, peer_case_id, summary  # noqa: E402,F401 - used as common.*

# reference::ALL_ROWS_MAX_MACS: above this the oracle checks `error_rows` sampled rows.
ALL_ROWS_MAX_MACS = 1 << 28

REPO = Path(__file__).resolve().parents[2]


def attnbench_bin() -> str:
    """The attnbench binary: $ATTNBENCH_BIN if set, else this checkout's release build
    (`cargo build --release`), else `.gpu/attnbench` (the copy GPU.md's batch runs from, on a
    machine without a Rust toolchain)."""
    if os.environ.get("ATTNBENCH_BIN"):
        return os.environ["ATTNBENCH_BIN"]
    for exe in (REPO / "target" / "release" / "attnbench", REPO / ".gpu" / "attnbench"):
        if exe.exists():
            return str(exe)
    raise SystemExit("error: no attnbench binary: run `cargo build --release` (or set ATTNBENCH_BIN)")


def load_cases(config: str, sets: list[str]) -> tuple[dict, list[dict], dict]:
    """(resolved config, cases, columns) exactly as `attnbench sweep` expands them; the
    columns of runs.csv and samples.csv are what `ResultsOut` writes."""
    cmd = [attnbench_bin(), "sweep", "--config", config, "--dry-run", "--json"]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(res.stderr.strip() or f"error: {' '.join(cmd)} failed")
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    return lines[0]["config"], lines[1:], lines[0]["columns"]


def peer_cases(cases: list[dict], variants: list[str]) -> list[tuple[str, dict]]:
    """One (peer variant, case) per distinct problem of the config: attnbench's variant and
    chunk axes are dropped (a peer has its own), everything else is kept, in config order."""
    seen = set()
    out = []
    for c in cases:
        parts = c["case_id"].split("|")
        key = "|".join(parts[1:7] + parts[8:])
        if key in seen:
            continue
        seen.add(key)
        for v in variants:
            out.append((v, c))
    return out


def stop_rule(run: dict) -> dict:
    rule = {k: run[k] for k in ("warmup", "min_reps", "max_reps", "min_time_s", "max_time_s", "rel_spread")}
    rule["warmup_s"] = run.get("warmup_s", 0.0)  # configs resolved before it existed lack it
    return rule


def time_repetitions(call, rule: dict) -> tuple[list[float], str]:
    """attnbench's rule (src/measure/timer.rs): warm-up, `warmup` calls and at least
    `warmup_s` seconds (stopping once it alone exceeds max_time_s), then timed calls until
    max_reps, the max_time_s cap (which wins over min_reps), or min_reps and min_time_s
    with MAD/median < rel_spread. `call` must return
    only when its work is done (synchronize inside it). When `call` returns a float, that is
    its time in seconds (a GPU peer's CUDA-event time) instead of the wall clock."""
    t0 = time.perf_counter()
    calls = 0
    while calls < rule["warmup"] or time.perf_counter() - t0 < rule["warmup_s"]:
        call()
        calls += 1
        if time.perf_counter() - t0 > rule["max_time_s"]:
            break
    max_reps = max(1, rule["max_reps"])
    samples: list[float] = []
    total = 0.0
    while True:
        t = time.perf_counter()
        r = call()
        dt = r if isinstance(r, float) else time.perf_counter() - t
        samples.append(dt)
        total += dt
        reps = len(samples)
        if reps >= max_reps:
            return samples, "max_reps"
        if total >= rule["max_time_s"]:
            return samples, "time_cap"
        if reps >= rule["min_reps"] and total >= rule["min_time_s"]:
            sm = summary(samples)
            spread = 0.0 if sm["median"] == 0 else sm["mad"] / abs(sm["median"])
            if spread < rule["rel_spread"]:
                return samples, "converged"


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """f32 values rounded to the storage dtype (round to nearest even), as f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        b = x.view(np.uint32).astype(np.uint64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.astype(np.uint32).view(np.float32)
    raise SystemExit(f"error: unknown dtype {dtype}")


def make_inputs(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded Q, K, V ([b, h, n, d], f32 holding values of the storage dtype). NumPy's
    stream, not attnbench's ChaCha: the same distribution and shapes, not the same bits."""
    s = case["shape"]
    rng = np.random.default_rng(case["seed"])
    scale = case["input_scale"]

    def gen(shape, scaled):
        if case["input_dist"] == "normal":
            x = rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.random(shape, dtype=np.float32)
        return round_to(x * (scale if scaled else 1.0), case["dtype"])

    q = gen((s["batch"], s["heads"], s["seq_q"], s["head_dim"]), True)
    k = gen((s["batch"], s["kv_heads"], s["seq_kv"], s["head_dim"]), True)
    v = gen((s["batch"], s["kv_heads"], s["seq_kv"], s["head_dim"]), False)
    return q, k, v


def d_out_for(case: dict) -> np.ndarray:
    s = case["shape"]
    shape = (s["batch"], s["heads"], s["seq_q"], s["head_dim"])
    if case["d_out"] == "ones":
        return np.ones(shape, dtype=np.float32)
    return np.random.default_rng(~case["seed"] & 0xFFFFFFFFFFFFFFFF).standard_normal(shape, dtype=np.float32)


def rows_to_check(shape: dict, sample: int) -> list[tuple[int, int, int]]:
    """(batch, head, row) ids: all rows when cheap, else `sample` rows spread evenly."""
    total = shape["batch"] * shape["heads"] * shape["seq_q"]
    macs = 2 * total * shape["seq_kv"] * shape["head_dim"]
    if macs <= ALL_ROWS_MAX_MACS or sample >= total:
        picks = list(range(total))
    elif sample <= 1:
        picks = [total - 1]
    else:
        picks = sorted(set(i * (total - 1) // (sample - 1) for i in range(sample)))
    out = []
    for i in picks:
        bh, row = divmod(i, shape["seq_q"])
        out.append((bh // shape["heads"], bh % shape["heads"], row))
    return out


def visible_keys(shape: dict, causal: bool, row: int) -> int:
    """Bottom-right aligned causal mask, as attnbench's Shape::visible_keys."""
    if not causal:
        return shape["seq_kv"]
    return min(max(row + shape["seq_kv"] - shape["seq_q"] + 1, 0), shape["seq_kv"])


def _row_parts(q, k, v, shape, causal, b, h, row):
    group = shape["heads"] // shape["kv_heads"]
    n = visible_keys(shape, causal, row)
    kk = k[b, h // group, :n].astype(np.float64)
    vv = v[b, h // group, :n].astype(np.float64)
    s = kk @ q[b, h, row].astype(np.float64) / math.sqrt(shape["head_dim"])
    if n == 0:
        return kk, vv, np.zeros(0), np.zeros(shape["head_dim"])
    p = np.exp(s - s.max())
    p /= p.sum()
    return kk, vv, p, p @ vv


def output_error(q, k, v, out, case: dict, sample: int) -> dict:
    """max_abs_err, max_rel_err (normwise: over the largest |exact|), err_rows, and the
    count of non-finite values, on attnbench's rows."""
    shape = case["shape"]
    rows = rows_to_check(shape, sample)
    max_abs, max_exact, bad = 0.0, 0.0, 0
    for b, h, r in rows:
        exact = _row_parts(q, k, v, shape, case["causal"], b, h, r)[3]
        got = np.asarray(out[b, h, r], dtype=np.float64)
        bad += int((~np.isfinite(got)).sum())
        diff = np.abs(got - exact)
        max_abs = max(max_abs, float(np.where(np.isfinite(diff), diff, 0).max(initial=0.0)))
        max_exact = max(max_exact, float(np.abs(exact).max(initial=0.0)))
    return {
        "max_abs_err": max_abs,
        "max_rel_err": max_abs / max_exact if max_exact > 0 else 0.0,
        "err_rows": len(rows),
        "non_finite": bad,
    }


def dq_error(q, k, v, d_out, dq, case: dict, sample: int) -> dict:
    """Error of dQ on attnbench's sampled rows against the f64 oracle (scope `dq`)."""
    shape = case["shape"]
    scale = 1.0 / math.sqrt(shape["head_dim"])
    rows = rows_to_check(shape, sample)
    max_abs, max_exact, bad = 0.0, 0.0, 0
    for b, h, r in rows:
        kk, vv, p, o = _row_parts(q, k, v, shape, case["causal"], b, h, r)
        go = d_out[b, h, r].astype(np.float64)
        ds = p * (vv @ go - go @ o)
        exact = scale * (ds @ kk) if len(p) else np.zeros(shape["head_dim"])
        got = np.asarray(dq[b, h, r], dtype=np.float64)
        bad += int((~np.isfinite(got)).sum())
        diff = np.abs(got - exact)
        max_abs = max(max_abs, float(np.where(np.isfinite(diff), diff, 0).max(initial=0.0)))
        max_exact = max(max_exact, float(np.abs(exact).max(initial=0.0)))
    return {
        "grad_max_abs_err": max_abs,
        "grad_max_rel_err": max_abs / max_exact if max_exact > 0 else 0.0,
        "grad_err_rows": len(rows),
        "grad_err_scope": "dq",
        "non_finite": bad,
    }


def progress(i: int, n: int, rec: dict) -> None:
    g = rec.get("gflops")
    what = f"{g:.1f} GFLOP/s" if isinstance(g, float) else rec["status"] + (f" ({rec['reason']})" if rec["reason"] else "")
    print(f"[{i}/{n}] {rec['case_id']}: {what}", flush=True)

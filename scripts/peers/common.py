"""Shared pieces of the peer benchmarks: the cases of an attnbench config (from
`attnbench sweep --dry-run --json`, so a peer runs exactly the shapes attnbench expands), the
same stopping rule and statistics as attnbench's timer, an f64 oracle on the same rows
attnbench checks, and rows in attnbench's CSV schema (appended and flushed one at a time).

Only the Python standard library and NumPy are needed here; the peers import their
framework themselves.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np

# runs.csv columns, in order (src/report/record.rs; tests/peers.rs checks the two agree).
HEADER = [
    "run",
    "case_id",
    "variant",
    "device",
    "dtype",
    "mode",
    "batch",
    "heads",
    "kv_heads",
    "seq_q",
    "seq_kv",
    "head_dim",
    "q_chunk",
    "kv_chunk",
    "causal",
    "window",
    "devices",
    "threads",
    "status",
    "reason",
    "reps",
    "time_median_s",
    "time_min_s",
    "time_max_s",
    "time_mad_s",
    "mem_overhead_bytes",
    "mem_predicted_bytes",
    "peak_rss_bytes",
    "io_bytes",
    "max_abs_err",
    "max_rel_err",
    "err_rows",
    "flops",
    "gflops",
    "comm_bytes",
    "comm_steps",
    "seed",
    "input_dist",
    "input_scale",
    "stopped_by",
    "time_bwd_median_s",
    "grad_max_abs_err",
    "grad_max_rel_err",
    "grad_err_rows",
    "grad_err_scope",
    "d_out",
    "extrapolated",
    "timed_rows",
    "diff_variant",
    "max_abs_diff",
    "splits",
    "allreduce",
    "kv_read_bytes",
    "kv_gbytes_per_s",
    "copy_gbytes_per_s",
    "copy_bw_frac",
    "comm_elements",
    "comm_max_device_bytes",
    "device_peak_elements",
    "device_peak_bytes",
    "device_pairs_max",
    "critical_path_pairs",
    "comm_time_s",
    "comm_time_min_s",
    "sim_comm_bytes",
    "sim_comm_max_device_bytes",
    "probe_gflops",
]

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


def load_cases(config: str, sets: list[str]) -> tuple[dict, list[dict]]:
    """(resolved config, cases) exactly as `attnbench sweep` expands them."""
    cmd = [attnbench_bin(), "sweep", "--config", config, "--dry-run", "--json"]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(res.stderr.strip() or f"error: {' '.join(cmd)} failed")
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    return lines[0]["config"], lines[1:]


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


def peer_case_id(case_id: str, variant: str, q_chunk=None, kv_chunk=None, device=None) -> str:
    """attnbench's case_id with the peer's variant and chunks (`-` when it does not chunk),
    and the device it ran on when that differs from the case's."""
    parts = case_id.split("|")
    parts[0] = variant
    if device is not None:
        parts[2] = device
    qc = "-" if q_chunk is None else str(q_chunk)
    kc = "-" if kv_chunk is None else str(kv_chunk)
    parts[7] = f"qc{qc}kc{kc}"
    return "|".join(parts)


def stop_rule(run: dict) -> dict:
    rule = {k: run[k] for k in ("warmup", "min_reps", "max_reps", "min_time_s", "max_time_s", "rel_spread")}
    rule["warmup_s"] = run.get("warmup_s", 0.0)  # configs resolved before it existed lack it
    return rule


def summary(samples: list[float]) -> dict:
    """Median (mean of the middle two for an even count), min, max, unscaled MAD."""
    s = sorted(samples)
    n = len(s)

    def med(x):
        return x[n // 2] if n % 2 else 0.5 * (x[n // 2 - 1] + x[n // 2])

    m = med(s)
    dev = sorted(abs(x - m) for x in s)
    return {"reps": n, "median": m, "min": s[0], "max": s[-1], "mad": med(dev)}


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


def base_record(run: dict, entry: dict, variant: str, q_chunk=None, kv_chunk=None, device=None) -> dict:
    """A row for `entry` (one line of the dry-run JSON) run by peer `variant` (on `device`
    when given, else on the case's)."""
    c = entry["case"]
    s = c["shape"]
    rec = {h: "" for h in HEADER}
    # Peers time every case in full (attnbench's CSV reads this column as a boolean).
    rec["extrapolated"] = "false"
    rec.update(
        run=run["name"],
        case_id=peer_case_id(entry["case_id"], variant, q_chunk, kv_chunk, device),
        variant=variant,
        device=device or c["device"],
        dtype=c["dtype"],
        mode=c["mode"],
        batch=s["batch"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        seq_q=s["seq_q"],
        seq_kv=s["seq_kv"],
        head_dim=s["head_dim"],
        q_chunk="" if q_chunk is None else q_chunk,
        kv_chunk="" if kv_chunk is None else kv_chunk,
        causal=c["causal"],
        window="" if c["window"] is None else c["window"],
        devices=c["devices"],
        threads=c["threads"],
        status="ok",
        reps=0,
        io_bytes=entry["io_bytes"],
        flops=entry["flops"],
        seed=c["seed"],
        input_dist=c["input_dist"],
        input_scale=c["input_scale"],
        d_out=c["d_out"] if c["mode"] == "fwd+bwd" else "",
    )
    return rec


def fill_timing(rec: dict, samples: list[float], stopped_by: str, flops: float) -> None:
    sm = summary(samples)
    rec.update(
        reps=sm["reps"],
        time_median_s=sm["median"],
        time_min_s=sm["min"],
        time_max_s=sm["max"],
        time_mad_s=sm["mad"],
        gflops=flops / sm["median"] / 1e9 if sm["median"] > 0 else "",
        stopped_by=stopped_by,
    )


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest round trip, "1.0" style like attnbench's writer
    return str(v)


class CsvOut:
    """Appends rows to DIR/runs.csv (creating it with the header), flushing each row. An
    existing file must have attnbench's header; nothing in it is ever rewritten."""

    def __init__(self, out_dir: str):
        self.path = Path(out_dir) / "runs.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists:
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), [])
            if header != HEADER:
                raise SystemExit(f"error: {self.path} does not have attnbench's runs.csv header")
        self.f = open(self.path, "a", newline="")
        self.w = csv.writer(self.f, lineterminator="\n")
        if not exists:
            self.w.writerow(HEADER)
            self.f.flush()

    def done_ids(self) -> set[str]:
        with open(self.path, newline="") as f:
            return {r["case_id"] for r in csv.DictReader(f)}

    def write(self, rec: dict) -> None:
        self.w.writerow([_text(rec[h]) for h in HEADER])
        self.f.flush()
        os.fsync(self.f.fileno())


def progress(i: int, n: int, rec: dict) -> None:
    g = rec.get("gflops")
    what = f"{g:.1f} GFLOP/s" if isinstance(g, float) else rec["status"] + (f" ({rec['reason']})" if rec["reason"] else "")
    print(f"[{i}/{n}] {rec['case_id']}: {what}", flush=True)

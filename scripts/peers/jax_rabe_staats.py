#!/usr/bin/env python3
"""The JAX reference implementation of Rabe & Staats (seed 001, Figure 1), typed in from the
paper, as the peer `jax-rabe-staats` of attnbench's `rabe-staats`.

Reads an attnbench config, runs every distinct problem of it (attnbench's variant and chunk
axes dropped) with the paper's defaults (query_chunk_size 1024, key_chunk_size 4096, each
clamped to n as the code does), jitted, timed by attnbench's rule (warm-up, repetitions
until convergence or the cap, median), and appends rows in attnbench's CSV schema to
DIR/runs.csv and each timed case's repetitions to DIR/samples.csv.

    python scripts/peers/jax_rabe_staats.py --config configs/cpu_perf.toml --out results/cpu_perf

Semantics: inputs are stored in the case's dtype and cast to f32 inside the jitted call
(compute f32 with Precision.HIGHEST, output f32, as attnbench and the paper's notebook).
Figure 1 has no mask, so causal cases are `skipped` rows; GQA/MQA key/value heads are
repeated to the query heads before the call (Figure 1 is multi-head only); a batch is a
`jax.vmap` over the code. `fwd+bwd` is `jax.vjp` of the same function (one jitted call;
the backward alone is not timed separately). Threads: XLA sizes its pool once per process,
so each thread count runs in a child process pinned to that many cores (and
`--xla_cpu_multi_thread_eigen=false` for one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

VARIANT = "jax-rabe-staats"
QUERY_CHUNK, KEY_CHUNK = 1024, 4096


def figure1():
    """Figure 1 of the paper, line for line (the paper's line 48 calls `lax.dynamic_slice`
    without importing `lax`; it is `jax.lax` here)."""
    import functools
    import math

    import jax
    from jax import numpy as jnp

    def _query_chunk_attention(query, key, value, precision, key_chunk_size=4096):
        """Multi-head dot product attention with a limited number of queries."""
        num_kv, num_heads, k_features = key.shape
        v_features = value.shape[-1]
        key_chunk_size = min(key_chunk_size, num_kv)
        query = query / jnp.sqrt(k_features)

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def summarize_chunk(query, key, value):
            attn_weights = jnp.einsum("qhd,khd->qhk", query, key, precision=precision)
            max_score = jnp.max(attn_weights, axis=-1, keepdims=True)
            max_score = jax.lax.stop_gradient(max_score)
            exp_weights = jnp.exp(attn_weights - max_score)
            exp_values = jnp.einsum("vhf,qhv->qhf", value, exp_weights, precision=precision)
            return (exp_values, exp_weights.sum(axis=-1), max_score.reshape((query.shape[0], num_heads)))

        def chunk_scanner(chunk_idx):
            key_chunk = jax.lax.dynamic_slice(key, (chunk_idx, 0, 0), slice_sizes=(key_chunk_size, num_heads, k_features))
            value_chunk = jax.lax.dynamic_slice(value, (chunk_idx, 0, 0), slice_sizes=(key_chunk_size, num_heads, v_features))
            return summarize_chunk(query, key_chunk, value_chunk)

        chunk_values, chunk_weights, chunk_max = jax.lax.map(chunk_scanner, xs=jnp.arange(0, num_kv, key_chunk_size))

        global_max = jnp.max(chunk_max, axis=0, keepdims=True)
        max_diffs = jnp.exp(chunk_max - global_max)
        chunk_values *= jnp.expand_dims(max_diffs, axis=-1)
        chunk_weights *= max_diffs

        all_values = chunk_values.sum(axis=0)
        all_weights = jnp.expand_dims(chunk_weights, -1).sum(axis=0)
        return all_values / all_weights

    def attention(query, key, value, precision=jax.lax.Precision.HIGHEST, query_chunk_size=1024):
        """Memory-efficient multi-head dot product attention."""
        num_q, num_heads, q_features = query.shape

        def chunk_scanner(chunk_idx, _):
            query_chunk = jax.lax.dynamic_slice(query, (chunk_idx, 0, 0), slice_sizes=(min(query_chunk_size, num_q), num_heads, q_features))
            return (chunk_idx + query_chunk_size, _query_chunk_attention(query_chunk, key, value, precision=precision))

        _, res = jax.lax.scan(chunk_scanner, init=0, xs=None, length=math.ceil(num_q / query_chunk_size))
        return res.reshape(num_q, num_heads, value.shape[-1])

    return attention


def run_cases(args, todo: list[dict], run: dict, columns: dict) -> None:
    """Child process: every case of one thread count."""
    import jax
    import numpy as np
    from jax import numpy as jnp

    jax.config.update("jax_platforms", "cpu")
    attention = figure1()
    rule = common.stop_rule(run)
    out = common.ResultsOut(args.out, columns)
    jdt = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}

    def batched(q, k, v):
        # [b, h, n, d] storage dtype -> Figure 1's [n, h, d] per batch, f32 compute.
        f = lambda a: jnp.swapaxes(a.astype(jnp.float32), 0, 1)  # noqa: E731
        o = jax.vmap(lambda a, b, c: attention(f(a), f(b), f(c)))(q, k, v)
        return jnp.swapaxes(o, 1, 2)

    for item in todo:
        entry, rec, index, total = item["entry"], item["rec"], item["index"], item["total"]
        c = entry["case"]
        s = c["shape"]
        qn, kn, vn = common.make_inputs(c)
        group = s["heads"] // s["kv_heads"]
        kr, vr = (np.repeat(x, group, axis=1) for x in (kn, vn))
        q, k, v = (jnp.asarray(x, dtype=jdt[c["dtype"]]) for x in (qn, kr, vr))
        if c["mode"] == "fwd+bwd":
            d_out = jnp.asarray(common.d_out_for(c))

            @jax.jit
            def fn(q, k, v):
                o, vjp = jax.vjp(batched, q, k, v)
                return o, vjp(d_out)

        else:
            fn = jax.jit(batched)
        result = {}

        def call():
            result["r"] = jax.block_until_ready(fn(q, k, v))

        try:
            samples, stopped = common.time_repetitions(call, rule)
        except Exception as e:  # noqa: BLE001 - any XLA failure is a row, not a crash
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            rec.update(status="oom" if "RESOURCE_EXHAUSTED" in msg else "error", reason=f"jax: {msg}"[:300])
            out.write(rec)
            common.progress(index, total, rec)
            continue
        common.fill_timing(rec, samples, stopped, entry["flops"])
        r = result["r"]
        o = np.asarray(r[0] if c["mode"] == "fwd+bwd" else r, dtype=np.float32)
        err = common.output_error(qn, kn, vn, o, c, run["error_rows"])
        rec.update({k: err[k] for k in ("max_abs_err", "max_rel_err", "err_rows")})
        if err["non_finite"]:
            rec.update(status="error", reason=f"{err['non_finite']} of the checked output values are NaN or infinite")
        if c["mode"] == "fwd+bwd":
            dq = np.asarray(r[1][0], dtype=np.float32)
            g = common.dq_error(qn, kn, vn, common.d_out_for(c), dq, c, run["error_rows"])
            rec.update({k: g[k] for k in ("grad_max_abs_err", "grad_max_rel_err", "grad_err_rows", "grad_err_scope")})
        out.write(rec, samples)
        common.progress(index, total, rec)
        del q, k, v, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="attnbench config (TOML)")
    ap.add_argument("--out", help="results directory [default: results/<run name>]")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="as attnbench sweep --set")
    ap.add_argument("--resume", action="store_true", help="skip cases already in DIR/runs.csv")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        job = json.loads(Path(args.child).read_text())
        args.out = job["out"]
        run_cases(args, job["todo"], job["run"], job["columns"])
        return

    config, cases, columns = common.load_cases(args.config, args.sets)
    run = config["run"]
    args.out = args.out or f"results/{run['name']}"
    out = common.ResultsOut(args.out, columns)
    done = out.done_ids() if args.resume else set()
    todo = common.peer_cases(cases, [VARIANT])
    by_threads: dict[int, list[dict]] = {}
    for i, (_, entry) in enumerate(todo, 1):
        c = entry["case"]
        s = c["shape"]
        rec = common.base_record(run, entry, VARIANT, min(QUERY_CHUNK, s["seq_q"]), min(KEY_CHUNK, s["seq_kv"]))
        if rec["case_id"] in done:
            continue
        reason = None
        if c["mode"] not in ("fwd", "fwd+bwd"):
            reason = f"mode {c['mode']} is not measured for {VARIANT}"
        elif c["causal"]:
            reason = "Figure 1 of Rabe & Staats has no mask (causal cases are not run)"
        elif c["window"] is not None or c["devices"] != 1 or c["device"] != "cpu":
            reason = "only single-device CPU cases without windows are measured for the JAX peer"
        if reason:
            rec.update(status="skipped", reason=reason)
            out.write(rec)
            common.progress(i, len(todo), rec)
            continue
        by_threads.setdefault(c["threads"], []).append({"entry": entry, "rec": rec, "index": i, "total": len(todo)})
    out.close()

    ncpu = len(os.sched_getaffinity(0))
    for threads, items in sorted(by_threads.items()):
        job = Path(args.out) / f".jax_job_t{threads}.json"
        job.write_text(json.dumps({"out": args.out, "run": run, "columns": columns, "todo": items}))
        env = dict(os.environ)
        flags = env.get("XLA_FLAGS", "")
        if threads == 1:
            flags += " --xla_cpu_multi_thread_eigen=false"
        env["XLA_FLAGS"] = flags.strip()
        cores = sorted(os.sched_getaffinity(0))[: min(threads, ncpu)]
        # XLA sizes its thread pool from the cores the process may run on.
        child = [sys.executable, __file__, "--config", args.config, "--child", str(job)]
        rc = subprocess.run(child, env=env, preexec_fn=lambda c=cores: os.sched_setaffinity(0, c)).returncode
        job.unlink(missing_ok=True)
        if rc != 0:
            raise SystemExit(f"error: the JAX child for {threads} threads exited with {rc}")


if __name__ == "__main__":
    main()

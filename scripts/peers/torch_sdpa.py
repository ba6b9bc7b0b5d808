#!/usr/bin/env python3
"""PyTorch `scaled_dot_product_attention` as a peer of attnbench's variants.

Reads an attnbench config, runs every distinct problem of it (attnbench's variant and chunk
axes dropped) with SDPA's flash backend (`torch-sdpa-flash`), memory-efficient backend
(`torch-sdpa-efficient`, CUDA only) and math backend (`torch-sdpa-math`), pinned with
`torch.nn.attention.sdpa_kernel`, timed by attnbench's rule (warm-up, repetitions until
convergence or the cap, median), and appends rows in attnbench's CSV schema to
DIR/runs.csv and each timed case's repetitions to DIR/samples.csv, so `attnbench report`
and `compare` treat them like its own.

    python scripts/peers/torch_sdpa.py --config configs/cpu_perf.toml --out results/cpu_perf
    python scripts/peers/torch_sdpa.py --device cuda --config configs/gpu_perf.toml --out OUT/gpu_perf

On `--device cuda` each call is timed with CUDA events (the GPU time between two events
around the SDPA call, as attnbench's CUDA backend times its kernels), the L2 cache is
flushed before each call when the config says `[run] cold = true`, `[run] tf32` sets
PyTorch's TF32 switches for f32, and the memory overhead is measured: the caching
allocator's peak during one untimed call beyond what was allocated before it and the
output (`torch.cuda.max_memory_allocated`).

Modes: `fwd`, and `fwd+bwd` (out = SDPA(q, k, v); out.backward(dO); `time_bwd_median_s` is
the backward alone within the same calls; dQ checked on attnbench's sampled rows). Inputs:
NumPy's seeded stream rounded to the storage dtype (the same distribution and shapes as
attnbench's, not the same bits); the output stays in the storage dtype, as SDPA returns it.
Threads: `torch.set_num_threads(threads)` per case (CPU). Not measured on the CPU: memory
(empty columns).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

VARIANTS = {
    "torch-sdpa-flash": "FLASH_ATTENTION",
    "torch-sdpa-efficient": "EFFICIENT_ATTENTION",
    "torch-sdpa-math": "MATH",
}
# The defaults per device (the efficient backend is a CUDA kernel).
DEFAULT_VARIANTS = {
    "cpu": "torch-sdpa-flash,torch-sdpa-math",
    "cuda": "torch-sdpa-flash,torch-sdpa-efficient,torch-sdpa-math",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="attnbench config (TOML)")
    ap.add_argument("--out", help="results directory [default: results/<run name>]")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="as attnbench sweep --set")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where every case runs (the config's device axis is replaced)")
    ap.add_argument("--variants", help="comma-separated subset of " + ", ".join(VARIANTS) + " [default: flash and math on cpu, all three on cuda]")
    ap.add_argument("--resume", action="store_true", help="skip cases already in DIR/runs.csv")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config, cases, columns = common.load_cases(args.config, args.sets)
    run = config["run"]
    rule = common.stop_rule(run)
    out = common.ResultsOut(args.out or f"results/{run['name']}", columns)
    done = out.done_ids() if args.resume else set()
    variants = [v for v in (args.variants or DEFAULT_VARIANTS[args.device]).split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"error: unknown variant {v} (expected one of {', '.join(VARIANTS)})")
    dev = torch.device(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    todo = common.peer_cases(cases, variants)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    cuda = dev.type == "cuda"
    flush = None
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = bool(run.get("tf32", False))
        torch.backends.cudnn.allow_tf32 = bool(run.get("tf32", False))
        if run.get("cold", False):
            l2 = torch.cuda.get_device_properties(dev).L2_cache_size
            flush = torch.empty(2 * max(l2, 1 << 20), dtype=torch.uint8, device=dev)

    # The backends of one shape come one after another: their inputs are drawn once (the
    # draw costs more than the timing at the large shapes).
    inputs_key, inputs = None, None
    for i, (variant, entry) in enumerate(todo, 1):
        c = entry["case"]
        s = c["shape"]
        rec = common.base_record(run, entry, variant, device=args.device)
        if rec["case_id"] in done:
            continue
        reason = None
        if c["mode"] not in ("fwd", "fwd+bwd"):
            reason = f"mode {c['mode']} is not measured for {variant}"
        elif c["window"] is not None or c["devices"] != 1:
            reason = "sliding windows and several devices are not measured for the peers"
        elif c["causal"] and s["seq_q"] != s["seq_kv"]:
            reason = "SDPA's is_causal is top-left aligned; attnbench's mask is bottom-right"
        if reason:
            rec.update(status="skipped", reason=reason)
            out.write(rec)
            common.progress(i, len(todo), rec)
            continue

        if dev.type == "cpu":
            torch.set_num_threads(c["threads"])
        key = (tuple(sorted(s.items())), c["dtype"], c["input_dist"], c["input_scale"], c["seed"])
        if key != inputs_key:
            inputs = qn = kn = vn = None  # the old arrays go before the new ones are drawn
            inputs_key, inputs = key, common.make_inputs(c)
        qn, kn, vn = inputs
        dt = tdtype[c["dtype"]]
        train = c["mode"] == "fwd+bwd"
        q, k, v = (torch.from_numpy(x).to(dev, dt).requires_grad_(train) for x in (qn, kn, vn))
        gqa = s["kv_heads"] != s["heads"]
        backend = getattr(SDPBackend, VARIANTS[variant])
        go = torch.from_numpy(common.d_out_for(c)).to(dev, dt) if train else None
        bwd_times: list[float] = []
        result = {}

        def call():
            if flush is not None:
                flush.add_(1)  # a write of twice the L2 size evicts the previous call's lines
            if cuda:
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record()
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa)
                if train:
                    for t in (q, k, v):
                        t.grad = None
                    if cuda:
                        ev[1].record()
                    else:
                        sync()
                        t0 = time.perf_counter()
                    o.backward(go)
                    if not cuda:
                        bwd_times.append(time.perf_counter() - t0)
            result["o"] = o
            if cuda:
                ev[2].record()
                ev[2].synchronize()
                if train:
                    bwd_times.append(ev[1].elapsed_time(ev[2]) / 1e3)
                return ev[0].elapsed_time(ev[2]) / 1e3
            return None

        try:
            samples, stopped = common.time_repetitions(call, rule)
        except RuntimeError as e:  # e.g. no kernel of this backend for these inputs
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            rec.update(status="error", reason=f"torch: {msg}"[:300])
            out.write(rec)
            common.progress(i, len(todo), rec)
            continue
        common.fill_timing(rec, samples, stopped, entry["flops"])
        if cuda and not train:
            # One untimed call under the caching allocator's peak counter: what it allocates
            # beyond what is live (inputs) and its output, as attnbench's overhead.
            del result["o"]
            sync()
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
            with sdpa_kernel(backend):
                o_probe = F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa)
            sync()
            out_bytes = o_probe.numel() * o_probe.element_size()
            rec["mem_overhead_bytes"] = max(0, torch.cuda.max_memory_allocated(dev) - before - out_bytes)
            result["o"] = o_probe
        if train:
            timed = bwd_times[len(bwd_times) - len(samples):]
            rec["time_bwd_median_s"] = common.summary(timed)["median"]
        o = result["o"].detach().float().cpu().numpy()
        err = common.output_error(qn, kn, vn, o, c, run["error_rows"])
        rec.update({k: err[k] for k in ("max_abs_err", "max_rel_err", "err_rows")})
        if err["non_finite"]:
            rec.update(status="error", reason=f"{err['non_finite']} of the checked output values are NaN or infinite")
        if train:
            dq = q.grad.detach().float().cpu().numpy()
            # The oracle gets dO as the backward saw it (rounded to the storage dtype).
            d_out = go.float().cpu().numpy()
            g = common.dq_error(qn, kn, vn, d_out, dq, c, run["error_rows"])
            rec.update({k: g[k] for k in ("grad_max_abs_err", "grad_max_rel_err", "grad_err_rows", "grad_err_scope")})
        out.write(rec, samples)
        common.progress(i, len(todo), rec)
        del q, k, v, go, result


if __name__ == "__main__":
    main()

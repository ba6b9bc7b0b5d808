#!/usr/bin/env python3
"""Combines several complete passes of the cpu_perf measurement (each a directory with
runs.csv, samples.csv and meta.json, ours and the peers' rows alike) into one: for every
case (every implementation the same way) the row of the pass whose median time is the median
over the passes, with that pass's samples. Why: on a shared 2-core VM the host takes a core away for minutes at a time, so
one pass can time a 2-thread case on one core; the median over an odd number of passes
discards such a pass for each case. The calibrated peaks are the best over the passes
(each is already the best of a few runs: a peak is an upper estimate).

Writes DIR/runs.csv, DIR/samples.csv, DIR/meta.json (the first pass's, with the combined
calibration and a `passes` list) and DIR/passes.csv (every pass's median of every case, and
each pass's machine-speed probe of it, and which pass was kept).

    python3 scripts/cpu_perf_combine.py results/cpu_perf results/cpu_perf/pass-1 results/cpu_perf/pass-2 ...
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


# The calibration's rates (best of a few runs each), combined as the best over the passes.
RATES = ("sgemm_gflops", "copy_gbytes_per_s", "fma_peak_gflops", "bf16_peak_gflops")


def read_csv(path: Path):
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return r.fieldnames or [], list(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory to write the combined files into")
    ap.add_argument("passes", type=Path, nargs="+", help="pass directories, in the order run")
    a = ap.parse_args()

    runs, samples, metas = [], [], []
    header = sample_header = None
    for p in a.passes:
        h, rows = read_csv(p / "runs.csv")
        header = header or h
        if h != header:
            raise SystemExit(f"{p}/runs.csv: columns differ from {a.passes[0]}/runs.csv")
        runs.append({r["case_id"]: r for r in rows})
        sh, srows = read_csv(p / "samples.csv")
        sample_header = sample_header or sh
        by_case = {}
        for s in srows:
            by_case.setdefault(s["case_id"], []).append(s)
        samples.append(by_case)
        metas.append(json.loads((p / "meta.json").read_text()))

    # Cases in the first pass's order, then any that only later passes have.
    order = list(runs[0])
    for r in runs[1:]:
        order += [c for c in r if c not in runs[0]]
    seen = set()
    order = [c for c in order if not (c in seen or seen.add(c))]

    kept_rows, kept_samples, table = [], [], []
    for case in order:
        ok = [
            (float(r[case]["time_median_s"]), i)
            for i, r in enumerate(runs)
            if case in r and r[case]["status"] == "ok" and r[case]["time_median_s"]
        ]
        if ok:
            ok.sort()
            chosen = ok[(len(ok) - 1) // 2][1]  # the median (the lower one of an even count)
        else:
            chosen = next(i for i, r in enumerate(runs) if case in r)
        kept_rows.append(runs[chosen][case])
        kept_samples += samples[chosen].get(case, [])
        times = [r[case]["time_median_s"] if case in r else "" for r in runs]
        # The machine-speed probe of each pass (empty for peers and runs without it).
        probe = [r[case].get("probe_gflops") or "" if case in r else "" for r in runs]
        table.append([case] + times + probe + [chosen + 1])

    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        w.writeheader()
        w.writerows(kept_rows)
    with open(a.out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sample_header, lineterminator="\n")
        w.writeheader()
        w.writerows(kept_samples)
    with open(a.out / "passes.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(
            ["case_id"]
            + [f"pass{i + 1}_median_s" for i in range(len(runs))]
            + [f"pass{i + 1}_probe_gflops" for i in range(len(runs))]
            + ["kept_pass"]
        )
        w.writerows(table)

    # A calibrated rate is the best of its runs (an upper estimate of the sustained rate);
    # over several passes it is the best of all their runs. A pass whose two-thread peak
    # ran while the host held one core back would otherwise halve the peak.
    meta = dict(metas[0])
    calib = []
    for c in metas[0].get("calibration", []):
        same = [x for m in metas for x in m.get("calibration", []) if x["threads"] == c["threads"]]
        merged = dict(c)
        for k in RATES:
            vals = [x[k] for x in same if isinstance(x.get(k), (int, float))]
            if vals:
                merged[k] = max(vals)
        calib.append(merged)
    meta["calibration"] = calib
    meta["passes"] = [
        {
            "dir": str(p),
            "git_revision": m.get("git_revision"),
            "git_dirty": m.get("git_dirty"),
            "started_unix_s": m.get("started_unix_s"),
            "calibration": m.get("calibration"),
        }
        for p, m in zip(a.passes, metas)
    ]
    (a.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(kept_rows)} cases from {len(runs)} passes -> {a.out}/runs.csv, passes.csv")


if __name__ == "__main__":
    main()

"""What a peer writes into an attnbench results directory, in attnbench's formats: the
`runs.csv` row of a case (attnbench's columns, in order) and the seconds of its timed
repetitions in `samples.csv` (`case_id,rep,time_s`, as src/results/samples.rs), so that
`attnbench report` and `compare` read peer cases like attnbench's own: `compare` judges a
case's time from its samples and calls it `unclear` without them.

The same semantics as attnbench's sweep (src/commands/sweep.rs, src/results/runs.rs):
- both files are appended to, never rewritten; a file is created with its header, and an
  existing one with another header is refused before anything is written;
- a case's samples are written and flushed before its `runs.csv` row, so a crash between
  the two leaves samples without a row: the case runs again on `--resume`, and its new
  samples (from `rep` 0 again) replace those when read;
- only an `ok` row has samples: skipped, failed and oom rows have none.

Standard library only (no NumPy), so it runs wherever Python does, CI included.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

# The columns of runs.csv and samples.csv, in order, are attnbench's: the first line of
# `attnbench sweep --dry-run --json` carries them ("columns"), and `ResultsOut` takes them
# from there, so no copy is kept here.

RUNS_NAME = "runs.csv"
SAMPLES_NAME = "samples.csv"


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


def summary(samples: list[float]) -> dict:
    """Median (mean of the middle two for an even count), min, max, unscaled MAD."""
    s = sorted(samples)
    n = len(s)

    def med(x):
        return x[n // 2] if n % 2 else 0.5 * (x[n // 2 - 1] + x[n // 2])

    m = med(s)
    dev = sorted(abs(x - m) for x in s)
    return {"reps": n, "median": m, "min": s[0], "max": s[-1], "mad": med(dev)}


def base_record(run: dict, entry: dict, variant: str, q_chunk=None, kv_chunk=None, device=None) -> dict:
    """A row for `entry` (one line of the dry-run JSON) run by peer `variant` (on `device`
    when given, else on the case's)."""
    c = entry["case"]
    s = c["shape"]
    # Peers time every case in full (attnbench's CSV reads this column as a boolean); the
    # columns not set here are written empty.
    rec = {"extrapolated": "false"}
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
    """The row's timing columns from its samples (the same samples go to samples.csv:
    `compare` checks that their count is `reps` and their median `time_median_s`)."""
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


def _check_header(path: Path, want: list[str]) -> bool:
    """Whether `path` holds rows already (is non-empty); refuses a header other than `want`,
    as attnbench does (src/results/runs.rs)."""
    if not (path.exists() and path.stat().st_size > 0):
        return False
    with open(path, newline="") as f:
        found = next(csv.reader(f), [])
    if found != want:
        raise SystemExit(
            f"error: {path} has a different CSV header than attnbench writes; use a new --out "
            f"directory (found `{','.join(found)}`, expected `{','.join(want)}`)"
        )
    return True


class _Appender:
    """Appends rows to one CSV file, creating it with `header`; every `flush` reaches the
    disk (fsync) before it returns."""

    def __init__(self, path: Path, header: list[str], exists: bool):
        self.path = path
        self.f = open(path, "a", newline="")
        self.w = csv.writer(self.f, lineterminator="\n")
        if not exists:
            self.w.writerow(header)
            self.flush()

    def flush(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


class CsvOut:
    """Appends rows to DIR/runs.csv (creating it with the header), flushing each row. An
    existing file must have attnbench's header; nothing in it is ever rewritten."""

    def __init__(self, out_dir: str, header: list[str]):
        path = Path(out_dir) / RUNS_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out = _Appender(path, header, _check_header(path, header))
        self.header = header
        self.path = path

    def done_ids(self) -> set[str]:
        with open(self.path, newline="") as f:
            return {r["case_id"] for r in csv.DictReader(f)}

    def write(self, rec: dict) -> None:
        unknown = sorted(set(rec) - set(self.header))
        if unknown:
            raise ValueError(f"not columns of {RUNS_NAME}: {', '.join(unknown)}")
        self._out.w.writerow([_text(rec.get(h, "")) for h in self.header])
        self._out.flush()

    def close(self) -> None:
        self._out.close()


class SamplesOut:
    """Appends the timed repetitions of one case at a time to DIR/samples.csv (creating it
    with `case_id,rep,time_s`), flushing each case; an existing file must have that header."""

    def __init__(self, out_dir: str, header: list[str]):
        path = Path(out_dir) / SAMPLES_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out = _Appender(path, header, _check_header(path, header))
        self.path = path

    def write(self, case_id: str, samples: list[float]) -> None:
        """One row per sample, `rep` counting from 0 in call order."""
        for rep, t in enumerate(samples):
            t = float(t)
            if not (t >= 0.0 and t != float("inf")):
                raise ValueError(f"{case_id}: repetition {rep} took {t} s: not a time")
            self._out.w.writerow([case_id, rep, _text(t)])
        self._out.flush()

    def close(self) -> None:
        self._out.close()


class ResultsOut:
    """A peer's writer into a results directory: DIR/runs.csv and DIR/samples.csv. Both
    headers are checked before either file is created or appended to."""

    def __init__(self, out_dir: str, columns: dict):
        """`columns`: the "columns" of the dry-run's first line ({"runs.csv": [...],
        "samples.csv": [...]})."""
        out = Path(out_dir)
        for name in (RUNS_NAME, SAMPLES_NAME):
            _check_header(out / name, columns[name])
        self.runs = CsvOut(out_dir, columns[RUNS_NAME])
        self.samples = SamplesOut(out_dir, columns[SAMPLES_NAME])

    def done_ids(self) -> set[str]:
        """The case ids in runs.csv (for `--resume`): a case with samples but no row, from a
        crash between the two, is not done."""
        return self.runs.done_ids()

    def write(self, rec: dict, samples: list[float] | None = None) -> None:
        """The case's samples (an `ok` row's only; a failed or skipped row has none, as in
        attnbench), flushed, then its row."""
        if samples and rec["status"] == "ok":
            self.samples.write(rec["case_id"], samples)
        self.runs.write(rec)

    def close(self) -> None:
        self.samples.close()
        self.runs.close()

#!/usr/bin/env bash
# Regenerates results/cpu_perf (issue 3) in one go: attnbench's sweep of configs/cpu_perf.toml
# plus the long causal case (h = 1, n = 16384) of the flash target, then the peers on the
# same cases (PyTorch SDPA flash and math, the JAX Rabe-Staats reference), all into one
# runs.csv, then the tables in results/cpu_perf/README.md. About 14 (Zen 5) to 20 (Zen 4)
# minutes a pass on a quiet 2-core machine. Run it on a quiet machine (`uptime` load well
# under 0.5): the figures are timings.
#
# --passes N (odd, default 1) repeats the whole measurement N times into DIR/pass-1 .. pass-N
# and keeps, for every case of every implementation alike, the pass with the median time
# (scripts/cpu_perf_combine.py; DIR/passes.csv lists every pass's figure). On a shared VM
# whose host takes a core away for minutes at a time, one pass can time a 2-thread case on
# one core; the median of five discards up to two such passes per case.
#
# --resume keeps the pass directories that a previous run finished (each finished pass
# writes DIR/pass-K/complete last) and measures only the others, with this checkout's build:
# a two-hour run cut off in its fourth pass loses only that pass.
#
#   scripts/cpu_perf.sh [--python /path/to/python-with-torch-and-jax] [--out DIR] [--passes N] [--resume]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
OUT=results/cpu_perf
PASSES=1
RESUME=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --passes) PASSES="$2"; shift 2 ;;
    --resume) RESUME=1; shift ;;
    *) echo "usage: $0 [--python PYTHON] [--out DIR] [--passes N] [--resume]" >&2; exit 2 ;;
  esac
done
if ! [[ "$PASSES" =~ ^[1-9][0-9]*$ ]] || [ $((PASSES % 2)) -eq 0 ]; then
  echo "--passes must be an odd number >= 1 (the median pass is kept), not '$PASSES'" >&2
  exit 2
fi
CONFIG=configs/cpu_perf.toml
LONG=(--set variant=flash --set heads=1 --set head_dim=64 --set seq_len=16384 --set causal=true --set dtype=f32)

# One complete measurement (ours, the long case, the peers) into $1.
measure() {
  local dir="$1"
  ./target/release/attnbench sweep --config "$CONFIG" --out "$dir" --force --no-report
  ./target/release/attnbench sweep --config "$CONFIG" --out "$dir" --resume --no-report "${LONG[@]}"
  "$PY" scripts/peers/torch_sdpa.py --config "$CONFIG" --out "$dir"
  "$PY" scripts/peers/torch_sdpa.py --config "$CONFIG" --out "$dir" --variants torch-sdpa-flash "${LONG[@]}"
  "$PY" scripts/peers/jax_rabe_staats.py --config "$CONFIG" --out "$dir"
}

echo "load: $(uptime)"
cargo build --release
if [ "$PASSES" -eq 1 ]; then
  # The README (method and the table markers) survives --force, which replaces only
  # runs.csv and meta.json.
  measure "$OUT"
else
  dirs=()
  for k in $(seq "$PASSES"); do
    if [ "$RESUME" -eq 1 ] && [ -f "$OUT/pass-$k/complete" ]; then
      echo "pass $k of $PASSES: kept ($OUT/pass-$k/complete: $(cat "$OUT/pass-$k/complete"))"
    else
      echo "pass $k of $PASSES (load: $(uptime))"
      # A pass measured again is not complete until it finishes (--resume must not keep it).
      rm -f "$OUT/pass-$k/complete"
      measure "$OUT/pass-$k"
      date -u +%Y-%m-%dT%H:%M:%SZ > "$OUT/pass-$k/complete"
    fi
    dirs+=("$OUT/pass-$k")
  done
  python3 scripts/cpu_perf_combine.py "$OUT" "${dirs[@]}"
fi
./target/release/attnbench report "$OUT"
"$PY" scripts/cpu_perf_table.py "$OUT" --readme
echo "load: $(uptime)"
echo "done: $OUT/runs.csv, $OUT/meta.json, $OUT/README.md, $OUT/table_full.md"

#!/usr/bin/env bash
# Regenerates results/cpu_perf (issue 3) in one go: attnbench's sweep of configs/cpu_perf.toml
# plus the long causal case (h = 1, n = 16384) of the flash target, then the peers on the
# same cases (PyTorch SDPA flash and math, the JAX Rabe-Staats reference), all into one
# runs.csv, then the tables in results/cpu_perf/README.md. About 18 minutes on a quiet 2-core
# machine. Run it on a quiet machine (`uptime` load well under 0.5): the figures are timings.
#
#   scripts/cpu_perf.sh [--python /path/to/python-with-torch-and-jax] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
OUT=results/cpu_perf
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--python PYTHON] [--out DIR]" >&2; exit 2 ;;
  esac
done
CONFIG=configs/cpu_perf.toml
LONG=(--set variant=flash --set heads=1 --set head_dim=64 --set seq_len=16384 --set causal=true --set dtype=f32)

echo "load: $(uptime)"
cargo build --release
# The README (method and the table markers) survives --force, which replaces only
# runs.csv and meta.json.
./target/release/attnbench sweep --config "$CONFIG" --out "$OUT" --force
./target/release/attnbench sweep --config "$CONFIG" --out "$OUT" --resume "${LONG[@]}"
"$PY" scripts/peers/torch_sdpa.py --config "$CONFIG" --out "$OUT"
"$PY" scripts/peers/torch_sdpa.py --config "$CONFIG" --out "$OUT" --variants torch-sdpa-flash "${LONG[@]}"
"$PY" scripts/peers/jax_rabe_staats.py --config "$CONFIG" --out "$OUT"
"$PY" scripts/cpu_perf_table.py "$OUT" --readme
echo "load: $(uptime)"
echo "done: $OUT/runs.csv, $OUT/meta.json, $OUT/README.md, $OUT/table_full.md"

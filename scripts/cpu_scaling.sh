#!/usr/bin/env bash
# Paired thread scaling of the cpu_perf kernels (issue 36: "the 2-thread figures paired as
# examples/scaling.rs does"): for each case, rounds of a warm block of calls on 1 thread and
# one on 2 threads, back to back, and the median of the rounds' ratios, so a stretch in
# which the shared host takes the second core away falls on both sides of a ratio alike.
# One line per case into OUT/scaling.txt (the example's output). About 8 minutes on the
# 2-core development VM.
#
#   scripts/cpu_scaling.sh [OUT]     (default results/cpu_scaling)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/cpu_scaling}
mkdir -p "$OUT"
cargo build --release --example scaling
: > "$OUT/scaling.txt"
# heads seq_len head_dim: the shapes the unpaired cpu_perf table showed scaling worst on.
for shape in "1 2048 64" "1 4096 64" "8 2048 64" "8 2048 128"; do
  read -r h n d <<< "$shape"
  for causal in 0 1; do
    for dtype in f32 bf16; do
      for variant in flash rabe-staats naive; do
        target/release/examples/scaling "$variant" "$n" "$h" "$d" "$dtype" "$causal" 2 7 3 \
          | tee -a "$OUT/scaling.txt"
      done
    done
  done
done
